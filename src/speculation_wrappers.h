// The per-layer wrappers behind Speculation (src/speculation.h), exposed so tests can reach
// the recurrent replay directly. WrapperContract gives every wrapper the spec §2.7 answers
// to the parts of the cache contract a wrapper does not serve. Single-threaded.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "src/cache.h"
#include "src/kernels.h"
#include "src/kv_cache.h"
#include "src/recurrent_cache.h"
#include "src/rotating_cache.h"
#include "src/speculation.h"

namespace kvtwin {

template <typename Base>
class WrapperContract : public Base, public SpeculativeLayer {
 public:
  LayerCache& cache() override { return *this; }
  CacheKind kind() const override { return live_kind_; }
  void Free() override {}
  SnapshotPtr Snapshot(int64_t) override { return nullptr; }
  Status PrepareSnapshots(const std::vector<int64_t>&) override {
    return FailedPrecondition("speculation wrappers do not capture snapshots");
  }
  std::vector<SnapshotPtr> TakeSnapshots() override { return {}; }
  bool ScheduleActive() const override { return false; }
  bool Restore(const CacheSnapshot*, int64_t) override { return false; }
  SnapshotPtr Merge(SnapshotPtr, SnapshotPtr) override { return nullptr; }
  std::pair<SnapshotPtr, SnapshotPtr> Split(SnapshotPtr snap, int64_t) override {
    return {nullptr, std::move(snap)};
  }

 protected:
  explicit WrapperContract(CacheKind live_kind) : live_kind_(live_kind) {}

 private:
  CacheKind live_kind_;
};

// Full KV, committing: writes straight through to the live cache.
class KvSpeculation final : public WrapperContract<AttentionCache> {
 public:
  explicit KvSpeculation(KvCache& live);
  int64_t Offset() const override { return live_.Offset(); }
  int64_t LiveBytes() const override { return 0; }  // the rows live in the live cache
  History Update(const Tensor& k, const Tensor& v) override;
  History View() const override { return live_.View(); }
  void Commit(int64_t accepted) override;

 private:
  KvCache& live_;
  int64_t start_;
  int64_t end_;
  bool done_ = false;
};

// Accumulates the forward's K/V rows privately; the history a write returns is the given
// `base` rows (oldest first) followed by every accumulated row. Used by the isolated full
// KV wrapper (base = the whole live history) and by the rotating wrapper (base = the last
// W logical tokens of the live window, of which a forward's history keeps the newest W - 1, plus
// the sliding-window applier).
class AccumulatingAttention final : public WrapperContract<AttentionCache> {
 public:
  // `live` is the cache wrapped; `window` > 0 makes the history a sliding window of W;
  // `committing` lets Commit append accepted rows to `live` (rotating only).
  AccumulatingAttention(AttentionCache& live, Tensor base_k, Tensor base_v, int64_t window,
                        bool committing);
  int64_t Offset() const override { return start_ + accumulated(); }
  int64_t LiveBytes() const override;
  History Update(const Tensor& k, const Tensor& v) override;
  History View() const override;
  void Commit(int64_t accepted) override;

  int64_t accumulated() const { return acc_k_.rows(); }

 private:
  // The newest `keep` rows of [base ; acc], copied into `k`/`v`, as a History for a query
  // of `query_len`.
  History MakeHistory(int64_t keep, int64_t query_len, Tensor& k, Tensor& v) const;

  AttentionCache& live_;
  int64_t start_;
  int64_t window_;
  bool committing_;
  bool done_ = false;
  Tensor base_k_, base_v_;  // history rows before the forward
  Tensor acc_k_, acc_v_;    // the forward's rows
  // The newest rows of [base ; acc] that the last Update's History points at.
  Tensor hist_k_, hist_v_;
  // View()'s copy, apart from the above like RotatingCache's: a draft model's View between
  // two writes must leave the last Update's History as it was (src/cache.h: valid until the
  // next mutation). Rebuilt by const View(), so mutable.
  mutable Tensor view_k_, view_v_;
};

// Recurrent: runs the forward from a copy of the live state and records its scan inputs.
class RecurrentSpeculation final : public WrapperContract<RecurrentLayer> {
 public:
  RecurrentSpeculation(RecurrentCache& live, bool committing);
  int64_t Offset() const override { return start_ + recorded(); }
  int64_t LiveBytes() const override;
  StateView Get(DType activation) override;
  std::vector<int64_t> SnapshotSplits(int64_t) const override { return {}; }
  void RecordScan(const Tensor& conv_inputs, const GdnInputs& scan, int64_t real_len,
                  const GdnParams& params) override;
  using RecurrentLayer::Put;
  void Put(int64_t real_len, std::vector<Tensor>& conv_states,
           std::vector<MatF>& delta_states) override;
  const RecurrentDims& dims() const override { return live_.dims(); }
  void Commit(int64_t accepted) override;

  int64_t recorded() const { return recorded_; }
  // The states after the first n recorded tokens (at each of `splits`, then at n), rebuilt
  // from the initial state: conv tail = last conv_tail rows of [initial conv ; recorded
  // conv inputs [0, n)], delta = the gated-delta scan of the first n recorded steps.
  // REQUIRES: a forward ran; 0 < n <= recorded(); splits strictly inside (0, n).
  std::pair<std::vector<Tensor>, std::vector<MatF>> Replay(
      int64_t n, const std::vector<int64_t>& splits) const;
  // The state the forward ended in (the full-acceptance path). REQUIRES: a forward ran.
  const Tensor& final_conv() const { return conv_; }
  const MatF& final_delta() const { return delta_; }

 private:
  RecurrentCache& live_;
  int64_t start_;
  bool committing_;
  bool done_ = false;
  bool started_ = false;  // Get was called
  Tensor initial_conv_;
  MatF initial_delta_;
  Tensor conv_;  // current state of the speculative forward
  MatF delta_;
  int64_t recorded_ = 0;
  Tensor rec_conv_;  // [recorded x conv_dim] real conv inputs
  MatF rec_qkv_, rec_ba_;
  std::optional<GdnParams> params_;
};

}  // namespace kvtwin
