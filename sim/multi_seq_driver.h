// MultiSeqDriver: lock-step runs of the multi-sequence caches (spec §2.8, §2.9.1, §5.2). One
// production HybridCache (one attention layer over the embedded CausalCache, and
// num_conv_layers short-conv layers) and the reference RefHybridCache receive every MsOp;
// after each op the driver checks, and stops at the first difference:
// * the outcome class (StatusCode) of StartForward, of the forward's first ConvState,
//   CopyPrefix and CanResume's bool; for Remove the code and which refusal it is (a shared
//   cell to shift vs no shift callback);
// * after a successful StartForward, before any ConvState: where each batch token was
//   placed (Locations), the current range, and the slot state (copy-on-write must not have
//   run yet); after the first ConvState the slots again;
// * after a forward, Get(): the range [range_begin, range_end) and, per batch token, the
//   cells it sees in cell order equal the model's Visible; every row of the view is the
//   model's content of that cell (K = the row written at written_pos with its position tag
//   moved by the cell's RoPE shifts; V never moves);
// * every cell, by index: its position and sequences, and its K/V rows (free cells keep
//   theirs); every sequence's cell range;
// * conv: each conv layer's state, as ConvState returns it in a forward and as each mapped
//   slot holds it after every op, against the model's as-specified state (kAsSpecified);
// * slots: refcount == sequences mapped, no leaked or lost slot, and exactly the model's
//   slot per sequence, refcounts and free stack (order included).
// SetCausal is called only when the op disables some causal indices, plus, on every fourth
// step, with an empty list (both paths of "reset at the next StartForward"); on about a third
// of the forwards a decoy list (CausalDecoy) goes first, which the op's list must replace,
// and before half of the non-empty lists the same list with an index past the batch must be
// refused and change nothing.
// Positions go up to int32's last one (K/V tags keep their low 24 bits), ids up to 4,095.
// UpdateConvState of a bf16 cache mostly receives f32 values off the bf16 grid that only
// round-to-nearest-even stores as the model expects (UnroundedConvValue).
// With ConvExpectation::kIdeal a sequence whose as-specified conv state leaves the ideal one
// (the documented weaknesses, spec §8 quirks 6 and 7) is a divergence too; with kAsSpecified
// it is only counted. Values: K/V rows are SyntheticForward::KvRow(layer 0, pos, h), conv
// inputs FillConvInput(layer, pos, h), with h chained per sequence over that sequence's own
// history (so a row of another sequence shows). Every observable is folded into a 64-bit
// digest. Single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "model/ref_multi_seq.h"
#include "sim/checks.h"
#include "sim/multi_seq_ops.h"
#include "sim/synthetic.h"
#include "src/hybrid_cache.h"

namespace kvtwin::sim {

enum class ConvExpectation : uint8_t { kAsSpecified, kIdeal };

// Sequence ids one 64-bit word of sequence bits per cell can tell apart (llama.cpp's
// LLAMA_MAX_SEQ): runs go past it, and the coverage counts forwards that do.
inline constexpr int32_t kSeqBitsPerWord = 64;
// A production context's size (4,096 tokens): the coverage counts forwards over caches and
// positions this large, which only `multiseq --huge` reaches.
inline constexpr int64_t kBigCells = 4096;

// The cache shape of a run: the ggml Init arguments plus the conv side.
struct MultiSeqConfig {
  int64_t window = kvtwin::kUnbounded;  // ggml w (a query sees w + 1 tokens)
  int64_t memory = kvtwin::kUnbounded;  // kUnbounded: the default, = window
  int64_t chunk = 0;                    // 0: off
  int32_t max_seqs = 4;
  int64_t capacity = 32;
  int64_t max_batch = 8;
  int64_t padding = 1;
  bool permuted_v = false;
  DType dtype = DType::kFloat32;
  int64_t kv_cols = 8;
  int32_t num_conv_layers = 1;
  int64_t d_conv = 2;
  int64_t hidden = 4;
  bool shift_supported = true;  // a RoPE shift callback is installed
  ConvExpectation conv = ConvExpectation::kAsSpecified;

  Status Validate() const;
  HybridConfig ToHybrid() const;
  model::MultiSeqInit ToModelInit() const;
  std::string Describe() const;  // one line, every field
  friend bool operator==(const MultiSeqConfig&, const MultiSeqConfig&) = default;
};

struct MsCoverage {
  int64_t forwards = 0;  // successful, not reserving
  int64_t reserves = 0;
  int64_t reserve_puts = 0;         // reserve passes whose graph Puts rows into cells 0..n-1
  int64_t reserve_conv_writes = 0;  // reserve passes whose graph writes the fake conv slots
  int64_t cache_full = 0;
  int64_t unequal_batches = 0;      // refused Unsupported by the hybrid
  int64_t unequal_newcomers = 0;    // of them, with a sequence that held no conv slot
  int64_t unequal_even_totals = 0;  // of them, tokens a multiple of the sequences
  int64_t causal_off = 0;           // forwards with SetCausal indices
  int64_t copy_prefix = 0;
  int64_t copy_prefix_partial = 0;  // len below the source's length
  int64_t removes_tail = 0;
  int64_t removes_whole = 0;
  int64_t removes_middle_shift = 0;
  int64_t removes_refused_shared = 0;
  int64_t removes_refused_no_shift = 0;
  int64_t removes_shift_failed = 0;  // the shift callback failed part way (injected)
  int64_t cow_copies = 0;
  int64_t can_resume_true = 0;
  int64_t can_resume_false = 0;
  int64_t ideal_divergences = 0;       // a sequence newly leaving the ideal conv state
  int64_t rewrites = 0;                // forwards writing a position their sequence holds
  int64_t cache_full_pruned = 0;       // cache full after window maintenance dropped cells
  int64_t unordered_batches = 0;       // forwards whose positions descend within a sequence
  int64_t joins = 0;                   // forwards where a new sequence joins others
  int64_t removes_degenerate = 0;      // finite Removes: begin == end, or past the last position
  int64_t half_edited_ops = 0;         // ops on a sequence a refused Remove left half-edited
  int64_t causal_reset_calls = 0;      // SetCausal with an empty list
  int64_t removes_far_end = 0;         // finite Removes ending at or past int32's largest value
  int64_t far_batches = 0;             // forwards with a position past 2^24 (inexact as a float)
  int64_t last_position_batches = 0;   // forwards with a token at int32's largest position
  int64_t high_id_batches = 0;         // forwards with a sequence id >= kSeqBitsPerWord
  int64_t forward_edits = 0;           // CopyPrefix / Remove between a StartForward and its Put
  int64_t forward_edits_on_batch = 0;  // of them, a Remove of or CopyPrefix onto a batch seq
  int64_t big_cache_forwards = 0;      // forwards started with kBigCells or more cells in use
  int64_t deep_batches = 0;            // forwards with a position kBigCells or more past 0
  int64_t refused_puts = 0;            // malformed Puts refused before a forward's Put
  int64_t interleaved_batches = 0;     // forwards where a sequence's tokens are not one run
  std::string ToString() const;
  MsCoverage& operator+=(const MsCoverage& o);
  // Every counter by name ("forwards", ...), in declaration order.
  struct Field {
    const char* name;
    int64_t MsCoverage::*member;
  };
  static const std::vector<Field>& Fields();
};

struct MsDivergence {
  int64_t step = 0;
  std::string op;
  Mismatch mismatch;
  std::string ToString() const;  // multi-line human report
};

// Whether `op` is one a correct runner may issue to a cache of shape `config` whose reference
// state is `ref` (the reference's REQUIREs plus production's argument rules: batch sizes and
// ids in range, indeterminate sequences only cleared).
// Shared by the driver and by generators that keep their own reference.
bool ValidMsOp(const MultiSeqConfig& config, const model::RefMultiSeqCache& ref, const MsOp& op);

// A mismatch of two lists of cells or positions: `what` plus the index where they first
// differ, both lists as IntRuns. REQUIRES: want != got.
Mismatch ListMismatch(const std::string& what, const std::vector<int64_t>& want,
                      const std::vector<int64_t>& got);

// The f32 value a forward hands UpdateConvState for a conv value `exact` the cache must
// store. The cache stores each value rounded once, to nearest even, to its dtype (spec
// §2.9.1), but every conv value of a run is already exact in that dtype, so handed over as is
// it passes any rounding that keeps exact values. For a bf16 cache the 16 bits bf16 drops are
// filled so that round-to-nearest-even alone gives `exact` back; `variant` (taken mod 4):
//   0: a quarter ulp toward zero: rounds up (truncation stores one ulp less);
//   1: a quarter ulp away from zero: rounds down (rounding away from zero: one ulp more);
//   2: `exact` even (last kept bit 0): the tie below it (truncation, ties toward zero: one
//      ulp less); odd: one bit above that tie (rounding twice, first onto the tie, then to
//      even: one ulp less);
//   3: the mirror of 2 above `exact` (ties away from zero, rounding twice: one ulp more).
// Zero, non-finite values and f32 pass unchanged. REQUIRES: `exact` is exact in `dtype`.
float UnroundedConvValue(DType dtype, float exact, uint32_t variant);

// The list a forward passes to SetCausal before the op's own, or nullopt. SetCausal replaces
// the forward's list (spec §2.8), so the op's list is what holds in the end and the model
// needs no change; a cache that adds to the list instead ends with more indices disabled
// (decoy and op list together always disable more than the op's list; so none when the op
// disables every index). Chosen for about a third of the non-reserving forwards: all
// indices, or those the op leaves causal. A pure function of the op, so replaying or
// shrinking a trace makes the same calls.
std::optional<std::vector<int64_t>> CausalDecoy(const MsOp& op);

class MultiSeqDriver {
 public:
  // REQUIRES: config.Validate().ok(). A production/model disagreement on the derived cell
  // count or memory is a divergence at step 0, before any op.
  MultiSeqDriver(MultiSeqConfig config, uint64_t value_seed);

  // Applies `op` to both caches and checks; returns the first divergence (also kept).
  // REQUIRES: no divergence yet; Valid(op).
  std::optional<MsDivergence> Apply(const MsOp& op);
  // ValidMsOp against the driver's reference.
  bool Valid(const MsOp& op) const { return ValidMsOp(config_, model_.kv(), op); }

  const MultiSeqConfig& config() const { return config_; }
  const model::RefHybridCache& model() const { return model_; }
  const HybridCache& cache() const { return *cache_; }
  // For tests that plant wrong state in production; the next check must report it.
  HybridCache& mutable_cache() { return *cache_; }
  // Re-runs every after-op check without an op (tests of planted state).
  std::optional<MsDivergence> CheckNow();
  // Always true: the model predicts a refused Remove cell by cell, so no sequence is left
  // unpredictable. Kept for callers written when a refusal made the sequence indeterminate.
  bool Determinate(int32_t /*seq*/) const { return true; }
  int64_t steps() const { return steps_; }
  uint64_t digest() const { return digest_; }
  const MsCoverage& coverage() const { return coverage_; }
  const std::optional<MsDivergence>& divergence() const { return divergence_; }

 private:
  // The op's batch as model tokens, each h chained over its sequence's history.
  model::MsBatch Tokens(const MsOp& op);
  model::ConvRow ConvInput(int64_t written_pos, uint64_t h) const;  // all layers side by side
  void ConvInputInto(int64_t written_pos, uint64_t h, model::ConvRow& out);

  Check ApplyForward(const MsOp& op);
  Check ApplyReserve(const MsOp& op);
  // After every StartForward (started: it succeeded): seqs(), num_seqs(), seq_tokens(),
  // slots() (empty after a refusal) and supported_for_batch().
  Check CheckForwardDescriptors(const MsOp& op, bool started) const;
  // in_forward: one of a forward's edits, on the embedded causal cache of both sides.
  Check ApplyCopyPrefix(const MsOp& op, bool in_forward = false);
  Check ApplyRemove(const MsOp& op, bool in_forward = false);
  // The forward's edits between StartForward and Put, each checked as its op is.
  Check ApplyForwardEdits(const MsOp& op);
  Check ApplyCanResume(const MsOp& op);
  // The forward after both StartForwards succeeded: placement, slots, SetCausal, Put, conv.
  Check RunForward(const MsOp& op, const model::MsBatch& batch);
  void CountForward(const MsOp& op);
  // Reads, checks and writes every conv layer of a started forward (the forward's graph);
  // before_rows_ / before_known_ hold each sequence of `order`'s state before the forward.
  // `reserve`: a reserve pass, whose sequence i reads and writes the fake slot i.
  Check RunConv(const model::MsBatch& batch, const std::vector<int32_t>& order,
                bool reserve = false);
  // Put of the batch's K/V rows (put_k_, put_v_), which must succeed (`what` names the call
  // in a report), after ProbeRefusedPut (multi_seq_put.cc).
  Check PutRows(const model::MsBatch& batch, const char* what);
  // On some forwards: a malformed variant of put_k_ / put_v_, which Put must refuse
  // (InvalidArgument) leaving the rows of the forward's cells as they were.
  Check ProbeRefusedPut();
  // Where StartForward placed the batch and the current range it derived.
  Check CheckPlacement() const;
  // `masked`: what each batch token's mask row shows, computed when the mask was last built
  // (edits came after it); null: computed now, from the metadata as it stands.
  Check CheckVisible(const model::MsBatch& batch, const std::vector<int64_t>& causal_off,
                     const std::vector<std::vector<model::MsVisibleCell>>* masked = nullptr);
  // Every row of a view (Get) against the model's cells of its range, in cell order.
  Check CheckViewRows(const CausalCache::View& view);
  // A ConvState result's dtype and shape (spec §2.9.1, §7): `rows` rows (one per current
  // sequence), d_conv·hidden wide, in the cache dtype. The report names `layer` and whether
  // a reserve pass asked; it is formatted only on a difference (this runs every forward).
  Check CheckConvStateShape(const Tensor& state, int64_t rows, int32_t layer, bool reserve) const;
  // A reserve pass's mask: every batch token's row over the whole cache.
  Check CheckReserveMask(const model::MsBatch& batch, const std::vector<int64_t>& causal_off,
                         const CausalCache::View& view);
  // One row of the view (view_row >= 0) or of the cache (view_row < 0, "stored") against
  // the model's content of cell `index`: row k_row of `k` and row v_row of `v`, compared in
  // place.
  Check CheckRow(int64_t view_row, int64_t index, const std::optional<model::MsRows>& want,
                 const Tensor& k, int64_t k_row, const Tensor& v, int64_t v_row);

  // After every op (multi_seq_checks.cc).
  Check CheckState();
  Check CheckRetention();
  Check CheckCells();
  Check CheckRanges() const;
  Check CheckSlots(bool current = false);
  // mapped_[slot]: the sequences production maps to it.
  Check CheckSlotCounts();
  // Production's slot per sequence, refcounts, free stack and (with `current`) the current
  // forward's slots against the model's.
  Check CheckSlotModel(bool current) const;
  Check CheckConv();
  Check CheckIdeal();
  // The shift calls of a Remove of [begin, end) on `seq` that succeeded or whose callback
  // failed (finite: end is bounded) against the model's cells: none unless it renumbered
  // cells; otherwise one call per window of max_batch cells, counted from the sequence's
  // first cell, that holds a moved cell (pos >= begin), with exactly those cells and delta
  // begin - end; up to the failing call.
  // `failed_call` >= 0: the callback failed on that call, the last one made.
  Check CheckShiftCalls(int32_t seq, int64_t begin, int64_t end, bool shifted, int64_t failed_call);
  // Rows `index` of memo_k_ / memo_v_ := the expected K and V rows of `rows` (K moved by its
  // shifts). A row is a pure function of (written_pos, token, shifts, K|V) for the run's
  // fixed values seed, dtype and width, so the memo recomputes a cell's rows only when the
  // model's record of that cell changes: the same bits as computing them every time.
  void ExpectRows(int64_t index, const model::MsRows& rows);
  std::string DescribeConv(int32_t layer, const float* row) const;

  void Fold(uint64_t value);
  void FoldState();

  MultiSeqConfig config_;
  SyntheticForward synth_;
  std::optional<HybridCache> cache_;  // always set after construction
  // Per conv layer: a ConvState of it has succeeded, so its buffer exists. A buffer is
  // allocated on a layer's first use, not before (spec §2.9.1), and a refused ConvState
  // (copy-on-write out of slots) returns before it; UpdateConvState needs a ConvState first.
  std::vector<uint8_t> conv_allocated_;
  model::RefHybridCache model_;
  int64_t steps_ = 0;
  uint64_t digest_ = 0;
  MsCoverage coverage_;
  std::set<int32_t> ideal_diverged_;  // sequences currently off the ideal conv state
  std::set<int32_t> half_edited_;     // refused Remove, not cleared since
  std::optional<MsDivergence> divergence_;

  // ExpectRows' memo: one row per cell index, with the record it was computed from.
  Tensor memo_k_, memo_v_;
  std::vector<std::optional<model::MsRows>> memo_key_;
  // Scratch reused across ops so the checks do not allocate after the first few steps; each
  // is overwritten before it is read and carries nothing from one use to the next.
  Tensor v_row_;                         // a stored V row (CausalCache::VRowInto)
  Tensor put_k_, put_v_;                 // PutRows: the batch's rows
  Tensor held_k_, held_v_;               // ProbeRefusedPut: the forward's cells' rows before it
  std::vector<float> floats_;            // a row as floats (hash, conv compare)
  MatF conv_in_;                         // one layer's conv input row
  std::vector<model::MsCell> cells_;     // the model's cell table
  std::vector<model::MsEntry> entries_;  // a history or a visible set
  std::vector<std::vector<model::MsVisibleCell>> masked_;   // the mask before a forward's edits
  std::vector<std::vector<model::MsVisibleCell>> visible_;  // CheckVisible: the mask now
  std::vector<int64_t> held_, want_held_;                   // CheckRetention, CountForward
  std::vector<int64_t> got_, got_pos_, want_, want_pos_;    // CheckVisible
  std::vector<std::vector<std::pair<int64_t, uint64_t>>> chains_;  // Tokens, per sequence
  std::vector<uint8_t> chained_;                                   // Tokens, per sequence
  std::vector<std::pair<int32_t, int64_t>> last_;                  // CountForward
  std::vector<BatchToken> kv_batch_;
  std::vector<int32_t> before_cow_;
  std::vector<model::ConvRows> before_rows_;  // RunConv: each sequence's state before
  std::vector<uint8_t> before_known_;
  model::ConvRows conv_want_;
  std::vector<model::ConvRow> inputs_;  // the batch tokens' conv inputs, all layers
  std::vector<const float*> stack_;
  MatF conv_got_, conv_next_;
  std::vector<std::vector<int32_t>> mapped_;  // CheckSlots
  // The RoPE shift calls of the current Remove, as the callback received them (cells,
  // delta). Shared with the callback the cache holds, so it stays valid when the driver
  // (and its cache) is moved.
  struct ShiftCall {
    std::vector<int64_t> cells;
    int64_t delta = 0;
    bool operator==(const ShiftCall&) const = default;
  };
  std::shared_ptr<std::vector<ShiftCall>> shift_calls_ = std::make_shared<std::vector<ShiftCall>>();
  // The shift call (0-based) the callback fails on in the current Remove, -1 for none.
  std::shared_ptr<int64_t> failing_shift_call_ = std::make_shared<int64_t>(-1);
  std::vector<int32_t> on_free_;
};

}  // namespace kvtwin::sim
