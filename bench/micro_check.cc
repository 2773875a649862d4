// Goal: what one reference recomputation costs (sim/checks.h LayerOracle), the price of
// checking after every operation: CheckLive re-derives every expected K/V row, window slot
// or recurrent state of a layer at offset `O` (the argument) from its token log, and
// CheckHistory re-derives the rows and the visible positions of one decode write.
// Method: Google Benchmark on the simulator's own tiny mixed stack (K/V 2 x 4 float32, a
// 16-token window, the default recurrent dims), since that is what the checks run on. A
// production layer and its reference are filled with the same tokens once; each iteration
// checks the unchanged state, so KV and rotating checks recompute all their rows while the
// recurrent check hits the oracle's memo of folded states. The "cold" recurrent variant
// builds a fresh oracle every iteration, so it folds all O tokens in double precision:
// what the first check of a long history (or a restore to an unseen prefix) pays.
// Items: checks/s; the tokens counter is O per check.
#include <benchmark/benchmark.h>

#include <memory>
#include <span>

#include "sim/checks.h"
#include "sim/forward.h"
#include "sim/stack.h"
#include "src/core/check.h"

namespace {

using kvtwin::model::RefCache;
using kvtwin::sim::LayerOracle;

constexpr int32_t kKv = 0, kRotating = 1, kRecurrent = 2;

const kvtwin::sim::StackConfig& CheckStack() {
  static const kvtwin::sim::StackConfig config =
      *kvtwin::sim::StackFromPreset("mixed", 3, 16, kvtwin::DType::kFloat32);
  return config;
}

RefCache RefFor(int32_t layer) {
  switch (layer) {
    case kKv:
      return RefCache::Kv();
    case kRotating:
      return RefCache::Rotating(CheckStack().layers[kRotating].window);
    default:
      return RefCache::Recurrent();
  }
}

// One layer of the stack and its reference, both at `offset` after the same writes (64
// token batches, then one decode write that CheckHistory looks at).
struct Filled {
  Filled(int32_t l, int64_t offset) : layer(l), synth(1), ref(RefFor(l)) {
    cache = std::move(kvtwin::sim::BuildCaches(CheckStack())[layer]);
    uint64_t h = synth.seed();
    kvtwin::model::TokenLog log;
    for (int64_t p = 0; p < offset; ++p) {
      const auto id = static_cast<int32_t>(p % 5 + 1);
      h = kvtwin::sim::NextHash(h, id);
      log.push_back({id, h});
    }
    for (int64_t p = 0; p < offset;) {
      const int64_t n = p + 1 == offset ? 1 : std::min<int64_t>(64, offset - 1 - p);
      const kvtwin::model::TokenLog part(log.begin() + p, log.begin() + p + n);
      history = kvtwin::sim::ForwardSynthetic(*cache, CheckStack(), synth, layer, p, part);
      ref.Write(part);
      p += n;
    }
    write.tokens = {log.back().id};
  }
  int32_t layer;
  kvtwin::sim::SyntheticForward synth;
  RefCache ref;
  std::unique_ptr<kvtwin::LayerCache> cache;
  kvtwin::History history;  // of the last (decode) write
  kvtwin::sim::Op write;
};

void BM_CheckLive(benchmark::State& state, int32_t layer) {
  const Filled f(layer, state.range(0));
  LayerOracle oracle(f.synth, CheckStack(), layer);
  for (auto _ : state) {
    const kvtwin::sim::Check m = oracle.CheckLive(*f.cache, f.ref);
    KV_CHECK(!m.has_value(), m->what);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["tokens"] = static_cast<double>(state.range(0));
}
BENCHMARK_CAPTURE(BM_CheckLive, kv, kKv)->Arg(64)->Arg(1024);
BENCHMARK_CAPTURE(BM_CheckLive, rotating, kRotating)->Arg(64)->Arg(1024);
BENCHMARK_CAPTURE(BM_CheckLive, recurrent, kRecurrent)->Arg(64)->Arg(1024);

void BM_CheckLiveRecurrentCold(benchmark::State& state) {
  const Filled f(kRecurrent, state.range(0));
  for (auto _ : state) {
    LayerOracle oracle(f.synth, CheckStack(), kRecurrent);
    const kvtwin::sim::Check m = oracle.CheckLive(*f.cache, f.ref);
    KV_CHECK(!m.has_value(), m->what);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["tokens"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_CheckLiveRecurrentCold)->Arg(64)->Arg(1024);

void BM_CheckHistory(benchmark::State& state, int32_t layer) {
  const Filled f(layer, state.range(0));
  LayerOracle oracle(f.synth, CheckStack(), layer);
  const int64_t start = state.range(0) - 1;
  for (auto _ : state) {
    const kvtwin::sim::Check m = oracle.CheckHistory(f.history, f.ref.log(), start, 1, f.write);
    KV_CHECK(!m.has_value(), m->what);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["tokens"] = static_cast<double>(state.range(0));
}
BENCHMARK_CAPTURE(BM_CheckHistory, kv, kKv)->Arg(64)->Arg(1024);
BENCHMARK_CAPTURE(BM_CheckHistory, rotating, kRotating)->Arg(64)->Arg(1024);

}  // namespace
