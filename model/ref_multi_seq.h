// The naive reference for the multi-sequence caches: the ggml causal cache shared by several
// sequences (spec §2.8, §5.2, quirks 6 and 8) and the original LFM2 hybrid cache that adds
// copy-on-write conv slots to it (spec §2.9.1, quirk 7). Written from the spec, never from
// src/.
//
// The reference is per-sequence token logs. Each sequence holds entries {position, Token,
// written position, applied RoPE shifts, logical cell id, physical cell index, retained};
// every observable is re-derived from them with ordered containers:
// * placement (§2.8 step 2): a cell is free when no retained entry of any sequence names its
//   index (a pruned or removed entry frees it; an entry whose forward never ran still holds
//   it); a forward takes the first n free indices in index order, token i the i-th. Reserve
//   passes place nothing. So the model predicts which physical cell holds what;
// * the per-sequence cell ranges [first, last] are state, kept as §2.8 keeps them: extended
//   by a forward, recomputed by window maintenance, CopyPrefix (dst) and a Remove that gets
//   past its cell loop -- a Remove refused on a shared cell leaves the range stale. The
//   current range of a forward is the union of its sequences' ranges (unbounded memory) or
//   the cells window maintenance marks (finite memory), plus the new cells, widened to the
//   padding multiple;
// * visibility (§2.8 mask, §5.2): over the current range, in cell (storage) order, the cells
//   of the query's sequence with pos <= p (unless causal is disabled for that query),
//   pos >= p - (p mod c) when chunked and pos >= p - w (ggml convention: w + 1 tokens);
// * retention: window maintenance drops entries below lowest - memory at each StartForward
//   (lowest = the smallest position of the sequence in the batch, else its largest held
//   position + 1), so the model predicts which positions every sequence holds, CanResume and
//   whether a forward finds the cache full;
// * cell contents: what the K/V rows of each physical cell were last written from (the last
//   Put into it) and the RoPE shifts applied to it since. A freed cell keeps its rows (the
//   §6.13 SWA view [5, 6, 3, 4] shows one), a cell whose forward never ran keeps the rows it
//   held before;
// * a Remove walks the sequence's cells in index order and stops at the first shared cell
//   it would have to shift (quirk 6): the cells before it are already edited (removed from
//   the sequence, or moved without a key shift), the range is not recomputed. With storage
//   order modelled that half-edited state is exact, so every sequence stays predictable.
// The model keeps the full history (pruned entries included, marked not retained) because
// the ideal conv state of the hybrid is defined over it; a refused Remove edits only the
// retained entries it reached.
//
// Rewriting a position without removing it first keeps the old cell (the spec writes a new
// cell and touches no other): both entries are retained and visible. History() (the ideal
// log) keeps only the newest entry per position.
//
// Misuse (empty batches, negative positions, an inverted range) aborts via KV_CHECK: the
// driver replays operations a correct runner would issue. Single-threaded value types.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "model/ref_cache.h"
#include "src/core/ids.h"
#include "src/core/status.h"

namespace kvtwin::model {

inline constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

// The arguments of the ggml cache constructors and Init(maxSeqs, capacity, maxBatch).
struct MultiSeqInit {
  int64_t window = kUnbounded;  // ggml w: a query at p sees [p - w, p]
  int64_t memory = 0;           // 0: the default (= window)
  int64_t chunk = kUnbounded;   // chunked attention; kUnbounded = off
  int32_t max_seqs = 1;
  int64_t capacity = 0;  // tokens per sequence
  int64_t max_batch = 0;
  int64_t padding = 1;          // the backend's cache padding
  bool shift_supported = true;  // whether a RoPE shift callback is installed
};

// The effective configuration after Init. cells == kUnbounded: an endless cell table (a
// forward is never full; placement is still first-fit).
struct MultiSeqConfig {
  int64_t window = kUnbounded;
  int64_t memory = kUnbounded;
  int64_t chunk = kUnbounded;
  int32_t max_seqs = 1;
  int64_t cells = kUnbounded;
  bool shift_supported = true;
  int64_t padding = 1;  // the current range is widened to multiples of it
  // The cells per RoPE shift call of a Remove (§2.8: the sequence's range in windows of
  // max_batch); unbounded: one call.
  int64_t max_batch = kUnbounded;
};

// Init's rules (§2.8): memory defaults to the window; a finite window with several
// sequences keeps one more (the stop token); memory >= capacity means unbounded; cells =
// max_seqs x capacity (unbounded memory) or max_seqs x memory + max_batch, rounded up to the
// padding. InvalidArgument when memory < window (fatal in the original).
// REQUIRES: max_seqs, capacity, max_batch, padding, chunk >= 1; window, memory >= 0.
Result<MultiSeqConfig> ResolveMultiSeqConfig(const MultiSeqInit& init);

struct MsToken {
  SeqId seq{};
  int64_t pos = 0;
  Token token;
  friend bool operator==(const MsToken&, const MsToken&) = default;
};
using MsBatch = std::vector<MsToken>;

// What a cell's K/V rows hold: the row the forward computed for `token` at `written_pos`,
// then RoPE-shifted by each of `shifts` in order (V rows never move).
struct MsRows {
  Token token;
  int64_t written_pos = 0;
  std::vector<int64_t> shifts;
  int64_t Shift() const;  // sum of shifts
  friend bool operator==(const MsRows&, const MsRows&) = default;
};

// One entry of a sequence as a checker sees it. The expected rows of a retained entry with
// data are {token, written_pos, shifts} (their sum is pos - written_pos unless a Remove ran
// without a shift callback or was refused half-way).
struct MsEntry {
  int64_t pos = 0;
  Token token;
  int64_t written_pos = 0;
  std::vector<int64_t> shifts;
  uint64_t cell = 0;      // logical cell id: one per write; equal ids = one shared cell
  int64_t index = 0;      // the physical cell it was placed in
  bool retained = true;   // false: dropped by window maintenance (history only)
  bool has_data = true;   // false: metadata committed, forward never ran (no Put)
  int64_t Shift() const;  // sum of shifts
  friend bool operator==(const MsEntry&, const MsEntry&) = default;
};

// One physical cell: its metadata and what its rows hold.
struct MsCell {
  int64_t pos = 0;             // meaningful while seqs is not empty
  std::vector<SeqId> seqs;     // ascending; empty = free
  std::optional<MsRows> rows;  // nullopt: never written
  friend bool operator==(const MsCell&, const MsCell&) = default;
};

// A cell range: [first, last] of a sequence, or a current range [begin, end).
using MsSpan = std::pair<int64_t, int64_t>;

// A cell a batch token attends: where it is and the position it holds.
struct MsVisibleCell {
  int64_t index = 0;
  int64_t pos = 0;
  friend bool operator==(const MsVisibleCell&, const MsVisibleCell&) = default;
};

// The message of the ResourceExhausted a failing RoPE shift callback returns (a shift graph
// that cannot be allocated); the drivers' callback and RefMultiSeqCache::Remove share it.
inline constexpr const char* kShiftFailure = "RoPE shift: out of memory";

class RefMultiSeqCache {
 public:
  explicit RefMultiSeqCache(MultiSeqConfig config);
  const MultiSeqConfig& config() const { return config_; }

  // StartForward (not reserving) then Put: window maintenance, then ResourceExhausted when
  // fewer than batch.size() cells are free (the pruning stays, nothing is placed), else
  // first-fit placement. REQUIRES: !batch.empty(), positions >= 0.
  Status Forward(const MsBatch& batch);
  // The two halves, for a cache wrapping this one: the entries of a successful StartForward
  // have no data until Put. REQUIRES for Put: the last operation was a successful
  // StartForward, or CopyPrefix / Remove edits after one. Such edits leave the forward open:
  // Put writes the cells StartForward chose, whatever sequences they hold by then (the
  // sharers a CopyPrefix gave them included, or none after a Remove), and Locations,
  // CurrentRange and Visible still answer for it (Visible over the metadata as it is now;
  // the mask StartForward built is the caller's to remember).
  Status StartForward(const MsBatch& batch);
  void Put();
  // The Put of a reserve pass whose graph runs (§2.8: reserving chooses locations 0..n-1 and
  // changes no metadata, and Put scatters the batch's rows into the chosen cells): cells
  // 0..n-1 hold the batch's rows, whatever sequences they hold. The metadata, the pending
  // forward and every entry stay as they are. REQUIRES: !batch.empty(), n <= the cells.
  void ReservePut(const MsBatch& batch);
  // dst := src's entries with pos < len (history and retention included; retained ones
  // share src's cells); dst's range is recomputed. src == dst empties the sequence (dst is
  // cleared first). REQUIRES: len >= 0.
  void CopyPrefix(SeqId src, SeqId dst, int64_t len);
  // §2.8 Remove over the sequence's cells in index order. Predicted outcomes: Unsupported
  // "shifting cells shared by multiple sequences" at the first retained cell at pos >= end
  // another sequence shares (the cells before it already edited, no key shift, the range
  // left stale); Unsupported "shift not supported" when end is finite, cells remain and no
  // shift callback exists (positions moved, keys not shifted); else ok (a sequence left
  // without cells returns before shifting). REQUIRES: 0 <= begin <= end.
  // `failing_shift_call` >= 0: the shift callback fails on that call (0-based; one call per
  // group of max_batch cells from the sequence's first cell that holds a cell to move, spec
  // §2.8): the groups before it are shifted, it and the rest are not, and the callback's
  // error ResourceExhausted comes back (positions already moved). A call past the last one
  // never happens, so nothing fails.
  Status Remove(SeqId seq, int64_t begin, int64_t end, int64_t failing_shift_call = -1);
  // §2.8: true with unbounded memory; else false without retained entries, else
  // max(0, pos - window) >= first && pos <= last + 1 over the retained positions (what the
  // cache holds now: pruning happens lazily, at the StartForwards, not when a position
  // leaves the window).
  bool CanResume(SeqId seq, int64_t pos) const;

  // The last successful StartForward (InForward): the cell of each batch token and the
  // current range [begin, end), padding-widened. REQUIRES: the last operation was one.
  bool InForward() const { return last_batch_.has_value(); }
  const std::vector<int64_t>& Locations() const;
  MsSpan CurrentRange() const;
  // What batch token i attends (§2.8 mask, §5.2): the entries of the cells of the current
  // range it sees, in cell order; duplicates of a rewritten position appear once per cell.
  // REQUIRES: `batch` is the batch of the last operation, a successful StartForward;
  // i < batch.size().
  std::vector<MsEntry> Visible(const MsBatch& batch, size_t i, bool causal_disabled) const;
  // Visible into `out` (replaced; its capacity is reused).
  void VisibleInto(const MsBatch& batch, size_t i, bool causal_disabled,
                   std::vector<MsEntry>& out) const;
  std::vector<int64_t> VisiblePositions(const MsBatch& batch, size_t i, bool causal_disabled) const;
  // VisibleInto for every token at once, cells and positions only (what a mask check compares):
  // out[i] for token i, causal off for the indices in `causal_off`. Each sequence's cells are
  // sorted once, not once per token (a ubatch of 512 over thousands of cells). Same REQUIRES.
  void VisibleCellsInto(const MsBatch& batch, const std::vector<int64_t>& causal_off,
                        std::vector<std::vector<MsVisibleCell>>& out) const;
  // What batch token i of a reserve pass sees (§5.2: no metadata change, the whole cache as
  // the current range): the same mask conditions over every cell as they are now, causal
  // unless SetCausal disabled it for i. Any batch.
  void ReserveVisibleInto(const MsBatch& batch, size_t i, bool causal_disabled,
                          std::vector<MsEntry>& out) const;

  // The cells holding `seq` (exact), ascending by position then write order.
  std::vector<MsEntry> Retained(SeqId seq) const;
  std::vector<int64_t> RetainedPositions(SeqId seq) const;
  // RetainedPositions into `out` (replaced; its capacity is reused): for checkers that ask
  // after every op and would otherwise allocate a fresh vector each time.
  void RetainedPositionsInto(SeqId seq, std::vector<int64_t>& out) const;
  // The retained positions a resumption at last + 1 attends (pos >= last + 1 - window): a
  // lower bound that holds for any pruning policy, for checkers that do not pin §2.8's.
  std::vector<int64_t> RetainedAtLeast(SeqId seq) const;
  // The ideal log: newest entry per position, pruned ones included, ascending.
  std::vector<MsEntry> History(SeqId seq) const;
  // History into `out` (replaced; its capacity is reused).
  void HistoryInto(SeqId seq, std::vector<MsEntry>& out) const;
  // Sequences holding at least one cell, ascending.
  std::vector<SeqId> Sequences() const;
  // Distinct live cells.
  int64_t UsedCells() const;
  // The cell table, indices [0, n): n = cells, or one past the highest index ever placed
  // when cells is unbounded.
  std::vector<MsCell> Cells() const;
  // Cells into `out` (replaced): the vector and each cell's sequence list keep their
  // capacity, so a checker that reads the table after every op does not reallocate it.
  void CellsInto(std::vector<MsCell>& out) const;
  // The per-sequence ranges [first, last] as §2.8 keeps them (possibly stale, see above);
  // sequences without one are absent.
  const std::map<SeqId, MsSpan>& Ranges() const { return ranges_; }

 private:
  struct Seq {
    std::vector<MsEntry> entries;  // sorted by (pos, cell)
  };
  static void Sort(std::vector<MsEntry>& entries);
  const Seq& Of(SeqId seq) const;  // an empty one when unknown
  // The §2.8 mask of batch token i over the cells of `range`.
  // Whether a query at position p sees a cell holding `pos` (§2.8 mask: causal unless
  // disabled, its own chunk, the window), the cell's range aside.
  bool Attends(int64_t p, int64_t pos, bool causal_disabled) const;
  void VisibleOverInto(const MsBatch& batch, size_t i, bool causal_disabled, MsSpan range,
                       std::vector<MsEntry>& out) const;
  // Whether a sequence other than `seq` holds a retained entry in cell `index`.
  bool SharedWithOther(SeqId seq, int64_t index) const;
  // occupied[i] != 0: a retained entry names cell i; indices >= size() are free (nothing is
  // placed at or beyond high_water_). Recomputed from the entries on every call; the buffer is
  // scratch, kept only so the answer does not allocate (it carries no state between calls).
  const std::vector<uint8_t>& Occupied() const;
  // Up to n free cell indices, lowest first (fewer: the cache is full).
  std::vector<int64_t> FirstFree(size_t n) const;
  // Window maintenance of §2.8 step 1; widens `current` by the cells it marks.
  void Prune(const MsBatch& batch, std::optional<MsSpan>& current);
  // The range of `seq` from its retained cells (erased when it has none).
  void RecomputeRange(SeqId seq);
  // The loop of §2.8 Remove over the retained cells in index order; the index of the shared
  // cell that stopped it, if any.
  std::optional<int64_t> EditCells(Seq& s, SeqId seq, int64_t begin, int64_t end, int64_t delta);
  // Forgets the pending Put and the batch Visible answers for.
  void EndForward();
  // What a CopyPrefix or Remove does to the forward: none while its Put is pending.
  void EditEndsForward();

  MultiSeqConfig config_;
  std::map<SeqId, Seq> seqs_;
  std::map<SeqId, MsSpan> ranges_;
  std::map<int64_t, MsRows> rows_;  // physical index -> what its rows hold
  uint64_t next_cell_ = 0;
  int64_t high_water_ = 0;  // one past the highest index ever placed
  // The last successful StartForward.
  std::optional<MsBatch> last_batch_;
  std::vector<int64_t> locations_;
  MsSpan current_{0, 0};
  bool put_pending_ = false;
  bool edited_in_forward_ = false;         // a CopyPrefix or Remove since the pending StartForward
  mutable std::vector<uint8_t> occupied_;  // Occupied()'s scratch
};

// The LFM2 hybrid (§2.9.1): the causal cache above plus one conv state of d_conv rows per
// slot, slots shared copy-on-write. Slots are physical: max_seqs of them, each with a
// refcount and the rows it holds; the free list is a LIFO stack initialised so the first
// allocation returns slot 0, then 1, ...; a slot is pushed back when its refcount reaches 0
// and keeps its rows until it is handed out again (then zeroed). Two expectations per
// sequence:
// * kIdeal: the conv inputs of the last d_conv entries of the sequence's history in position
//   order (zero rows first when it holds fewer) -- what a cache consistent with its KV log
//   would hold;
// * kAsSpecified: what the original holds: the rows of the sequence's slot; CopyPrefix makes
//   dst share src's slot whatever len is; any successful Remove unmaps the sequence (zero
//   state on its next forward); a forward shifts its tokens' inputs in, in batch order.
// ConvDivergesFromIdeal flags the documented weaknesses (quirks 6, 7) as they happen.
enum class ConvMode : uint8_t { kIdeal, kAsSpecified };
using ConvRow = std::vector<float>;
using ConvRows = std::vector<ConvRow>;  // d_conv rows, oldest first
// The conv input row of a token, as the forward that wrote it at `written_pos` computed it.
using ConvInputFn = std::function<ConvRow(int64_t written_pos, const Token& token)>;

class RefHybridCache {
 public:
  // REQUIRES: d_conv >= 1, width >= 1; inputs returns rows of `width` floats.
  RefHybridCache(MultiSeqConfig config, int64_t d_conv, int64_t width, ConvInputFn inputs);
  const RefMultiSeqCache& kv() const { return kv_; }
  // The embedded causal cache on its own: a forward's edits between StartForward and Put
  // (the §2.8 cache as a plain transformer's server edits it; slots do not move).
  RefMultiSeqCache& mutable_kv() { return kv_; }

  // A forward as the original runs it, in three calls:
  // * StartForward: KV StartForward (its errors first), then Unsupported when the batch's
  //   sequences contribute different token counts (KV metadata already committed, no data);
  //   a slot popped for every sequence without one, in first-appearance order
  //   (ResourceExhausted when the stack is empty: the slots popped before stay mapped, not
  //   zeroed); the new slots zeroed. The sequences may interleave in the batch: the conv
  //   update shifts in each sequence's tokens in batch order (the original's model reshapes
  //   the batch to a [tokens, sequences] grid, which its runner keeps contiguous; the cache
  //   itself counts tokens per sequence).
  // * ConvState: the forward's first ConvState runs copy-on-write, in batch order, for every
  //   current sequence whose slot is still shared (refcount > 1) when its turn comes;
  //   ResourceExhausted when the stack runs empty, and the same outcome on every later call.
  //   A model without conv layers never calls it, so nothing is unshared.
  // * FinishForward: the conv update (when ConvState ran) and the KV Put.
  // A forward that fails leaves the rows of the slots it took unknown (its zeroing and copies
  // belong to its graph).
  Status StartForward(const MsBatch& batch);
  Status ConvState();
  void FinishForward();
  // All three; reads_conv = false: a model without conv layers (no ConvState).
  Status Forward(const MsBatch& batch, bool reads_conv = true);
  // A reserve pass whose graph runs (the KV side and the allocator do not move): its conv
  // update writes the fake slots 0..n-1 (spec 2.9.1: "write rows for the current slots"),
  // slot i taking the i-th sequence of the batch (first appearance) shifted in over the rows
  // the slot held, whoever holds it. Unknown rows stay unknown. REQUIRES: a batch the
  // hybrid's StartForward accepts (equal token counts per sequence).
  void ReserveConvWrite(const MsBatch& batch);
  void CopyPrefix(SeqId src, SeqId dst, int64_t len);
  // KV Remove (`failing_shift_call` as there); on success the sequence's slot is released
  // (any range).
  Status Remove(SeqId seq, int64_t begin, int64_t end, int64_t failing_shift_call = -1);
  bool CanResume(SeqId seq, int64_t pos) const { return kv_.CanResume(seq, pos); }

  // nullopt: kAsSpecified and the slot's rows are unknown (a failed forward took it).
  std::optional<ConvRows> ExpectedConv(SeqId seq, ConvMode mode) const;
  // ExpectedConv into `out` (replaced; the rows keep their capacity); false where
  // ExpectedConv is nullopt (out is then unspecified).
  bool ExpectedConvInto(SeqId seq, ConvMode mode, ConvRows& out) const;
  // True when the as-specified state differs from the ideal one or is unknown.
  bool ConvDivergesFromIdeal(SeqId seq) const;
  // The sequences of each live slot, each ascending, groups ordered by first sequence.
  std::vector<std::vector<SeqId>> SlotGroups() const;
  int64_t LiveSlots() const;
  // The physical allocator: the slot a sequence maps to, refcounts, the free stack (back()
  // is handed out next), and the current forward's slots (after copy-on-write once it ran).
  std::optional<int32_t> SlotOf(SeqId seq) const;
  int32_t RefCount(int32_t slot) const;
  // The rows `slot` holds into `out`; false when they are unknown.
  bool SlotRowsInto(int32_t slot, ConvRows& out) const;
  const std::vector<int32_t>& FreeSlots() const { return free_; }
  const std::vector<int32_t>& CurrentSlots() const { return cur_slots_; }

 private:
  struct Slot {
    int32_t refs = 0;
    std::optional<ConvRows> rows;  // what it holds; nullopt: unknown
  };
  ConvRows ZeroRows() const;
  void ZeroRowsInto(ConvRows& out) const;
  void IdealConvInto(SeqId seq, ConvRows& out) const;
  // Drops seq from its slot; pushes the slot when it was the last user.
  void Release(SeqId seq);
  std::optional<int32_t> Pop();
  // Marks the rows of the slots this forward took unknown (its graph never ran).
  void ForgetTaken();
  // Each of `seqs`' tokens of `batch`, in batch order, shifted into the rows of the slot
  // at the same index of `slots`.
  void ShiftIn(const MsBatch& batch, const std::vector<SeqId>& seqs,
               const std::vector<int32_t>& slots);

  RefMultiSeqCache kv_;
  int64_t d_conv_;
  int64_t width_;
  ConvInputFn inputs_;
  std::vector<Slot> slots_;
  std::vector<int32_t> free_;
  std::map<SeqId, int32_t> slot_of_;
  // The current forward.
  std::optional<MsBatch> batch_;
  std::vector<SeqId> cur_seqs_;
  std::vector<int32_t> cur_slots_;
  std::vector<int32_t> taken_;      // zeroed or copied into by this forward
  std::optional<Status> writable_;  // set by the first ConvState
  // Scratch of ConvDivergesFromIdeal and IdealConvInto: overwritten on every call, no state
  // between calls (so copies of the cache and the answers are unaffected).
  mutable ConvRows ideal_scratch_, specified_scratch_;
  mutable std::vector<MsEntry> history_scratch_;  // IdealConvInto's
};

}  // namespace kvtwin::model
