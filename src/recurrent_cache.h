// RecurrentCache: conv tail + gated-delta state of one recurrent layer (spec §2.3), B = 1.
// conv is [conv_tail x conv_dim] in the activation dtype of the first Get; delta is
// [(Hv*Dv) x Dk] (row h*Dv + i, column j = S_h[i][j]) and always float32. Both are absent
// until the first Get. The state cannot rewind: Restore(null, t) succeeds only at t ==
// offset, and a snapshot restores only to its own offset (but from anywhere, in any order).
// Put advances the offset by the real (unpadded) length. Single-threaded.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "src/cache.h"
#include "src/capture_schedule.h"

namespace kvtwin {

struct RecurrentDims {
  int64_t conv_tail = 3;    // kernel - 1
  int64_t num_k_heads = 1;  // Hk
  int64_t num_v_heads = 2;  // Hv (multiple of Hk)
  int64_t head_k_dim = 4;   // Dk
  int64_t head_v_dim = 4;   // Dv
  // 2*Hk*Dk + Hv*Dv: the packed [q | k | v] width that the conv runs over.
  int64_t conv_dim() const { return 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim; }
  int64_t delta_rows() const { return num_v_heads * head_v_dim; }
  friend bool operator==(const RecurrentDims&, const RecurrentDims&) = default;
};

class RecurrentSnapshot final : public CacheSnapshot {
 public:
  RecurrentSnapshot(int64_t offset, Tensor conv, MatF delta);
  CacheKind kind() const override { return CacheKind::kRecurrent; }
  int64_t SizeBytes() const override;
  int64_t from() const override { return offset_; }
  int64_t to() const override { return offset_; }
  int64_t offset() const { return offset_; }
  const Tensor& conv() const { return conv_; }
  const MatF& delta() const { return delta_; }

 private:
  int64_t offset_;
  Tensor conv_;
  MatF delta_;
};

struct GdnInputs;
struct GdnParams;

// What a recurrent layer's forward talks to (see RunRecurrentForward): the live cache, or a
// speculation wrapper standing in for it. The forward reads the state with Get, segments
// its kernels at SnapshotSplits, hands the real rows of its scan inputs to RecordScan and
// installs the resulting states with Put.
class RecurrentLayer : public LayerCache {
 public:
  struct StateView {
    const Tensor* conv;
    const MatF* delta;
  };
  // The state the forward starts from. REQUIRES: `activation` equals the dtype of the
  // first Get (until Free).
  virtual StateView Get(DType activation) = 0;
  // Scheduled offsets strictly inside (offset, offset + forward_len), relative to offset.
  virtual std::vector<int64_t> SnapshotSplits(int64_t forward_len) const = 0;
  // The forward's inputs before Put: packed conv inputs [L x conv_dim] in the activation
  // dtype and the gated-delta inputs, of which the first `real_len` rows are real. The live
  // cache keeps nothing (it never rewinds, so it never replays); a speculation wrapper keeps
  // the real rows to rebuild the state of an accepted prefix.
  virtual void RecordScan(const Tensor& conv_inputs, const GdnInputs& scan, int64_t real_len,
                          const GdnParams& params) {
    (void)conv_inputs, (void)scan, (void)real_len, (void)params;
  }
  // Installs the state after a forward of `real_len` real tokens. The lists hold one state
  // per interior split (SnapshotSplits(real_len)) then the end state. The end state is
  // swapped in, so on return the lists' last entries hold the layer's previous state
  // buffers (for the caller to reuse; their contents are unspecified).
  // REQUIRES: Get was called; equal non-empty lists of size splits + 1; shapes match.
  virtual void Put(int64_t real_len, std::vector<Tensor>& conv_states,
                   std::vector<MatF>& delta_states) = 0;
  // Put of lists the caller does not keep.
  void Put(int64_t real_len, std::vector<Tensor>&& conv_states, std::vector<MatF>&& delta_states) {
    Put(real_len, conv_states, delta_states);
  }
  virtual const RecurrentDims& dims() const = 0;
};

class RecurrentCache final : public RecurrentLayer {
 public:
  explicit RecurrentCache(RecurrentDims dims);

  CacheKind kind() const override { return CacheKind::kRecurrent; }
  int64_t Offset() const override { return offset_; }
  int64_t LiveBytes() const override;
  void Free() override;
  SnapshotPtr Snapshot(int64_t from) override;
  Status PrepareSnapshots(const std::vector<int64_t>& offsets) override;
  std::vector<SnapshotPtr> TakeSnapshots() override;
  bool ScheduleActive() const override { return schedule_.active(); }
  bool Restore(const CacheSnapshot* snap, int64_t target) override;
  SnapshotPtr Merge(SnapshotPtr parent, SnapshotPtr child) override;
  std::pair<SnapshotPtr, SnapshotPtr> Split(SnapshotPtr snap, int64_t at) override;

  // The live state, created as zeros (conv in `activation`, delta float32) on first use.
  // Never changes the offset.
  StateView Get(DType activation) override;
  std::vector<int64_t> SnapshotSplits(int64_t forward_len) const override;
  using RecurrentLayer::Put;
  void Put(int64_t real_len, std::vector<Tensor>& conv_states,
           std::vector<MatF>& delta_states) override;
  const RecurrentDims& dims() const override { return dims_; }

  // Inspection for checkers and tests.
  bool HasState() const { return has_state_; }
  const Tensor& conv() const { return conv_; }
  const MatF& delta() const { return delta_; }

 private:
  // Offers a capture of (conv, delta) at `reached` to the schedule.
  void CaptureBoundary(int64_t reached, const Tensor& conv, const MatF& delta);

  RecurrentDims dims_;
  bool has_state_ = false;
  Tensor conv_;
  MatF delta_;
  int64_t offset_ = 0;
  CaptureSchedule schedule_;
};

}  // namespace kvtwin
