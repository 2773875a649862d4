// Goal: what the recurrent kernels cost (spec §2.4): one gated-delta step, whole forwards
// in the step-by-step and the segmented form, the causal conv, and the replay a partly
// accepted speculation runs to rebuild the state of its accepted prefix (spec README,
// "Recurrent speculation").
// Method: Google Benchmark on a gated-delta layer with Hk = 2, Hv = 4, Dk = Dv = 64
// (delta state 256 x 64 float32) and a 3-token conv tail, inputs from the synthetic
// forward built outside the timed loop. The speculation benchmark forwards [current, d1,
// d2, d3] through the wrapper and times only Commit (manual time): accepting all 4 tokens
// installs the recorded end state, fewer replays that many scan steps from the initial
// state.
#include <benchmark/benchmark.h>

#include <chrono>
#include <span>
#include <vector>

#include "bench/bench_dims.h"
#include "sim/forward.h"
#include "sim/stack.h"
#include "src/kernels.h"
#include "src/speculation.h"

namespace {

using kvtwin::DType;
using kvtwin::MatF;

// Synthetic inputs of `length` tokens and the layer's kernel parameters.
struct Inputs {
  explicit Inputs(int64_t length) : synth(1) {
    const kvtwin::RecurrentDims dims = kvtwin::bench::BenchRecurrentDims();
    conv = synth.ConvParams(0, dims);
    gdn = synth.GdnParamsFor(0, dims);
    MatF x(length, dims.conv_dim());
    scan.qkv.resize(length, dims.conv_dim());
    scan.ba.resize(length, 2 * dims.num_v_heads);
    for (int64_t r = 0; r < length; ++r) {
      const auto h = static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ull;
      synth.FillConvInput(x, r, DType::kBFloat16, 0, r, h, dims.conv_dim());
      synth.FillGdnInput(scan.qkv, scan.ba, r, DType::kBFloat16, 0, r, h, dims);
    }
    conv_inputs = kvtwin::Tensor::FromFloat(DType::kBFloat16, x);
    state = MatF::Zero(dims.delta_rows(), dims.head_k_dim);
    tail = kvtwin::Tensor(DType::kBFloat16, dims.conv_tail, dims.conv_dim());
  }
  kvtwin::sim::SyntheticForward synth;
  kvtwin::ConvWeights conv;
  kvtwin::GdnParams gdn;
  kvtwin::GdnInputs scan;
  kvtwin::Tensor conv_inputs, tail;
  MatF state;
};

void BM_GatedDeltaStep(benchmark::State& state) {
  Inputs in(64);
  std::vector<float> y(static_cast<size_t>(kvtwin::bench::BenchRecurrentDims().delta_rows()));
  int64_t t = 0;
  for (auto _ : state) {
    kvtwin::GatedDeltaStep(in.state, in.scan.qkv.row(t).data(), in.scan.ba.row(t).data(), in.gdn,
                           y.data());
    benchmark::DoNotOptimize(y.data());
    t = (t + 1) % 64;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_GatedDeltaStep);

// A forward of L tokens; segmented runs it as segments of 64 between splits.
void BM_GatedDelta(benchmark::State& state, bool segmented) {
  const auto length = state.range(0);
  Inputs in(length);
  std::vector<int64_t> splits;
  for (int64_t s = 64; s < length; s += 64) splits.push_back(s);
  for (auto _ : state) {
    kvtwin::GdnResult r =
        segmented ? kvtwin::GatedDeltaSegmented(in.state, in.scan, length, in.gdn, splits)
                  : kvtwin::GatedDelta(in.state, in.scan, length, in.gdn, splits);
    benchmark::DoNotOptimize(r.y.data());
  }
  state.SetItemsProcessed(state.iterations() * length);
}
BENCHMARK_CAPTURE(BM_GatedDelta, steps, false)->Arg(16)->Arg(512);
BENCHMARK_CAPTURE(BM_GatedDelta, segmented, true)->Arg(512);

void BM_CausalConv1D(benchmark::State& state) {
  const auto length = state.range(0);
  Inputs in(length);
  for (auto _ : state) {
    kvtwin::ConvResult r = kvtwin::CausalConv1D(in.tail, in.conv_inputs, length, in.conv, {});
    benchmark::DoNotOptimize(r.out.data());
  }
  state.SetItemsProcessed(state.iterations() * length);
}
BENCHMARK(BM_CausalConv1D)->Arg(1)->Arg(512);

// Commit(accepted) of a 4-token speculative forward over a live recurrent layer.
void BM_RecurrentCommit(benchmark::State& state) {
  using Clock = std::chrono::steady_clock;
  const int64_t accepted = state.range(0);
  kvtwin::sim::StackConfig config;
  config.preset = "bench";
  config.dtype = DType::kBFloat16;
  config.dims.recurrent = kvtwin::bench::BenchRecurrentDims();
  config.layers = {{kvtwin::CacheKind::kRecurrent, 0}};
  const kvtwin::sim::SyntheticForward synth(1);
  kvtwin::model::TokenLog log;
  uint64_t h = synth.seed();
  for (int32_t p = 0; p < 4096 + 8; ++p) {
    h = kvtwin::sim::NextHash(h, p % 97);
    log.push_back({p % 97, h});
  }
  kvtwin::RecurrentCache cache(config.dims.recurrent);
  kvtwin::LayerCache* layers[] = {&cache};
  for (auto _ : state) {
    const int64_t start = cache.Offset();
    kvtwin::Result<kvtwin::Speculation> spec = kvtwin::BeginSpeculation(layers);
    (void)kvtwin::sim::ForwardSynthetic(spec->layer(0), config, synth, 0, start,
                                        std::span(log).subspan(static_cast<size_t>(start), 4));
    const auto t0 = Clock::now();
    spec->Commit(accepted);
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    if (cache.Offset() >= 4096) cache.Free();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_RecurrentCommit)->Arg(1)->Arg(3)->Arg(4)->UseManualTime();

}  // namespace
