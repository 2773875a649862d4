// CaptureSchedule: the PrepareSnapshots / TakeSnapshots bookkeeping shared by every cache
// kind (spec §1.3). It holds the scheduled offsets (strictly ascending, none behind the
// cache at prepare time), one capture slot per offset, and `base`, the from-offset of the
// next edge-local capture. `base` moves only when a scheduled offset is reached, which is
// what makes each KV capture cover exactly the edge between consecutive scheduled offsets.
// An empty schedule still counts as active once prepared (it must be taken).
// Single-threaded.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "src/cache.h"
#include "src/core/status.h"

namespace kvtwin {

class CaptureSchedule {
 public:
  // Errors (nothing changes): already active -> FailedPrecondition; an offset < current or
  // offsets not strictly ascending -> InvalidArgument.
  Status Prepare(int64_t current, const std::vector<int64_t>& offsets);
  // The captures, one per scheduled offset in scheduled order; the schedule becomes
  // inactive. Inactive schedule -> empty list.
  std::vector<SnapshotPtr> Take();
  // Drops the schedule and closes every capture it still holds (spec §8.2: Go leaks them).
  void Reset();

  bool active() const { return active_; }

  // Scheduled offsets o with start <= o <= end, ascending: a view of the schedule, valid until
  // the next Prepare, Take or Reset (CaptureReached leaves it valid). A view and not a copy:
  // every write of a cache with an active schedule asks.
  std::span<const int64_t> ScheduledIn(int64_t start, int64_t end) const;
  // If `reached` is scheduled and its slot is still empty: slot := make(base), then
  // base := reached (even when make returns null). `make` is called with the current base.
  template <typename MakeSnapshot>
  void CaptureReached(int64_t reached, MakeSnapshot&& make) {
    const int64_t i = IndexOf(reached);
    if (i < 0 || captured_[static_cast<size_t>(i)] != nullptr) return;
    captured_[static_cast<size_t>(i)] = make(base_);
    base_ = reached;
  }
  // Views of the captures still held (for State()-style accounting); entries may be null.
  const std::vector<SnapshotPtr>& held() const { return captured_; }

 private:
  // Index of `offset` in the schedule, or -1 (also when inactive).
  int64_t IndexOf(int64_t offset) const;

  bool active_ = false;
  std::vector<int64_t> offsets_;
  std::vector<SnapshotPtr> captured_;
  int64_t base_ = 0;
};

}  // namespace kvtwin
