// RotatingCache: the sliding-window K/V cache (spec §2.2), v1 generation (eager snapshots).
// W = window keys including the query. Storage regimes (spec §2.2):
//   R1 linear (offset <= W): slot i holds position i, idx == offset;
//   R2 ring (Dim == W < offset): logical j (0 = oldest) is in slot (idx + j) mod W;
//   R3 oversize linear (after a batched write or restoring such a clone): logical order,
//      Dim up to W - 1 + L, idx == Dim, slot i holds position offset - Dim + i.
// A single-token write (L == 1) goes through the ring; a batched write (L > 1) linearizes,
// keeps the newest W - 1 older tokens and appends. Live rewind is refused once the ring
// has wrapped (offset > W). Snapshots are whole windows (with the ring cursor); Restore
// preserves the cursor so the next single-token write lands in the right slot.
// Single-threaded.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "src/cache.h"
#include "src/capture_schedule.h"

namespace kvtwin {

class RotatingSnapshot final : public CacheSnapshot {
 public:
  // `k`/`v` are the window buffer as it must be installed; `idx` the cursor to restore.
  RotatingSnapshot(int64_t from, int64_t to, int64_t idx, Tensor k, Tensor v);
  CacheKind kind() const override { return CacheKind::kRotating; }
  int64_t SizeBytes() const override { return k_.Bytes() + v_.Bytes(); }
  int64_t from() const override { return from_; }
  int64_t to() const override { return to_; }
  int64_t idx() const { return idx_; }
  const Tensor& k() const { return k_; }
  const Tensor& v() const { return v_; }

 private:
  int64_t from_;
  int64_t to_;
  int64_t idx_;
  Tensor k_;
  Tensor v_;
};

class RotatingCache final : public AttentionCache {
 public:
  static constexpr int64_t kGrowStep = 256;
  // REQUIRES: window >= 1.
  explicit RotatingCache(int64_t window);

  CacheKind kind() const override { return CacheKind::kRotating; }
  int64_t Offset() const override { return offset_; }
  int64_t LiveBytes() const override { return k_.Bytes() + v_.Bytes(); }
  void Free() override;
  SnapshotPtr Snapshot(int64_t from) override;
  Status PrepareSnapshots(const std::vector<int64_t>& offsets) override;
  std::vector<SnapshotPtr> TakeSnapshots() override;
  bool ScheduleActive() const override { return schedule_.active(); }
  bool Restore(const CacheSnapshot* snap, int64_t target) override;
  SnapshotPtr Merge(SnapshotPtr parent, SnapshotPtr child) override;
  std::pair<SnapshotPtr, SnapshotPtr> Split(SnapshotPtr snap, int64_t at) override;
  History Update(const Tensor& k, const Tensor& v) override;
  History View() const override;

  // The newest `count` tokens of the window as K and V rows in logical order (oldest
  // first), whatever the storage regime. REQUIRES: 0 <= count <= min(Offset(), W).
  std::pair<Tensor, Tensor> LogicalTail(int64_t count) const;

  // Inspection for checkers and tests.
  int64_t window() const { return window_; }
  int64_t ring_idx() const { return idx_; }
  int64_t buffer_rows() const { return k_.rows(); }  // Dim
  bool HasBuffer() const { return has_buffer_; }
  const Tensor& keys() const { return k_; }
  const Tensor& values() const { return v_; }

 private:
  History UpdateSingle(const Tensor& k, const Tensor& v);  // L == 1
  History Concat(const Tensor& k, const Tensor& v);        // L > 1
  // Owned window snapshot at `o` sliced from the logical-order buffer right after a concat.
  SnapshotPtr WindowAt(int64_t o) const;
  // KV_CHECKs the REQUIRES of Update (row counts, column counts and dtype of the buffer).
  void CheckWrite(const Tensor& k, const Tensor& v) const;
  // Buffer order [idx, Dim) ++ [0, idx), idx := Dim (concat step 3, wrapped case).
  void Linearize();
  // History over buffer rows [0, key_len) with the rotating applier.
  History BufferHistory(int64_t key_len, int64_t query_len) const;

  int64_t window_;
  bool has_buffer_ = false;
  Tensor k_;
  Tensor v_;
  int64_t offset_ = 0;
  int64_t idx_ = 0;
  CaptureSchedule schedule_;
  // View() of an oversize (R3) buffer must show only its trailing W rows, but a History
  // can only name rows [0, length) of a tensor, and View() is const so it cannot shift the
  // buffer. It copies those rows here instead; they live until the next View() or
  // mutation, which is the History pointer lifetime anyway. Not counted in LiveBytes().
  mutable Tensor view_k_;
  mutable Tensor view_v_;
};

}  // namespace kvtwin
