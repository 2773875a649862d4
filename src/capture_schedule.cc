#include "src/capture_schedule.h"

#include <algorithm>
#include <string>

namespace kvtwin {

Status CaptureSchedule::Prepare(int64_t current, const std::vector<int64_t>& offsets) {
  if (active_) {
    return FailedPrecondition("PrepareSnapshots while a schedule is active (take it first)");
  }
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (offsets[i] < current) {
      return InvalidArgument("PrepareSnapshots offset " + std::to_string(offsets[i]) +
                             " is behind the cache offset " + std::to_string(current));
    }
    if (i > 0 && offsets[i] <= offsets[i - 1]) {
      return InvalidArgument("PrepareSnapshots offsets are not strictly ascending at index " +
                             std::to_string(i));
    }
  }
  active_ = true;
  offsets_ = offsets;
  captured_.clear();
  captured_.resize(offsets.size());
  base_ = current;
  return Status::Ok();
}

std::vector<SnapshotPtr> CaptureSchedule::Take() {
  std::vector<SnapshotPtr> out = std::move(captured_);
  Reset();
  return out;
}

void CaptureSchedule::Reset() {
  active_ = false;
  offsets_.clear();
  captured_.clear();
  base_ = 0;
}

std::span<const int64_t> CaptureSchedule::ScheduledIn(int64_t start, int64_t end) const {
  if (!active_) return {};
  const auto lo = std::lower_bound(offsets_.begin(), offsets_.end(), start);
  const auto hi = std::upper_bound(lo, offsets_.end(), end);
  return {lo, hi};
}

int64_t CaptureSchedule::IndexOf(int64_t offset) const {
  if (!active_) return -1;
  auto it = std::lower_bound(offsets_.begin(), offsets_.end(), offset);
  if (it == offsets_.end() || *it != offset) return -1;
  return it - offsets_.begin();
}

}  // namespace kvtwin
