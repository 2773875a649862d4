// RefCache: the naive reference for one layer cache (spec §5.1): the cache is its token log.
// Every observable (offset, boolean outcome of Restore/Split/Merge, snapshot ranges and
// contents, capture-schedule entries, which positions attention sees) is re-derived from
// the log with ordered containers and no capacity tricks; a KV cache's slot capacity and a
// window buffer's row count are the numbers kept beside the log, because spec §2.1 and
// §2.2 fix how they grow and they are what the cache's memory (LiveBytes) and a window
// snapshot's size (spec §7) report. Written from the spec, never from
// src/. A Token carries the provenance hash h_p that the driver derived for it; the model
// treats it as opaque data. Single-threaded value type.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "model/shared_log.h"
#include "src/core/status.h"

namespace kvtwin::model {

enum class RefKind : uint8_t { kKv, kRotating, kRecurrent };

struct RefSnapshot {
  RefKind kind = RefKind::kKv;
  int64_t from = 0;  // KV: first position; rotating: the label spec §2.2 gives the range
  int64_t to = 0;    // KV: end (exclusive); whole-state kinds: the state's offset
  // KV: the tokens of [from, to); whole-state kinds: tokens [0, to), sharing their prefix
  // with the log they were taken from (SharedLog), so a snapshot per block stays linear.
  SharedLog tokens;
  // Rotating: the buffer rows the snapshot holds (spec §7: a clone of State() or a window
  // slice of min(o, W)), what its bytes and a restore's buffer follow; 0 = not modeled (a
  // snapshot built from a range alone, whose `from` is not modeled either) and always 0
  // for the other kinds.
  int64_t rows = 0;
};
// What a snapshot's bytes are a multiple of (spec §7): KV rows to - from, a rotating
// snapshot's rows, one whole recurrent state. REQUIRES: a rotating snapshot's rows modeled.
int64_t SnapshotUnits(const RefSnapshot& snap);
using RefSnap = std::optional<RefSnapshot>;  // nullopt = a null snapshot

class RefCache {
 public:
  static RefCache Kv();
  static RefCache Rotating(int64_t window);
  static RefCache Recurrent();

  RefKind kind() const { return kind_; }
  int64_t window() const { return window_; }
  int64_t Offset() const { return static_cast<int64_t>(log_.size()); }
  std::span<const Token> log() const { return log_.span(); }
  // Whether live state exists (a buffer for attention kinds, conv/delta for recurrent):
  // created by a write or a snapshot restore, dropped by Free.
  bool HasState() const { return has_state_; }
  // KV only: the slots the buffer has (0 without one). Spec §2.1 append step 2: a new buffer
  // holds ceil(n / 256) * 256 slots; an append past the capacity adds that step after the
  // buffer cut to the offset when the offset is not a multiple of 256 (Go slices [0, prev)
  // before concatenating), else after the whole capacity. Rewinds keep it; Free drops it.
  int64_t kv_capacity() const { return kv_capacity_; }
  // Rotating only: the buffer's row count Dim (0 without one), kept beside the log for the
  // same reason as kv_capacity(): spec §2.2 fixes it and it is what the cache's memory and
  // its snapshots' sizes report. A decode grows a linear buffer by min(256, W - offset)
  // when the offset reached it and cuts an oversize one to W; a batched write leaves
  // min(offset, W - 1) + L rows; a snapshot restore installs the snapshot's rows; a live
  // rewind keeps them; Free drops them.
  int64_t rotating_rows() const { return rotating_rows_; }

  // Appends the tokens of one forward (recurrent: only the real, unpadded tokens) and runs
  // the capture rules of the kind. REQUIRES: !tokens.empty(), except on a recurrent layer:
  // a forward of padding alone (spec §2.3 Put: the offset advances by the real length, 0)
  // leaves the log as it is, makes the state exist, and captures the offset it ends on,
  // which is where it started.
  void Write(std::span<const Token> tokens) { Write(tokens, nullptr); }
  // The same, where `leader` is another layer that has just written these tokens and whose
  // log held what this one holds before it did (LogSameAs): this log then takes the
  // leader's rather than a copy of its own (SharedLog::AppendLike). Memory only.
  void Write(std::span<const Token> tokens, const RefCache* leader);
  // Whether this log certainly holds the tokens `other`'s does (SharedLog::SameTokensAs).
  bool LogSameAs(const RefCache& other) const { return log_.SameTokensAs(other.log_); }
  RefSnap Snapshot(int64_t from) const;
  // Same outcome classes as the production cache: FailedPrecondition when a schedule is
  // active, InvalidArgument for an offset behind the cache or unsorted/duplicate offsets.
  Status PrepareSnapshots(const std::vector<int64_t>& offsets);
  std::vector<RefSnap> TakeSnapshots();
  bool ScheduleActive() const { return schedule_active_; }
  // The active schedule's offsets (those already reached included).
  const std::vector<int64_t>& Scheduled() const { return scheduled_; }
  bool Restore(const RefSnapshot* snap, int64_t target);
  RefSnap Merge(RefSnap parent, RefSnap child) const;
  // A committed speculative forward of `forward` (spec §2.7): afterwards the log is the
  // old log plus the first clamp(accepted, 0, |forward|) tokens of `forward`. How the
  // capture schedule sees it depends on the kind: a full KV layer wrote every token
  // through (captures included) and rewound; the others took only the accepted tokens,
  // as one ordinary forward. `split` in (0, |forward|): the forward ran as two, [0, split)
  // then the rest, which a full KV layer wrote through as two appends (its capacity grows
  // per append); 0 = one forward. An isolated speculation changes nothing and has no call
  // here. REQUIRES: !forward.empty(), 0 <= split < |forward|.
  void CommitSpeculation(const TokenLog& forward, int64_t accepted, int64_t split = 0);
  std::pair<RefSnap, RefSnap> Split(RefSnap snap, int64_t at) const;
  void Free();
  // Recurrent only: a forward's Get whose Put never came (the forward was dropped between
  // the layer's read and its write). Spec §2.3 Get creates the zero state when none exists,
  // so the state exists from then on; the offset, the log and the schedule stay (Get
  // captures nothing).
  void ReadState();

 private:
  RefCache(RefKind kind, int64_t window) : kind_(kind), window_(window) {}
  // Offers a capture at `reached` (scheduled, slot empty) made from the current state.
  void CaptureAt(int64_t reached, bool batched_write);
  // The capture rule of the schedule (spec §1.3 captureReached): fills the first empty slot
  // scheduled at `reached` with `snap` and then moves base there, even when `snap` is null.
  void OfferCapture(int64_t reached, RefSnap snap);
  // Whether OfferCapture(reached, ...) would fill a slot.
  bool WantsCapture(int64_t reached) const;
  // The whole-state snapshot {from, to, tokens [0, to)} of the log as it was at `to`.
  RefSnapshot WholeStateAt(int64_t from, int64_t to) const;
  bool RestoreKv(const RefSnapshot* snap, int64_t target);
  bool RestoreRotating(const RefSnapshot* snap, int64_t target);
  bool RestoreRecurrent(const RefSnapshot* snap, int64_t target);

  // KV: the capacity after appending n tokens at offset prev (see kv_capacity()).
  void GrowKv(int64_t prev, int64_t n);
  // Rotating: the rows after writing n tokens at offset prev (see rotating_rows()).
  void GrowRotating(int64_t prev, int64_t n);
  // Rotating: the rows an eager clone of State() holds now, min(offset, Dim).
  int64_t StateRows() const;

  RefKind kind_;
  int64_t window_ = 0;  // rotating only
  SharedLog log_;
  int64_t kv_capacity_ = 0;
  int64_t rotating_rows_ = 0;
  bool has_state_ = false;
  bool schedule_active_ = false;
  std::vector<int64_t> scheduled_;
  std::vector<RefSnap> captured_;
  int64_t base_ = 0;
};

// A logical attention mask as the reference sees it: causal or not, plus relaxation
// rectangles in absolute positions (q in [q_lo, q_hi), k in [k_lo, k_hi) reopened), plus
// blocked rectangles (an additive array's -inf cells: blocked whatever reopens them).
struct RefRect {
  int64_t q_lo, q_hi, k_lo, k_hi;
};
struct RefMask {
  bool causal = true;
  std::vector<RefRect> rects;
  std::vector<RefRect> blocks;
};

// Positions, oldest first, that the history returned by a write of `query_len` tokens at
// offset `o` holds: full KV [0, o+L); rotating batched the newest min(o, W-1) + L; rotating
// decode the newest min(o+1, W).
std::vector<int64_t> ExpectedHistoryPositions(RefKind kind, int64_t window, int64_t o,
                                              int64_t query_len);
// The same positions as a range [first, end): they are always consecutive.
struct PositionRange {
  int64_t first = 0, end = 0;
  friend bool operator==(const PositionRange&, const PositionRange&) = default;
};
PositionRange ExpectedHistoryRange(RefKind kind, int64_t window, int64_t o, int64_t query_len);
// Positions (ascending) that the query at absolute position p attends in that forward:
// keys of the history that the mask allows (causal k <= p, or reopened by a rectangle),
// for a window W only keys k >= p - W + 1, and never a blocked cell.
std::vector<int64_t> ExpectedVisible(RefKind kind, int64_t window, int64_t o, int64_t query_len,
                                     int64_t p, const RefMask& mask);
// The same positions as ranges, ascending, disjoint and never adjacent, into `out`: the same
// rule (the causal prefix or the whole history, plus reopened rectangles, cut to the window)
// taken interval by interval, so a query costs O(rectangles), not O(history). ExpectedVisible
// is the per-key statement of the rule; a property test holds the two equal.
void ExpectedVisibleRangesInto(RefKind kind, int64_t window, int64_t o, int64_t query_len,
                               int64_t p, const RefMask& mask, std::vector<PositionRange>& out);
// Sorts ranges by start and merges the overlapping and adjacent ones: the form
// ExpectedVisibleRangesInto returns, so equal position sets compare equal.
void CanonicalizeRanges(std::vector<PositionRange>& ranges);

}  // namespace kvtwin::model
