// The kvtwin CLI: CLI11 wiring only; the commands live in cli_*.cc (sim/cli.h documents
// the exit codes and output contract).
#include <CLI/CLI.hpp>

#include "sim/cli.h"

namespace {

using kvtwin::cli::Usage;

// --kv-dims and --recurrent-dims into `dims`; a malformed value is a usage error (exit 2).
void AddDimsOptions(CLI::App* cmd, kvtwin::sim::ModelDims& dims, const std::string& scope = "") {
  const auto parse = [&dims](auto parser) {
    return [&dims, parser](const std::string& text) {
      const kvtwin::Status s = parser(text, &dims);
      if (!s.ok()) throw CLI::ValidationError(s.message());
    };
  };
  cmd->add_option_function<std::string>("--kv-dims", parse(kvtwin::sim::ParseKvDims),
                                        scope + "K/V heads and head widths HEADS,DK,DV (2,4,5)");
  cmd->add_option_function<std::string>(
      "--recurrent-dims", parse(kvtwin::sim::ParseRecurrentDims),
      scope +
          "recurrent layers' TAIL,HK,HV,DK,DV: conv tail, key and value heads, key and "
          "value head widths (3,2,4,2,3)");
}

// The replay setup of a Mooncake file (its model, budget and prefill cadence).
void AddSetupOptions(CLI::App* cmd, kvtwin::sim::TraceHeader& h, kvtwin::sim::MooncakeOptions& m) {
  cmd->add_option("--trace-block", m.trace_block,
                  "Mooncake: tokens per hash id in the trace (512; Alibaba's Qwen traces: 16)");
  CLI::Option* scale = cmd->add_option("--block-scale", m.block_scale,
                                       "Mooncake: tokens per trace block (1..B, default B)");
  cmd->add_option("--skip", m.skip, "Mooncake: leave out the first N requests");
  cmd->add_option("--limit", m.limit, "Mooncake: N requests only (0 = all)");
  cmd->add_option("--preset", h.preset,
                  "Mooncake: dense | rotating | sliding | recurrent | mixed | holey");
  cmd->add_option("--layers", h.layers, "Mooncake: layers in the stack");
  cmd->add_option("--window", h.window, "Mooncake: W of rotating layers");
  cmd->add_option("--dtype", h.dtype, "Mooncake: f32 | bf16, or K/V such as bf16/f32");
  AddDimsOptions(cmd, h.dims, "Mooncake: ");
  cmd->add_option("--budget", h.budget_bytes, "Mooncake: eviction budget in bytes (0 = unlimited)");
  CLI::Option* chunk =
      cmd->add_option("--chunk", h.chunk, "Mooncake: prefill chunk in tokens (default: max(5, S))");
  CLI::Option* interval = cmd->add_option(
      "--interval", h.capture_interval, "Mooncake: periodic capture interval (default: max(8, S))");
  cmd->add_option("--pre-thinking", h.pre_thinking, "Mooncake: capture at len - N (0 = none)");
  cmd->add_option("--seed", h.seed, "value seed of the synthetic rows");
  // The scale defaults to the recorded lengths, and the cadence follows it unless given
  // (sim/mooncake.h).
  cmd->parse_complete_callback([&h, &m, scale, chunk, interval] {
    if (scale->count() == 0) m.block_scale = m.trace_block;
    if (chunk->count() == 0) h.chunk = kvtwin::sim::MooncakeChunk(m.block_scale);
    if (interval->count() == 0) h.capture_interval = kvtwin::sim::MooncakeInterval(m.block_scale);
  });
}

void AddRequestOptions(CLI::App* cmd, kvtwin::sim::RequestOptions& o) {
  cmd->add_option("--preset", o.preset,
                  "dense | rotating | sliding | recurrent | mixed | holey (stateless layers) | "
                  "staggered (per-layer windows)");
  cmd->add_option("--layers", o.layers, "layers in the stack");
  cmd->add_option("--window", o.window, "W of rotating layers");
  cmd->add_option("--dtype", o.dtype, "f32 | bf16, or K/V such as bf16/f32 (V rows apart)");
  AddDimsOptions(cmd, o.dims);
  cmd->add_option("--conversations", o.conversations, "conversations in the pool");
  cmd->add_option("--requests", o.requests, "requests per seed");
  cmd->add_option("--budget", o.budget_bytes, "eviction budget in bytes (0 = unlimited)");
  cmd->add_option("--chunk", o.chunk, "prefill chunk in tokens");
  cmd->add_option("--interval", o.capture_interval, "periodic prefill capture interval (0 = none)");
  cmd->add_option("--pre-thinking", o.pre_thinking, "capture at len - N (0 = none)");
  cmd->add_flag("--swarm", o.swarm, "let each seed choose the stack and the budget");
  cmd->add_flag("--long", o.long_context,
                "long conversations (to 700 tokens) past the KV growth steps; with --swarm, "
                "windows of 256 and more");
  cmd->add_flag("--huge", o.huge_context,
                "prompts of production length (to 24,000 tokens, turns to 6,000) that diverge "
                "anywhere; with --swarm, windows to 4,097, chunks to 4,096, budgets in MB");
  cmd->add_flag("--media", o.media,
                "image spans in the prompts: effective tokens with bit 31 set (negative ids)");
  cmd->add_flag("--spike", o.spike,
                "a budget of 0 every 1,000th request, no limit reached otherwise: one eviction "
                "pass over a trie of a thousand and more nodes (--requests defaults to 1000)");
}

// --spike's first budget of 0 is request kSpikeEvery, so it sets the default request count.
void ApplySpikeDefaults(CLI::App* cmd, kvtwin::sim::RequestOptions& o) {
  if (o.spike && cmd->get_option("--requests")->count() == 0) {
    o.requests = kvtwin::sim::kSpikeEvery;
  }
}

void AddRunOptions(CLI::App* cmd, kvtwin::sim::RunOptions& o) {
  cmd->add_option("--preset", o.preset,
                  "dense | rotating | sliding | recurrent | mixed | staggered (per-layer windows)");
  cmd->add_option("--layers", o.layers, "layers in the stack");
  cmd->add_option("--window", o.window, "W of rotating layers");
  cmd->add_option("--dtype", o.dtype, "f32 | bf16, or K/V such as bf16/f32 (V rows apart)");
  AddDimsOptions(cmd, o.dims);
  cmd->add_option("--steps", o.steps, "operations per seed");
  cmd->add_flag("--swarm", o.swarm, "let each seed choose the stack and op mix");
}

void AddReportOptions(CLI::App* cmd, kvtwin::cli::ReportFlags& r) {
  cmd->add_option("--json", r.json, "write a JSON summary");
  cmd->add_option("--junit", r.junit, "write JUnit XML");
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = kvtwin::cli;
  CLI::App app{"kvtwin: lock-step differential testing of LLM inference cache semantics"};
  app.require_subcommand(1);

  uint64_t root_seed = 1;
  int64_t seeds_per_config = 8, run_steps = 1500;
  CLI::App* run = app.add_subcommand(
      "run", "replay the bundled workloads, traces and fuzz corpora; print the verdict");
  run->add_option("--seed", root_seed, "root seed");
  run->add_option("--seeds-per-config", seeds_per_config, "seeds per preset and dtype")
      ->check(CLI::Range(1, 100000));
  run->add_option("--steps", run_steps, "operations per seed")->check(CLI::Range(1, 10000000));

  kvtwin::sim::RunOptions sweep_options;
  cli::SweepFlags sweep_flags;
  CLI::App* sweep = app.add_subcommand("sweep", "run a range of op-level seeds");
  sweep->add_option("--seeds", sweep_flags.seeds, "seed range A..B");
  sweep->add_option("--shard", sweep_flags.shard, "run only seeds with seed % n == i (i/n)");
  sweep->add_option("--save-failing", sweep_flags.save_failing,
                    "directory for the failing seed's trace");
  AddRunOptions(sweep, sweep_options);
  AddReportOptions(sweep, sweep_flags.reports);

  kvtwin::sim::RequestOptions request_options;
  cli::RequestsFlags request_flags;
  CLI::App* requests =
      app.add_subcommand("requests", "run seeded request streams through the prefix-cache manager");
  requests->add_option("--seeds", request_flags.seeds, "seed range A..B");
  AddRequestOptions(requests, request_options);
  requests->add_option("--dot", request_flags.dot, "write the last seed's final trie as DOT");
  requests->add_option("--save", request_flags.save, "write the last seed's requests as a trace");
  requests->add_flag("--dump", request_flags.dump, "print the last seed's final trie");

  cli::MultiSeqFlags multiseq_flags;
  CLI::App* multiseq = app.add_subcommand(
      "multiseq", "run seeds through the multi-sequence causal cache and the LFM2 hybrid");
  multiseq->add_option("--seeds", multiseq_flags.seeds, "seed range A..B");
  multiseq->add_option("--steps", multiseq_flags.steps, "operations per seed");
  multiseq->add_option("--conv", multiseq_flags.conv,
                       "as-specified | ideal (report the documented conv weaknesses)");
  multiseq->add_flag("--huge", multiseq_flags.huge,
                     "production-sized caches: thousands of cells a sequence, windows to 4,097, "
                     "prompts of a whole ubatch (to 512)");
  AddReportOptions(multiseq, multiseq_flags.reports);

  cli::ReplayFlags replay_flags;
  CLI::App* replay =
      app.add_subcommand("replay", "replay kvtwin traces or Mooncake JSONL in lock step");
  replay->add_option("files", replay_flags.files, "trace files");
  replay->add_option("--fuzz-input", replay_flags.fuzz_input,
                     "a libFuzzer input to decode, save as a trace and replay");
  replay->add_option("--fuzz-corpus", replay_flags.fuzz_corpus,
                     "replay every entry of a libFuzzer corpus: a folder per target (as "
                     "fuzz/corpus), or with --target that target's folder");
  replay->add_option(
      "--target", replay_flags.fuzz_target,
      "fuzz target of --fuzz-input or --fuzz-corpus (kv, rotating, recurrent, speculation, prefix, "
      "hybrid, trace_reader)");
  replay->add_option("--save", replay_flags.save,
                     "trace to write for --fuzz-input (default: INPUT.jsonl)");
  AddSetupOptions(replay, replay_flags.options.mooncake_setup, replay_flags.options.mooncake);
  AddReportOptions(replay, replay_flags.reports);
  replay->add_flag("--quiet", replay_flags.quiet, "print only failures and the verdict");
  replay->add_option("--reach", replay_flags.reach,
                     "COUNTER[=N]: a replay that passes must end with this coverage counter at N "
                     "(1) or more, else verdict unreached (repeatable; beside a trace header's "
                     "\"reaches\"; a Mooncake file has no header to carry them)");
  replay->add_flag("--coverage", replay_flags.coverage,
                   "print each file's driver coverage by the counter names a trace header's "
                   "\"reaches\" claims (requests and multiseq traces)");
  replay->add_flag("--audit-every-call", replay_flags.options.audit_every_call,
                   "requests: run the whole-trie checks on every session call (quadratic on a "
                   "large trie; by default they are amortized and a failure is localized)");

  cli::GenFlags gen_flags;
  CLI::App* gen = app.add_subcommand("gen", "generate a seeded workload as a trace");
  gen->add_option("--kind", gen_flags.kind, "requests | ops | multiseq");
  gen->add_option("--seed", gen_flags.seed, "workload seed");
  gen->add_option("-o,--out", gen_flags.out, "trace file to write")->required();
  AddRequestOptions(gen, gen_flags.requests);  // ops reuse the stack options (below)
  gen->add_option("--steps", gen_flags.ops.steps, "ops, multiseq: operations");

  cli::ImportFlags import_flags;
  CLI::App* import = app.add_subcommand("import", "convert Mooncake JSONL into a kvtwin trace");
  import->add_option("in", import_flags.in, "Mooncake JSONL")->required();
  import->add_option("-o,--out", import_flags.out, "trace file to write")->required();
  AddSetupOptions(import, import_flags.setup, import_flags.mooncake);

  cli::ShrinkFlags shrink_flags;
  CLI::App* shrink = app.add_subcommand("shrink", "minimize a diverging trace");
  shrink->add_option("in", shrink_flags.in, "diverging trace")->required();
  shrink->add_option("-o,--out", shrink_flags.out, "minimized trace to write")->required();
  shrink->add_option("--name", shrink_flags.name, "test name of the printed gtest snippet");
  shrink->add_option("--keep-reach", shrink_flags.keep_reach,
                     "COUNTER[=N]: keep the divergence reaching this coverage counter N (1) times "
                     "or more, and claim it in the shrunk trace's header \"reaches\" "
                     "(repeatable; names: kvtwin replay --coverage)");
  shrink->add_option("--max-replays", shrink_flags.max_replays, "replay budget")
      ->check(CLI::Range(int64_t{1}, int64_t{100000000}));

  cli::ExplainFlags explain_flags;
  CLI::App* explain = app.add_subcommand("explain", "show the state after one event of a trace");
  explain->add_option("file", explain_flags.file, "trace")->required();
  explain->add_option("--at", explain_flags.at, "event index (0-based)")->required();
  explain->add_option("--dot", explain_flags.dot, "write the trie as DOT");
  AddSetupOptions(explain, explain_flags.options.mooncake_setup, explain_flags.options.mooncake);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return Usage(e.what());
  }
  cli::InstallInterruptHandler();
  if (*run) return cli::RunBundled(root_seed, seeds_per_config, run_steps);
  if (*requests) {
    ApplySpikeDefaults(requests, request_options);
    return cli::Requests(request_options, request_flags);
  }
  if (*replay) {
    if (!replay_flags.fuzz_corpus.empty()) return cli::ReplayFuzzCorpus(replay_flags);
    if (!replay_flags.fuzz_input.empty()) return cli::ReplayFuzzInput(replay_flags);
    if (replay_flags.files.empty()) {
      return cli::Usage("replay: give trace files, --fuzz-input or --fuzz-corpus");
    }
    return cli::Replay(replay_flags);
  }
  if (*multiseq) return cli::MultiSeq(multiseq_flags);
  if (*gen) {
    // Op generation shares the stack options with requests, but keeps the defaults of
    // `sweep` for those not given, so `gen --kind ops --seed S` records what `sweep --seeds
    // S` runs.
    auto given = [gen](const char* name) { return gen->get_option(name)->count() > 0; };
    if (given("--preset")) gen_flags.ops.preset = gen_flags.requests.preset;
    if (given("--layers")) gen_flags.ops.layers = gen_flags.requests.layers;
    if (given("--window")) gen_flags.ops.window = gen_flags.requests.window;
    if (given("--dtype")) gen_flags.ops.dtype = gen_flags.requests.dtype;
    gen_flags.ops.dims = gen_flags.requests.dims;  // the same defaults
    gen_flags.ops.swarm = gen_flags.requests.swarm;
    if (given("--steps")) gen_flags.multiseq.steps = gen_flags.ops.steps;
    gen_flags.multiseq.huge = gen_flags.requests.huge_context;  // --huge: multiseq's too
    ApplySpikeDefaults(gen, gen_flags.requests);
    return cli::Gen(gen_flags);
  }
  if (*import) return cli::Import(import_flags);
  if (*shrink) return cli::Shrink(shrink_flags);
  if (*explain) return cli::Explain(explain_flags);
  return cli::Sweep(sweep_options, sweep_flags);
}
