// KvCache (spec §2.1), v1: every snapshot is an owned copy of exactly its slots, so there
// is no lazy list, no own-lazy restore fast path and nothing to materialize before a write.
#include "src/kv_cache.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "src/core/check.h"

namespace kvtwin {
namespace {

// A KV snapshot's allocation is [object | K rows | V rows], each part starting at a multiple
// of the allocator's alignment (the allocation itself is that aligned), so every element is
// aligned whatever the dtypes. Offsets from the start of the allocation:
static_assert(alignof(std::max_align_t) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__,
              "operator new returns memory aligned for any element type");
constexpr size_t RoundUpToAlign(size_t n) {
  constexpr size_t kAlign = alignof(std::max_align_t);
  return (n + kAlign - 1) / kAlign * kAlign;
}
constexpr size_t kKRowsOffset = RoundUpToAlign(sizeof(KvSnapshot));
size_t VRowsOffset(size_t k_bytes) { return RoundUpToAlign(kKRowsOffset + k_bytes); }

// ceil(rows / step) * step: the capacity a grow adds (spec §2.1 append step 2).
int64_t RoundUpToStep(int64_t rows, int64_t step) { return (rows + step - 1) / step * step; }

const KvSnapshot& AsKv(const CacheSnapshot& snap) {
  KV_CHECK(snap.kind() == CacheKind::kFullKv,
           std::string("KV cache given a ") + CacheKindName(snap.kind()) + " snapshot");
  return static_cast<const KvSnapshot&>(snap);
}

}  // namespace

KvSnapshot::KvSnapshot(int64_t from, int64_t to, TensorView k_shape, TensorView v_shape)
    : from_(from),
      to_(to),
      k_dtype_(k_shape.dtype()),
      v_dtype_(v_shape.dtype()),
      k_cols_(k_shape.cols()),
      v_cols_(v_shape.cols()) {}

std::unique_ptr<KvSnapshot> KvSnapshot::Make(int64_t from, int64_t to,
                                             std::initializer_list<TensorView> k_pieces,
                                             std::initializer_list<TensorView> v_pieces) {
  KV_CHECK(from >= 0 && to > from, "KV snapshot range must be non-empty and non-negative");
  KV_CHECK(k_pieces.size() > 0 && v_pieces.size() > 0, "a KV snapshot side has a piece");
  // Σ bytes of one side, whose pieces must share the first piece's dtype and columns.
  const auto side_bytes = [&](std::initializer_list<TensorView> pieces) {
    const TensorView& first = *pieces.begin();
    int64_t rows = 0;
    for (const TensorView& p : pieces) {
      KV_CHECK(p.dtype() == first.dtype() && p.cols() == first.cols(),
               "KV snapshot pieces of one side must share a dtype and column count");
      rows += p.rows();
    }
    KV_CHECK(rows == to - from, "KV snapshot rows must equal its range length");
    return static_cast<size_t>(rows * first.cols() * ElementBytes(first.dtype()));
  };
  const size_t k_bytes = side_bytes(k_pieces);
  const size_t v_bytes = side_bytes(v_pieces);
  char* memory = static_cast<char*>(::operator new(VRowsOffset(k_bytes) + v_bytes));
  std::unique_ptr<KvSnapshot> snap(new (memory)
                                       KvSnapshot(from, to, *k_pieces.begin(), *v_pieces.begin()));
  const auto copy = [](std::initializer_list<TensorView> pieces, char* out) {
    for (const TensorView& p : pieces) {
      const auto n = static_cast<size_t>(p.Bytes());
      if (n > 0) std::memcpy(out, p.data(), n);
      out += n;
    }
  };
  copy(k_pieces, memory + kKRowsOffset);
  copy(v_pieces, memory + VRowsOffset(k_bytes));
  return snap;
}

TensorView KvSnapshot::k() const {
  return TensorView(k_dtype_, reinterpret_cast<const char*>(this) + kKRowsOffset, to_ - from_,
                    k_cols_);
}

TensorView KvSnapshot::v() const {
  const auto k_bytes = static_cast<size_t>(k().Bytes());
  return TensorView(v_dtype_, reinterpret_cast<const char*>(this) + VRowsOffset(k_bytes),
                    to_ - from_, v_cols_);
}

void KvCache::Free() {
  // Dropping the tensors (not just zeroing) lets the next first write pick a new dtype and
  // column count, as a fresh cache would.
  k_ = Tensor();
  v_ = Tensor();
  has_buffer_ = false;
  offset_ = 0;
  schedule_.Reset();
}

SnapshotPtr KvCache::Snapshot(int64_t from) { return Capture(from, offset_); }

Status KvCache::PrepareSnapshots(const std::vector<int64_t>& offsets) {
  return schedule_.Prepare(offset_, offsets);
}

std::vector<SnapshotPtr> KvCache::TakeSnapshots() { return schedule_.Take(); }

bool KvCache::Restore(const CacheSnapshot* snap, int64_t target) {
  // The kind check comes before any outcome, even a false one.
  const KvSnapshot* s = snap != nullptr ? &AsKv(*snap) : nullptr;
  if (target < 0) return false;
  if (s == nullptr) {
    // Live rewind: rows above the new offset stay as stale data (spec §2.1).
    if (target > offset_) return false;
    offset_ = target;
    return true;
  }
  // "Needs base": everything before the snapshot's range must already be live.
  if (target > s->to() || offset_ < s->from()) return false;
  offset_ = s->from();
  Append(s->k(), s->v());
  // A target below the refilled range behaves as a rewind after the refill.
  if (target < offset_) offset_ = target;
  return true;
}

SnapshotPtr KvCache::Merge(SnapshotPtr parent, SnapshotPtr child) {
  // A null side means the edge was never captured: the merged edge has no data either, and
  // the non-null input is closed by going out of scope (spec §2.1, §8.4).
  if (parent == nullptr || child == nullptr) return nullptr;
  const KvSnapshot& p = AsKv(*parent);
  const KvSnapshot& c = AsKv(*child);
  // Go does not check adjacency for owned snapshots; we do, since a gap or overlap would
  // silently mislabel every position after the seam (spec §8.4, our decision).
  KV_CHECK(p.to() == c.from(), "KV Merge of non-adjacent snapshots [" + std::to_string(p.from()) +
                                   "," + std::to_string(p.to()) + ") and [" +
                                   std::to_string(c.from()) + "," + std::to_string(c.to()) + ")");
  return KvSnapshot::Make(p.from(), c.to(), {p.k(), c.k()}, {p.v(), c.v()});
}

std::pair<SnapshotPtr, SnapshotPtr> KvCache::Split(SnapshotPtr snap, int64_t at) {
  if (snap == nullptr) return {nullptr, nullptr};
  const KvSnapshot& s = AsKv(*snap);
  const int64_t i = at - s.from();
  const int64_t n = s.to() - s.from();
  if (i <= 0) return {nullptr, std::move(snap)};
  if (i >= n) return {std::move(snap), nullptr};
  SnapshotPtr parent = KvSnapshot::Make(s.from(), at, {s.k().Rows(0, i)}, {s.v().Rows(0, i)});
  SnapshotPtr child = KvSnapshot::Make(at, s.to(), {s.k().Rows(i, n - i)}, {s.v().Rows(i, n - i)});
  return {std::move(parent), std::move(child)};
}

History KvCache::Update(const Tensor& k, const Tensor& v) {
  const int64_t start = offset_;
  Append(k, v);
  // Edge-local captures: each covers [base, o), base being the previous reached scheduled
  // offset (or the offset at prepare time); CaptureReached then moves base to o.
  for (int64_t o : schedule_.ScheduledIn(start, offset_)) {
    schedule_.CaptureReached(o, [&](int64_t base) { return Capture(base, o); });
  }
  return View();
}

History KvCache::View() const {
  // The full cache needs no applier: slots are in logical order and the plain causal mask
  // applies (spec §2.1).
  History h;
  h.k = &k_;
  h.v = &v_;
  h.length = offset_;  // 0 without a buffer
  return h;
}

void KvCache::Append(TensorView k, TensorView v) {
  const int64_t n = k.rows();
  KV_CHECK(n >= 1 && v.rows() == n, "KV write needs K and V with the same row count >= 1");
  if (has_buffer_) {
    KV_CHECK(k.dtype() == k_.dtype() && v.dtype() == v_.dtype(),
             "KV write dtype differs from the first write");
    KV_CHECK(k.cols() == k_.cols() && v.cols() == v_.cols(),
             "KV write column count differs from the first write");
  }
  const int64_t prev = offset_;
  const int64_t chunk = RoundUpToStep(n, kGrowStep);
  if (!has_buffer_) {
    k_ = Tensor(k.dtype(), chunk, k.cols());
    v_ = Tensor(v.dtype(), chunk, v.cols());
    has_buffer_ = true;
  } else if (prev + n > Capacity()) {
    // Go slices the buffer to [0, prev) before concatenating when prev is not a step
    // multiple, so capacity after growth is prev + chunk there and Cap + chunk otherwise.
    // Only capacity and padding change; rows [0, prev) are kept.
    if (prev % kGrowStep != 0) {
      k_.ResizeRows(prev);
      v_.ResizeRows(prev);
    }
    k_.ResizeRows(k_.rows() + chunk);
    v_.ResizeRows(v_.rows() + chunk);
  }
  k_.CopyRows(prev, k, 0, n);
  v_.CopyRows(prev, v, 0, n);
  offset_ = prev + n;
}

SnapshotPtr KvCache::Capture(int64_t from, int64_t to) const {
  KV_CHECK(from >= 0, "KV snapshot from a negative offset");
  if (!has_buffer_ || to <= from) return nullptr;
  KV_CHECK(to <= offset_, "KV capture beyond the live offset");
  return KvSnapshot::Make(from, to, {TensorView(k_).Rows(from, to - from)},
                          {TensorView(v_).Rows(from, to - from)});
}

}  // namespace kvtwin
