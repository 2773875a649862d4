// Goal: what the prefix-sharing manager's own operations cost (spec §3): the trie's best
// match, a switch between two conversations with page-in, and one eviction pass.
// Method: Google Benchmark.
// * Best match: a trie of N chat conversations (bench/scaling_workload.h: a shared
//   12-token system prompt, then distinct user turns) built once per N by ProductionRunner
//   on the simulator's tiny mixed stack; each iteration matches the stored keys of one of
//   them. Items: matches/s.
// * Switch: two conversations of `L` tokens (the argument) after a shared 64-token prefix
//   on a realistic small stack (K/V 4 x 64 bfloat16, a 256-token window, Hk 2 / Hv 4 / Dk
//   Dv 64); each iteration is Begin of the other conversation plus one new token (rewind
//   to the shared prefix, page-in of the other edge) and the Close that ends the session
//   without a forward, so the trie never changes. Items: switches/s.
// * Eviction: N conversations on the tiny stack; each iteration lowers the budget by one
//   byte and times EnforceEvictionPolicy (one victim: the LRU leaf), then serves a new
//   conversation untimed so N stays put. Items: victims/s.
// Begin and Close are called directly (ProductionRunner only runs whole requests), by
// Serve below: Begin, forward whatever the caches lack, Close.
#include <benchmark/benchmark.h>

#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "bench/bench_dims.h"
#include "bench/scaling_workload.h"
#include "sim/forward.h"
#include "sim/production_runner.h"
#include "sim/stack.h"
#include "src/core/check.h"
#include "src/prefix_cache.h"

namespace {

using kvtwin::PrefixCache;
using kvtwin::Rng;
using kvtwin::sim::StackConfig;

StackConfig TinyStack() {
  return *kvtwin::sim::StackFromPreset("mixed", 3, 4, kvtwin::DType::kFloat32);
}

StackConfig SmallStack() {
  StackConfig config = TinyStack();
  config.dtype = kvtwin::DType::kBFloat16;
  config.dims.kv_heads = 4;
  config.dims.head_dim = 64;
  config.dims.value_dim = 64;
  config.dims.recurrent = kvtwin::bench::BenchRecurrentDims();
  config.layers[1].window = 256;
  return config;
}

// A manager over a layer stack, driven one prompt at a time.
struct Stack {
  explicit Stack(StackConfig c) : config(std::move(c)), synth(1) {
    caches = kvtwin::sim::BuildCaches(config);
    std::vector<kvtwin::LayerCache*> raw;
    for (const auto& cache : caches) raw.push_back(cache.get());
    manager = std::make_unique<PrefixCache>(raw);
    manager->set_max_paged_out_bytes(std::numeric_limits<int64_t>::max());
  }
  ~Stack() { manager.reset(); }  // it points into `caches`

  // A request without decode: the stored path becomes exactly `prompt`.
  void Serve(std::span<const int32_t> prompt) {
    const kvtwin::Result<kvtwin::BeginReport> begun = manager->Begin(prompt);
    KV_CHECK(begun.ok(), begun.status().ToString());
    kvtwin::model::TokenLog log;
    uint64_t h = synth.seed();
    for (const int32_t t : prompt) {
      h = kvtwin::sim::NextHash(h, t);
      log.push_back({t, h});
    }
    const auto from = static_cast<size_t>(begun->cached);
    for (size_t i = 0; i < caches.size(); ++i) {
      (void)kvtwin::sim::ForwardSynthetic(*caches[i], config, synth, static_cast<int32_t>(i),
                                          begun->cached, std::span(log).subspan(from));
    }
    KV_CHECK(manager->Close().ok(), "Close");
  }

  StackConfig config;
  kvtwin::sim::SyntheticForward synth;
  std::vector<std::unique_ptr<kvtwin::LayerCache>> caches;
  std::unique_ptr<PrefixCache> manager;
};

// N conversations served by ProductionRunner, kept for every run of one argument.
struct Populated {
  std::unique_ptr<kvtwin::sim::ProductionRunner> runner;
  std::vector<std::vector<kvtwin::TrieKey>> stored;  // keys of each conversation
};

const Populated& PopulatedTrie(int64_t n) {
  static std::map<int64_t, Populated> cache;
  Populated& p = cache[n];
  if (p.runner != nullptr) return p;
  kvtwin::sim::RequestDriverOptions options;
  options.chunk = 2048;
  options.capture_interval = 8192;
  p.runner = std::make_unique<kvtwin::sim::ProductionRunner>(TinyStack(), options, 1);
  const kvtwin::bench::ChatWorkload chats(1, kvtwin::bench::ChatShape{});
  Rng rng = Rng::Derive(1, "best match");
  for (int32_t c = 0; c < n; ++c) {
    const kvtwin::sim::RequestPlan plan = chats.Open(c, rng);
    KV_CHECK(p.runner->Run(plan).ok(), "populate");
    std::vector<kvtwin::TrieKey> keys;
    for (const int32_t t : plan.inputs) keys.push_back(static_cast<uint32_t>(t));
    for (const int32_t t : plan.outputs) keys.push_back(static_cast<uint32_t>(t));
    p.stored.push_back(std::move(keys));
  }
  return p;
}

void BM_TrieBestMatch(benchmark::State& state) {
  const Populated& p = PopulatedTrie(state.range(0));
  const kvtwin::PrefixTrie& trie = p.runner->manager().trie();
  Rng rng = Rng::Derive(2, "targets");
  for (auto _ : state) {
    const auto& keys = p.stored[rng.Below(p.stored.size())];
    benchmark::DoNotOptimize(trie.FindBestMatch(trie.root(), keys).matched);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["nodes"] = static_cast<double>(trie.num_nodes());
}
BENCHMARK(BM_TrieBestMatch)->Arg(1000)->Arg(10000);

void BM_SwitchPageIn(benchmark::State& state) {
  const int64_t length = state.range(0);
  Stack stack(SmallStack());
  Rng rng = Rng::Derive(3, "switch");
  std::vector<int32_t> prompts[2];
  for (auto& prompt : prompts) {
    for (int64_t i = 0; i < 64; ++i) prompt.push_back(static_cast<int32_t>(i + 1));
    for (int64_t i = 0; i < length; ++i)
      prompt.push_back(static_cast<int32_t>(rng.Range(1000, 31999)));
    stack.Serve(prompt);
    prompt.push_back(7);  // one token past the stored path: no hold-back, full page-in
  }
  int which = 0;
  for (auto _ : state) {
    const kvtwin::Result<kvtwin::BeginReport> begun = stack.manager->Begin(prompts[which]);
    KV_CHECK(begun.ok() && begun->cached == 64 + length, "switch did not page the edge in");
    KV_CHECK(stack.manager->Close().ok(), "Close");
    which ^= 1;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["tokens_paged_in"] = benchmark::Counter(
      static_cast<double>(state.iterations() * length), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SwitchPageIn)->Arg(256)->Arg(2048);

void BM_EvictionPass(benchmark::State& state) {
  using Clock = std::chrono::steady_clock;
  Stack stack(TinyStack());
  const kvtwin::bench::ChatWorkload chats(1, kvtwin::bench::ChatShape{});
  Rng rng = Rng::Derive(4, "eviction");
  int32_t next = 0;
  auto serve_new = [&] { stack.Serve(chats.Open(next++, rng).inputs); };
  for (int64_t c = 0; c < state.range(0); ++c) serve_new();
  for (auto _ : state) {
    const int64_t nodes = stack.manager->trie().num_nodes();
    stack.manager->set_max_paged_out_bytes(stack.manager->trie().paged_out_bytes() - 1);
    const auto t0 = Clock::now();
    stack.manager->EnforceEvictionPolicy();
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    KV_CHECK(stack.manager->trie().num_nodes() < nodes, "the pass evicted nothing");
    stack.manager->set_max_paged_out_bytes(std::numeric_limits<int64_t>::max());
    serve_new();
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["nodes"] = static_cast<double>(stack.manager->trie().num_nodes());
}
BENCHMARK(BM_EvictionPass)->Arg(256)->Arg(4096)->UseManualTime();

}  // namespace
