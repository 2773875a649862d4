#include "sim/forward.h"

#include <optional>
#include <type_traits>

#include "src/recurrent_forward.h"

namespace kvtwin::sim {

LayerKernels DeriveLayerKernels(const SyntheticForward& synth, const StackConfig& config) {
  LayerKernels k;
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const auto layer = static_cast<int32_t>(i);
    const bool recurrent = config.layers[i].kind == CacheKind::kRecurrent;
    k.conv.push_back(recurrent ? synth.ConvParams(layer, config.dims.recurrent) : ConvWeights{});
    k.gdn.push_back(recurrent ? synth.GdnParamsFor(layer, config.dims.recurrent) : GdnParams{});
  }
  return k;
}
namespace {

// Junk in padded rows: a correct kernel ignores it, a wrong one folds it in visibly.
constexpr float kPadValue = 99.0f;

// `m` as rows x cols with rows [real, rows) set to kPadValue; Eigen keeps the storage when
// the element count is unchanged.
void FitPadded(MatF& m, int64_t rows, int64_t cols, int64_t real) {
  m.resize(rows, cols);
  m.bottomRows(rows - real).setConstant(kPadValue);
}

// The conv inputs in the activation dtype, in `out`'s storage when it has the shape (x is
// representable in the dtype, so the cast is exact).
void ConvertInto(Tensor& out, DType dtype, const MatF& x) {
  out.EnsureShape(dtype, x.rows(), x.cols());
  out.Visit([&](auto& m) {
    using Scalar = typename std::decay_t<decltype(m)>::Scalar;
    m = x.template cast<Scalar>();
  });
}

}  // namespace

ForwardInputs& ForwardScratch::For(int64_t rows) {
  const auto r = static_cast<size_t>(rows);
  if (r >= kInputsByRows) return larger;
  if (by_rows.size() <= r) by_rows.resize(r + 1);
  return by_rows[r];
}

History ForwardSynthetic(LayerCache& target, const StackConfig& config,
                         const SyntheticForward& synth, int32_t layer, int64_t start,
                         std::span<const model::Token> tokens, const ConvWeights* conv,
                         const GdnParams* gdn, int64_t pad, bool segmented,
                         ForwardScratch* scratch) {
  // Built only without a caller's scratch: an empty one still costs a dozen destructors.
  std::optional<ForwardScratch> local;
  ForwardScratch& buffers = scratch != nullptr ? *scratch : local.emplace();
  const auto real = static_cast<int64_t>(tokens.size());
  ForwardInputs& s = buffers.For(target.kind() == CacheKind::kRecurrent ? real + pad : real);
  if (target.kind() != CacheKind::kRecurrent) {
    s.k.EnsureShape(config.dtype, real, config.k_cols());  // FillKvRow rewrites every row
    s.v.EnsureShape(config.value_dtype(), real, config.v_cols());
    for (int64_t r = 0; r < real; ++r) {
      const uint64_t h = tokens[static_cast<size_t>(r)].h;
      synth.FillKvRow(s.k, r, layer, start + r, h, false);
      synth.FillKvRow(s.v, r, layer, start + r, h, true);
    }
    return static_cast<AttentionCache&>(target).Update(s.k, s.v);
  }
  const RecurrentDims& dims = config.dims.recurrent;
  const int64_t rows = real + pad;
  RecurrentForwardInputs& in = s.recurrent;
  FitPadded(s.conv, rows, dims.conv_dim(), real);
  FitPadded(in.scan.qkv, rows, dims.conv_dim(), real);
  FitPadded(in.scan.ba, rows, 2 * dims.num_v_heads, real);
  for (int64_t r = 0; r < real; ++r) {
    const uint64_t h = tokens[static_cast<size_t>(r)].h;
    synth.FillConvInput(s.conv, r, config.dtype, layer, start + r, h, dims.conv_dim());
    synth.FillGdnInput(in.scan.qkv, in.scan.ba, r, config.dtype, layer, start + r, h, dims);
  }
  ConvertInto(in.conv_inputs, config.dtype, s.conv);
  in.real_len = real;
  in.segmented = segmented;
  // Not `conv != nullptr ? *conv : synth.ConvParams(...)`: a conditional with a prvalue
  // branch copies the lvalue one, four allocations per layer per forward.
  ConvWeights derived_conv;
  GdnParams derived_gdn;
  if (conv == nullptr) conv = &(derived_conv = synth.ConvParams(layer, dims));
  if (gdn == nullptr) gdn = &(derived_gdn = synth.GdnParamsFor(layer, dims));
  RunRecurrentForward(static_cast<RecurrentLayer&>(target), in, *conv, *gdn, &buffers.kernels);
  return History{};
}

}  // namespace kvtwin::sim
