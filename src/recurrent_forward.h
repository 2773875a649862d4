// RunRecurrentForward: one recurrent layer's forward (causal conv, then the gated-delta
// scan) against a RecurrentLayer, which is the live cache or a speculation wrapper standing
// in for it. The one place that sequences Get → SnapshotSplits → kernels → RecordScan →
// Put, so a speculative forward and an ordinary one cannot drift apart.
#pragma once

#include <cstdint>

#include "src/kernels.h"
#include "src/recurrent_cache.h"

namespace kvtwin {

struct RecurrentForwardInputs {
  Tensor conv_inputs;      // [L x conv_dim] packed conv inputs, activation dtype
  GdnInputs scan;          // [L x ...] gated-delta inputs
  int64_t real_len = 0;    // rows >= real_len are padding (identity steps)
  bool segmented = false;  // run the gated delta segment by segment between splits
};

// The kernels' buffers, kept by the caller (the model runner) across forwards like any
// activation workspace: with it, a forward of the same shape as the previous one (every
// decode step) allocates nothing. The states rotate through Put: the layer takes the new
// ones and hands its old buffers back here. One scratch serves every layer of a stack.
struct RecurrentForwardScratch {
  ConvScratch conv_scratch;
  ConvResult conv;
  GdnResult scan;
  GdnSegmentScratch segments;  // the segmented form's (RecurrentForwardInputs::segmented)
};

// REQUIRES: the inputs have L >= real_len >= 0 rows and the layer's widths; the weights
// and parameters match the layer's dims. Without `scratch` every buffer is fresh.
void RunRecurrentForward(RecurrentLayer& layer, const RecurrentForwardInputs& in,
                         const ConvWeights& conv, const GdnParams& gdn,
                         RecurrentForwardScratch* scratch = nullptr);

}  // namespace kvtwin
