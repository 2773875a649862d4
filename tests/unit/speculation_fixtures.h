// Shared fixtures of the speculation tests (speculation_attention_test.cc and
// speculation_recurrent_test.cc). Every input a layer receives is a function of the
// absolute position it is written at, so a twin cache fed "the same tokens" through
// ordinary writes gets bit-identical rows: attention rows are position-tagged (tagged_rows.h),
// recurrent conv and scan rows are deterministic waves of the position. Also holds the
// stated tolerance for computed recurrent state and the spec §2.7 wrapper-contract check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "src/kernels.h"
#include "src/recurrent_cache.h"
#include "src/recurrent_forward.h"
#include "src/speculation.h"
#include "unit/tagged_rows.h"

namespace kvtwin::specfx {

// The draft counts D of the acceptance criteria; a forward writes T = D + 1 tokens.
inline const std::vector<int64_t> kDrafts = {1, 3, 10};

// Begin that must succeed (KV_CHECK-aborts with the Status otherwise).
inline Speculation Begin(std::vector<LayerCache*> layers) {
  return BeginSpeculation(layers).value();
}
inline Speculation BeginIsolated(std::vector<LayerCache*> layers) {
  return BeginIsolatedSpeculation(layers).value();
}

inline AttentionCache& Attn(Speculation& spec, size_t i) {
  return dynamic_cast<AttentionCache&>(spec.layer(i));
}
inline RecurrentLayer& Rec(Speculation& spec, size_t i) {
  return dynamic_cast<RecurrentLayer&>(spec.layer(i));
}

// One write of positions [first, first + count), tagged p + 1 / -(p + 1).
inline History WriteTagged(AttentionCache& cache, int64_t first, int64_t count) {
  const std::vector<float> tags = tagged::Positions(first, count);
  return cache.Update(tagged::Keys(tags), tagged::Values(tags));
}

// The positions a history's rows [0, length) hold, read from their tags.
inline std::vector<int64_t> HistoryPositions(const History& h) {
  std::vector<int64_t> positions;
  for (const float tag : tagged::Tags(*h.k, *h.v, 0, h.length)) {
    positions.push_back(static_cast<int64_t>(tag) - 1);
  }
  return positions;
}

// ---- recurrent inputs ----------------------------------------------------------------

inline RecurrentDims Dims() { return RecurrentDims{}; }  // tail 3, Hk 1, Hv 2, Dk 4, Dv 4

struct Kernels {
  ConvWeights conv;
  GdnParams gdn;
};

// Deterministic, varied values in [-1, 1].
inline float Wave(int64_t i, int64_t j, float rate, float phase) {
  return std::sin(rate * static_cast<float>(i) + 1.3f * static_cast<float>(j) + phase);
}

inline Kernels MakeKernels() {
  const RecurrentDims d = Dims();
  Kernels k;
  k.conv.w = MatF(d.conv_dim(), d.conv_tail + 1);
  for (int64_t c = 0; c < k.conv.w.rows(); ++c) {
    for (int64_t j = 0; j < k.conv.w.cols(); ++j) k.conv.w(c, j) = 0.5f * Wave(c, j, 0.7f, 0.1f);
  }
  k.conv.bias = VecF::Constant(d.conv_dim(), 0.05f);
  k.conv.silu = true;
  k.gdn.dims = d;
  k.gdn.dt_bias = VecF::Constant(d.num_v_heads, 0.2f);
  k.gdn.a_exp = VecF::Constant(d.num_v_heads, 0.8f);
  return k;
}

// Forward inputs for positions [first, first + count) with bf16 activations, plus `pad`
// padding rows after them (real_len = count). Row values depend on the position only.
inline RecurrentForwardInputs TokenInputs(int64_t first, int64_t count, int64_t pad = 0) {
  const RecurrentDims d = Dims();
  const int64_t rows = count + pad;
  MatF conv = MatF::Constant(rows, d.conv_dim(), 7.0f);
  RecurrentForwardInputs in;
  in.scan.qkv = MatF::Constant(rows, d.conv_dim(), 7.0f);
  in.scan.ba = MatF::Constant(rows, 2 * d.num_v_heads, 7.0f);
  for (int64_t r = 0; r < count; ++r) {
    const int64_t p = first + r;
    for (int64_t c = 0; c < d.conv_dim(); ++c) conv(r, c) = Wave(p, c, 0.37f, 0.3f);
    for (int64_t c = 0; c < d.conv_dim(); ++c) in.scan.qkv(r, c) = Wave(p, c, 0.53f, 1.0f);
    for (int64_t c = 0; c < 2 * d.num_v_heads; ++c)
      in.scan.ba(r, c) = 2.0f * Wave(p, c, 0.29f, 2.0f);
  }
  in.conv_inputs = Tensor::FromFloat(DType::kBFloat16, conv);
  in.real_len = count;
  return in;
}

// One forward of `count` tokens continuing from the layer's own offset.
inline void Forward(RecurrentLayer& layer, const Kernels& k, int64_t count, int64_t pad = 0) {
  RunRecurrentForward(layer, TokenInputs(layer.Offset(), count, pad), k.conv, k.gdn);
}

// A live recurrent cache that folded positions [0, prefix) in two ordinary forwards (none
// for prefix 0: no state at all).
inline void Prefill(RecurrentCache& cache, const Kernels& k, int64_t prefix) {
  const int64_t first = prefix / 2;
  if (first > 0) Forward(cache, k, first);
  if (prefix - first > 0) Forward(cache, k, prefix - first);
}

// Recurrent state is computed, so it is compared with a stated tolerance (STYLE §5.5): the
// spec lets a commit rebuild the accepted prefix by replaying the recorded scan instead of
// keeping the forward's own state, and a replay may reorder float sums. Today both apply the
// same float step to the same rows in the same order, so they agree bit for bit; 1e-5
// relative to the state's largest element is ~80 float ulps there, while one token more or
// less moves the state by > 1e-3 (RecurrentSpeculation.OneTokenMoreOrLessIsVisible).
inline constexpr double kDeltaRelTol = 1e-5;

inline double MaxAbsDiff(const MatF& a, const MatF& b) {
  return static_cast<double>((a - b).cwiseAbs().maxCoeff());
}

inline ::testing::AssertionResult DeltaNear(const MatF& got, const MatF& want) {
  if (got.rows() != want.rows() || got.cols() != want.cols()) {
    return ::testing::AssertionFailure() << "delta shape " << got.rows() << "x" << got.cols()
                                         << " vs " << want.rows() << "x" << want.cols();
  }
  const double scale = std::max(1.0, static_cast<double>(want.cwiseAbs().maxCoeff()));
  const double diff = MaxAbsDiff(got, want);
  if (diff <= kDeltaRelTol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max |delta diff| " << diff << " > " << kDeltaRelTol << " * " << scale;
}

// Live recurrent state equals the twin's: offset, presence, conv bit-exact, delta near.
inline void ExpectSameRecurrent(const RecurrentCache& live, const RecurrentCache& twin) {
  EXPECT_EQ(live.Offset(), twin.Offset());
  ASSERT_EQ(live.HasState(), twin.HasState());
  if (!twin.HasState()) return;
  EXPECT_TRUE(live.conv().Equals(twin.conv())) << "conv tail differs";
  EXPECT_TRUE(DeltaNear(live.delta(), twin.delta()));
}

// ---- spec §2.7: the wrapper's answers to the rest of the cache contract ---------------

// `make_snapshot` gives a real snapshot of the wrapped live cache (so "Split returns its
// input" is checked on a real object, not on null). `offset` is where the wrapper must be.
inline void ExpectWrapperContract(LayerCache& w, CacheKind kind,
                                  const std::function<SnapshotPtr()>& make_snapshot,
                                  int64_t offset) {
  EXPECT_EQ(w.kind(), kind);
  EXPECT_EQ(w.Offset(), offset);
  EXPECT_EQ(w.Snapshot(0), nullptr);
  EXPECT_FALSE(w.Restore(nullptr, offset));
  EXPECT_FALSE(w.Restore(nullptr, offset - 1));
  SnapshotPtr real = make_snapshot();
  ASSERT_NE(real, nullptr);
  EXPECT_FALSE(w.Restore(real.get(), real->to()));
  EXPECT_EQ(w.Merge(make_snapshot(), make_snapshot()), nullptr);
  const CacheSnapshot* raw = real.get();
  auto [left, right] = w.Split(std::move(real), offset - 1);
  EXPECT_EQ(left, nullptr);
  EXPECT_EQ(right.get(), raw);  // the input comes back untouched as the second element
  EXPECT_EQ(w.PrepareSnapshots({offset + 1}).code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(w.ScheduleActive());
  EXPECT_TRUE(w.TakeSnapshots().empty());
  w.Free();
  EXPECT_EQ(w.Offset(), offset);  // Free is a no-op
}

}  // namespace kvtwin::specfx
