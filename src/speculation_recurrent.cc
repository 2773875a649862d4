// The recurrent speculation wrapper (spec/README.md, "Recurrent speculation (v1)"). A fold
// cannot be rewound, so the wrapper never lets the forward touch the live state: it runs
// the forward from a copy of the initial state, keeps the scan inputs, and on Commit
// either installs the post-forward state (everything accepted) or replays the accepted
// prefix from the initial state. Either way the live cache receives one ordinary Put, so
// its capture schedule sees the accepted tokens like any forward's.
#include <algorithm>
#include <string>
#include <utility>

#include "src/core/check.h"
#include "src/speculation_wrappers.h"

namespace kvtwin {

RecurrentSpeculation::RecurrentSpeculation(RecurrentCache& live, bool committing)
    : WrapperContract(CacheKind::kRecurrent),
      live_(live),
      start_(live.Offset()),
      committing_(committing) {}

int64_t RecurrentSpeculation::LiveBytes() const {
  const auto delta_bytes = [](const MatF& m) {
    return static_cast<int64_t>(m.size()) * static_cast<int64_t>(sizeof(float));
  };
  return initial_conv_.Bytes() + delta_bytes(initial_delta_) + conv_.Bytes() + delta_bytes(delta_) +
         rec_conv_.Bytes() + delta_bytes(rec_qkv_) + delta_bytes(rec_ba_);
}

RecurrentLayer::StateView RecurrentSpeculation::Get(DType activation) {
  KV_CHECK(!done_, "forward through a committed speculation");
  if (!started_) {
    // Copy, never Get on the live cache: that would create live state for a fresh layer.
    if (live_.HasState()) {
      KV_CHECK(live_.conv().dtype() == activation,
               std::string("speculative Get with ") + DTypeName(activation) +
                   " but the live conv state is " + DTypeName(live_.conv().dtype()));
      initial_conv_ = live_.conv();
      initial_delta_ = live_.delta();
    } else {
      const RecurrentDims& d = live_.dims();
      initial_conv_ = Tensor(activation, d.conv_tail, d.conv_dim());
      initial_delta_ = MatF::Zero(d.delta_rows(), d.head_k_dim);
    }
    conv_ = initial_conv_;
    delta_ = initial_delta_;
    started_ = true;
  }
  KV_CHECK(conv_.dtype() == activation, "speculative Get changed the activation dtype");
  return StateView{&conv_, &delta_};
}

void RecurrentSpeculation::RecordScan(const Tensor& conv_inputs, const GdnInputs& scan,
                                      int64_t real_len, const GdnParams& params) {
  KV_CHECK(started_ && !done_, "RecordScan outside a speculative forward");
  KV_CHECK(real_len >= 0 && real_len <= conv_inputs.rows() && real_len <= scan.qkv.rows() &&
               real_len <= scan.ba.rows(),
           "RecordScan real length outside the inputs");
  if (params_.has_value()) {
    KV_CHECK(params_->dt_bias == params.dt_bias && params_->a_exp == params.a_exp,
             "gated-delta parameters changed within one speculation");
  } else {
    params_ = params;
  }
  rec_conv_.AppendRows(conv_inputs.Rows(0, real_len));
  const auto append = [real_len](MatF& to, const MatF& from) {
    const Eigen::Index old = to.rows();
    to.conservativeResize(old + real_len, from.cols());
    to.bottomRows(real_len) = from.topRows(real_len);
  };
  append(rec_qkv_, scan.qkv);
  append(rec_ba_, scan.ba);
}

void RecurrentSpeculation::Put(int64_t real_len, std::vector<Tensor>& conv_states,
                               std::vector<MatF>& delta_states) {
  KV_CHECK(started_ && !done_, "Put outside a speculative forward");
  // The wrapper reports no splits, so a forward hands exactly the end state.
  KV_CHECK(conv_states.size() == 1 && delta_states.size() == 1,
           "speculative Put expects exactly the end state");
  recorded_ += real_len;
  // Replay needs every folded token's inputs: a forward that skipped RecordScan (not run
  // through RunRecurrentForward) would make a partial commit silently wrong.
  KV_CHECK(rec_conv_.rows() == recorded_ && rec_qkv_.rows() == recorded_,
           "speculative forward did not record its scan inputs");
  std::swap(conv_, conv_states.back());
  std::swap(delta_, delta_states.back());
}

std::pair<std::vector<Tensor>, std::vector<MatF>> RecurrentSpeculation::Replay(
    int64_t n, const std::vector<int64_t>& splits) const {
  KV_CHECK(params_.has_value() && n > 0 && n <= recorded_,
           "replay of " + std::to_string(n) + " of " + std::to_string(recorded_) + " tokens");
  const GdnInputs scan{rec_qkv_.topRows(n), rec_ba_.topRows(n)};
  GdnResult g = GatedDelta(initial_delta_, scan, n, *params_, splits);
  std::vector<Tensor> convs;
  for (const int64_t s : splits) convs.push_back(ConvTailAfter(initial_conv_, rec_conv_, s));
  convs.push_back(ConvTailAfter(initial_conv_, rec_conv_, n));
  return {std::move(convs), std::move(g.states)};
}

void RecurrentSpeculation::Commit(int64_t accepted) {
  KV_CHECK(committing_, "an isolated wrapper has no commit");
  KV_CHECK(!done_, "speculation wrapper committed twice");
  done_ = true;
  KV_CHECK(live_.Offset() == start_, "live recurrent cache used directly during a speculation");
  const int64_t n = std::min(accepted, recorded_);
  if (n <= 0) return;
  // The live schedule may want captures inside the accepted range; those states exist only
  // through a replay.
  const std::vector<int64_t> splits = live_.SnapshotSplits(n);
  (void)live_.Get(conv_.dtype());
  if (n == recorded_ && splits.empty()) {
    // Copies: final_conv() and final_delta() still report the end state after a commit.
    live_.Put(n, {conv_}, {delta_});
    return;
  }
  auto [convs, deltas] = Replay(n, splits);
  live_.Put(n, std::move(convs), std::move(deltas));
}

}  // namespace kvtwin
