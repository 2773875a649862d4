// KvCache: the full attention K/V cache (spec §2.1), v1 generation (eager snapshots).
// Buffers K and V are Tensors with one row per slot; the capacity grows in steps of 256
// slots. Invariant: slots [0, offset) hold positions 0..offset-1 of the current logical
// history; slots >= offset are zero padding or stale rows left by a rewind.
// Snapshots are edge-local: exactly the positions [from, to). Restore needs the base: the
// cache must already hold everything before the snapshot's range. Single-threaded.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "src/cache.h"
#include "src/capture_schedule.h"

namespace kvtwin {

// Holds K rows then V rows in the same allocation as the object itself: a prefix trie keeps
// one snapshot per layer per node, and three allocations each (object, K, V) were most of
// the production replay's allocations.
class KvSnapshot final : public CacheSnapshot {
 public:
  // The rows [from, to): K is the concatenation of `k_pieces`, V of `v_pieces`, copied.
  // REQUIRES: 0 <= from < to; the pieces of one side share a dtype and column count (K's
  // and V's may differ); Σ rows of each side == to - from.
  static std::unique_ptr<KvSnapshot> Make(int64_t from, int64_t to,
                                          std::initializer_list<TensorView> k_pieces,
                                          std::initializer_list<TensorView> v_pieces);
  // Make allocates the object and its rows as one block of raw memory.
  static void operator delete(void* p) { ::operator delete(p); }

  CacheKind kind() const override { return CacheKind::kFullKv; }
  int64_t SizeBytes() const override { return k().Bytes() + v().Bytes(); }
  int64_t from() const override { return from_; }
  int64_t to() const override { return to_; }
  TensorView k() const;
  TensorView v() const;

 private:
  KvSnapshot(int64_t from, int64_t to, TensorView k_shape, TensorView v_shape);

  int64_t from_;
  int64_t to_;
  DType k_dtype_, v_dtype_;
  int64_t k_cols_, v_cols_;
};

class KvCache final : public AttentionCache {
 public:
  static constexpr int64_t kGrowStep = 256;

  CacheKind kind() const override { return CacheKind::kFullKv; }
  int64_t Offset() const override { return offset_; }
  int64_t LiveBytes() const override { return k_.Bytes() + v_.Bytes(); }
  void Free() override;
  SnapshotPtr Snapshot(int64_t from) override;
  Status PrepareSnapshots(const std::vector<int64_t>& offsets) override;
  std::vector<SnapshotPtr> TakeSnapshots() override;
  bool ScheduleActive() const override { return schedule_.active(); }
  bool Restore(const CacheSnapshot* snap, int64_t target) override;
  // REQUIRES (when both are non-null): parent->to() == child->from().
  SnapshotPtr Merge(SnapshotPtr parent, SnapshotPtr child) override;
  std::pair<SnapshotPtr, SnapshotPtr> Split(SnapshotPtr snap, int64_t at) override;
  History Update(const Tensor& k, const Tensor& v) override;
  History View() const override;

  // Inspection for checkers and tests.
  bool HasBuffer() const { return has_buffer_; }
  int64_t Capacity() const { return k_.rows(); }
  const Tensor& keys() const { return k_; }
  const Tensor& values() const { return v_; }

 private:
  // Grows if needed, writes rows at [offset, offset + L), advances offset.
  void Append(TensorView k, TensorView v);
  // Owned copy of slots [from, to), or null if the range is empty or there is no buffer.
  SnapshotPtr Capture(int64_t from, int64_t to) const;

  bool has_buffer_ = false;
  Tensor k_;
  Tensor v_;
  int64_t offset_ = 0;
  CaptureSchedule schedule_;
};

}  // namespace kvtwin
