// The naive reference for the multi-sequence caches: the ggml causal cache shared by several
// sequences (spec §2.8, §5.2, quirks 6 and 8) and the original LFM2 hybrid cache that adds
// copy-on-write conv slots to it (spec §2.9.1, quirk 7). Written from the spec, never from
// src/.
//
// The reference is per-sequence token logs. Each sequence holds entries {position, Token,
// written position, applied RoPE shifts, logical cell id, retained}; every observable is
// re-derived from them with ordered containers:
// * visibility (§5.2): the retained entries of the query's sequence with pos <= p (unless
//   causal is disabled for that query), pos >= p - (p mod c) when chunked and pos >= p - w
//   (ggml convention: w + 1 tokens), the batch's own tokens included;
// * retention: window maintenance is a deterministic rule over sequence-level facts (each
//   StartForward drops entries below lowest - memory), so the model predicts exactly which
//   positions every sequence still holds, CanResume, and -- with a known cell count --
//   whether a forward finds the cache full;
// * sharing: a logical cell id names the production cell an entry lives in. A forward makes
//   one fresh id per token; CopyPrefix gives dst src's ids. Entries of two sequences with
//   one id are one shared cell; that lineage decides the "shifting shared cells" refusal.
//   Physical cell indices, LIFO slot order and storage order are not modelled.
//
// What the spec leaves unpredictable at sequence level is made explicit, never guessed:
// * a Remove refused for a shared cell has already modified cells in storage order (quirk
//   6): the sequence becomes indeterminate; only Remove(seq, 0, kUnbounded) or a CopyPrefix
//   into it makes it determinate again (the original runner clears it at once). Meanwhile
//   queries on it, CopyPrefix from it, and -- since cell counts and sharing are unknown --
//   every Forward and every Remove with a finite end abort;
// * a StartForward whose forward never ran (the hybrid refused it after the KV side had
//   committed its metadata) leaves entries without data (has_data == false): their positions
//   are exact, their K/V rows are whatever the cells held before.
// The model keeps the full history (pruned entries included, marked not retained) because
// the ideal conv state of the hybrid is defined over it.
//
// Rewriting a position without removing it first keeps the old cell (the spec writes a new
// cell and touches no other): both entries are retained and visible. History() (the ideal
// log) keeps only the newest entry per position.
//
// Misuse (empty batches, negative positions, an inverted range, touching an indeterminate
// sequence) aborts via KV_CHECK: the driver replays operations a correct runner would issue.
// Single-threaded value types.
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

// The effective configuration after Init. cells == kUnbounded: the cell count is not
// modelled and a forward is never predicted to find the cache full.
struct MultiSeqConfig {
  int64_t window = kUnbounded;
  int64_t memory = kUnbounded;
  int64_t chunk = kUnbounded;
  int32_t max_seqs = 1;
  int64_t cells = kUnbounded;
  bool shift_supported = true;
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

// One entry of a sequence as a checker sees it. The expected K row of a cell is the row the
// forward computed for `token` at `written_pos`, then RoPE-shifted by each of `shifts` in
// order (their sum is pos - written_pos unless a Remove ran without a shift callback).
struct MsEntry {
  int64_t pos = 0;
  Token token;
  int64_t written_pos = 0;
  std::vector<int64_t> shifts;
  uint64_t cell = 0;      // logical cell id: equal ids in two sequences = one shared cell
  bool retained = true;   // false: dropped by window maintenance (history only)
  bool has_data = true;   // false: metadata committed, forward never ran (no Put)
  int64_t Shift() const;  // sum of shifts
  friend bool operator==(const MsEntry&, const MsEntry&) = default;
};

class RefMultiSeqCache {
 public:
  explicit RefMultiSeqCache(MultiSeqConfig config);
  const MultiSeqConfig& config() const { return config_; }

  // StartForward (not reserving) then Put: window maintenance, then ResourceExhausted when
  // the live cells plus the batch exceed `cells` (the pruning stays, nothing is written),
  // else one fresh cell per token. REQUIRES: !batch.empty(), positions >= 0, no sequence
  // indeterminate.
  Status Forward(const MsBatch& batch);
  // The two halves, for a cache wrapping this one: the entries of a successful StartForward
  // have no data until Put. REQUIRES for Put: the last operation was a successful
  // StartForward.
  Status StartForward(const MsBatch& batch);
  void Put();
  // dst := src's entries with pos < len (history and retention included; retained ones
  // share src's cells). src == dst empties the sequence (dst is cleared first).
  // REQUIRES: len >= 0; src determinate unless src == dst.
  void CopyPrefix(SeqId src, SeqId dst, int64_t len);
  // Drops [begin, end); with a finite end moves later entries by begin - end. Predicted
  // outcomes: Unsupported "shifting shared cells" when a retained entry at pos >= end is
  // shared (the sequence becomes indeterminate); Unsupported "not supported" when end is
  // finite, entries remain and no shift callback exists (positions moved, keys not
  // shifted); else ok (a sequence left without cells returns before shifting).
  // REQUIRES: 0 <= begin <= end; the sequence determinate unless this is (0, kUnbounded).
  Status Remove(SeqId seq, int64_t begin, int64_t end);
  // §2.8: true with unbounded memory; else false without retained entries, else
  // max(0, pos - window) >= first && pos <= last + 1 over the retained positions (what the
  // cache holds now: pruning happens lazily, at the StartForwards, not when a position
  // leaves the window). REQUIRES: seq determinate.
  bool CanResume(SeqId seq, int64_t pos) const;

  // What batch token i attends (§5.2), ascending by position then write order; duplicates
  // of a rewritten position appear once per cell. REQUIRES: `batch` is the batch of the
  // last operation, a successful StartForward; i < batch.size().
  std::vector<MsEntry> Visible(const MsBatch& batch, size_t i, bool causal_disabled) const;
  std::vector<int64_t> VisiblePositions(const MsBatch& batch, size_t i, bool causal_disabled) const;

  // The cells holding `seq` (exact), ascending by position then write order.
  std::vector<MsEntry> Retained(SeqId seq) const;
  std::vector<int64_t> RetainedPositions(SeqId seq) const;
  // The retained positions a resumption at last + 1 attends (pos >= last + 1 - window): a
  // lower bound that holds for any pruning policy, for checkers that do not pin §2.8's.
  std::vector<int64_t> RetainedAtLeast(SeqId seq) const;
  // The ideal log: newest entry per position, pruned ones included, ascending.
  std::vector<MsEntry> History(SeqId seq) const;
  // Sequences holding at least one cell, ascending.
  std::vector<SeqId> Sequences() const;
  bool Determinate(SeqId seq) const;
  // Distinct live cells; nullopt while a sequence is indeterminate.
  std::optional<int64_t> UsedCells() const;

 private:
  struct Seq {
    std::vector<MsEntry> entries;  // sorted by (pos, cell)
    bool determinate = true;
  };
  static void Sort(std::vector<MsEntry>& entries);
  const Seq* Find(SeqId seq) const;
  const Seq& Determined(SeqId seq) const;
  bool AnyIndeterminate() const;
  // Whether a sequence other than `seq` holds a retained entry of `cell`.
  bool SharedWithOther(SeqId seq, uint64_t cell) const;
  // Window maintenance of §2.8 step 1.
  void Prune(const MsBatch& batch);
  // Forgets the pending Put and the batch Visible answers for.
  void EndForward();

  MultiSeqConfig config_;
  std::map<SeqId, Seq> seqs_;
  uint64_t next_cell_ = 0;
  std::optional<MsBatch> last_batch_;                 // set by a successful StartForward
  std::optional<std::pair<uint64_t, uint64_t>> put_;  // cells [first, last) awaiting Put
};

// The LFM2 hybrid (§2.9.1): the causal cache above plus one conv state of d_conv rows per
// slot, slots shared copy-on-write. Two expectations per sequence:
// * kIdeal: the conv inputs of the last d_conv entries of the sequence's history in position
//   order (zero rows first when it holds fewer) -- what a cache consistent with its KV log
//   would hold;
// * kAsSpecified: what the original holds: a state per slot; CopyPrefix makes dst share src's
//   current state whatever len is; any successful Remove unmaps the sequence (zero state on
//   its next forward); a forward shifts its tokens' inputs in, in batch order.
// ConvDivergesFromIdeal flags the documented weaknesses (quirk 7) as they happen.
// Slots are modelled as groups of sequences (one group per live slot): refcount of a
// production slot == size of its group, live slots == number of groups; which index a
// group occupies (LIFO reuse) is not predicted.
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

  // KV StartForward (its errors first), then: Unsupported when the batch's sequences
  // contribute different token counts (KV metadata already committed, no data); a slot for
  // every sequence without one, in first-appearance order (ResourceExhausted when all
  // max_seqs slots are live; slots taken before that hold stale rows); copy-on-write for
  // every sequence whose slot is shared (ResourceExhausted likewise); then the conv update
  // and the KV Put. REQUIRES (beyond the KV ones): each sequence's tokens contiguous in the
  // batch when the counts are equal -- the original reshapes the batch to a
  // [tokens, sequences] grid.
  Status Forward(const MsBatch& batch);
  void CopyPrefix(SeqId src, SeqId dst, int64_t len);
  // KV Remove; on success the sequence's slot is released (any range).
  Status Remove(SeqId seq, int64_t begin, int64_t end);
  bool CanResume(SeqId seq, int64_t pos) const { return kv_.CanResume(seq, pos); }

  // nullopt: kAsSpecified and the slot's rows are stale (a failed allocation or copy).
  std::optional<ConvRows> ExpectedConv(SeqId seq, ConvMode mode) const;
  // True when the as-specified state differs from the ideal one or is unknown.
  bool ConvDivergesFromIdeal(SeqId seq) const;
  // The sequences of each live slot, each ascending, groups ordered by first sequence.
  std::vector<std::vector<SeqId>> SlotGroups() const;
  int64_t LiveSlots() const { return static_cast<int64_t>(groups_.size()); }

 private:
  struct Group {
    std::set<SeqId> seqs;
    std::optional<ConvRows> state;  // nullopt: stale rows
  };
  ConvRows ZeroRows() const;
  ConvRows IdealConv(SeqId seq) const;
  // Drops seq from its slot; frees the slot when it was the last user.
  void Release(SeqId seq);
  int64_t NewGroup(SeqId seq, std::optional<ConvRows> state);
  // Slot allocation and copy-on-write of the batch's sequences; the slots touched before a
  // failure get stale rows.
  Status AcquireSlots(const std::vector<SeqId>& order);
  void ShiftIn(const MsBatch& batch, const std::vector<SeqId>& order);

  RefMultiSeqCache kv_;
  int64_t d_conv_;
  int64_t width_;
  ConvInputFn inputs_;
  std::map<int64_t, Group> groups_;  // logical slot -> its sequences and state
  std::map<SeqId, int64_t> group_of_;
  int64_t next_group_ = 0;
};

}  // namespace kvtwin::model
