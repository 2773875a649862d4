// The kvtwin CLI. `run` replays the bundled lock-step sweep (every preset, both dtypes,
// plus swarm seeds) and prints the verdict; `sweep` runs a seed range with explicit
// options; `requests` runs seeded request streams through the prefix-cache manager
// (sim/requests.h). Exit codes (STYLE §5.7): 0 pass, 1 divergence, 2 usage or input
// error, 134 a KV_CHECK abort. Every failure ends with a one-line reproduce command.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "sim/requests.h"
#include "sim/run.h"

namespace {

using kvtwin::sim::RunOptions;
using kvtwin::sim::RunResult;

struct SeedRange {
  uint64_t first = 0, last = 0;
};

bool ParseU64(const std::string& text, uint64_t& out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && !text.empty();
}

// "A..B" or "A" -> an inclusive range; false on anything else.
bool ParseSeeds(const std::string& text, SeedRange& out) {
  const size_t dots = text.find("..");
  if (dots == std::string::npos) {
    if (!ParseU64(text, out.first)) return false;
    out.last = out.first;
    return true;
  }
  return ParseU64(text.substr(0, dots), out.first) && ParseU64(text.substr(dots + 2), out.last) &&
         out.first <= out.last;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "kvtwin: %s\n", message.c_str());
  return 2;
}

// Runs one seed; on divergence prints the report and returns false.
bool RunOne(const RunOptions& options, uint64_t seed, uint64_t& runs, uint64_t& steps) {
  const RunResult r = kvtwin::sim::RunSeed(options, seed);
  ++runs;
  steps += static_cast<uint64_t>(r.steps);
  if (!r.divergence) return true;
  fmt::print("FAIL seed {}: {}\n  ops: {}\n", seed, r.stack, r.weights);
  fmt::print("{}\n  last ops:\n", r.divergence->ToString());
  for (const std::string& op : r.recent_ops) fmt::print("    {}\n", op);
  fmt::print("reproduce: {}\n", r.reproduce);
  return false;
}

int Sweep(const RunOptions& options, const std::string& seeds_text, const std::string& shard) {
  SeedRange seeds;
  if (!ParseSeeds(seeds_text, seeds))
    return Usage("--seeds: expected A..B with A <= B, got '" + seeds_text + "'");
  uint64_t shard_index = 0, shard_count = 1;
  if (!shard.empty()) {
    const size_t slash = shard.find('/');
    if (slash == std::string::npos || !ParseU64(shard.substr(0, slash), shard_index) ||
        !ParseU64(shard.substr(slash + 1), shard_count) || shard_count == 0 ||
        shard_index >= shard_count) {
      return Usage("--shard: expected i/n with 0 <= i < n, got '" + shard + "'");
    }
  }
  if (kvtwin::Status s = kvtwin::sim::ValidateRunOptions(options); !s.ok())
    return Usage(s.message());
  fmt::print("kvtwin sweep: seeds {}..{} shard {}/{}\n", seeds.first, seeds.last, shard_index,
             shard_count);
  uint64_t runs = 0, steps = 0;
  for (uint64_t seed = seeds.first;; ++seed) {
    if (seed % shard_count == shard_index && !RunOne(options, seed, runs, steps)) return 1;
    if (seed == seeds.last) break;
  }
  fmt::print("PASS: {} runs, {} steps, no divergence\n", runs, steps);
  return 0;
}

bool RunBundledRequests(uint64_t root_seed, int64_t seeds_per_config, uint64_t& runs,
                        uint64_t& requests);

// The bundled job: every preset in both dtypes, then swarm seeds, then request streams
// through the prefix-cache manager.
int RunBundled(uint64_t root_seed, int64_t seeds_per_config, int64_t steps) {
  fmt::print("kvtwin run: root seed {}\n", root_seed);
  uint64_t runs = 0, total_steps = 0;
  for (const std::string& preset : kvtwin::sim::PresetNames()) {
    for (const char* dtype : {"f32", "bf16"}) {
      RunOptions options{preset, 4, 4, dtype, steps, false};
      for (int64_t i = 0; i < seeds_per_config; ++i) {
        if (!RunOne(options, root_seed + static_cast<uint64_t>(i), runs, total_steps)) return 1;
      }
      fmt::print("  {:<9} {:<4} {} seeds x {} steps: pass\n", preset, dtype, seeds_per_config,
                 steps);
    }
  }
  RunOptions swarm;
  swarm.swarm = true;
  swarm.steps = steps;
  for (int64_t i = 0; i < 4 * seeds_per_config; ++i) {
    if (!RunOne(swarm, root_seed + 1000 + static_cast<uint64_t>(i), runs, total_steps)) return 1;
  }
  fmt::print("  swarm          {} seeds x {} steps: pass\n", 4 * seeds_per_config, steps);
  uint64_t request_runs = 0, requests = 0;
  if (!RunBundledRequests(root_seed, seeds_per_config, request_runs, requests)) return 1;
  fmt::print("PASS: {} runs, {} steps, {} request runs, {} requests, no divergence\n", runs,
             total_steps, request_runs, requests);
  return 0;
}

// Writes `text` to `path` through a temporary name and a rename, so a reader never sees
// half a file.
bool WriteWhole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  bool written = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    written = out && (out << text) && out.flush();
  }
  if (written && std::rename(tmp.c_str(), path.c_str()) == 0) return true;
  std::remove(tmp.c_str());
  return false;
}

// A KV_CHECK abort (exit 134) inside a request run still ends with the reproduce line:
// the handler writes the current seed's command, prepared before the run, with the only
// async-signal-safe calls it needs, then lets the default action end the process.
char g_abort_reproduce[2048];

extern "C" void PrintReproduceOnAbort(int sig) {
  const ssize_t ignored = write(STDERR_FILENO, g_abort_reproduce, std::strlen(g_abort_reproduce));
  (void)ignored;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void ArmAbortReproduce(const std::string& command) {
  std::snprintf(g_abort_reproduce, sizeof(g_abort_reproduce), "reproduce: %s\n", command.c_str());
  std::signal(SIGABRT, PrintReproduceOnAbort);
}

void PrintRequestFailure(const kvtwin::sim::RequestResult& r) {
  fmt::print("FAIL seed {}: {}\n  mix: {}\n{}\n  last requests:\n", r.seed, r.stack, r.mix,
             r.divergence->ToString());
  for (const std::string& line : r.recent) fmt::print("    {}\n", line);
  fmt::print("  trie:\n{}reproduce: {}\n", r.trie_dump, r.reproduce);
}

// The request-level part of the bundled job: every preset, unlimited and tight budgets.
bool RunBundledRequests(uint64_t root_seed, int64_t seeds_per_config, uint64_t& runs,
                        uint64_t& requests) {
  for (const std::string& preset : kvtwin::sim::PresetNames()) {
    for (const int64_t budget : {int64_t{0}, int64_t{6000}}) {
      kvtwin::sim::RequestOptions options;
      options.preset = preset;
      options.budget_bytes = budget;
      for (int64_t i = 0; i < seeds_per_config; ++i) {
        options.seed = root_seed + static_cast<uint64_t>(i);
        ArmAbortReproduce(kvtwin::sim::RequestsReproduceCommand(options));
        const kvtwin::sim::RequestResult r = kvtwin::sim::RunRequests(options);
        ++runs;
        requests += static_cast<uint64_t>(r.requests);
        if (r.divergence) {
          PrintRequestFailure(r);
          return false;
        }
      }
      fmt::print("  requests {:<9} budget {:<5} {} seeds x {} requests: pass\n", preset, budget,
                 seeds_per_config, options.requests);
      std::fflush(stdout);
    }
  }
  return true;
}

struct RequestsFlags {
  std::string seeds = "1..20";
  std::string dot;
  bool dump = false;
};

int Requests(kvtwin::sim::RequestOptions options, const RequestsFlags& flags) {
  SeedRange seeds;
  if (!ParseSeeds(flags.seeds, seeds))
    return Usage("--seeds: expected A..B with A <= B, got '" + flags.seeds + "'");
  options.seed = seeds.first;
  if (kvtwin::Status s = kvtwin::sim::ValidateRequestOptions(options); !s.ok())
    return Usage(s.message());
  fmt::print("kvtwin requests: seeds {}..{}\n", seeds.first, seeds.last);
  std::fflush(stdout);  // before a possible KV_CHECK abort
  uint64_t runs = 0, requests = 0, digest = 0;
  kvtwin::sim::RequestCoverage coverage;
  kvtwin::sim::RequestResult r;
  for (uint64_t seed = seeds.first;; ++seed) {
    options.seed = seed;
    ArmAbortReproduce(kvtwin::sim::RequestsReproduceCommand(options));
    r = kvtwin::sim::RunRequests(options);
    ++runs;
    requests += static_cast<uint64_t>(r.requests);
    coverage += r.coverage;
    digest = (digest ^ r.digest) * 0x100000001b3u;  // FNV-style fold, order-sensitive
    if (r.divergence || seed == seeds.last) break;
  }
  if (flags.dump) fmt::print("final trie (seed {}):\n{}", r.seed, r.trie_dump);
  if (!flags.dot.empty() && !WriteWhole(flags.dot, r.trie_dot)) {
    return Usage("--dot: cannot write '" + flags.dot + "'");
  }
  if (r.divergence) {
    PrintRequestFailure(r);
    return 1;
  }
  fmt::print("coverage: {}\ndigest: {:016x}\n", coverage.ToString(), digest);
  fmt::print("PASS: {} runs, {} requests, no divergence\n", runs, requests);
  return 0;
}

CLI::App* AddRequestsCommand(CLI::App& app, kvtwin::sim::RequestOptions& o, RequestsFlags& f) {
  CLI::App* requests =
      app.add_subcommand("requests", "run seeded request streams through the prefix-cache manager");
  requests->add_option("--seeds", f.seeds, "seed range A..B");
  requests->add_option("--preset", o.preset, "dense | sliding | recurrent | mixed");
  requests->add_option("--layers", o.layers, "layers in the stack");
  requests->add_option("--window", o.window, "W of rotating layers");
  requests->add_option("--dtype", o.dtype, "f32 | bf16");
  requests->add_option("--conversations", o.conversations, "conversations in the pool");
  requests->add_option("--requests", o.requests, "requests per seed");
  requests->add_option("--budget", o.budget_bytes, "eviction budget in bytes (0 = unlimited)");
  requests->add_option("--chunk", o.chunk, "prefill chunk in tokens");
  requests->add_option("--interval", o.capture_interval,
                       "periodic prefill capture interval (0 = none)");
  requests->add_option("--pre-thinking", o.pre_thinking, "capture at len - N (0 = none)");
  requests->add_option("--dot", f.dot, "write the last seed's final trie as DOT");
  requests->add_flag("--dump", f.dump, "print the last seed's final trie");
  return requests;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvtwin: lock-step differential testing of LLM inference cache semantics"};
  app.require_subcommand(1);
  uint64_t root_seed = 1;
  int64_t seeds_per_config = 8, run_steps = 1500;
  CLI::App* run =
      app.add_subcommand("run", "replay the bundled lock-step workloads; print the verdict");
  run->add_option("--seed", root_seed, "root seed");
  run->add_option("--seeds-per-config", seeds_per_config, "seeds per preset and dtype")
      ->check(CLI::Range(1, 100000));
  run->add_option("--steps", run_steps, "operations per seed")->check(CLI::Range(1, 10000000));

  RunOptions options;
  std::string seeds = "1..100", shard;
  CLI::App* sweep = app.add_subcommand("sweep", "run a range of seeds with explicit options");
  sweep->add_option("--seeds", seeds, "seed range A..B");
  sweep->add_option("--shard", shard, "run only seeds with seed % n == i (i/n)");
  sweep->add_option("--preset", options.preset, "dense | sliding | recurrent | mixed");
  sweep->add_option("--layers", options.layers, "layers in the stack");
  sweep->add_option("--window", options.window, "W of rotating layers");
  sweep->add_option("--dtype", options.dtype, "f32 | bf16");
  sweep->add_option("--steps", options.steps, "operations per seed");
  sweep->add_flag("--swarm", options.swarm, "let each seed choose the stack and op mix");
  kvtwin::sim::RequestOptions request_options;
  RequestsFlags request_flags;
  CLI::App* requests = AddRequestsCommand(app, request_options, request_flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return Usage(e.what());
  }
  if (*run) return RunBundled(root_seed, seeds_per_config, run_steps);
  if (*requests) return Requests(request_options, request_flags);
  return Sweep(options, seeds, shard);
}
