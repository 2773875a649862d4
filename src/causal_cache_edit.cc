// CausalCache (spec §2.8), the sequence edits: CopyPrefix, Remove with the RoPE shift, and
// CanResume. Remove keeps the historical order of effects (spec §8 quirk 6): the metadata
// changes cell by cell and an error (a shared cell to shift, no shift callback) is reported
// after whatever has already changed (after a shared-cell error even the sequence's range
// is left as it was).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "src/causal_cache.h"

namespace kvtwin {
namespace {

Status ValidateSeq(int32_t seq, const CausalConfig& c) {
  if (seq < 0 || seq >= c.max_seqs) {
    return InvalidArgument("causal cache: sequence " + std::to_string(seq) + " out of range");
  }
  return Status::Ok();
}

// The cells the shift callback receives, grouped as the Go `shift` does: the sequence's
// range is walked in windows of max_batch cells starting at its first cell, and each
// window contributes the cells of `seq` with pos >= begin (after renumbering). Windows
// without such cells are skipped.
std::vector<std::vector<int64_t>> ShiftGroups(const std::vector<CausalCache::Cell>& cells,
                                              std::pair<int64_t, int64_t> range, int32_t seq,
                                              int64_t begin, int64_t max_batch) {
  std::vector<std::vector<int64_t>> groups;
  for (int64_t start = range.first; start <= range.second; start += max_batch) {
    std::vector<int64_t> group;
    const int64_t stop = std::min(range.second + 1, start + max_batch);
    for (int64_t i = start; i < stop; ++i) {
      const CausalCache::Cell& cell = cells[static_cast<size_t>(i)];
      if (cell.seqs.contains(seq) && cell.pos >= begin) group.push_back(i);
    }
    if (!group.empty()) groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace

Status CausalCache::CopyPrefix(int32_t src, int32_t dst, int64_t len) {
  KV_RETURN_IF_ERROR(ValidateSeq(src, config_));
  KV_RETURN_IF_ERROR(ValidateSeq(dst, config_));
  // Per cell, dst is dropped before src is tested, so src == dst empties the sequence
  // (as in the Go code).
  int64_t first = kUnbounded;
  int64_t last = -1;
  for (size_t i = 0; i < cells_.size(); ++i) {
    Cell& cell = cells_[i];
    cell.seqs.erase(dst);
    if (cell.seqs.contains(src) && cell.pos < len) {
      cell.seqs.insert(dst);
      first = std::min(first, static_cast<int64_t>(i));
      last = std::max(last, static_cast<int64_t>(i));
    }
  }
  if (last < 0) {
    ranges_.erase(dst);
  } else {
    ranges_[dst] = {first, last};
  }
  return Status::Ok();
}

Status CausalCache::Remove(int32_t seq, int64_t begin, int64_t end) {
  KV_RETURN_IF_ERROR(ValidateSeq(seq, config_));
  if (begin < 0 || end < begin) {
    return InvalidArgument("causal cache: Remove of [" + std::to_string(begin) + ", " +
                           std::to_string(end) + ")");
  }
  const int64_t delta = end == kUnbounded ? 0 : begin - end;
  int64_t first = kUnbounded;
  int64_t last = -1;
  for (size_t i = 0; i < cells_.size(); ++i) {
    Cell& cell = cells_[i];
    if (!cell.seqs.contains(seq)) continue;
    if (cell.pos >= begin && cell.pos < end) {
      cell.seqs.erase(seq);
      continue;
    }
    if (cell.pos >= end) {
      if (cell.seqs.size() > 1) {
        return Unsupported("causal cache: shifting shared cells unsupported");
      }
      cell.pos += delta;
    }
    first = std::min(first, static_cast<int64_t>(i));
    last = std::max(last, static_cast<int64_t>(i));
  }
  if (last < 0) {
    ranges_.erase(seq);
    return Status::Ok();
  }
  ranges_[seq] = {first, last};
  if (end == kUnbounded) return Status::Ok();
  // Checked only now, as in the Go code: the renumbering above already happened.
  if (!shift_) return Unsupported("causal cache: shift not supported");
  for (const std::vector<int64_t>& group :
       ShiftGroups(cells_, ranges_[seq], seq, begin, config_.max_batch)) {
    KV_RETURN_IF_ERROR(shift_(*this, group, delta));
  }
  return Status::Ok();
}

bool CausalCache::CanResume(int32_t seq, int64_t pos) const {
  if (config_.memory == kUnbounded) return true;
  auto it = ranges_.find(seq);
  if (it == ranges_.end()) return false;
  // The window of the resumed position must lie inside what is stored.
  int64_t first = kUnbounded;
  int64_t last = -1;
  for (int64_t i = it->second.first; i <= it->second.second; ++i) {
    const Cell& cell = cells_[static_cast<size_t>(i)];
    if (!cell.seqs.contains(seq)) continue;
    first = std::min(first, cell.pos);
    last = std::max(last, cell.pos);
  }
  // Every edit erases a sequence's range with its last cell, so a range always holds one.
  KV_CHECK(last >= 0, "causal cache: the range of sequence " + std::to_string(seq) +
                          " holds none of its cells");
  return std::max<int64_t>(0, pos - config_.window) >= first && pos <= last + 1;
}

}  // namespace kvtwin
