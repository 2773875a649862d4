// Goal: pin down the recurrent kernels of spec §2.4 (causal conv with a carried tail, gated
// delta rule) and their split protocol, as the MLX-free analogues of spec §6.7.
// Method: segmented runs are compared bit-exactly with unsplit runs and with runs over
// each prefix (they perform the same float operations in the same order, so any
// difference is a bug, not rounding); the arithmetic itself is compared against
// independent double-precision computations written in this file with stated tolerances;
// padding, bf16 tails, extreme gate inputs and the key-head grouping get targeted cases.
// Inputs come from fixed-seed Rng streams.
#include "src/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "src/core/rng.h"

namespace kvtwin {
namespace {

constexpr uint64_t kSeed = 20240611;

// Uniform values in [-scale, scale), exact in float32.
MatF RandomMat(Rng& rng, int64_t rows, int64_t cols, float scale = 1.0f) {
  MatF m(rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) m(r, c) = scale * (2.0f * rng.Unit() - 1.0f);
  }
  return m;
}

VecF RandomVec(Rng& rng, int64_t n, float lo, float hi) {
  VecF v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * rng.Unit();
  return v;
}

// Exact element equality (so -0 == +0, NaN != NaN) with the first mismatch in the message.
::testing::AssertionResult BitEqual(const MatF& a, const MatF& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) {
    return ::testing::AssertionFailure()
           << "shape " << a.rows() << "x" << a.cols() << " vs " << b.rows() << "x" << b.cols();
  }
  for (int64_t r = 0; r < a.rows(); ++r) {
    for (int64_t c = 0; c < a.cols(); ++c) {
      if (!(a(r, c) == b(r, c))) {
        return ::testing::AssertionFailure()
               << "(" << r << "," << c << "): " << a(r, c) << " vs " << b(r, c);
      }
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Near(const MatF& got, const MatD& want, double tol) {
  if (got.rows() != want.rows() || got.cols() != want.cols()) {
    return ::testing::AssertionFailure() << "shape mismatch";
  }
  for (int64_t r = 0; r < got.rows(); ++r) {
    for (int64_t c = 0; c < got.cols(); ++c) {
      const double diff = std::fabs(static_cast<double>(got(r, c)) - want(r, c));
      if (!(diff <= tol)) {
        return ::testing::AssertionFailure() << "(" << r << "," << c << "): " << got(r, c) << " vs "
                                             << want(r, c) << ", tol " << tol;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------
// Causal conv

struct ConvCase {
  Tensor tail;
  Tensor x;
  ConvWeights weights;
};

ConvCase MakeConvCase(DType dtype, int64_t conv_tail, int64_t channels, int64_t len, bool bias,
                      bool silu) {
  Rng rng = Rng::Derive(kSeed, "conv");
  ConvCase cc;
  cc.tail = Tensor::FromFloat(dtype, RandomMat(rng, conv_tail, channels));
  cc.x = Tensor::FromFloat(dtype, RandomMat(rng, len, channels));
  cc.weights.w = RandomMat(rng, channels, conv_tail + 1);
  if (bias) cc.weights.bias = RandomVec(rng, channels, -0.5f, 0.5f);
  cc.weights.silu = silu;
  return cc;
}

TEST(CausalConv1D, SplitsKeepTheOutputAndEachBoundaryTailEqualsAPrefixRunsTail) {
  const ConvCase cc = MakeConvCase(DType::kBFloat16, 3, 5, 4, true, true);
  const ConvResult whole = CausalConv1D(cc.tail, cc.x, 4, cc.weights, {});
  const std::vector<int64_t> splits = {1, 2, 3};
  const ConvResult split = CausalConv1D(cc.tail, cc.x, 4, cc.weights, splits);

  EXPECT_TRUE(BitEqual(split.out, whole.out));
  ASSERT_EQ(whole.states.size(), 1u);
  ASSERT_EQ(split.states.size(), splits.size() + 1);
  EXPECT_TRUE(split.states.back().Equals(whole.states.back()));
  for (size_t i = 0; i < splits.size(); ++i) {
    const int64_t s = splits[i];
    const ConvResult prefix = CausalConv1D(cc.tail, cc.x.Rows(0, s), s, cc.weights, {});
    EXPECT_TRUE(split.states[i].Equals(prefix.states.back()))
        << "boundary " << s << ": " << split.states[i].ShapeString();
    // Tails are copies, so the prefix run also reproduces the first outputs exactly.
    EXPECT_TRUE(BitEqual(prefix.out, whole.out.topRows(s)));
  }
}

TEST(CausalConv1D, BiasAndSiluEqualSiluOfAHandComputedConvOverPriorAndInput) {
  const int64_t conv_tail = 3;
  const int64_t channels = 4;
  const int64_t len = 3;
  const ConvCase cc = MakeConvCase(DType::kFloat32, conv_tail, channels, len, true, true);
  const ConvResult got = CausalConv1D(cc.tail, cc.x, len, cc.weights, {});

  const MatF prior = cc.tail.ToFloat();
  const MatF input = cc.x.ToFloat();
  MatD want(len, channels);
  for (int64_t t = 0; t < len; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      double acc = cc.weights.bias[c];
      for (int64_t j = 0; j <= conv_tail; ++j) {
        const int64_t row = t + j;  // index into [prior ; input]
        const float xv = row < conv_tail ? prior(row, c) : input(row - conv_tail, c);
        acc += static_cast<double>(cc.weights.w(c, j)) * static_cast<double>(xv);
      }
      want(t, c) = acc / (1.0 + std::exp(-acc));
    }
  }
  // Float32 accumulation of 4 products plus a bias, all of magnitude <= 1: a few ulps.
  EXPECT_TRUE(Near(got.out, want, 1e-5));
}

TEST(CausalConv1D, PaddedRowsChangeNeitherTheTailsNorTheRealOutputsAndConvolveZeros) {
  ConvCase cc = MakeConvCase(DType::kFloat32, 3, 5, 4, true, false);
  MatF padded = cc.x.ToFloat();
  padded.bottomRows(2).setConstant(99.0f);
  const Tensor x_padded = Tensor::FromFloat(DType::kFloat32, padded);
  const Tensor x_real = x_padded.Rows(0, 2);

  const ConvResult got = CausalConv1D(cc.tail, x_padded, 2, cc.weights, {1});
  const ConvResult want = CausalConv1D(cc.tail, x_real, 2, cc.weights, {1});

  ASSERT_EQ(got.states.size(), 2u);
  ASSERT_EQ(want.states.size(), 2u);
  for (size_t i = 0; i < got.states.size(); ++i) {
    EXPECT_TRUE(got.states[i].Equals(want.states[i])) << "state " << i;
  }
  EXPECT_TRUE(BitEqual(got.out.topRows(2), want.out));
  // Spec §2.4.1: a padded row's output is the formula over its inputs zeroed, which the
  // real rows before it still reach through the taps (not zero, not the 99s).
  MatF zeroed = padded;
  zeroed.bottomRows(2).setZero();
  const ConvResult over_zeros =
      CausalConv1D(cc.tail, Tensor::FromFloat(DType::kFloat32, zeroed), 4, cc.weights, {});
  EXPECT_TRUE(BitEqual(got.out.bottomRows(2), over_zeros.out.bottomRows(2)));
  EXPECT_FALSE(got.out.bottomRows(2).isZero()) << "the taps reach back to the real rows";
}

TEST(CausalConv1D, Bf16TailHoldsExactlyTheRoundedRawInputsNotTheOutputs) {
  const int64_t conv_tail = 3;
  const int64_t channels = 4;
  const int64_t len = 5;
  ConvCase cc = MakeConvCase(DType::kBFloat16, conv_tail, channels, len, true, true);
  Rng rng = Rng::Derive(kSeed, "bf16-raw");
  const MatF raw = RandomMat(rng, len, channels);
  cc.x = Tensor::FromFloat(DType::kBFloat16, raw);
  const ConvResult got = CausalConv1D(cc.tail, cc.x, len, cc.weights, {});

  const Tensor& tail = got.states.back();
  ASSERT_EQ(tail.dtype(), DType::kBFloat16);
  ASSERT_EQ(tail.rows(), conv_tail);
  ASSERT_EQ(tail.cols(), channels);
  bool rounding_happened = false;
  for (int64_t r = 0; r < conv_tail; ++r) {
    for (int64_t c = 0; c < channels; ++c) {
      const float source = raw(len - conv_tail + r, c);
      const float rounded = RoundTo(DType::kBFloat16, source);
      rounding_happened = rounding_happened || rounded != source;
      EXPECT_EQ(tail.At(r, c), rounded) << "(" << r << "," << c << ")";
      EXPECT_NE(tail.At(r, c), got.out(len - conv_tail + r, c)) << "tail holds an output";
    }
  }
  EXPECT_TRUE(rounding_happened) << "inputs were already bf16; the test proves nothing";
}

// Every argument is checked against the tail before the first row, each with its own
// message: a caller's dtype or shape slip must abort, never read past a row.
TEST(CausalConv1D, RejectsEveryArgumentThatDoesNotFitTheTail) {
  const ConvCase cc = MakeConvCase(DType::kFloat32, 3, 5, 4, true, false);
  const Tensor x_bf16 = Tensor::FromFloat(DType::kBFloat16, cc.x.ToFloat());
  EXPECT_DEATH(CausalConv1D(cc.tail, x_bf16, 4, cc.weights, {}), "not in the tail's dtype");
  const Tensor wide_x(DType::kFloat32, 4, 6);
  EXPECT_DEATH(CausalConv1D(cc.tail, wide_x, 4, cc.weights, {}), "vs tail");
  EXPECT_DEATH(CausalConv1D(cc.tail, cc.x, 5, cc.weights, {}), "real_len outside");
  EXPECT_DEATH(CausalConv1D(cc.tail, cc.x, -1, cc.weights, {}), "real_len outside");
  ConvWeights short_kernel = cc.weights;
  short_kernel.w = MatF::Zero(5, 3);
  EXPECT_DEATH(CausalConv1D(cc.tail, cc.x, 4, short_kernel, {}), "conv weights must be");
  ConvWeights few_channels = cc.weights;
  few_channels.w = MatF::Zero(4, 4);
  EXPECT_DEATH(CausalConv1D(cc.tail, cc.x, 4, few_channels, {}), "conv weights must be");
  ConvWeights short_bias = cc.weights;
  short_bias.bias = cc.weights.bias.head(4);
  EXPECT_DEATH(CausalConv1D(cc.tail, cc.x, 4, short_bias, {}), "conv bias must be");
}

TEST(CausalConv1D, RejectsSplitsThatAreNotStrictlyInsideTheRealPrefix) {
  const ConvCase cc = MakeConvCase(DType::kFloat32, 3, 5, 4, false, false);
  EXPECT_DEATH(CausalConv1D(cc.tail, cc.x, 3, cc.weights, {3}), "strictly ascending");
  EXPECT_DEATH(CausalConv1D(cc.tail, cc.x, 4, cc.weights, {2, 2}), "strictly ascending");
  EXPECT_DEATH(CausalConv1D(cc.tail, cc.x, 4, cc.weights, {0}), "strictly ascending");
}

// The Into form keeps its buffers across calls; whatever a previous call of another shape,
// dtype or split count left in them, the result must be the fresh value form's, bit for bit.
TEST(CausalConv1D, IntoWithReusedBuffersEqualsTheValueFormAcrossShapes) {
  struct Call {
    DType dtype;
    int64_t len, real;
    std::vector<int64_t> splits;
  };
  const std::vector<Call> calls = {{DType::kFloat32, 6, 6, {2, 4}},   {DType::kFloat32, 1, 1, {}},
                                   {DType::kFloat32, 1, 1, {}},       {DType::kFloat32, 5, 3, {1}},
                                   {DType::kBFloat16, 4, 4, {3}},     {DType::kBFloat16, 1, 1, {}},
                                   {DType::kFloat32, 6, 6, {1, 2, 5}}};
  ConvScratch scratch;
  ConvResult into;
  for (size_t i = 0; i < calls.size(); ++i) {
    const Call& c = calls[i];
    ConvCase cc = MakeConvCase(c.dtype, 3, 5, c.len, true, true);
    cc.x.Set(0, 0, static_cast<float>(i));  // no two calls see the same input
    const ConvResult fresh = CausalConv1D(cc.tail, cc.x, c.real, cc.weights, c.splits);
    CausalConv1DInto(cc.tail, cc.x, c.real, cc.weights, c.splits, scratch, into);
    SCOPED_TRACE("call " + std::to_string(i));
    ASSERT_EQ(into.out.rows(), fresh.out.rows());
    EXPECT_TRUE(fresh.out.cwiseEqual(into.out).all());
    ASSERT_EQ(into.states.size(), fresh.states.size());
    for (size_t k = 0; k < fresh.states.size(); ++k) {
      EXPECT_TRUE(into.states[k].Equals(fresh.states[k])) << "state " << k;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Gated delta rule

GdnParams MakeParams(RecurrentDims dims, Rng& rng) {
  GdnParams p;
  p.dims = dims;
  p.dt_bias = RandomVec(rng, dims.num_v_heads, -1.0f, 1.0f);
  p.a_exp = RandomVec(rng, dims.num_v_heads, 0.1f, 2.0f);
  return p;
}

GdnInputs MakeInputs(const RecurrentDims& dims, Rng& rng, int64_t len) {
  return GdnInputs{RandomMat(rng, len, dims.conv_dim()),
                   RandomMat(rng, len, 2 * dims.num_v_heads, 3.0f)};
}

RecurrentDims Dims(int64_t hk, int64_t hv, int64_t dk, int64_t dv) {
  RecurrentDims d;
  d.num_k_heads = hk;
  d.num_v_heads = hv;
  d.head_k_dim = dk;
  d.head_v_dim = dv;
  return d;
}

// Weightless RMSNorm of x[0..n) times `scale`, in double.
std::vector<double> RefNorm(const float* x, int64_t n, double scale) {
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += static_cast<double>(x[j]) * x[j];
  const double inv = 1.0 / std::sqrt(sum / static_cast<double>(n) + 1e-6);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) out[static_cast<size_t>(j)] = x[j] * inv * scale;
  return out;
}

// One token in double precision, in the spec's closed form
// F(S) = g·S + β (v − g·S k̂) k̂ᵀ, then y = F(S) q̂ (spec §2.4.2, "full recurrence").
void RefStep(MatD& s, const float* qkv, const float* ba, const GdnParams& p, double* y) {
  const RecurrentDims& d = p.dims;
  const int64_t dk = d.head_k_dim;
  const int64_t dv = d.head_v_dim;
  const double sqrt_dk = std::sqrt(static_cast<double>(dk));
  for (int64_t h = 0; h < d.num_v_heads; ++h) {
    const int64_t g = h / (d.num_v_heads / d.num_k_heads);
    const std::vector<double> q = RefNorm(qkv + g * dk, dk, 1.0 / static_cast<double>(dk));
    const std::vector<double> k = RefNorm(qkv + (d.num_k_heads + g) * dk, dk, 1.0 / sqrt_dk);
    const float* v = qkv + 2 * d.num_k_heads * dk + h * dv;
    const double x = static_cast<double>(ba[d.num_v_heads + h]) + p.dt_bias[h];
    const double softplus = std::log1p(std::exp(-std::fabs(x))) + std::max(x, 0.0);
    const double decay = std::exp(-softplus * static_cast<double>(p.a_exp[h]));
    const double beta = 1.0 / (1.0 + std::exp(-static_cast<double>(ba[h])));
    for (int64_t i = 0; i < dv; ++i) {
      auto row = s.row(h * dv + i);
      double sk = 0.0;
      for (int64_t j = 0; j < dk; ++j) sk += row[j] * k[static_cast<size_t>(j)];
      const double correction = beta * (v[i] - decay * sk);
      double out = 0.0;
      for (int64_t j = 0; j < dk; ++j) {
        row[j] = decay * row[j] + correction * k[static_cast<size_t>(j)];
        out += row[j] * q[static_cast<size_t>(j)];
      }
      y[h * dv + i] = out;
    }
  }
}

TEST(GatedDelta, SegmentedAndSplitRunsEqualTheUnsplitRunAndEachPrefixRun) {
  Rng rng = Rng::Derive(kSeed, "gdn-segments");
  const GdnParams params = MakeParams(Dims(2, 4, 4, 3), rng);
  const GdnInputs inputs = MakeInputs(params.dims, rng, 5);
  const MatF initial = RandomMat(rng, params.dims.delta_rows(), params.dims.head_k_dim, 0.5f);
  const GdnResult whole = GatedDelta(initial, inputs, 5, params, {});
  ASSERT_EQ(whole.states.size(), 1u);

  // Both forms run the same float operations per token in the same order, so agreement is
  // exact: a tolerance here would hide a reordering or a dropped/duplicated token.
  for (const std::vector<int64_t>& splits : {std::vector<int64_t>{1, 2, 3, 4}, {2}}) {
    for (const bool segmented : {false, true}) {
      SCOPED_TRACE(std::string(segmented ? "segmented" : "token by token") + ", " +
                   std::to_string(splits.size()) + " splits");
      const GdnResult got = segmented ? GatedDeltaSegmented(initial, inputs, 5, params, splits)
                                      : GatedDelta(initial, inputs, 5, params, splits);
      EXPECT_TRUE(BitEqual(got.y, whole.y));
      ASSERT_EQ(got.states.size(), splits.size() + 1);
      EXPECT_TRUE(BitEqual(got.states.back(), whole.states.back()));
      for (size_t i = 0; i < splits.size(); ++i) {
        const int64_t s = splits[i];
        const GdnInputs prefix{inputs.qkv.topRows(s), inputs.ba.topRows(s)};
        const GdnResult want = GatedDelta(initial, prefix, s, params, {});
        EXPECT_TRUE(BitEqual(got.states[i], want.states.back())) << "boundary " << s;
      }
    }
  }
}

TEST(GatedDelta, PaddedRowsAreIdentityStepsWithZeroOutput) {
  Rng rng = Rng::Derive(kSeed, "gdn-padding");
  const GdnParams params = MakeParams(Dims(1, 2, 4, 4), rng);
  GdnInputs padded = MakeInputs(params.dims, rng, 5);
  padded.qkv.bottomRows(2).setConstant(99.0f);
  padded.ba.bottomRows(2).setConstant(99.0f);
  const GdnInputs real{padded.qkv.topRows(3), padded.ba.topRows(3)};
  const MatF initial = RandomMat(rng, params.dims.delta_rows(), params.dims.head_k_dim);

  for (const bool segmented : {false, true}) {
    SCOPED_TRACE(segmented ? "segmented" : "token by token");
    const auto run = segmented ? GatedDeltaSegmented : GatedDelta;
    const GdnResult got = run(initial, padded, 3, params, {1});
    const GdnResult want = run(initial, real, 3, params, {1});
    ASSERT_EQ(got.states.size(), 2u);
    EXPECT_TRUE(BitEqual(got.states[0], want.states[0]));
    EXPECT_TRUE(BitEqual(got.states[1], want.states[1]));
    EXPECT_TRUE(BitEqual(got.y.topRows(3), want.y));
    EXPECT_TRUE(BitEqual(got.y.bottomRows(2), MatF::Zero(2, params.dims.delta_rows())));
  }
}

TEST(GatedDeltaStep, MatchesADoublePrecisionHandComputationForOneToken) {
  Rng rng = Rng::Derive(kSeed, "gdn-one-token");
  const GdnParams params = MakeParams(Dims(1, 2, 3, 2), rng);
  const GdnInputs inputs = MakeInputs(params.dims, rng, 1);
  MatF state = RandomMat(rng, params.dims.delta_rows(), params.dims.head_k_dim);
  MatD want_state = state.cast<double>();
  MatF y(1, params.dims.delta_rows());
  MatD want_y(1, params.dims.delta_rows());

  GatedDeltaStep(state, inputs.qkv.data(), inputs.ba.data(), params, y.data());
  RefStep(want_state, inputs.qkv.data(), inputs.ba.data(), params, want_y.data());
  // Values are O(1) and each output sums 3 products: float32 rounding stays near 1e-7.
  EXPECT_TRUE(Near(state, want_state, 1e-5));
  EXPECT_TRUE(Near(y, want_y, 1e-5));
}

TEST(GatedDelta, MatchesADoublePrecisionReferenceOverSeveralTokens) {
  Rng rng = Rng::Derive(kSeed, "gdn-several");
  const GdnParams params = MakeParams(Dims(2, 4, 8, 4), rng);
  const int64_t len = 7;
  const GdnInputs inputs = MakeInputs(params.dims, rng, len);
  const MatF initial = RandomMat(rng, params.dims.delta_rows(), params.dims.head_k_dim);
  const GdnResult got = GatedDelta(initial, inputs, len, params, {3});
  ASSERT_EQ(got.states.size(), 2u);

  MatD state = initial.cast<double>();
  MatD want_y(len, params.dims.delta_rows());
  for (int64_t t = 0; t < len; ++t) {
    RefStep(state, inputs.qkv.row(t).data(), inputs.ba.row(t).data(), params, want_y.row(t).data());
    if (t + 1 == 3) {
      EXPECT_TRUE(Near(got.states[0], state, 1e-4)) << "boundary 3";
    }
  }
  // The spec's reference tolerance for states (§2.4.2); errors compound over tokens.
  EXPECT_TRUE(Near(got.states.back(), state, 1e-4));
  EXPECT_TRUE(Near(got.y, want_y, 1e-4));
}

TEST(GatedDeltaStep, ExtremeDecayAndBetaInputsStayFiniteAndMatchTheReference) {
  Rng rng = Rng::Derive(kSeed, "gdn-extreme");
  const GdnParams params = MakeParams(Dims(1, 2, 4, 4), rng);
  const GdnInputs base = MakeInputs(params.dims, rng, 1);
  const MatF initial = RandomMat(rng, params.dims.delta_rows(), params.dims.head_k_dim);
  // ±100 is past float's exp range (e^88), where naive sigmoid/softplus give inf/inf.
  for (const float alpha : {-100.0f, -30.0f, 30.0f, 100.0f}) {
    for (const float beta : {-100.0f, -30.0f, 30.0f, 100.0f}) {
      SCOPED_TRACE("alpha_raw " + std::to_string(alpha) + ", beta_raw " + std::to_string(beta));
      MatF ba = base.ba;
      ba.leftCols(2).setConstant(beta);
      ba.rightCols(2).setConstant(alpha);
      MatF state = initial;
      MatF y(1, params.dims.delta_rows());
      GatedDeltaStep(state, base.qkv.data(), ba.data(), params, y.data());
      ASSERT_TRUE(state.allFinite());
      ASSERT_TRUE(y.allFinite());
      MatD want_state = initial.cast<double>();
      MatD want_y(1, params.dims.delta_rows());
      RefStep(want_state, base.qkv.data(), ba.data(), params, want_y.data());
      EXPECT_TRUE(Near(state, want_state, 1e-5));
      EXPECT_TRUE(Near(y, want_y, 1e-5));
    }
  }
}

// Long-memory heads (a small A, Mamba's and GDN's way of remembering a long context) decay
// by g = exp(-x) with x far below 1 on every token. With the write gate shut (β_raw = -inf,
// β = 0) a step is the decay alone, so after n tokens each head's state is its start times
// exp(-Σ x_t) exactly, whatever else the kernel does. Each float step may round the decay
// and the product by about an ulp each (2^-24 relative), so n steps stay within
// 3n·2^-24; a decay approximated where x is small (1 - x, a truncated series, a product
// accumulated in a narrower type) errs one way on every token and passes that bound only
// over a long stretch, which no short comparison sees. Heads span x from 1e-6 to 5e-2 on a
// log grid (α_raw jittered per token), through the token-by-token and the segmented scan.
TEST(GatedDelta, LongMemoryHeadsDecayByTheExactProductOverALongShutStretch) {
  Rng rng = Rng::Derive(kSeed, "gdn-long-memory");
  constexpr int64_t kHeads = 16, kTokens = 1000;
  GdnParams params;
  params.dims = Dims(1, kHeads, 2, 2);
  params.dt_bias = RandomVec(rng, kHeads, -1.0f, 1.0f);
  params.a_exp = VecF(kHeads);
  std::vector<double> centre(kHeads);  // each head's α_raw before its jitter
  for (int64_t h = 0; h < kHeads; ++h) {
    // x = softplus(α_raw + dt_bias) · A with softplus at about 1: A sets the head's regime.
    const double x = std::pow(10.0, -6.0 + 4.7 * static_cast<double>(h) / (kHeads - 1));
    params.a_exp[h] = static_cast<float>(x);
    centre[h] = std::log(std::expm1(1.0)) - params.dt_bias[h];
  }
  GdnInputs in = MakeInputs(params.dims, rng, kTokens);
  std::vector<double> exponent(kHeads, 0.0);  // Σ x_t per head, in double
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) {
      const float alpha = static_cast<float>(centre[h] + 0.2 * (rng.Unit() - 0.5));
      in.ba(t, h) = -std::numeric_limits<float>::infinity();
      in.ba(t, kHeads + h) = alpha;
      exponent[h] += std::log1p(std::exp(static_cast<double>(alpha) + params.dt_bias[h])) *
                     static_cast<double>(params.a_exp[h]);
    }
  }
  const MatF initial = RandomMat(rng, params.dims.delta_rows(), params.dims.head_k_dim);
  const double bound = 3.0 * kTokens * std::ldexp(1.0, -24);
  const std::vector<int64_t> splits = {97, 500, 501, 903};
  for (const bool segmented : {false, true}) {
    SCOPED_TRACE(segmented ? "segmented" : "token by token");
    const GdnResult got = segmented ? GatedDeltaSegmented(initial, in, kTokens, params, splits)
                                    : GatedDelta(initial, in, kTokens, params, splits);
    const MatF& state = got.states.back();
    for (int64_t h = 0; h < kHeads; ++h) {
      const double factor = std::exp(-exponent[h]);
      for (int64_t r = h * 2; r < h * 2 + 2; ++r) {
        for (int64_t c = 0; c < 2; ++c) {
          const double want = static_cast<double>(initial(r, c)) * factor;
          const double err = std::fabs(static_cast<double>(state(r, c)) - want);
          EXPECT_LE(err, bound * std::fabs(want))
              << "head " << h << " (A " << params.a_exp[h] << ", Σx " << exponent[h] << "), state ("
              << r << "," << c << "): " << state(r, c) << " vs " << want;
        }
      }
    }
  }
}

TEST(GatedDeltaStep, PaddingStyleInputsAreAnExactIdentity) {
  Rng rng = Rng::Derive(kSeed, "gdn-identity");
  const GdnParams params = MakeParams(Dims(1, 2, 4, 4), rng);
  const MatF initial = RandomMat(rng, params.dims.delta_rows(), params.dims.head_k_dim);
  // Spec §2.4.2: zero q, k, v and β_raw = α_raw = −∞ give β = 0, g = 1, y = 0.
  const MatF qkv = MatF::Zero(1, params.dims.conv_dim());
  const MatF ba =
      MatF::Constant(1, 2 * params.dims.num_v_heads, -std::numeric_limits<float>::infinity());
  MatF state = initial;
  MatF y = MatF::Constant(1, params.dims.delta_rows(), 7.0f);
  GatedDeltaStep(state, qkv.data(), ba.data(), params, y.data());
  EXPECT_TRUE(BitEqual(state, initial));
  EXPECT_TRUE(BitEqual(y, MatF::Zero(1, params.dims.delta_rows())));
}

TEST(GatedDeltaStep, EachValueHeadReadsTheKeyHeadOfItsGroup) {
  // Hv = 2*Hk: heads 0,1 must use key head 0 and heads 2,3 key head 1. Key head g is the
  // unit vector e_g, so from a zero state S_h = β v k̂ᵀ is non-zero only in column g; an
  // interleaved grouping (h % Hk) would put head 1's mass in column 1.
  Rng rng = Rng::Derive(kSeed, "gdn-grouping");
  const GdnParams params = MakeParams(Dims(2, 4, 4, 2), rng);
  const int64_t dk = params.dims.head_k_dim;
  MatF qkv = MatF::Zero(1, params.dims.conv_dim());
  for (int64_t g = 0; g < 2; ++g) {
    qkv(0, g * dk + g) = 1.0f;        // q_g = e_g
    qkv(0, (2 + g) * dk + g) = 1.0f;  // k_g = e_g
  }
  qkv.rightCols(params.dims.delta_rows()) = RandomMat(rng, 1, params.dims.delta_rows()) +
                                            MatF::Constant(1, params.dims.delta_rows(), 2.0f);
  const MatF ba = MatF::Zero(1, 2 * params.dims.num_v_heads);
  MatF state = MatF::Zero(params.dims.delta_rows(), dk);
  MatF y(1, params.dims.delta_rows());
  GatedDeltaStep(state, qkv.data(), ba.data(), params, y.data());

  for (int64_t h = 0; h < 4; ++h) {
    for (int64_t i = 0; i < params.dims.head_v_dim; ++i) {
      const int64_t row = h * params.dims.head_v_dim + i;
      for (int64_t j = 0; j < dk; ++j) {
        if (j == h / 2) {
          EXPECT_GT(state(row, j), 0.0f) << "head " << h << " row " << i;
        } else {
          EXPECT_EQ(state(row, j), 0.0f) << "head " << h << " row " << i << " col " << j;
        }
      }
      EXPECT_GT(y(0, row), 0.0f) << "q̂ of the wrong key head reads zero";
    }
  }
}

// As for the conv: one GdnResult reused across calls of different shapes and split counts,
// including the rotation RunRecurrentForward does (the last state's buffer handed back
// holding an older state), equals the value form bit for bit. A forward of padding alone
// (real length 0) passes the state through: its end state is the input state, not what
// the reused buffer held.
TEST(GatedDelta, IntoWithReusedBuffersEqualsTheValueFormAcrossShapes) {
  Rng rng = Rng::Derive(kSeed, "gdn-into");
  const GdnParams params = MakeParams(Dims(1, 2, 4, 3), rng);
  MatF state = MatF::Zero(params.dims.delta_rows(), params.dims.head_k_dim);
  GdnResult into;
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> calls = {
      {5, {2, 3}}, {1, {}}, {0, {}},           {1, {}}, {4, {1}},
      {0, {}},     {1, {}}, {6, {1, 2, 4, 5}}, {3, {}}};
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto& [len, splits] = calls[i];
    const GdnInputs inputs = MakeInputs(params.dims, rng, len + 1);  // one padded row
    const GdnResult fresh = GatedDelta(state, inputs, len, params, splits);
    GatedDeltaInto(state, inputs, len, params, splits, into);
    SCOPED_TRACE("call " + std::to_string(i));
    ASSERT_EQ(into.y.rows(), fresh.y.rows());
    EXPECT_TRUE(fresh.y.cwiseEqual(into.y).all());
    ASSERT_EQ(into.states.size(), fresh.states.size());
    for (size_t k = 0; k < fresh.states.size(); ++k) {
      ASSERT_EQ(into.states[k].rows(), fresh.states[k].rows()) << "state " << k;
      ASSERT_EQ(into.states[k].cols(), fresh.states[k].cols()) << "state " << k;
      EXPECT_TRUE(into.states[k].cwiseEqual(fresh.states[k]).all()) << "state " << k;
    }
    if (len == 0) {
      EXPECT_TRUE(into.states.back().cwiseEqual(state).all());
    }
    std::swap(state, into.states.back());  // what RecurrentCache::Put does
  }
}

TEST(GatedDelta, RejectsSplitsThatAreNotStrictlyInsideTheRealPrefix) {
  Rng rng = Rng::Derive(kSeed, "gdn-death");
  const GdnParams params = MakeParams(Dims(1, 2, 4, 4), rng);
  const GdnInputs inputs = MakeInputs(params.dims, rng, 4);
  const MatF state = MatF::Zero(params.dims.delta_rows(), params.dims.head_k_dim);
  EXPECT_DEATH(GatedDelta(state, inputs, 3, params, {3}), "strictly ascending");
  EXPECT_DEATH(GatedDelta(state, inputs, 4, params, {2, 1}), "strictly ascending");
  EXPECT_DEATH(GatedDeltaSegmented(state, inputs, 4, params, {0}), "strictly ascending");
}

// Every argument of the scan is checked against the dims before the first step, each with
// its own message: a caller's shape slip must abort, never read past a row.
TEST(GatedDelta, RejectsEveryArgumentThatDoesNotFitTheDims) {
  for (auto* scan : {&GatedDelta, &GatedDeltaSegmented}) {
    Rng rng = Rng::Derive(kSeed, "gdn-death-shapes");
    const GdnParams params = MakeParams(Dims(1, 2, 4, 4), rng);
    const GdnInputs inputs = MakeInputs(params.dims, rng, 3);
    const MatF state = MatF::Zero(params.dims.delta_rows(), params.dims.head_k_dim);
    EXPECT_DEATH(scan(MatF::Zero(state.rows() + 1, state.cols()), inputs, 3, params, {}),
                 "delta state must be");
    EXPECT_DEATH(scan(MatF::Zero(state.rows(), state.cols() + 1), inputs, 3, params, {}),
                 "delta state must be");
    GdnInputs wide_qkv = inputs;
    wide_qkv.qkv = MatF::Zero(3, inputs.qkv.cols() + 1);
    EXPECT_DEATH(scan(state, wide_qkv, 3, params, {}), "qkv must be");
    GdnInputs narrow_ba = inputs;
    narrow_ba.ba = MatF::Zero(3, inputs.ba.cols() - 1);
    EXPECT_DEATH(scan(state, narrow_ba, 3, params, {}), "ba must be");
    GdnInputs short_ba = inputs;
    short_ba.ba = inputs.ba.topRows(2);
    EXPECT_DEATH(scan(state, short_ba, 2, params, {}), "row counts differ");
    GdnParams short_bias = params;
    short_bias.dt_bias = params.dt_bias.head(1);
    EXPECT_DEATH(scan(state, inputs, 3, short_bias, {}), "dt_bias and a_exp");
    GdnParams short_a = params;
    short_a.a_exp = params.a_exp.head(1);
    EXPECT_DEATH(scan(state, inputs, 3, short_a, {}), "dt_bias and a_exp");
    EXPECT_DEATH(scan(state, inputs, 4, params, {}), "real_len outside");
    EXPECT_DEATH(scan(state, inputs, -1, params, {}), "real_len outside");
    GdnParams no_dk = params;
    no_dk.dims.head_k_dim = 0;
    EXPECT_DEATH(scan(MatF::Zero(state.rows(), 0), inputs, 3, no_dk, {}), "must be positive");
    const GdnParams odd = MakeParams(Dims(2, 3, 4, 4), rng);  // Hv not a multiple of Hk
    EXPECT_DEATH(scan(MatF::Zero(odd.dims.delta_rows(), odd.dims.head_k_dim),
                      MakeInputs(odd.dims, rng, 2), 2, odd, {}),
                 "multiple of Hk");
  }
}

}  // namespace
}  // namespace kvtwin
