// RefCache: the reference cache is its token log. Every rule below is transcribed from the
// spec (cache-semantics.md §1.2, §1.3, §2.1-§2.3, §5.1) and kept deliberately literal: no
// buffers (only their sizes), no ring cursor, no lazy snapshots (v1: every snapshot is owned).
// Where the §5.1 fakes and the production rules of §2.x differ in an edge case, the production rule
// wins, because the model is compared with the production caches step by step.
#include "model/ref_cache.h"

#include <algorithm>
#include <string>

namespace kvtwin::model {
namespace {

// log[begin, end), sharing the log's buffer. REQUIRES: 0 <= begin <= end <= size.
SharedLog Slice(const SharedLog& log, int64_t begin, int64_t end) {
  KV_CHECK(0 <= begin && begin <= end && end <= static_cast<int64_t>(log.size()),
           "slice [" + std::to_string(begin) + ", " + std::to_string(end) + ") of a log of " +
               std::to_string(log.size()));
  return log.Slice(static_cast<size_t>(begin), static_cast<size_t>(end));
}

void Truncate(SharedLog& log, int64_t length) {
  KV_CHECK(0 <= length && length <= static_cast<int64_t>(log.size()), "truncate beyond log");
  log.Truncate(static_cast<size_t>(length));
}

// A snapshot handed back to a cache must be one this kind can have produced.
void CheckSnapshotShape(const RefSnapshot& snap, RefKind kind) {
  KV_CHECK(snap.kind == kind, "snapshot of another cache kind");
  KV_CHECK(0 <= snap.from && snap.from <= snap.to, "snapshot range inverted");
  const int64_t held = static_cast<int64_t>(snap.tokens.size());
  if (kind == RefKind::kKv) {
    KV_CHECK(held == snap.to - snap.from, "KV snapshot tokens do not match its range");
  } else {
    KV_CHECK(held == snap.to, "whole-state snapshot must hold tokens [0, to)");
  }
}

}  // namespace

int64_t SnapshotUnits(const RefSnapshot& snap) {
  switch (snap.kind) {
    case RefKind::kKv:
      return snap.to - snap.from;
    case RefKind::kRotating:
      KV_CHECK(snap.rows > 0, "the size of a window snapshot whose rows are not modeled");
      return snap.rows;
    case RefKind::kRecurrent:
      return 1;
  }
  return 0;
}

RefCache RefCache::Kv() { return RefCache(RefKind::kKv, 0); }

RefCache RefCache::Rotating(int64_t window) {
  KV_CHECK(window >= 1, "a sliding window holds at least one token");
  return RefCache(RefKind::kRotating, window);
}

RefCache RefCache::Recurrent() { return RefCache(RefKind::kRecurrent, 0); }

void RefCache::Write(std::span<const Token> tokens, const RefCache* leader) {
  const int64_t start = Offset();
  if (tokens.empty()) {
    KV_CHECK(kind_ == RefKind::kRecurrent, "only a recurrent layer takes padding alone");
    // Put's captureBoundary(offset, live) after an advance of 0: the start itself, filled
    // only if its slot is still empty (Prepare's immediate capture was null without state).
    has_state_ = true;
    if (schedule_active_ && WantsCapture(start)) CaptureAt(start, false);
    return;
  }
  // Rotating (§2.2 Update step 1): the start boundary is cloned before the write, because
  // the write may evict tokens of the window that the boundary state still needs.
  // Built only when a slot takes it: a whole-state snapshot is the log so far, and making
  // one on every write of a long prefill was quadratic (OfferCapture drops it otherwise).
  if (kind_ == RefKind::kRotating && schedule_active_ && WantsCapture(start)) {
    OfferCapture(start, Snapshot(0));
  }
  if (kind_ == RefKind::kKv) GrowKv(start, static_cast<int64_t>(tokens.size()));
  if (kind_ == RefKind::kRotating) GrowRotating(start, static_cast<int64_t>(tokens.size()));
  if (leader != nullptr) {
    log_.AppendLike(tokens, leader->log_);
  } else {
    log_.Append(tokens);
  }
  has_state_ = true;
  const bool batched = tokens.size() > 1;
  // KV (§2.1) captures every scheduled offset in [start, end], the start included (a zero
  // width edge unless base lags behind). Whole-state kinds took their start boundary
  // before the write (rotating) or at prepare time (recurrent), so they start after it.
  const int64_t first = kind_ == RefKind::kKv ? start : start + 1;
  // Ascending, as prepared; CaptureAt fills slots but never changes the offsets.
  for (int64_t reached : scheduled_) {
    if (first <= reached && reached <= Offset()) CaptureAt(reached, batched);
  }
}

void RefCache::CaptureAt(int64_t reached, bool batched_write) {
  KV_CHECK(0 <= reached && reached <= Offset(), "capture beyond the written log");
  // A single-token write reaches only its own end (KV: or its start, the zero-width edge);
  // production takes a different path per write type, the reference needs none.
  KV_CHECK(
      batched_write || reached == Offset() || (kind_ == RefKind::kKv && reached + 1 == Offset()),
      "single-token write captured an interior offset");
  RefSnap snap;
  switch (kind_) {
    case RefKind::kKv:
      // Edge-local: the tokens between the previous scheduled boundary and this one.
      if (has_state_ && reached > base_) {
        snap = RefSnapshot{kind_, base_, reached, Slice(log_, base_, reached)};
      }
      break;
    case RefKind::kRotating:
      // The window ending at `reached`; the range start is informational (§2.2). After a
      // batched write it is a slice of the window's min(o, W) rows; after a single-token
      // write (the ring may be out of logical order) an eager clone of State().
      snap = WholeStateAt(reached - std::min(reached, window_), reached);
      snap->rows = batched_write ? std::min(reached, window_) : StateRows();
      break;
    case RefKind::kRecurrent:
      snap = WholeStateAt(0, reached);
      break;
  }
  OfferCapture(reached, std::move(snap));
}

void RefCache::OfferCapture(int64_t reached, RefSnap snap) {
  // Offsets are unique, so at most one slot matches. "Empty" is the Go nil check: a null
  // capture leaves the slot empty, so revisiting the offset after a rewind fires again.
  for (size_t i = 0; i < scheduled_.size(); ++i) {
    if (scheduled_[i] != reached || captured_[i].has_value()) continue;
    captured_[i] = std::move(snap);
    base_ = reached;  // moves even for a null capture (spec §8 quirk 5)
    return;
  }
}

void RefCache::GrowKv(int64_t prev, int64_t n) {
  constexpr int64_t kStep = 256;
  const int64_t chunk = (n + kStep - 1) / kStep * kStep;
  if (!has_state_) {
    kv_capacity_ = chunk;
  } else if (prev + n > kv_capacity_) {
    kv_capacity_ = (prev % kStep != 0 ? prev : kv_capacity_) + chunk;
  }
}

void RefCache::GrowRotating(int64_t prev, int64_t n) {
  if (n > 1) {
    // concat (§2.2): a linear buffer is cut to its live rows, a wrapped one linearized
    // (W rows or more), then only the newest W - 1 old rows are kept before the append.
    rotating_rows_ = std::min(prev, window_ - 1) + n;
    return;
  }
  // update step 2: the first buffer, or a linear one the offset has filled, grows by a
  // step; a filled buffer's offset is its row count (a live rewind only lowers the offset).
  constexpr int64_t kStep = 256;
  if (!has_state_ || (prev >= rotating_rows_ && rotating_rows_ < window_)) {
    KV_CHECK(prev < window_, "a linear window buffer filled past the window");
    rotating_rows_ += std::min(kStep, window_ - prev);
  }
  rotating_rows_ = std::min(rotating_rows_, window_);  // step 3: an oversize buffer is cut
}

int64_t RefCache::StateRows() const { return std::min(Offset(), rotating_rows_); }

bool RefCache::WantsCapture(int64_t reached) const {
  for (size_t i = 0; i < scheduled_.size(); ++i) {
    if (scheduled_[i] == reached && !captured_[i].has_value()) return true;
  }
  return false;
}

RefSnapshot RefCache::WholeStateAt(int64_t from, int64_t to) const {
  return RefSnapshot{kind_, from, to, Slice(log_, 0, to)};
}

RefSnap RefCache::Snapshot(int64_t from) const {
  KV_CHECK(from >= 0, "snapshot from a negative position");
  if (!has_state_) return std::nullopt;
  switch (kind_) {
    case RefKind::kKv:
      if (from >= Offset()) return std::nullopt;  // empty range
      return RefSnapshot{kind_, from, Offset(), Slice(log_, from, Offset())};
    case RefKind::kRotating:
      // The whole window, whatever `from` is; `from` only labels the range.
      if (Offset() <= from) return std::nullopt;
      {
        RefSnapshot snap = WholeStateAt(from, Offset());
        snap.rows = StateRows();
        return snap;
      }
    case RefKind::kRecurrent:
      // `from` is ignored (§2.3); the state covers [0, offset).
      return WholeStateAt(0, Offset());
  }
  return std::nullopt;
}

Status RefCache::PrepareSnapshots(const std::vector<int64_t>& offsets) {
  if (schedule_active_) {
    return FailedPrecondition("PrepareSnapshots: previous schedule not taken");
  }
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (offsets[i] < Offset()) {
      return InvalidArgument("PrepareSnapshots: offset " + std::to_string(offsets[i]) +
                             " behind the cache offset " + std::to_string(Offset()));
    }
    if (i > 0 && offsets[i] <= offsets[i - 1]) {
      return InvalidArgument("PrepareSnapshots: offsets not strictly ascending");
    }
  }
  scheduled_ = offsets;
  captured_.assign(offsets.size(), std::nullopt);
  base_ = Offset();
  schedule_active_ = true;
  // Recurrent (§2.3): an offset equal to the current position is captured right away,
  // since no later Put reaches it again.
  if (kind_ == RefKind::kRecurrent) OfferCapture(Offset(), Snapshot(0));
  return Status::Ok();
}

std::vector<RefSnap> RefCache::TakeSnapshots() {
  if (!schedule_active_) return {};
  std::vector<RefSnap> out = std::move(captured_);
  scheduled_.clear();
  captured_.clear();
  schedule_active_ = false;
  return out;
}

bool RefCache::Restore(const RefSnapshot* snap, int64_t target) {
  if (snap != nullptr) CheckSnapshotShape(*snap, kind_);
  switch (kind_) {
    case RefKind::kKv:
      return RestoreKv(snap, target);
    case RefKind::kRotating:
      return RestoreRotating(snap, target);
    case RefKind::kRecurrent:
      return RestoreRecurrent(snap, target);
  }
  return false;
}

bool RefCache::RestoreKv(const RefSnapshot* snap, int64_t target) {
  if (target < 0) return false;
  if (snap == nullptr) {
    // Live rewind: slots below the offset still hold their positions.
    if (target > Offset()) return false;
    Truncate(log_, target);
    return true;
  }
  // Needs base: the cache must already hold everything before the snapshot's range.
  if (target > snap->to || Offset() < snap->from) return false;
  Truncate(log_, snap->from);
  GrowKv(snap->from, static_cast<int64_t>(snap->tokens.size()));  // the refill is an append
  log_.Concat(snap->tokens);
  Truncate(log_, target);  // a target below snap->from acts as a rewind
  has_state_ = true;
  return true;
}

bool RefCache::RestoreRotating(const RefSnapshot* snap, int64_t target) {
  if (target < 0) return false;
  if (snap == nullptr) {
    if (target >= Offset()) return target == Offset();
    // After the ring wrapped, any rewind would need evicted tokens.
    if (Offset() > window_) return false;
    Truncate(log_, target);
    return true;
  }
  if (target > snap->to) return false;
  // Clamping a full window would leave it incomplete.
  if (target < snap->to && snap->to > window_) return false;
  KV_CHECK(snap->rows > 0, "a window snapshot restored without its modeled rows");
  log_ = snap->tokens;  // whole-state restore: the current offset is irrelevant
  Truncate(log_, target);
  rotating_rows_ = snap->rows;  // the buffer is a copy of the snapshot's
  has_state_ = true;
  return true;
}

bool RefCache::RestoreRecurrent(const RefSnapshot* snap, int64_t target) {
  // A recurrent state cannot be rewound or clamped, only replaced at its exact offset.
  if (snap == nullptr) return target == Offset();
  if (target != snap->to) return false;
  log_ = snap->tokens;
  has_state_ = true;
  return true;
}

void RefCache::CommitSpeculation(const TokenLog& forward, int64_t accepted, int64_t split) {
  KV_CHECK(!forward.empty(), "a speculative forward writes at least one token");
  KV_CHECK(split >= 0 && split < static_cast<int64_t>(forward.size()),
           "a speculation splits inside its forward");
  const int64_t start = Offset();
  const int64_t n = std::clamp<int64_t>(accepted, 0, static_cast<int64_t>(forward.size()));
  if (kind_ == RefKind::kKv) {
    if (split > 0) {
      const std::span<const Token> all(forward);
      Write(all.first(static_cast<size_t>(split)));
      Write(all.subspan(static_cast<size_t>(split)));
    } else {
      Write(forward);
    }
    Truncate(log_, start + n);  // the commit is a pure cursor move
    return;
  }
  if (n > 0) Write(std::span<const Token>(forward).first(static_cast<size_t>(n)));
}

RefSnap RefCache::Merge(RefSnap parent, RefSnap child) const {
  if (parent) CheckSnapshotShape(*parent, kind_);
  if (child) CheckSnapshotShape(*child, kind_);
  // Whole-state kinds: the child's state already contains the parent's (a null child
  // therefore loses the parent's state, spec §8 quirk 4).
  if (kind_ != RefKind::kKv) return child;
  // KV: a null side drops the data of the whole merged edge.
  if (!parent || !child) return std::nullopt;
  // REQUIRES: adjacent edges (production does not check; callers must not do otherwise).
  KV_CHECK(parent->to == child->from,
           "KV merge of non-adjacent edges [" + std::to_string(parent->from) + ", " +
               std::to_string(parent->to) + ") and [" + std::to_string(child->from) + ", " +
               std::to_string(child->to) + ")");
  RefSnapshot merged{kind_, parent->from, child->to, std::move(parent->tokens)};
  merged.tokens.Concat(child->tokens);
  return merged;
}

std::pair<RefSnap, RefSnap> RefCache::Split(RefSnap snap, int64_t at) const {
  if (snap) CheckSnapshotShape(*snap, kind_);
  if (kind_ != RefKind::kKv) return {std::nullopt, std::move(snap)};  // cannot split
  if (!snap) return {std::nullopt, std::nullopt};
  const int64_t i = at - snap->from;
  const int64_t n = snap->to - snap->from;
  if (i <= 0) return {std::nullopt, std::move(snap)};
  if (i >= n) return {std::move(snap), std::nullopt};
  RefSnapshot parent{kind_, snap->from, at, Slice(snap->tokens, 0, i)};
  RefSnapshot child{kind_, at, snap->to, Slice(snap->tokens, i, n)};
  return {std::move(parent), std::move(child)};
}

void RefCache::ReadState() {
  KV_CHECK(kind_ == RefKind::kRecurrent, "only a recurrent layer's state is read alone");
  has_state_ = true;
}

void RefCache::Free() {
  log_.Clear();
  has_state_ = false;
  kv_capacity_ = 0;
  rotating_rows_ = 0;
  // The schedule is dropped with its captures (the production cache must close them).
  schedule_active_ = false;
  scheduled_.clear();
  captured_.clear();
  base_ = 0;
}

PositionRange ExpectedHistoryRange(RefKind kind, int64_t window, int64_t o, int64_t query_len) {
  KV_CHECK(kind != RefKind::kRecurrent, "a recurrent layer returns no attention history");
  KV_CHECK(o >= 0 && query_len >= 1, "a forward writes at least one token at o >= 0");
  int64_t oldest = 0;
  if (kind == RefKind::kRotating) {
    KV_CHECK(window >= 1, "a sliding window holds at least one token");
    // Batched: concat keeps W-1 older tokens so the first query sees a full window.
    // Decode: the ring holds the newest W positions.
    const int64_t held =
        query_len > 1 ? std::min(o, window - 1) + query_len : std::min(o + 1, window);
    oldest = o + query_len - held;
  }
  return PositionRange{oldest, o + query_len};
}

std::vector<int64_t> ExpectedHistoryPositions(RefKind kind, int64_t window, int64_t o,
                                              int64_t query_len) {
  const PositionRange range = ExpectedHistoryRange(kind, window, o, query_len);
  std::vector<int64_t> positions;
  for (int64_t k = range.first; k < range.end; ++k) positions.push_back(k);
  return positions;
}

void ExpectedVisibleRangesInto(RefKind kind, int64_t window, int64_t o, int64_t query_len,
                               int64_t p, const RefMask& mask, std::vector<PositionRange>& out) {
  KV_CHECK(o <= p && p < o + query_len, "the query must be one of the forward's tokens");
  out.clear();
  const PositionRange held = ExpectedHistoryRange(kind, window, o, query_len);
  // The window is intersected after relaxation: a rectangle never reopens outside it.
  const int64_t lo = kind == RefKind::kRotating ? std::max(held.first, p - window + 1) : held.first;
  const auto add = [&](int64_t first, int64_t end) {
    first = std::max(first, lo);
    end = std::min(end, held.end);
    if (first < end) out.push_back(PositionRange{first, end});
  };
  add(held.first, mask.causal ? p + 1 : held.end);
  for (const RefRect& r : mask.rects) {
    if (r.q_lo <= p && p < r.q_hi) add(r.k_lo, r.k_hi);
  }
  CanonicalizeRanges(out);
  for (const RefRect& b : mask.blocks) {
    if (b.q_lo > p || p >= b.q_hi || b.k_lo >= b.k_hi) continue;
    // Cut [k_lo, k_hi) out of every range; a range can split in two. The pieces go behind
    // the ranges they come from, in order, and the originals are dropped: `out` keeps its
    // buffer (callers pass a scratch; this runs for every query of every checked forward).
    const size_t n = out.size();
    for (size_t i = 0; i < n; ++i) {
      const PositionRange r = out[i];
      if (r.first < b.k_lo) out.push_back({r.first, std::min(r.end, b.k_lo)});
      if (r.end > b.k_hi) out.push_back({std::max(r.first, b.k_hi), r.end});
    }
    out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n));
  }
}

void CanonicalizeRanges(std::vector<PositionRange>& ranges) {
  const auto by_first = [](const PositionRange& a, const PositionRange& b) {
    return a.first < b.first;
  };
  if (!std::is_sorted(ranges.begin(), ranges.end(), by_first)) {
    std::sort(ranges.begin(), ranges.end(), by_first);
  }
  size_t kept = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (kept > 0 && ranges[i].first <= ranges[kept - 1].end) {
      ranges[kept - 1].end = std::max(ranges[kept - 1].end, ranges[i].end);
    } else {
      ranges[kept++] = ranges[i];
    }
  }
  ranges.resize(kept);
}

std::vector<int64_t> ExpectedVisible(RefKind kind, int64_t window, int64_t o, int64_t query_len,
                                     int64_t p, const RefMask& mask) {
  KV_CHECK(o <= p && p < o + query_len, "the query must be one of the forward's tokens");
  std::vector<int64_t> visible;
  const PositionRange range = ExpectedHistoryRange(kind, window, o, query_len);
  for (int64_t k = range.first; k < range.end; ++k) {
    bool allowed = !mask.causal || k <= p;
    for (const RefRect& r : mask.rects) {
      if (r.q_lo <= p && p < r.q_hi && r.k_lo <= k && k < r.k_hi) allowed = true;
    }
    // The window is intersected after relaxation: a rectangle never reopens outside it.
    if (kind == RefKind::kRotating && k < p - window + 1) allowed = false;
    for (const RefRect& b : mask.blocks) {
      if (b.q_lo <= p && p < b.q_hi && b.k_lo <= k && k < b.k_hi) allowed = false;
    }
    if (allowed) visible.push_back(k);
  }
  return visible;
}

}  // namespace kvtwin::model
