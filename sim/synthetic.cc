#include "sim/synthetic.h"

#include <fmt/format.h>
// Inlined: NextHash runs per token and RowSeed per synthesized row (production's inputs and
// the oracle's expected rows), on a few bytes each, where a call into the shared library
// cost more than the hashing.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cmath>
#include <limits>

#include "src/core/check.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

// Stream tags keep the value families of one (layer, p, h) independent.
enum Stream : uint64_t {
  kKey = 1,
  kValue = 2,
  kConv = 3,
  kGdn = 4,
  kParams = 5,
  kQuery = 6,
  kGdnGate = 7,
};

uint64_t RowSeed(uint64_t run_seed, Stream stream, int32_t layer, int64_t p, uint64_t h) {
  const uint64_t words[4] = {static_cast<uint64_t>(stream), static_cast<uint64_t>(layer),
                             static_cast<uint64_t>(p), h};
  return XXH3_64bits_withSeed(words, sizeof(words), run_seed);
}

// Uniform in [lo, hi) from 24 random bits.
float Uniform(uint64_t& state, float lo, float hi) {
  const auto bits = static_cast<float>(SplitMix64(state) >> 40);
  return lo + (hi - lo) * bits * (1.0f / 16777216.0f);
}

float Byte(uint64_t value, int shift) { return static_cast<float>((value >> shift) & 0xFF); }

}  // namespace

std::string Provenance::ToString() const {
  if (!valid) return "untagged row";
  return fmt::format("pos {} h=0x{:06x} L{} {}", position, hash24, layer, is_value ? "V" : "K");
}

uint64_t NextHash(uint64_t h_prev, int32_t token) {
  return XXH3_64bits_withSeed(&token, sizeof(token), h_prev);
}

Tensor SyntheticForward::KvRow(DType dtype, int64_t cols, int32_t layer, int64_t p, uint64_t h,
                               bool is_value) const {
  Tensor row(dtype, 1, cols);
  FillKvRow(row, 0, layer, p, h, is_value);
  return row;
}

void SyntheticForward::FillKvRow(Tensor& out, int64_t row, int32_t layer, int64_t p, uint64_t h,
                                 bool is_value) const {
  KV_CHECK(out.cols() >= kTagElements || (is_value && out.cols() == 0),
           "K/V rows need room for the provenance tag (only an MLA layer's V has none)");
  KV_CHECK(p >= 0 && p <= kMaxBatchPosition, "position outside int32");
  KV_CHECK(row >= 0 && row < out.rows(), "row out of range");
  if (out.cols() == 0) return;
  const auto up = static_cast<uint64_t>(p);
  const float tag[kTagElements] = {
      Byte(up, 0),
      Byte(up, 8),
      Byte(up, 16),
      Byte(h, 0),
      Byte(h, 8),
      Byte(h, 16),
      static_cast<float>((static_cast<uint32_t>(layer) & 0x7F) | (is_value ? 0x80 : 0))};
  uint64_t state = RowSeed(seed_, is_value ? kValue : kKey, layer, p, h);
  // Typed stores (a filler touches every element of every expected row; see Tensor::Visit),
  // converting each float exactly as Tensor::Set does.
  out.Visit([&](auto& m) {
    using Scalar = typename std::decay_t<decltype(m)>::Scalar;
    for (int64_t c = 0; c < kTagElements; ++c) m(row, c) = static_cast<Scalar>(tag[c]);
    for (int64_t c = kTagElements; c < m.cols(); ++c)
      m(row, c) = static_cast<Scalar>(Uniform(state, -1.0f, 1.0f));
  });
}

void SyntheticForward::FillQueryRow(MatF& out, int64_t row, int32_t layer, int64_t p) const {
  uint64_t state = RowSeed(seed_, kQuery, layer, p, 0);
  // One query in 8 is 256 times larger, so its scores reach the hundreds, as a real model's
  // attention sinks do: a softmax that does not subtract the row's maximum (or starts it at
  // 0) overflows exp past 88 there, where scores of a few units never would (64 times was
  // not enough with the default widths: scores stayed under 88).
  const float gain = SplitMix64(state) % 8 == 0 ? 256.0f : 1.0f;
  for (int64_t c = 0; c < out.cols(); ++c) {
    const float bound = gain * (c < kTagElements ? 1.0f / 256.0f : 1.0f);
    out(row, c) = Uniform(state, -bound, bound);
  }
}

void SyntheticForward::FillConvInput(MatF& out, int64_t row, DType dtype, int32_t layer, int64_t p,
                                     uint64_t h, int64_t conv_dim) const {
  uint64_t state = RowSeed(seed_, kConv, layer, p, h);
  for (int64_t c = 0; c < conv_dim; ++c) {
    // A draw within 1/64 of zero (one cell in 64) is scaled by 2^-120 into float's and
    // bf16's subnormal range (below 2^-126), as a real activation near zero can be: a
    // conversion that flushes subnormals to zero (a device's DAZ) shows only on such
    // values. The draw sequence is the same, so every other cell keeps its value.
    const float u = Uniform(state, -1.0f, 1.0f);
    out(row, c) = RoundTo(dtype, std::fabs(u) < 1.0f / 64 ? std::ldexp(u, -120) : u);
  }
}

void SyntheticForward::FillGdnInput(MatF& qkv, MatF& ba, int64_t row, DType dtype, int32_t layer,
                                    int64_t p, uint64_t h, const RecurrentDims& dims) const {
  uint64_t state = RowSeed(seed_, kGdn, layer, p, h);
  for (int64_t c = 0; c < dims.conv_dim(); ++c) {
    qkv(row, c) = RoundTo(dtype, Uniform(state, -1.0f, 1.0f));
  }
  // Mostly in [-3, 3); one cell in 16 twelve times wider, so the gate's softplus and beta's
  // sigmoid also run saturated (|x| past 20, where kernels switch to a linear or constant
  // branch), as a real model's outliers do: a decay then rounds to 1 in float, or falls to
  // about 1e-43, a denormal. One in 64 lies in ±[90, 180), past where float's e^x overflows
  // (88.7) and e^-x underflows to 0 (104): a sigmoid or softplus that exponentiates on the
  // wrong side turns into inf / inf or log(0) there, and only there (with a small A, below,
  // such a gate still leaves a decay well inside (0, 1)).
  for (int64_t c = 0; c < 2 * dims.num_v_heads; ++c) {
    const float x = Uniform(state, -3.0f, 3.0f);
    const uint64_t wide = SplitMix64(state) % 64;
    const float v = wide % 16 == 0 ? 12.0f * x
                    : wide == 1    ? std::copysign(90.0f + 30.0f * std::fabs(x), x)
                                   : x;
    ba(row, c) = RoundTo(dtype, v);
  }
  // Gates at exactly ±inf on a real token, from a stream of their own (every other cell
  // keeps its value). Spec §2.4.2 marks padding with β_raw = α_raw = -inf, an identity
  // step, but a real token may carry either alone: β_raw = -inf on every head (one token in
  // 16) shuts the write gate while the state still decays; α_raw = -inf (one in 16) keeps
  // the state undecayed while it still writes; both (one in 32) is an identity step that
  // still advances the offset; α_raw = +inf on one head (one in 64) decays it to exactly 0.
  // A kernel or a commit that takes a shut gate for "nothing happened", or one of these
  // tokens for padding, differs only here.
  uint64_t gate = RowSeed(seed_, kGdnGate, layer, p, h);
  const uint64_t pick = SplitMix64(gate) % 64;
  const int64_t hv = dims.num_v_heads;
  const float inf = std::numeric_limits<float>::infinity();
  const bool shut = pick < 4 || (pick >= 8 && pick < 10);
  const bool still = (pick >= 4 && pick < 10);
  for (int64_t c = 0; c < hv; ++c) {
    if (shut) ba(row, c) = -inf;
    if (still) ba(row, hv + c) = -inf;
  }
  if (pick == 10)
    ba(row, hv + static_cast<int64_t>(SplitMix64(gate) % static_cast<uint64_t>(hv))) = inf;
}

ConvWeights SyntheticForward::ConvParams(int32_t layer, const RecurrentDims& dims) const {
  uint64_t state = RowSeed(seed_, kParams, layer, -1, 0);
  ConvWeights w;
  w.w = MatF(dims.conv_dim(), dims.conv_tail + 1);
  for (Eigen::Index i = 0; i < w.w.size(); ++i) w.w.data()[i] = Uniform(state, -0.5f, 0.5f);
  // Spec §2.4.1 makes both the bias and the SiLU optional (Qwen3.5 applies SiLU; a plain
  // short conv does not). Each layer draws its own form, a quarter of them without each, so
  // every run of a few recurrent layers reaches both sides of the kernel's two branches.
  const uint64_t form = SplitMix64(state);
  if (form % 4 != 0) {
    w.bias = VecF(dims.conv_dim());
    for (Eigen::Index i = 0; i < w.bias.size(); ++i) w.bias(i) = Uniform(state, -0.1f, 0.1f);
  }
  w.silu = (form / 4) % 4 != 0;
  return w;
}

GdnParams SyntheticForward::GdnParamsFor(int32_t layer, const RecurrentDims& dims) const {
  uint64_t state = RowSeed(seed_, kParams, layer, -2, 0);
  GdnParams g;
  g.dims = dims;
  g.dt_bias = VecF(dims.num_v_heads);
  g.a_exp = VecF(dims.num_v_heads);
  // A = exp(A_log) in [1/e, e), and one head in four off that range from a stream of its
  // own (the other heads keep their draws): A in [e^-6, e^-3) decays slowly even under a
  // saturated gate, so an extreme gate's rounding shows in the state instead of vanishing
  // under a decay of e^-100; A in [e, e^3) decays as fast as Mamba's initial range (1..16).
  uint64_t off_range = RowSeed(seed_, kParams, layer, -3, 0);
  for (int64_t i = 0; i < dims.num_v_heads; ++i) {
    g.dt_bias(i) = Uniform(state, -1.0f, 1.0f);
    g.a_exp(i) = std::exp(Uniform(state, -1.0f, 1.0f));
    const uint64_t pick = SplitMix64(off_range) % 8;
    if (pick == 0) g.a_exp(i) = std::exp(Uniform(off_range, -6.0f, -3.0f));
    if (pick == 1) g.a_exp(i) = std::exp(Uniform(off_range, 1.0f, 3.0f));
  }
  return g;
}

Provenance DecodeRow(TensorView t, int64_t row) {
  Provenance out;
  if (t.cols() < kTagElements || row < 0 || row >= t.rows()) return out;
  uint32_t bytes[kTagElements];
  for (int64_t c = 0; c < kTagElements; ++c) {
    const float v = t.At(row, c);
    if (!(v >= 0.0f && v <= 255.0f) || std::floor(v) != v) return out;
    bytes[c] = static_cast<uint32_t>(v);
  }
  out.valid = true;
  out.position = bytes[0] | (bytes[1] << 8) | (bytes[2] << 16);
  out.hash24 = bytes[3] | (bytes[4] << 8) | (bytes[5] << 16);
  out.layer = static_cast<int32_t>(bytes[6] & 0x7F);
  out.is_value = (bytes[6] & 0x80) != 0;
  return out;
}

void ShiftPositionTag(Tensor& t, int64_t row, int64_t delta) {
  const Provenance tag = DecodeRow(t, row);
  if (!tag.valid) return;
  const auto up = static_cast<uint64_t>(tag.position + delta) & 0xFFFFFF;
  t.Set(row, 0, Byte(up, 0));
  t.Set(row, 1, Byte(up, 8));
  t.Set(row, 2, Byte(up, 16));
}

}  // namespace kvtwin::sim
