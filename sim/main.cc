// The kvtwin CLI. `run` replays the bundled lock-step sweep (every preset, both dtypes,
// plus swarm seeds) and prints the verdict; `sweep` runs a seed range with explicit
// options. Exit codes (STYLE §5.7): 0 pass, 1 divergence, 2 usage or input error, 134 a
// KV_CHECK abort. Every failure ends with a one-line reproduce command.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <string>

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

// The bundled job: every preset in both dtypes, then swarm seeds.
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
  fmt::print("PASS: {} runs, {} steps, no divergence\n", runs, total_steps);
  return 0;
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return Usage(e.what());
  }
  if (*run) return RunBundled(root_seed, seeds_per_config, run_steps);
  return Sweep(options, seeds, shard);
}
