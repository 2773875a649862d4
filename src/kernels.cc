// The recurrent kernels of spec §2.4 in plain float32 loops. The sums are written out as
// scalar loops in a fixed order (no Eigen reductions) so that, with -ffp-contract=off, the
// result is the same bits under gcc and clang and the same bits whether a forward is run
// in one call or segment by segment.
#include "src/kernels.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "src/core/check.h"

namespace kvtwin {
namespace {

constexpr float kRmsEps = 1e-6f;

void CheckSplits(const std::vector<int64_t>& splits, int64_t real_len) {
  int64_t prev = 0;
  for (const int64_t s : splits) {
    KV_CHECK(s > prev && s < real_len, "split " + std::to_string(s) +
                                           " not strictly ascending inside (0, " +
                                           std::to_string(real_len) + ")");
    prev = s;
  }
}

void CheckConvArgs(const Tensor& tail, const Tensor& x, int64_t real_len,
                   const ConvWeights& weights) {
  KV_CHECK(x.dtype() == tail.dtype(),
           "conv input " + x.ShapeString() + " not in the tail's dtype " + tail.ShapeString());
  KV_CHECK(x.cols() == tail.cols(),
           "conv input " + x.ShapeString() + " vs tail " + tail.ShapeString());
  KV_CHECK(real_len >= 0 && real_len <= x.rows(), "conv real_len outside [0, L]");
  KV_CHECK(weights.w.rows() == tail.cols() && weights.w.cols() == tail.rows() + 1,
           "conv weights must be [conv_dim x (conv_tail + 1)]");
  KV_CHECK(weights.bias.size() == 0 || weights.bias.size() == tail.cols(),
           "conv bias must be empty or [conv_dim]");
}

float Silu(float v) { return v / (1.0f + std::exp(-v)); }

// One output row: bias, then the taps oldest first. `window` points at X[t] (row-major).
void ConvRow(const float* window, const ConvWeights& weights, float* out) {
  const int64_t channels = weights.w.rows();
  const int64_t taps = weights.w.cols();
  const bool has_bias = weights.bias.size() != 0;
  for (int64_t c = 0; c < channels; ++c) {
    float acc = has_bias ? weights.bias[c] : 0.0f;
    for (int64_t j = 0; j < taps; ++j) acc += weights.w(c, j) * window[j * channels + c];
    out[c] = weights.silu ? Silu(acc) : acc;
  }
}

// 1 / sqrt(mean(x^2) + eps): the weightless RMSNorm scale of one head.
float InvRms(const float* x, int64_t n) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += x[j] * x[j];
  return 1.0f / std::sqrt(sum / static_cast<float>(n) + kRmsEps);
}

// log(1 + e^x) without overflow for large x (e^x would be inf in float at x > 88).
float Softplus(float x) { return std::log1p(std::exp(-std::fabs(x))) + std::max(x, 0.0f); }

// Branch on the sign so e^(-x) never overflows into inf / inf.
float Sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

// The per-token, per-value-head scalars of the gated-delta rule.
struct HeadScalars {
  float decay;   // g in (0, 1]
  float beta;    // in [0, 1]
  float q_norm;  // q̂_j = (q_j * q_norm) * q_scale
  float k_norm;  // k̂_j = (k_j * k_norm) * k_scale
};

// Updates the Dv rows of one head's state in place and writes its Dv outputs. Each row i
// only reads its own row (m_i = S_i · k̂), so running decay, correction and read-out row by
// row is the spec's phase order per element; k̂ and q̂ are recomputed per use (the same
// float ops each time) so no scratch buffer is needed.
void UpdateHead(float* s, const float* q, const float* k, const float* v, const HeadScalars& hs,
                int64_t dk, int64_t dv, float* y) {
  const float q_scale = 1.0f / static_cast<float>(dk);
  const float k_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int64_t i = 0; i < dv; ++i) {
    float* row = s + i * dk;
    for (int64_t j = 0; j < dk; ++j) row[j] = hs.decay * row[j];
    float m = 0.0f;
    for (int64_t j = 0; j < dk; ++j) m += row[j] * ((k[j] * hs.k_norm) * k_scale);
    const float delta = hs.beta * (v[i] - m);
    for (int64_t j = 0; j < dk; ++j) row[j] += delta * ((k[j] * hs.k_norm) * k_scale);
    float out = 0.0f;
    for (int64_t j = 0; j < dk; ++j) out += row[j] * ((q[j] * hs.q_norm) * q_scale);
    y[i] = out;
  }
}

void CheckGdnArgs(const MatF& state, const GdnInputs& inputs, int64_t real_len,
                  const GdnParams& params) {
  const RecurrentDims& d = params.dims;
  KV_CHECK(d.num_k_heads > 0 && d.num_v_heads > 0 && d.head_k_dim > 0 && d.head_v_dim > 0,
           "gated-delta dims must be positive");
  KV_CHECK(d.num_v_heads % d.num_k_heads == 0, "Hv must be a multiple of Hk");
  KV_CHECK(state.rows() == d.delta_rows() && state.cols() == d.head_k_dim,
           "delta state must be [(Hv*Dv) x Dk]");
  KV_CHECK(inputs.qkv.cols() == d.conv_dim(), "qkv must be [L x (2*Hk*Dk + Hv*Dv)]");
  KV_CHECK(inputs.ba.cols() == 2 * d.num_v_heads, "ba must be [L x 2*Hv]");
  KV_CHECK(inputs.ba.rows() == inputs.qkv.rows(), "qkv and ba row counts differ");
  KV_CHECK(params.dt_bias.size() == d.num_v_heads && params.a_exp.size() == d.num_v_heads,
           "dt_bias and a_exp must be [Hv]");
  KV_CHECK(real_len >= 0 && real_len <= inputs.qkv.rows(), "real_len outside [0, L]");
}

}  // namespace

ConvResult CausalConv1D(const Tensor& tail, const Tensor& x, int64_t real_len,
                        const ConvWeights& weights, const std::vector<int64_t>& splits) {
  ConvScratch scratch;
  ConvResult result;
  CausalConv1DInto(tail, x, real_len, weights, splits, scratch, result);
  return result;
}

void CausalConv1DInto(const Tensor& tail, const Tensor& x, int64_t real_len,
                      const ConvWeights& weights, const std::vector<int64_t>& splits,
                      ConvScratch& scratch, ConvResult& out) {
  CheckConvArgs(tail, x, real_len, weights);
  CheckSplits(splits, real_len);
  const int64_t conv_tail = tail.rows();
  const int64_t len = x.rows();
  // X = [tail ; x] with padded rows zeroed, kept in the tail's dtype so that boundary tails
  // are exact copies of the raw inputs.
  Tensor& window = scratch.window;
  window.EnsureShape(tail.dtype(), conv_tail + len, tail.cols());
  window.CopyRows(0, tail, 0, conv_tail);
  window.CopyRows(conv_tail, x, 0, real_len);
  window.Visit([&](auto& m) { m.bottomRows(len - real_len).setZero(); });
  window.Visit([&](const auto& m) { scratch.window_f = m.template cast<float>(); });

  // Spec §2.4.1 defines every output row t < L, a padded one over its zeroed inputs (the
  // real rows before it still reach it through the taps): what the model's graph computes
  // and hands on, even though the gated-delta step then masks those tokens.
  out.out.resize(len, tail.cols());
  for (int64_t t = 0; t < len; ++t) {
    ConvRow(scratch.window_f.row(t).data(), weights, out.out.row(t).data());
  }
  out.states.resize(splits.size() + 1);
  for (size_t i = 0; i < out.states.size(); ++i) {
    const int64_t boundary = i < splits.size() ? splits[i] : real_len;
    out.states[i].EnsureShape(window.dtype(), conv_tail, window.cols());
    out.states[i].CopyRows(0, window, boundary, conv_tail);
  }
}

void GatedDeltaStep(MatF& state, const float* qkv_row, const float* ba_row, const GdnParams& params,
                    float* y) {
  const RecurrentDims& d = params.dims;
  const int64_t hk = d.num_k_heads;
  const int64_t hv = d.num_v_heads;
  const int64_t dk = d.head_k_dim;
  const int64_t dv = d.head_v_dim;
  KV_CHECK(hk > 0 && hv % hk == 0, "Hv must be a multiple of Hk");
  KV_CHECK(state.rows() == hv * dv && state.cols() == dk, "delta state must be [(Hv*Dv) x Dk]");
  const int64_t group = hv / hk;
  for (int64_t h = 0; h < hv; ++h) {
    const int64_t g = h / group;
    const float* q = qkv_row + g * dk;
    const float* k = qkv_row + hk * dk + g * dk;
    const float* v = qkv_row + 2 * hk * dk + h * dv;
    const float gate = Softplus(ba_row[hv + h] + params.dt_bias[h]) * params.a_exp[h];
    const HeadScalars hs{std::exp(-gate), Sigmoid(ba_row[h]), InvRms(q, dk), InvRms(k, dk)};
    UpdateHead(state.data() + h * dv * dk, q, k, v, hs, dk, dv, y + h * dv);
  }
}

Tensor ConvTailAfter(const Tensor& tail, const Tensor& x, int64_t n) {
  KV_CHECK(n >= 0 && n <= x.rows(),
           "conv tail after " + std::to_string(n) + " of " + std::to_string(x.rows()) + " rows");
  const int64_t keep = tail.rows();
  if (n >= keep) return x.Rows(n - keep, keep);
  Tensor out = tail.Rows(n, keep - n);
  if (n > 0) out.AppendRows(x.Rows(0, n));
  return out;
}

GdnResult GatedDelta(const MatF& state, const GdnInputs& inputs, int64_t real_len,
                     const GdnParams& params, const std::vector<int64_t>& splits) {
  GdnResult result;
  GatedDeltaInto(state, inputs, real_len, params, splits, result);
  return result;
}

void GatedDeltaInto(const MatF& state, const GdnInputs& inputs, int64_t real_len,
                    const GdnParams& params, const std::vector<int64_t>& splits, GdnResult& out) {
  CheckGdnArgs(state, inputs, real_len, params);
  CheckSplits(splits, real_len);
  out.y.setZero(inputs.qkv.rows(), params.dims.delta_rows());
  out.states.resize(splits.size() + 1);
  MatF& s = out.states.back();
  KV_CHECK(&s != &state, "GatedDeltaInto would scan in place over its input state");
  s = state;
  size_t next_split = 0;
  for (int64_t t = 0; t < real_len; ++t) {
    GatedDeltaStep(s, inputs.qkv.row(t).data(), inputs.ba.row(t).data(), params,
                   out.y.row(t).data());
    if (next_split < splits.size() && splits[next_split] == t + 1) {
      out.states[next_split] = s;
      ++next_split;
    }
  }
  // Rows at and beyond real_len are identity steps: y stays zero and the state is kept.
}

GdnResult GatedDeltaSegmented(const MatF& state, const GdnInputs& inputs, int64_t real_len,
                              const GdnParams& params, const std::vector<int64_t>& splits) {
  GdnSegmentScratch scratch;
  GdnResult result;
  GatedDeltaSegmentedInto(state, inputs, real_len, params, splits, scratch, result);
  return result;
}

void GatedDeltaSegmentedInto(const MatF& state, const GdnInputs& inputs, int64_t real_len,
                             const GdnParams& params, const std::vector<int64_t>& splits,
                             GdnSegmentScratch& scratch, GdnResult& out) {
  CheckGdnArgs(state, inputs, real_len, params);
  CheckSplits(splits, real_len);
  out.y.setZero(inputs.qkv.rows(), params.dims.delta_rows());
  out.states.resize(splits.size() + 1);
  scratch.state = state;
  int64_t begin = 0;
  for (size_t i = 0; i < out.states.size(); ++i) {
    const int64_t end = i < splits.size() ? splits[i] : real_len;
    scratch.segment.qkv = inputs.qkv.middleRows(begin, end - begin);
    scratch.segment.ba = inputs.ba.middleRows(begin, end - begin);
    GatedDeltaInto(scratch.state, scratch.segment, end - begin, params, {}, scratch.part);
    out.y.middleRows(begin, end - begin) = scratch.part.y;
    scratch.state = scratch.part.states.back();
    out.states[i] = scratch.state;
    begin = end;
  }
}

}  // namespace kvtwin
