// Goal: what the snapshot contract costs per cache kind (spec §1.2): Snapshot (an owned
// copy), Restore from a snapshot, and Split / Merge, the operations the trie runs on every
// node split, compaction and eviction merge.
// Method: Google Benchmark. One layer of each kind (K/V rows of 4 heads x 64 in bfloat16,
// a 256-token window, a gated-delta layer with Hk = 2, Hv = 4, Dk = Dv = 64) is filled
// through the synthetic forward to offset 4096; a full KV snapshot covers the last `edge`
// tokens (the argument), whole-state kinds capture their whole state. Restore of a KV
// snapshot first rewinds the cache to the snapshot's base (a cursor move), as page-in does.
// Split and Merge consume their inputs, so each iteration does both and times only one of
// them with a steady clock (manual time); whole-state kinds split into (null, snapshot)
// and merge to the child, so only their KV numbers measure copying.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "bench/bench_dims.h"
#include "sim/forward.h"
#include "sim/stack.h"
#include "src/core/check.h"

namespace {

using kvtwin::CacheKind;
using kvtwin::LayerCache;
using kvtwin::SnapshotPtr;

constexpr int64_t kOffset = 4096;

kvtwin::sim::StackConfig SnapshotStack() {
  kvtwin::sim::StackConfig config;
  config.preset = "bench";
  config.dtype = kvtwin::DType::kBFloat16;
  config.dims.kv_heads = 4;
  config.dims.head_dim = 64;
  config.dims.value_dim = 64;
  config.dims.recurrent = kvtwin::bench::BenchRecurrentDims();
  config.layers = {
      {CacheKind::kFullKv, 0}, {CacheKind::kRotating, 256}, {CacheKind::kRecurrent, 0}};
  return config;
}

// Layer `layer` of SnapshotStack() at kOffset: prefilled in 512-token chunks, then a few
// decode steps so a rotating layer is in its ring regime.
std::unique_ptr<LayerCache> FilledLayer(int32_t layer) {
  const kvtwin::sim::StackConfig config = SnapshotStack();
  std::unique_ptr<LayerCache> cache = std::move(kvtwin::sim::BuildCaches(config)[layer]);
  const kvtwin::sim::SyntheticForward synth(1);
  kvtwin::model::TokenLog log;
  uint64_t h = synth.seed();
  for (int64_t p = 0; p < kOffset; ++p) {
    const auto id = static_cast<int32_t>(p % 1000);
    h = kvtwin::sim::NextHash(h, id);
    log.push_back({id, h});
  }
  for (int64_t p = 0; p < kOffset;) {
    const int64_t n = p + 8 >= kOffset ? 1 : std::min<int64_t>(512, kOffset - 8 - p);
    (void)kvtwin::sim::ForwardSynthetic(*cache, config, synth, layer, p,
                                        std::span(log).subspan(static_cast<size_t>(p), n));
    p += n;
  }
  return cache;
}

int64_t EdgeFrom(const LayerCache& cache, int64_t edge) {
  return cache.kind() == CacheKind::kFullKv ? kOffset - edge : 0;
}

void BM_Snapshot(benchmark::State& state, int32_t layer) {
  std::unique_ptr<LayerCache> cache = FilledLayer(layer);
  const int64_t from = EdgeFrom(*cache, state.range(0));
  int64_t bytes = 0;
  for (auto _ : state) {
    SnapshotPtr snap = cache->Snapshot(from);
    bytes += snap->SizeBytes();
    benchmark::DoNotOptimize(snap.get());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(bytes);
}

void BM_Restore(benchmark::State& state, int32_t layer) {
  std::unique_ptr<LayerCache> cache = FilledLayer(layer);
  const int64_t from = EdgeFrom(*cache, state.range(0));
  const SnapshotPtr snap = cache->Snapshot(from);
  const bool kv = cache->kind() == CacheKind::kFullKv;
  for (auto _ : state) {
    // The KV base stays in the live buffer: rewinding to it is how page-in starts.
    if (kv) KV_CHECK(cache->Restore(nullptr, from), "rewind to the snapshot base");
    KV_CHECK(cache->Restore(snap.get(), kOffset), "restore of an own snapshot");
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * snap->SizeBytes());
}

// Times Split (split_timed) or Merge; the other half of the round trip is untimed.
void SplitMerge(benchmark::State& state, int32_t layer, bool split_timed) {
  using Clock = std::chrono::steady_clock;
  std::unique_ptr<LayerCache> cache = FilledLayer(layer);
  const int64_t edge = state.range(0);
  const int64_t from = EdgeFrom(*cache, edge);
  const int64_t at = from + edge / 2;
  SnapshotPtr snap = cache->Snapshot(from);
  for (auto _ : state) {
    const auto t0 = Clock::now();
    auto [head, tail] = cache->Split(std::move(snap), at);
    const auto t1 = Clock::now();
    snap = cache->Merge(std::move(head), std::move(tail));
    const auto t2 = Clock::now();
    state.SetIterationTime(std::chrono::duration<double>(split_timed ? t1 - t0 : t2 - t1).count());
  }
  KV_CHECK(snap != nullptr && snap->to() == kOffset, "split + merge lost the snapshot");
  state.SetItemsProcessed(state.iterations());
}
void BM_Split(benchmark::State& state, int32_t layer) { SplitMerge(state, layer, true); }
void BM_Merge(benchmark::State& state, int32_t layer) { SplitMerge(state, layer, false); }

// KV over edges of 256 and 4096 tokens; whole-state kinds do not depend on the edge.
#define KVTWIN_SNAPSHOT_BENCH(fn, ...)                           \
  BENCHMARK_CAPTURE(fn, kv, 0)->Arg(256)->Arg(4096) __VA_ARGS__; \
  BENCHMARK_CAPTURE(fn, rotating, 1)->Arg(256) __VA_ARGS__;      \
  BENCHMARK_CAPTURE(fn, recurrent, 2)->Arg(256) __VA_ARGS__
KVTWIN_SNAPSHOT_BENCH(BM_Snapshot);
KVTWIN_SNAPSHOT_BENCH(BM_Restore);
KVTWIN_SNAPSHOT_BENCH(BM_Split, ->UseManualTime());
KVTWIN_SNAPSHOT_BENCH(BM_Merge, ->UseManualTime());
#undef KVTWIN_SNAPSHOT_BENCH

}  // namespace
