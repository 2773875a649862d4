// Goal: how fast the production caches write and how fast the lock-step driver checks.
// Method: Google Benchmark; decode (L = 1) and batched writes per cache kind on tiny
// dimensions, and whole seeded lock-step runs per preset (steps per second).
#include <benchmark/benchmark.h>

#include "sim/run.h"
#include "src/kv_cache.h"
#include "src/rotating_cache.h"

namespace {

using kvtwin::DType;
using kvtwin::Tensor;

template <typename Cache>
void WriteBench(benchmark::State& state, Cache cache) {
  const auto length = state.range(0);
  const Tensor k(DType::kBFloat16, length, 8), v(DType::kBFloat16, length, 8);
  int64_t tokens = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(cache.Update(k, v).length);
    tokens += length;
    if (cache.Offset() > 8192) cache.Free();
  }
  state.SetItemsProcessed(tokens);
}

void BM_KvWrite(benchmark::State& state) { WriteBench(state, kvtwin::KvCache()); }
void BM_RotatingWrite(benchmark::State& state) { WriteBench(state, kvtwin::RotatingCache(64)); }
BENCHMARK(BM_KvWrite)->Arg(1)->Arg(16)->Arg(512);
BENCHMARK(BM_RotatingWrite)->Arg(1)->Arg(16)->Arg(512);

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
