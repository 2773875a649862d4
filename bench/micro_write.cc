// Goal: what one forward's cache write costs per cache kind, for a decode step (L = 1) and
// for batched prefill writes (L = 16, 512), so a regression in the write path of any kind
// shows up as tokens/s.
// Method: Google Benchmark over realistic but small layer shapes: K/V rows of 4 heads x 64
// (256 columns, bfloat16), a 256-token window, and a gated-delta layer with Hk = 2, Hv = 4,
// Dk = Dv = 64 (delta state 256 x 64 float32). Inputs are built once outside the timed loop
// from the synthetic forward, so only the cache's Update / RunRecurrentForward is timed
// (including the recurrent kernels, which are part of a recurrent layer's write). The
// caches are freed at offset 8192, so a write's cost is its average over offsets 0..8192,
// KV buffer growth (a reallocation every 256 slots) included; BM_KvWriteNoGrowth isolates
// the write path itself.
#include <benchmark/benchmark.h>

#include "bench/bench_dims.h"
#include "sim/synthetic.h"
#include "src/kv_cache.h"
#include "src/recurrent_cache.h"
#include "src/recurrent_forward.h"
#include "src/rotating_cache.h"

namespace {

using kvtwin::DType;
using kvtwin::Tensor;

constexpr int64_t kKvCols = 256;
constexpr int64_t kWindow = 256;
constexpr int64_t kMaxOffset = 8192;

template <typename Cache>
void AttentionWrite(benchmark::State& state, Cache cache) {
  const auto length = state.range(0);
  const kvtwin::sim::SyntheticForward synth(1);
  Tensor k(DType::kBFloat16, length, kKvCols), v(DType::kBFloat16, length, kKvCols);
  for (int64_t r = 0; r < length; ++r) {
    synth.FillKvRow(k, r, 0, r, static_cast<uint64_t>(r), false);
    synth.FillKvRow(v, r, 0, r, static_cast<uint64_t>(r), true);
  }
  int64_t tokens = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(cache.Update(k, v).length);
    tokens += length;
    if (cache.Offset() > kMaxOffset) cache.Free();
  }
  state.SetItemsProcessed(tokens);
}

void BM_KvWrite(benchmark::State& state) { AttentionWrite(state, kvtwin::KvCache()); }
void BM_RotatingWrite(benchmark::State& state) {
  AttentionWrite(state, kvtwin::RotatingCache(kWindow));
}
BENCHMARK(BM_KvWrite)->Arg(1)->Arg(16)->Arg(512);
BENCHMARK(BM_RotatingWrite)->Arg(1)->Arg(16)->Arg(512);

// A decode write at a steady offset of 4096, rewound after each write (a cursor move), so
// the buffer never grows: BM_KvWrite/1 minus this is what the 256-slot growth costs.
void BM_KvWriteNoGrowth(benchmark::State& state) {
  kvtwin::KvCache cache;
  const Tensor prefill(DType::kBFloat16, 4096, kKvCols);
  (void)cache.Update(prefill, prefill);
  const Tensor k(DType::kBFloat16, 1, kKvCols), v(DType::kBFloat16, 1, kKvCols);
  for (auto _ : state) {
    benchmark::DoNotOptimize(cache.Update(k, v).length);
    if (!cache.Restore(nullptr, 4096)) state.SkipWithError("rewind refused");
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_KvWriteNoGrowth);

// A recurrent layer's write is its forward: conv, gated-delta scan, Put.
void BM_RecurrentWrite(benchmark::State& state) {
  const auto length = state.range(0);
  const kvtwin::RecurrentDims dims = kvtwin::bench::BenchRecurrentDims();
  const kvtwin::sim::SyntheticForward synth(1);
  const kvtwin::ConvWeights conv = synth.ConvParams(0, dims);
  const kvtwin::GdnParams gdn = synth.GdnParamsFor(0, dims);
  kvtwin::MatF x(length, dims.conv_dim());
  kvtwin::RecurrentForwardInputs in;
  in.scan.qkv.resize(length, dims.conv_dim());
  in.scan.ba.resize(length, 2 * dims.num_v_heads);
  for (int64_t r = 0; r < length; ++r) {
    const auto h = static_cast<uint64_t>(r);
    synth.FillConvInput(x, r, DType::kBFloat16, 0, r, h, dims.conv_dim());
    synth.FillGdnInput(in.scan.qkv, in.scan.ba, r, DType::kBFloat16, 0, r, h, dims);
  }
  in.conv_inputs = Tensor::FromFloat(DType::kBFloat16, x);
  in.real_len = length;
  kvtwin::RecurrentCache cache(dims);
  for (auto _ : state) {
    kvtwin::RunRecurrentForward(cache, in, conv, gdn);
    benchmark::DoNotOptimize(cache.Offset());
    if (cache.Offset() > kMaxOffset) cache.Free();
  }
  state.SetItemsProcessed(state.iterations() * length);
}
BENCHMARK(BM_RecurrentWrite)->Arg(1)->Arg(16)->Arg(512);

}  // namespace
