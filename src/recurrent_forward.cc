#include "src/recurrent_forward.h"

#include <utility>
#include <vector>

#include "src/core/check.h"

namespace kvtwin {

void RunRecurrentForward(RecurrentLayer& layer, const RecurrentForwardInputs& in,
                         const ConvWeights& conv, const GdnParams& gdn,
                         RecurrentForwardScratch* scratch) {
  KV_CHECK(in.real_len >= 0 && in.real_len <= in.conv_inputs.rows() &&
               in.conv_inputs.rows() == in.scan.qkv.rows() &&
               in.scan.qkv.rows() == in.scan.ba.rows(),
           "recurrent forward inputs disagree on their row counts");
  RecurrentForwardScratch local;
  RecurrentForwardScratch& s = scratch != nullptr ? *scratch : local;
  const RecurrentLayer::StateView state = layer.Get(in.conv_inputs.dtype());
  const std::vector<int64_t> splits = layer.SnapshotSplits(in.real_len);
  CausalConv1DInto(*state.conv, in.conv_inputs, in.real_len, conv, splits, s.conv_scratch, s.conv);
  if (in.segmented) {
    GatedDeltaSegmentedInto(*state.delta, in.scan, in.real_len, gdn, splits, s.segments, s.scan);
  } else {
    GatedDeltaInto(*state.delta, in.scan, in.real_len, gdn, splits, s.scan);
  }
  layer.RecordScan(in.conv_inputs, in.scan, in.real_len, gdn);
  layer.Put(in.real_len, s.conv.states, s.scan.states);
}

}  // namespace kvtwin
