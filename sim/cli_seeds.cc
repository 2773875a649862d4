// The seeded commands: `run` (the bundled job), `sweep` (op-level seeds) and `requests`
// (request-level seeds).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <utility>

#include "sim/cli.h"

namespace kvtwin::cli {
namespace {

using sim::RunOptions;
using sim::RunResult;

constexpr int64_t kWideWindow = 300;
constexpr int64_t kProductionWindows[] = {1024, 2047, 4096};
// The production-width stage of RunBundled: seeds and steps per seed.
constexpr int64_t kWideRowSeeds = 3;
constexpr int64_t kWideRowSteps = 400;

sim::CaseReport SeedCase(const RunResult& r) {
  sim::CaseReport c;
  c.name = fmt::format("seed {}", r.seed);
  c.verdict = r.divergence ? "divergence" : "pass";
  if (r.divergence) {
    c.kind = sim::DivergenceKind(r.divergence->mismatch.what);
    c.detail = r.divergence->ToString();
  }
  c.reproduce = r.reproduce;
  c.steps = r.steps;
  c.digest = r.digest;
  return c;
}

void PrintSeedFailure(const RunResult& r) {
  fmt::print("FAIL seed {}: {}\n  ops: {}\n", r.seed, r.stack, r.weights);
  fmt::print("{}\n  last ops:\n", r.divergence->ToString());
  for (const std::string& op : r.recent_ops) fmt::print("    {}\n", op);
  fmt::print("reproduce: {}\n", r.reproduce);
}

// Runs one seed; on divergence prints the report and returns false.
bool RunOne(const RunOptions& options, uint64_t seed, uint64_t& runs, uint64_t& steps) {
  const RunResult r = sim::RunSeed(options, seed);
  ++runs;
  steps += static_cast<uint64_t>(r.steps);
  if (!r.divergence) return true;
  PrintSeedFailure(r);
  return false;
}

void PrintRequestFailure(const sim::RequestResult& r) {
  fmt::print("FAIL seed {}: {}\n  mix: {}\n{}{}\n  last requests:\n", r.seed, r.stack, r.mix,
             r.derived.empty() ? "" : "  derived: " + r.derived + "\n", r.divergence->ToString());
  for (const std::string& line : r.recent) fmt::print("    {}\n", line);
  fmt::print("  trie:\n{}reproduce: {}\n", r.trie_dump, r.reproduce);
}

// Runs `count` request seeds from `first` with `options`; false after printing a failure.
bool RunRequestSeeds(sim::RequestOptions options, uint64_t first, int64_t count, uint64_t& runs,
                     uint64_t& requests) {
  for (int64_t i = 0; i < count; ++i) {
    options.seed = first + static_cast<uint64_t>(i);
    ArmAbortReproduce(sim::RequestsReproduceCommand(options));
    const sim::RequestResult r = sim::RunRequests(options);
    ++runs;
    requests += static_cast<uint64_t>(r.requests);
    if (r.divergence) {
      PrintRequestFailure(r);
      return false;
    }
  }
  return true;
}

// The request-level part of the bundled job: every preset, unlimited and tight budgets,
// then swarm seeds, each drawing its stack, budget and workload mix (restarts that grow
// wide nodes, template variants, memory pressure): about 5 ms a swarm seed.
bool RunBundledRequests(uint64_t root_seed, int64_t seeds_per_config, uint64_t& runs,
                        uint64_t& requests) {
  std::vector<std::string> presets = sim::RequestPresetNames();
  presets.emplace_back(sim::kStaggeredPreset);  // per-layer windows (not drawn by the swarm)
  for (const std::string& preset : presets) {
    for (const int64_t budget : {int64_t{0}, int64_t{6000}}) {
      sim::RequestOptions options;
      options.preset = preset;
      options.budget_bytes = budget;
      if (!RunRequestSeeds(options, root_seed, seeds_per_config, runs, requests)) return false;
      fmt::print("  requests {:<9} budget {:<5} {} seeds x {} requests: pass\n", preset, budget,
                 seeds_per_config, options.requests);
      std::fflush(stdout);
    }
  }
  sim::RequestOptions swarm;
  swarm.swarm = true;
  // Swarm seeds cost about 5 ms each, and a trie bug whose trigger needs a deep, aged
  // trie may show in one seed in 200 (an eviction merge whose victim is newer than its only
  // child, mutant 188, in 23 of seeds 1-4000): 1,000 seeds catch such a bug with
  // probability 1 - (1 - 1/200)^1000, about 99 %, for some 3 s more than 320 did.
  const int64_t swarm_seeds = 125 * seeds_per_config;
  if (!RunRequestSeeds(swarm, root_seed, swarm_seeds, runs, requests)) return false;
  fmt::print("  requests swarm {} seeds x {} requests: pass\n", swarm_seeds, swarm.requests);
  std::fflush(stdout);
  // The long and huge stages: three conversations each.
  const auto three_conversations = [&](bool huge, int64_t seeds, const char* name) {
    sim::RequestOptions o = swarm;
    o.long_context = !huge;
    o.huge_context = huge;
    o.conversations = 3;
    if (!RunRequestSeeds(o, root_seed, seeds, runs, requests)) return false;
    fmt::print("  requests {} swarm {} seeds x {} requests: pass\n", name, seeds, o.requests);
    std::fflush(stdout);
    return true;
  };
  // Long contexts: conversations growing to hundreds of tokens, so KV buffers cross their
  // 256-row growth steps under the manager and rotating windows of 256 and more hold whole
  // nodes (about 20 ms a seed).
  if (!three_conversations(false, 5 * seeds_per_config, "long")) return false;
  // Production lengths: prompts to 24,000 tokens that diverge at any token, so trie edges
  // of thousands of keys split anywhere in them and windows of 4,096 sit inside one node
  // (about 0.4 s a seed).
  if (!three_conversations(true, 2 * seeds_per_config, "huge")) return false;
  // Media: image spans whose positions hold a fold value with bit 31 set (negative ids),
  // shared across conversations, so the trie keys a sign or width slip would corrupt.
  sim::RequestOptions media_swarm = swarm;
  media_swarm.media = true;
  const int64_t media_seeds = 25 * seeds_per_config;
  if (!RunRequestSeeds(media_swarm, root_seed, media_seeds, runs, requests)) return false;
  fmt::print("  requests media swarm {} seeds x {} requests: pass\n", media_seeds,
             media_swarm.requests);
  std::fflush(stdout);
  // Spikes: a trie grown to a thousand and more nodes with no eviction, then one request under
  // a budget of 0 whose pass must take every evictable node (about 0.1 s a seed).
  sim::RequestOptions spike = swarm;
  spike.spike = true;
  spike.requests = sim::kSpikeEvery;
  if (!RunRequestSeeds(spike, root_seed, seeds_per_config, runs, requests)) return false;
  fmt::print("  requests spike swarm {} seeds x {} requests: pass\n", seeds_per_config,
             spike.requests);
  std::fflush(stdout);
  return true;
}

// The bundled traces: traces/workloads (generated workloads and the down-sampled Mooncake
// trace) and traces/regress (minimized bugs), in name order.
bool RunBundledTraces(uint64_t& files, uint64_t& events) {
  namespace fs = std::filesystem;
  for (const char* folder : {"workloads", "regress"}) {
    const fs::path dir = fs::path(KVTWIN_TRACES_DIR) / folder;
    std::vector<fs::path> paths;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".jsonl") paths.push_back(entry.path());
    }
    std::sort(paths.begin(), paths.end());
    for (const fs::path& p : paths) {
      sim::ReplayOptions options;
      options.interrupted = &Interrupted();
      ArmAbortReproduce(sim::ReplayCommand(p.string(), options));
      const sim::ReplayResult r = sim::ReplayFile(p.string(), options);
      ++files;
      events += static_cast<uint64_t>(r.events);
      if (!r.passed()) {
        fmt::print("FAIL {}: {}\n{}\nreproduce: {}\n", p.string(), r.verdict(), r.detail(),
                   sim::ReplayCommand(p.string(), options));
        return false;
      }
      fmt::print("  trace {:<52} {} events: pass\n",
                 fmt::format("{}/{}", folder, p.filename().string()), r.events);
      std::fflush(stdout);
    }
  }
  return true;
}

// Seeds first..first + count - 1 of one kind of multi-sequence run; false after printing the
// first divergence.
bool RunMultiSeqSeeds(const sim::MultiSeqRunOptions& options, uint64_t first, int64_t count,
                      uint64_t& runs) {
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t seed = first + static_cast<uint64_t>(i);
    ArmAbortReproduce(sim::MultiSeqReproduceCommand(options, seed));
    const sim::MultiSeqRunResult r = sim::RunMultiSeq(options, seed);
    ++runs;
    if (r.divergence) {
      fmt::print("FAIL seed {}: {}\n{}\n  last ops:\n", seed, r.config, r.divergence->ToString());
      for (const std::string& op : r.recent_ops) fmt::print("    {}\n", op);
      fmt::print("reproduce: {}\n", r.reproduce);
      return false;
    }
  }
  return true;
}

// The multi-sequence part of the bundled job: seeds over every cache shape the seed draws,
// then production-sized caches: thousands of cells a sequence, windows to 4,097, ubatches of
// 512 (0.2-6 s a seed: the checks read every cell's visibility for every batch token).
bool RunBundledMultiSeq(uint64_t root_seed, int64_t seeds, uint64_t& runs) {
  const sim::MultiSeqRunOptions options;
  if (!RunMultiSeqSeeds(options, root_seed + 2000, seeds, runs)) return false;
  fmt::print("  multiseq       {} seeds x {} ops: pass\n", seeds, options.steps);
  std::fflush(stdout);
  sim::MultiSeqRunOptions huge;
  huge.huge = true;
  const int64_t huge_seeds = seeds / 32;
  if (!RunMultiSeqSeeds(huge, root_seed, huge_seeds, runs)) return false;
  fmt::print("  multiseq huge  {} seeds x {} ops: pass\n", huge_seeds, huge.steps);
  std::fflush(stdout);
  return true;
}

}  // namespace

int MultiSeq(const MultiSeqFlags& flags) {
  SeedRange seeds;
  if (!ParseSeeds(flags.seeds, seeds))
    return Usage("--seeds: expected A..B with A <= B, got '" + flags.seeds + "'");
  sim::MultiSeqRunOptions options;
  if (flags.steps < 1) return Usage(fmt::format("--steps must be >= 1, got {}", flags.steps));
  options.steps = flags.steps;
  options.huge = flags.huge;
  if (flags.conv == "ideal") {
    options.conv = sim::ConvExpectation::kIdeal;
  } else if (flags.conv != "as-specified") {
    return Usage("--conv: expected as-specified or ideal, got '" + flags.conv + "'");
  }
  fmt::print("kvtwin multiseq: seeds {}..{}\n", seeds.first, seeds.last);
  std::fflush(stdout);
  Progress progress("multiseq: seeds done");
  std::vector<sim::CaseReport> cases;
  sim::MsCoverage total;
  int code = 0;
  for (uint64_t seed = seeds.first;; ++seed) {
    if (Interrupted().load()) {
      code = 130;
      break;
    }
    ArmAbortReproduce(sim::MultiSeqReproduceCommand(options, seed));
    const sim::MultiSeqRunResult r = sim::RunMultiSeq(options, seed);
    sim::CaseReport c;
    c.name = fmt::format("seed {}", seed);
    c.verdict = r.divergence ? "divergence" : "pass";
    c.reproduce = r.reproduce;
    c.steps = r.steps;
    c.digest = r.digest;
    if (r.divergence) {
      c.kind = sim::DivergenceKind(r.divergence->mismatch.what);
      c.detail = r.divergence->ToString();
    }
    cases.push_back(c);
    total += r.coverage;
    progress.Update(static_cast<int64_t>(cases.size()));
    if (r.divergence) {
      fmt::print("FAIL seed {}: {}\n{}\n  last ops:\n", seed, r.config, r.divergence->ToString());
      for (const std::string& op : r.recent_ops) fmt::print("    {}\n", op);
      fmt::print("reproduce: {}\n", r.reproduce);
      code = 1;
      break;
    }
    if (seed == seeds.last) break;
  }
  if (!flags.reports.Write("multiseq", cases)) return 2;
  fmt::print("coverage: {}\n", total.ToString());
  if (code == 130) fmt::print("INTERRUPTED: {} runs, no divergence so far\n", cases.size());
  if (code == 0) {
    fmt::print("PASS: {} runs, no divergence\ndigest: {:016x}\n", cases.size(),
               sim::RunDigest(cases));
  }
  return code;
}

namespace {

RunOptions FixedStack(const std::string& preset, int32_t layers, int64_t window,
                      const std::string& dtype, int64_t steps) {
  RunOptions o;
  o.preset = preset;
  o.layers = layers;
  o.window = window;
  o.dtype = dtype;
  o.steps = steps;
  return o;
}

}  // namespace

int RunBundled(uint64_t root_seed, int64_t seeds_per_config, int64_t steps) {
  fmt::print("kvtwin run: root seed {}\n", root_seed);
  std::fflush(stdout);
  uint64_t runs = 0, total_steps = 0;
  for (const std::string& preset : sim::PresetNames()) {
    for (const char* dtype : {"f32", "bf16"}) {
      const RunOptions options = FixedStack(preset, 4, 4, dtype, steps);
      for (int64_t i = 0; i < seeds_per_config; ++i) {
        if (!RunOne(options, root_seed + static_cast<uint64_t>(i), runs, total_steps)) return 1;
      }
      fmt::print("  {:<9} {:<4} {} seeds x {} steps: pass\n", preset, dtype, seeds_per_config,
                 steps);
    }
  }
  // K and V rows in two dtypes (llama.cpp's --cache-type-k / --cache-type-v): every buffer,
  // snapshot, wrapper and price must keep V's dtype apart from K's. The swarm draws it too,
  // one seed in six; these two stacks hold it for every seed, both ways round.
  for (const auto& [preset, dtype] :
       {std::pair{"mixed", "bf16/f32"}, std::pair{"sliding", "f32/bf16"}}) {
    const RunOptions options = FixedStack(preset, 4, 4, dtype, steps);
    for (int64_t i = 0; i < seeds_per_config; ++i) {
      if (!RunOne(options, root_seed + static_cast<uint64_t>(i), runs, total_steps)) return 1;
    }
    fmt::print("  {:<9} {:<8} {} seeds x {} steps: pass\n", preset, dtype, seeds_per_config, steps);
  }
  // A window wider than the ring's 256-slot growth step: the ring grows by the step before
  // it holds W rows, and a decode at offset 256 or more grows it again, branches no window
  // of at most 256 reaches (real sliding windows are 512-4096 tokens).
  const RunOptions wide = FixedStack("rotating", 3, kWideWindow, "f32", steps);
  for (int64_t i = 0; i < seeds_per_config; ++i) {
    if (!RunOne(wide, root_seed + static_cast<uint64_t>(i), runs, total_steps)) return 1;
  }
  fmt::print("  rotating  W={} {} seeds x {} steps: pass\n", kWideWindow, seeds_per_config, steps);
  // Production windows (Mistral's and Gemma-2's 4096, Phi-3's 2047, 1024): a path keyed to a
  // wide window (a commit or a copy that changes strategy past some width) shows only there,
  // and a seed of the run's 1,500 steps takes the ring past W and wraps it. One seed each,
  // about 5 s for the three.
  for (const int64_t window : kProductionWindows) {
    const RunOptions big = FixedStack("rotating", 2, window, "f32", steps);
    if (!RunOne(big, root_seed, runs, total_steps)) return 1;
  }
  fmt::print("  rotating  W={} 1 seed x {} steps each: pass\n", fmt::join(kProductionWindows, ","),
             steps);
  // Rows of a production width (8 heads of 128 columns, K and V: 8 KiB a row in f32) under a
  // full KV layer and a window of 300: buffers, windows and snapshots past a mebibyte, where
  // a path taken only for large tensors (a copy into a reused buffer, a split in place) shows.
  // About 4 s a seed: the checks read every row of every held snapshot after each step.
  RunOptions wide_rows = FixedStack("mixed", 2, kWideWindow, "f32", kWideRowSteps);
  wide_rows.dims.kv_heads = 8;
  wide_rows.dims.head_dim = 128;
  wide_rows.dims.value_dim = 128;
  for (int64_t i = 0; i < kWideRowSeeds; ++i) {
    if (!RunOne(wide_rows, root_seed + static_cast<uint64_t>(i), runs, total_steps)) return 1;
  }
  fmt::print("  mixed x2 W={} kv 8x128/128 {} seeds x {} steps: pass\n", kWideWindow, kWideRowSeeds,
             kWideRowSteps);
  // Recurrent layers of a production width (4 key and 8 value heads of 64: 64 x 64 state
  // blocks, a conv of 1,024 channels, widths the fused kernels' size classes take), in
  // both activation dtypes: about 1.8 s a seed (long speculations and padded buckets included).
  for (const char* dtype : {"f32", "bf16"}) {
    RunOptions wide_state = FixedStack("recurrent", 2, 4, dtype, kWideRowSteps);
    wide_state.dims.recurrent = RecurrentDims{3, 4, 8, 64, 64};
    for (int64_t i = 0; i < kWideRowSeeds; ++i) {
      if (!RunOne(wide_state, root_seed + static_cast<uint64_t>(i), runs, total_steps)) return 1;
    }
    fmt::print("  recurrent x2 {} rec 3,4,8,64,64 {} seeds x {} steps: pass\n", dtype,
               kWideRowSeeds, kWideRowSteps);
  }
  // Rotating layers of windows 4, 9 and 2 in one stack, under one speculation.
  const RunOptions staggered = FixedStack(sim::kStaggeredPreset, 4, 4, "bf16", steps);
  for (int64_t i = 0; i < seeds_per_config; ++i) {
    if (!RunOne(staggered, root_seed + static_cast<uint64_t>(i), runs, total_steps)) return 1;
  }
  fmt::print("  staggered bf16 {} seeds x {} steps: pass\n", seeds_per_config, steps);
  RunOptions swarm;
  swarm.swarm = true;
  swarm.steps = steps;
  for (int64_t i = 0; i < 4 * seeds_per_config; ++i) {
    if (!RunOne(swarm, root_seed + 1000 + static_cast<uint64_t>(i), runs, total_steps)) return 1;
  }
  fmt::print("  swarm          {} seeds x {} steps: pass\n", 4 * seeds_per_config, steps);
  uint64_t request_runs = 0, requests = 0;
  if (!RunBundledRequests(root_seed, seeds_per_config, request_runs, requests)) return 1;
  uint64_t multiseq_runs = 0;
  // Multi-sequence seeds cost about 7 ms each, and a stale range at a sequence's end (a
  // CopyPrefix after a refused Remove) meets its draw about once in a hundred seeds.
  if (!RunBundledMultiSeq(root_seed, 16 * seeds_per_config, multiseq_runs)) return 1;
  uint64_t trace_files = 0, trace_events = 0;
  if (!RunBundledTraces(trace_files, trace_events)) return 1;
  if (!RunProductionTrace(KVTWIN_MOONCAKE_TRACE, trace_files, trace_events)) return 1;
  uint64_t corpus_entries = 0;
  if (const int code = RunBundledCorpora(KVTWIN_FUZZ_CORPUS_DIR, corpus_entries); code != 0) {
    return code;
  }
  fmt::print(
      "PASS: {} runs, {} steps, {} request runs, {} requests, {} multi-sequence runs, {} traces, "
      "{} trace events, {} fuzz corpus entries, no divergence\n",
      runs, total_steps, request_runs, requests, multiseq_runs, trace_files, trace_events,
      corpus_entries);
  return 0;
}

int Sweep(const RunOptions& options, const SweepFlags& flags) {
  SeedRange seeds;
  if (!ParseSeeds(flags.seeds, seeds))
    return Usage("--seeds: expected A..B with A <= B, got '" + flags.seeds + "'");
  uint64_t shard_index = 0, shard_count = 1;
  if (!flags.shard.empty()) {
    const std::string& shard = flags.shard;
    const size_t slash = shard.find('/');
    if (slash == std::string::npos || !ParseU64(shard.substr(0, slash), shard_index) ||
        !ParseU64(shard.substr(slash + 1), shard_count) || shard_count == 0 ||
        shard_index >= shard_count) {
      return Usage("--shard: expected i/n with 0 <= i < n, got '" + shard + "'");
    }
  }
  if (Status s = sim::ValidateRunOptions(options); !s.ok()) return Usage(s.message());
  if (!flags.save_failing.empty() && !std::filesystem::is_directory(flags.save_failing)) {
    return Usage("--save-failing: '" + flags.save_failing + "' is not a directory");
  }
  fmt::print("kvtwin sweep: seeds {}..{} shard {}/{}\n", seeds.first, seeds.last, shard_index,
             shard_count);
  std::fflush(stdout);
  Progress progress("sweep: seeds done");
  std::vector<sim::CaseReport> cases;
  uint64_t runs = 0, steps = 0;
  int code = 0;
  for (uint64_t seed = seeds.first;; ++seed) {
    if (Interrupted().load()) {
      code = 130;
      break;
    }
    if (seed % shard_count == shard_index) {
      ArmAbortReproduce(sim::ReproduceCommand(options, seed));
      sim::Trace trace;
      const RunResult r =
          sim::RunSeed(options, seed, flags.save_failing.empty() ? nullptr : &trace);
      ++runs;
      steps += static_cast<uint64_t>(r.steps);
      cases.push_back(SeedCase(r));
      progress.Update(static_cast<int64_t>(runs));
      if (r.divergence) {
        PrintSeedFailure(r);
        if (!flags.save_failing.empty()) {
          const std::string path = fmt::format("{}/seed-{}.jsonl", flags.save_failing, seed);
          const Status s = sim::WriteTrace(path, trace);
          if (!s.ok()) return Usage("--save-failing: " + s.message());
          fmt::print("trace: {}\nshrink: kvtwin shrink {} -o {}\n", path, path,
                     fmt::format("{}/seed-{}.min.jsonl", flags.save_failing, seed));
        }
        code = 1;
        break;
      }
    }
    if (seed == seeds.last) break;
  }
  if (!flags.reports.Write("sweep", cases)) return 2;
  if (code == 130) {
    fmt::print("INTERRUPTED: {} runs, {} steps, no divergence so far\n", runs, steps);
  } else if (code == 0) {
    fmt::print("PASS: {} runs, {} steps, no divergence\ndigest: {:016x}\n", runs, steps,
               sim::RunDigest(cases));
  }
  return code;
}

int Requests(sim::RequestOptions options, const RequestsFlags& flags) {
  SeedRange seeds;
  if (!ParseSeeds(flags.seeds, seeds))
    return Usage("--seeds: expected A..B with A <= B, got '" + flags.seeds + "'");
  options.seed = seeds.first;
  if (Status s = sim::ValidateRequestOptions(options); !s.ok()) return Usage(s.message());
  fmt::print("kvtwin requests: seeds {}..{}\n", seeds.first, seeds.last);
  std::fflush(stdout);  // before a possible KV_CHECK abort
  uint64_t runs = 0, requests = 0, digest = 0;
  sim::RequestCoverage coverage;
  sim::RequestResult r;
  sim::Trace trace;
  for (uint64_t seed = seeds.first;; ++seed) {
    options.seed = seed;
    ArmAbortReproduce(sim::RequestsReproduceCommand(options));
    r = sim::RunRequests(options, flags.save.empty() ? nullptr : &trace);
    ++runs;
    requests += static_cast<uint64_t>(r.requests);
    coverage += r.coverage;
    digest = (digest ^ r.digest) * 0x100000001b3u;  // FNV-style fold, order-sensitive
    if (!r.derived.empty()) fmt::print("  seed {}: {}\n", seed, r.derived);
    if (r.divergence || seed == seeds.last || Interrupted().load()) break;
  }
  if (flags.dump) fmt::print("final trie (seed {}):\n{}", r.seed, r.trie_dump);
  if (!flags.dot.empty() && !WriteWhole(flags.dot, r.trie_dot)) {
    return Usage("--dot: cannot write '" + flags.dot + "'");
  }
  if (!flags.save.empty()) {
    if (Status s = sim::WriteTrace(flags.save, trace); !s.ok())
      return Usage("--save: " + s.message());
  }
  if (r.divergence) {
    PrintRequestFailure(r);
    return 1;
  }
  fmt::print("coverage: {}\ndigest: {:016x}\n", coverage.ToString(), digest);
  if (Interrupted().load()) {
    fmt::print("INTERRUPTED: {} runs, {} requests, no divergence so far\n", runs, requests);
    return 130;
  }
  fmt::print("PASS: {} runs, {} requests, no divergence\n", runs, requests);
  return 0;
}

}  // namespace kvtwin::cli
