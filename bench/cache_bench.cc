// Goal: what a speculative forward plus commit costs against a plain write (micro_write.cc),
// and how fast the lock-step driver runs and checks whole seeded runs.
// Method: Google Benchmark; a D = 3 speculation (4-token forward, 2 tokens committed) over
// a cache at a steady offset on tiny dimensions; whole seeded lock-step runs per preset
// (steps per second). The other micro-benchmarks of the `cache_bench` binary live in
// micro_*.cc: writes, snapshots, recurrent kernels, the trie and manager, the checks.
#include <benchmark/benchmark.h>

#include "sim/run.h"
#include "src/kv_cache.h"
#include "src/rotating_cache.h"
#include "src/speculation.h"

namespace {

using kvtwin::DType;
using kvtwin::Tensor;

// Each iteration: Begin over one layer, a 4-token forward through the wrapper, Commit(2);
// the cache is freed now and then so the offset stays in one regime.
template <typename Cache>
void SpeculateBench(benchmark::State& state, Cache cache) {
  const Tensor k(DType::kBFloat16, 4, 8), v(DType::kBFloat16, 4, 8);
  const Tensor k1(DType::kBFloat16, 1, 8), v1(DType::kBFloat16, 1, 8);
  (void)cache.Update(k1, v1);
  kvtwin::LayerCache* layers[] = {&cache};
  for (auto _ : state) {
    auto spec = kvtwin::BeginSpeculation(layers);
    auto& wrapper = static_cast<kvtwin::AttentionCache&>(spec->layer(0));
    benchmark::DoNotOptimize(wrapper.Update(k, v).length);
    spec->Commit(2);
    if (cache.Offset() > 4096) {
      cache.Free();
      (void)cache.Update(k1, v1);
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_KvSpeculate(benchmark::State& state) { SpeculateBench(state, kvtwin::KvCache()); }
void BM_RotatingSpeculate(benchmark::State& state) {
  SpeculateBench(state, kvtwin::RotatingCache(64));
}
BENCHMARK(BM_KvSpeculate);
BENCHMARK(BM_RotatingSpeculate);

void BM_LockstepRun(benchmark::State& state, const char* preset) {
  kvtwin::sim::RunOptions options;
  options.preset = preset;
  options.steps = 1000;
  uint64_t seed = 1;
  for (auto _ : state) benchmark::DoNotOptimize(kvtwin::sim::RunSeed(options, seed++).digest);
  state.SetItemsProcessed(state.iterations() * options.steps);
}
BENCHMARK_CAPTURE(BM_LockstepRun, dense, "dense");
BENCHMARK_CAPTURE(BM_LockstepRun, sliding, "sliding");
BENCHMARK_CAPTURE(BM_LockstepRun, recurrent, "recurrent");
BENCHMARK_CAPTURE(BM_LockstepRun, mixed, "mixed");

}  // namespace
