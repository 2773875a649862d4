// RotatingCache (spec §2.2), v1: every snapshot is an owned copy. The start-boundary and
// single-token captures are clones of State(); a capture right after a batched write is an
// owned copy of exactly the window slice the lazy path of v2 would name. Hence no lazy
// list, no own-lazy restore fast path and no R4 (sliced linear) regime.
#include "src/rotating_cache.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "src/core/check.h"

namespace kvtwin {
namespace {

const RotatingSnapshot& AsRotating(const CacheSnapshot& snap) {
  KV_CHECK(snap.kind() == CacheKind::kRotating,
           std::string("rotating cache given a ") + CacheKindName(snap.kind()) + " snapshot");
  return static_cast<const RotatingSnapshot&>(snap);
}

}  // namespace

RotatingSnapshot::RotatingSnapshot(int64_t from, int64_t to, int64_t idx, Tensor k, Tensor v)
    : from_(from), to_(to), idx_(idx), k_(std::move(k)), v_(std::move(v)) {
  KV_CHECK(from_ >= 0 && to_ > from_, "rotating snapshot range must be non-empty");
  KV_CHECK(k_.rows() > 0 && k_.rows() == v_.rows(), "rotating snapshot K/V row mismatch");
  KV_CHECK(idx_ >= 0 && idx_ <= k_.rows(), "rotating snapshot cursor outside its buffer");
}

RotatingCache::RotatingCache(int64_t window) : window_(window) {
  KV_CHECK(window >= 1, "rotating cache window must be >= 1");
}

void RotatingCache::Free() {
  // Dropping the tensors lets the next first write pick a new dtype and column count.
  k_ = Tensor();
  v_ = Tensor();
  view_k_ = Tensor();
  view_v_ = Tensor();
  has_buffer_ = false;
  offset_ = 0;
  idx_ = 0;
  schedule_.Reset();
}

SnapshotPtr RotatingCache::Snapshot(int64_t from) {
  if (!has_buffer_ || offset_ <= from) return nullptr;
  // A clone of State() as it is (ring-ordered or oversize) plus the cursor; `from` is
  // informational, restores ignore it.
  const int64_t rows = std::min(offset_, k_.rows());
  return std::make_unique<RotatingSnapshot>(from, offset_, idx_, k_.Rows(0, rows),
                                            v_.Rows(0, rows));
}

Status RotatingCache::PrepareSnapshots(const std::vector<int64_t>& offsets) {
  return schedule_.Prepare(offset_, offsets);
}

std::vector<SnapshotPtr> RotatingCache::TakeSnapshots() { return schedule_.Take(); }

bool RotatingCache::Restore(const CacheSnapshot* snap, int64_t target) {
  // The kind check comes before any outcome, even a false one.
  const RotatingSnapshot* s = snap != nullptr ? &AsRotating(*snap) : nullptr;
  if (target < 0) return false;
  if (s == nullptr) {
    if (target >= offset_) return target == offset_;  // only the no-op succeeds
    // After the ring wrapped, the tokens before the window are gone (spec §1.2).
    if (offset_ > window_) return false;
    offset_ = target;
    idx_ = target;
    return true;
  }
  if (target > s->to()) return false;
  // Clamping a full window would leave it short of the tokens that precede target.
  if (target < s->to() && s->to() > window_) return false;
  // Whole-state restore: the current offset is irrelevant. Keeping the snapshot's cursor
  // is what makes the next single-token write land in the right ring slot.
  k_ = s->k();
  v_ = s->v();
  has_buffer_ = true;
  offset_ = s->to();
  idx_ = s->idx();
  if (target < offset_) {
    offset_ = target;
    idx_ = target;
  }
  return true;
}

SnapshotPtr RotatingCache::Merge(SnapshotPtr parent, SnapshotPtr child) {
  if (parent != nullptr) AsRotating(*parent);
  if (child != nullptr) AsRotating(*child);
  // The child's window supersedes the parent's; the parent is closed on return.
  return child;
}

std::pair<SnapshotPtr, SnapshotPtr> RotatingCache::Split(SnapshotPtr snap, int64_t at) {
  (void)at;  // a whole-window snapshot cannot be divided
  if (snap != nullptr) AsRotating(*snap);
  return {nullptr, std::move(snap)};
}

History RotatingCache::Update(const Tensor& k, const Tensor& v) {
  CheckWrite(k, v);
  const int64_t start = offset_;
  const bool batched = k.rows() > 1;
  // The start boundary is captured before the write, as a clone of the current window
  // (null when the cache is empty). `base` is meaningless for whole-window snapshots.
  if (schedule_.active()) {
    schedule_.CaptureReached(start, [&](int64_t) { return Snapshot(0); });
  }
  History h = batched ? Concat(k, v) : UpdateSingle(k, v);
  for (int64_t o : schedule_.ScheduledIn(start, offset_)) {
    if (o == start) continue;
    // After a single-token write the buffer may be ring-ordered, so slot arithmetic is
    // invalid and the whole State() is cloned; after a concat it is in logical order.
    schedule_.CaptureReached(
        o, [&](int64_t) { return batched ? WindowAt(o) : Snapshot(o - std::min(o, window_)); });
  }
  return h;
}

History RotatingCache::View() const {
  const int64_t rows = has_buffer_ ? std::min(offset_, k_.rows()) : 0;
  if (rows <= window_) return BufferHistory(rows, 1);
  // Oversize (R3): the window is the trailing W rows, already in logical order.
  view_k_.AssignRows(k_, rows - window_, window_);
  view_v_.AssignRows(v_, rows - window_, window_);
  History h;
  h.k = &view_k_;
  h.v = &view_v_;
  h.length = window_;
  h.has_applier = true;
  h.applier = {window_, 1, window_, 0};
  return h;
}

std::pair<Tensor, Tensor> RotatingCache::LogicalTail(int64_t count) const {
  KV_CHECK(count >= 0 && count <= std::min(offset_, window_),
           "logical tail of " + std::to_string(count) + " tokens at offset " +
               std::to_string(offset_) + " W " + std::to_string(window_));
  if (count == 0) return {Tensor(), Tensor()};
  const int64_t rows = k_.rows();
  if (offset_ <= window_ || idx_ == rows) {
    // R1 (slot i holds position i, idx == offset) or R3 (oversize, logical order, idx ==
    // Dim): the newest tokens end at the cursor.
    return {k_.Rows(idx_ - count, count), v_.Rows(idx_ - count, count)};
  }
  // R2: logical j of the W tokens lives in slot (idx + j) mod W; the newest `count` start
  // at j = W - count and may wrap past the end of the buffer.
  KV_CHECK(rows == window_, "wrapped window buffer is not W rows");
  const int64_t first = (idx_ + window_ - count) % window_;
  const int64_t run = std::min(count, window_ - first);
  Tensor k = k_.Rows(first, run);
  Tensor v = v_.Rows(first, run);
  if (run < count) {
    k.AppendRows(k_.Rows(0, count - run));
    v.AppendRows(v_.Rows(0, count - run));
  }
  return {std::move(k), std::move(v)};
}

History RotatingCache::UpdateSingle(const Tensor& k, const Tensor& v) {
  // Step 2: grow toward W while the linear buffer is full.
  if (!has_buffer_ || (offset_ >= k_.rows() && k_.rows() < window_)) {
    const int64_t grow = std::min(kGrowStep, window_ - offset_);
    KV_CHECK(grow > 0, "rotating grow with offset at or past the window");
    if (!has_buffer_) {
      k_ = Tensor(k.dtype(), grow, k.cols());
      v_ = Tensor(v.dtype(), grow, v.cols());
      has_buffer_ = true;
    } else {
      k_.ResizeRows(k_.rows() + grow);
      v_.ResizeRows(v_.rows() + grow);
    }
    idx_ = offset_;
  }
  // Step 3: an oversize buffer (after a batched write) is in logical order; keep its newest
  // W rows so the ring is exactly W slots.
  if (k_.rows() > window_) {
    const int64_t drop = k_.rows() - window_;
    k_.DropFrontRows(drop);
    v_.DropFrontRows(drop);
    idx_ = window_;
  }
  if (idx_ >= window_) idx_ = 0;  // step 4: wrap
  k_.CopyRows(idx_, k, 0, 1);
  v_.CopyRows(idx_, v, 0, 1);
  offset_ += 1;
  idx_ += 1;
  return BufferHistory(std::min(offset_, window_), 1);
}

History RotatingCache::Concat(const Tensor& k, const Tensor& v) {
  const int64_t n = k.rows();
  if (!has_buffer_) {
    k_ = k;
    v_ = v;
    has_buffer_ = true;
  } else {
    if (idx_ < k_.rows()) {
      if (offset_ <= window_) {
        // Not wrapped: slots >= idx are grow padding or stale post-rewind rows.
        k_.ResizeRows(idx_);
        v_.ResizeRows(idx_);
      } else {
        Linearize();
      }
    }
    // Keep the newest W - 1 older tokens: the first query of the batch then sees a full
    // window of W keys including itself.
    const int64_t trim = idx_ - window_ + 1;
    if (trim > 0) {
      k_.DropFrontRows(trim);
      v_.DropFrontRows(trim);
    }
    k_.AppendRows(k);
    v_.AppendRows(v);
  }
  offset_ += n;
  idx_ = k_.rows();
  return BufferHistory(k_.rows(), n);
}

SnapshotPtr RotatingCache::WindowAt(int64_t o) const {
  const int64_t buf_base = offset_ - k_.rows();  // absolute position of slot 0
  const int64_t live = std::min(o, window_);
  if (live <= 0) return nullptr;
  const int64_t begin = o - live - buf_base;
  // Concat keeps W - 1 pre-batch tokens, so the slice never starts before slot 0.
  KV_CHECK(begin >= 0 && o - buf_base <= k_.rows(), "window slice outside the buffer");
  // Cursor = live length so a restore installs a logical-order buffer.
  return std::make_unique<RotatingSnapshot>(o - live, o, live, k_.Rows(begin, live),
                                            v_.Rows(begin, live));
}

void RotatingCache::CheckWrite(const Tensor& k, const Tensor& v) const {
  KV_CHECK(k.rows() >= 1 && v.rows() == k.rows(),
           "rotating write needs K and V with the same row count >= 1");
  if (!has_buffer_) return;  // the first write (also after Free) sets dtype and columns
  KV_CHECK(k.dtype() == k_.dtype() && v.dtype() == v_.dtype(),
           "rotating write dtype differs from the first write");
  KV_CHECK(k.cols() == k_.cols() && v.cols() == v_.cols(),
           "rotating write column count differs from the first write");
}

void RotatingCache::Linearize() {
  const int64_t dim = k_.rows();
  k_ = Tensor::Concat(k_.Rows(idx_, dim - idx_), k_.Rows(0, idx_));
  v_ = Tensor::Concat(v_.Rows(idx_, dim - idx_), v_.Rows(0, idx_));
  idx_ = dim;
}

History RotatingCache::BufferHistory(int64_t key_len, int64_t query_len) const {
  History h;
  h.k = &k_;
  h.v = &v_;
  h.length = key_len;
  h.has_applier = true;
  h.applier = {key_len, query_len, window_, idx_};
  return h;
}

}  // namespace kvtwin
