#include "sim/forward.h"

#include "src/recurrent_forward.h"

namespace kvtwin::sim {

LayerKernels DeriveLayerKernels(const SyntheticForward& synth, const StackConfig& config) {
  LayerKernels k;
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const auto layer = static_cast<int32_t>(i);
    const bool recurrent = config.layers[i].kind == CacheKind::kRecurrent;
    k.conv.push_back(recurrent ? synth.ConvParams(layer, config.recurrent) : ConvWeights{});
    k.gdn.push_back(recurrent ? synth.GdnParamsFor(layer, config.recurrent) : GdnParams{});
  }
  return k;
}
namespace {

// Junk in padded rows: a correct kernel ignores it, a wrong one folds it in visibly.
constexpr float kPadValue = 99.0f;

}  // namespace

History ForwardSynthetic(LayerCache& target, const StackConfig& config,
                         const SyntheticForward& synth, int32_t layer, int64_t start,
                         std::span<const model::Token> tokens, const ConvWeights* conv,
                         const GdnParams* gdn, int64_t pad, bool segmented) {
  const auto real = static_cast<int64_t>(tokens.size());
  if (target.kind() != CacheKind::kRecurrent) {
    Tensor k(config.dtype, real, config.kv_cols());
    Tensor v(config.dtype, real, config.kv_cols());
    for (int64_t r = 0; r < real; ++r) {
      const uint64_t h = tokens[static_cast<size_t>(r)].h;
      synth.FillKvRow(k, r, layer, start + r, h, false);
      synth.FillKvRow(v, r, layer, start + r, h, true);
    }
    return static_cast<AttentionCache&>(target).Update(k, v);
  }
  const RecurrentDims& dims = config.recurrent;
  const int64_t rows = real + pad;
  MatF x = MatF::Constant(rows, dims.conv_dim(), kPadValue);
  RecurrentForwardInputs in;
  in.scan = GdnInputs{MatF::Constant(rows, dims.conv_dim(), kPadValue),
                      MatF::Constant(rows, 2 * dims.num_v_heads, kPadValue)};
  for (int64_t r = 0; r < real; ++r) {
    const uint64_t h = tokens[static_cast<size_t>(r)].h;
    synth.FillConvInput(x, r, config.dtype, layer, start + r, h, dims.conv_dim());
    synth.FillGdnInput(in.scan.qkv, in.scan.ba, r, config.dtype, layer, start + r, h, dims);
  }
  in.conv_inputs = Tensor::FromFloat(config.dtype, x);
  in.real_len = real;
  in.segmented = segmented;
  RunRecurrentForward(static_cast<RecurrentLayer&>(target), in,
                      conv != nullptr ? *conv : synth.ConvParams(layer, dims),
                      gdn != nullptr ? *gdn : synth.GdnParamsFor(layer, dims));
  return History{};
}

}  // namespace kvtwin::sim
