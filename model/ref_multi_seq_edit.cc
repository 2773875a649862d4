// RefMultiSeqCache, the sequence edits of §2.8: CopyPrefix, Remove and CanResume. Remove is
// the one whose storage order shows (quirk 6): it walks the sequence's cells in index order
// and may stop half-way at a shared cell, so it is transcribed as that loop over the
// physical cells rather than as an edit of the position log.
#include <algorithm>
#include <string>

#include "model/ref_multi_seq.h"

namespace kvtwin::model {

void RefMultiSeqCache::EditEndsForward() {
  // Between StartForward and Put the forward stays open (§2.8: Put scatters into the cells
  // StartForward chose); after its Put an edit ends it, as a new forward would.
  if (put_pending_) {
    edited_in_forward_ = true;
    return;
  }
  EndForward();
}

void RefMultiSeqCache::CopyPrefix(SeqId src, SeqId dst, int64_t len) {
  // A negative length (ollama's len is an int32 the caller may pass as -1) is not "to the
  // end" as in llama.cpp's seq_cp: by §2.8's rule no cell has pos < len, so dst is emptied.
  EditEndsForward();
  std::vector<MsEntry> copied;
  // dst leaves every cell first, so a copy onto itself finds nothing left to copy.
  if (src != dst) {
    for (const MsEntry& e : Of(src).entries) {
      if (e.pos < len) copied.push_back(e);
    }
  }
  if (copied.empty()) {
    seqs_.erase(dst);
  } else {
    seqs_[dst].entries = std::move(copied);
  }
  RecomputeRange(dst);
}

Status RefMultiSeqCache::Remove(SeqId seq, int64_t begin, int64_t end, int64_t failing_shift_call) {
  KV_CHECK(0 <= begin && begin <= end, "Remove range [" + std::to_string(begin) + ", " +
                                           std::to_string(end) + ") inverted or negative");
  EditEndsForward();
  const bool finite = end != kUnbounded;
  const int64_t delta = finite ? begin - end : 0;
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    ranges_.erase(seq);
    return Status::Ok();
  }
  Seq& s = it->second;
  if (std::optional<int64_t> shared = EditCells(s, seq, begin, end, delta)) {
    Sort(s.entries);
    return Unsupported("shifting cells shared by multiple sequences not supported (cell " +
                       std::to_string(*shared) + "; earlier cells already edited)");
  }
  // The history the cells no longer hold follows the same cut and move (the ideal log).
  std::erase_if(s.entries,
                [&](const MsEntry& e) { return !e.retained && e.pos >= begin && e.pos < end; });
  for (MsEntry& e : s.entries) {
    if (!e.retained && e.pos >= end) e.pos += delta;
  }
  Sort(s.entries);
  RecomputeRange(seq);
  if (!ranges_.contains(seq)) {
    if (s.entries.empty()) seqs_.erase(it);
    return Status::Ok();  // no cell left: returns before the shift (and its callback check)
  }
  if (!finite) return Status::Ok();
  if (!config_.shift_supported) {
    return Unsupported("shift not supported: no RoPE shift callback (positions moved)");
  }
  // The callback moves the keys of every cell of the sequence at pos >= begin: exactly the
  // cells the loop moved. It is called per window of max_batch cells from the sequence's
  // first cell that holds such a cell, in index order; a failing call stops the walk.
  const int64_t first = ranges_.at(seq).first;
  const int64_t window = config_.max_batch;
  std::vector<int64_t> windows;  // of the cells to move, ascending, each once: the calls
  for (const MsEntry& e : s.entries) {
    if (e.retained && e.pos >= begin) windows.push_back((e.index - first) / window);
  }
  std::sort(windows.begin(), windows.end());
  windows.erase(std::unique(windows.begin(), windows.end()), windows.end());
  const bool fails =
      failing_shift_call >= 0 && failing_shift_call < static_cast<int64_t>(windows.size());
  for (MsEntry& e : s.entries) {
    if (!e.retained || e.pos < begin) continue;
    const int64_t call =
        std::lower_bound(windows.begin(), windows.end(), (e.index - first) / window) -
        windows.begin();
    if (fails && call >= failing_shift_call) continue;
    e.shifts.push_back(delta);
    if (auto rows = rows_.find(e.index); rows != rows_.end()) rows->second.shifts.push_back(delta);
  }
  if (fails) return ResourceExhausted(kShiftFailure);
  return Status::Ok();
}

std::optional<int64_t> RefMultiSeqCache::EditCells(Seq& s, SeqId seq, int64_t begin, int64_t end,
                                                   int64_t delta) {
  std::vector<size_t> order;  // the sequence's cells, by index
  for (size_t k = 0; k < s.entries.size(); ++k) {
    if (s.entries[k].retained) order.push_back(k);
  }
  std::sort(order.begin(), order.end(),
            [&s](size_t a, size_t b) { return s.entries[a].index < s.entries[b].index; });
  std::vector<bool> leave(s.entries.size(), false);
  std::optional<int64_t> stopped;
  for (size_t k : order) {
    MsEntry& e = s.entries[k];
    if (e.pos >= begin && e.pos < end) {
      leave[k] = true;
    } else if (e.pos >= end) {
      if (SharedWithOther(seq, e.index)) {
        stopped = e.index;
        break;
      }
      e.pos += delta;
    }
  }
  std::vector<MsEntry> kept;
  for (size_t k = 0; k < s.entries.size(); ++k) {
    if (!leave[k]) kept.push_back(std::move(s.entries[k]));
  }
  s.entries = std::move(kept);
  return stopped;
}

bool RefMultiSeqCache::CanResume(SeqId seq, int64_t pos) const {
  const std::vector<int64_t> held = RetainedPositions(seq);
  if (config_.memory == kUnbounded) return true;
  if (held.empty()) return false;
  const int64_t first = *std::min_element(held.begin(), held.end());
  const int64_t last = *std::max_element(held.begin(), held.end());
  return std::max<int64_t>(0, pos - config_.window) >= first && pos <= last + 1;
}

void RefMultiSeqCache::RecomputeRange(SeqId seq) {
  std::optional<MsSpan> range;
  for (const MsEntry& e : Of(seq).entries) {
    if (!e.retained) continue;
    if (!range) range = MsSpan{e.index, e.index};
    range->first = std::min(range->first, e.index);
    range->second = std::max(range->second, e.index);
  }
  if (range) {
    ranges_[seq] = *range;
  } else {
    ranges_.erase(seq);
  }
}

bool RefMultiSeqCache::SharedWithOther(SeqId seq, int64_t index) const {
  for (const auto& [id, other] : seqs_) {
    if (id == seq) continue;
    for (const MsEntry& e : other.entries) {
      if (e.retained && e.index == index) return true;
    }
  }
  return false;
}

}  // namespace kvtwin::model
