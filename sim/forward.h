// ForwardSynthetic: one forward of synthetic rows through a layer, the way a model would
// run it, shared by the op-level lock-step driver and the request-level driver so both
// feed the caches identical values. `target` stands for layer `layer` of `config`: the
// live cache or a speculation wrapper. K/V rows come from SyntheticForward::FillKvRow; a
// recurrent layer runs RunRecurrentForward on conv and gated-delta inputs derived from
// (layer, position, h), plus `pad` padding rows of junk that a correct kernel ignores.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/ref_cache.h"
#include "sim/stack.h"
#include "sim/synthetic.h"
#include "src/cache.h"
#include "src/kernels.h"
#include "src/recurrent_forward.h"

namespace kvtwin::sim {

// Returns the attention history the forward saw (empty for a recurrent layer). The
// kernel parameters default to the ones `synth` derives for the layer; `segmented` runs
// the gated delta segment by segment.
// The kernel parameters `synth` derives for every layer of `config`, one entry per layer
// (default-constructed for a non-recurrent layer), as the drivers hand them to
// ForwardSynthetic.
struct LayerKernels {
  std::vector<ConvWeights> conv;
  std::vector<GdnParams> gdn;
};
LayerKernels DeriveLayerKernels(const SyntheticForward& synth, const StackConfig& config);

// The input buffers of ForwardSynthetic, kept by a driver across forwards so a forward
// allocates only when its shape changes (every layer of one forward has the same shape).
// Reuse is transparent: every real row is rewritten in full and every padded row is reset.
// Eigen and Tensor keep a buffer only while the element count stays, and forwards of
// varying token counts (prefill chunks, speculative drafts) reallocated them nearly every
// time: the inputs are kept per token count below kInputsByRows, a set each.
struct ForwardInputs {
  Tensor k, v;
  MatF conv;                         // float conv inputs, converted into recurrent.conv_inputs
  RecurrentForwardInputs recurrent;  // scan.qkv and scan.ba are filled in place
};
struct ForwardScratch {
  static constexpr size_t kInputsByRows = 64;
  std::vector<ForwardInputs> by_rows;  // [rows], grown on demand
  ForwardInputs larger;                // any longer forward
  RecurrentForwardScratch kernels;     // the recurrent kernels' buffers
  ForwardInputs& For(int64_t rows);
};

History ForwardSynthetic(LayerCache& target, const StackConfig& config,
                         const SyntheticForward& synth, int32_t layer, int64_t start,
                         std::span<const model::Token> tokens, const ConvWeights* conv = nullptr,
                         const GdnParams* gdn = nullptr, int64_t pad = 0, bool segmented = false,
                         ForwardScratch* scratch = nullptr);

}  // namespace kvtwin::sim
