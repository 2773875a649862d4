// LayerOracle: what one layer must hold, derived from the reference token log through the
// synthetic forward, and the comparisons against the production cache (spec §4.1, §5.2,
// §5.3). K/V rows and conv tails are moved, not computed, so they are compared bit-exactly;
// the delta state is computed, so it is compared with kDeltaTolerance against the
// double-precision reference fold. Every mismatch says what the slot holds and what it
// should hold, decoded from the provenance tags. Single-threaded.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/ref_cache.h"
#include "model/ref_recurrent.h"
#include "sim/ops.h"
#include "sim/stack.h"
#include "sim/synthetic.h"
#include "src/attention_mask.h"
#include "src/cache.h"
#include "src/kv_cache.h"
#include "src/recurrent_cache.h"
#include "src/rotating_cache.h"

namespace kvtwin::sim {

// Largest allowed |actual - expected| of a delta-state element, relative to
// max(1, |expected|): float32 accumulation against a double fold stays near 1e-6, while a
// state stored or computed in bfloat16 is off by ~4e-3.
inline constexpr double kDeltaTolerance = 1e-4;
// Whether a computed value is within kDeltaTolerance of the reference's (false for NaN).
inline bool WithinDeltaTolerance(double actual, double expected) {
  return std::abs(actual - expected) <= kDeltaTolerance * std::max(1.0, std::abs(expected));
}

struct Mismatch {
  std::string what;
  std::string expected;
  std::string actual;
};
using Check = std::optional<Mismatch>;

// What returned a history: a live cache's write or View (spec §2.1, §2.2) or a speculation
// wrapper's forward (spec §2.7, which fixes the rows and the mask but no rotating cursor).
enum class HistorySource : uint8_t { kWrite, kView, kSpeculation };

// Bit-equality of `n` rows of two tensors of one element type (a memcmp); false for
// differing dtypes or widths, or rows out of range.
bool SameBits(TensorView a, int64_t ra, TensorView b, int64_t rb, int64_t n);

// The reference kind that models a production cache kind.
model::RefKind ToRefKind(CacheKind kind);

// Slots holding the trailing min(offset, W) positions of a rotating buffer, oldest first,
// read by storage regime (spec §2.2 R1-R3); an error when (offset, idx, rows) fit no regime.
Result<std::vector<int64_t>> RotatingWindowSlots(int64_t offset, int64_t idx, int64_t rows,
                                                 int64_t window);
// The same into `slots` (cleared first), for checkers that reuse one buffer.
Status RotatingWindowSlotsInto(int64_t offset, int64_t idx, int64_t rows, int64_t window,
                               std::vector<int64_t>& slots);

// A forward's shape as far as LayerOracle's attention check is concerned: the layer (its
// index, kind, window and width), the query and key counts, whether the mask is causal, the
// rotating applier's layout, and the element type.
struct AttendedShape {
  int32_t layer;
  CacheKind kind;
  int64_t layer_window, k_cols, v_cols;
  int64_t query_len, key_len;
  bool causal;
  bool has_applier;
  int64_t applier_key_len, applier_query_len, window, ring_idx;
  DType dtype;
  friend auto operator<=>(const AttendedShape&, const AttendedShape&) = default;
};

// Which forwards with a zero or plain causal mask have their attention arithmetic checked
// (why not every one: LayerOracle::CheckAttentionOnce). By default, the first forward of
// each shape in a run: a run's verdict is a function of the run alone. An oracle given a
// ShapeRunCounts checks a subset of those, for a fuzz session's thousands of short runs a
// second over the same few hundred shapes: the first forward of a shape in a run is checked
// when the number of earlier runs that met the shape is 0 or a power of two (runs 1, 2, 3,
// 5, 9, 17, ...), so every shape is still checked, on differing data, at log cost. Being a
// subset, a divergence found this way is found by a fresh run of the same ops without the
// counts (at that forward or an earlier one): a crash artifact reproduces with `kvtwin
// replay --fuzz-input`, and its trace with `kvtwin replay` and `shrink`. Forwards with a
// rectangle or an array are checked every time either way. One ShapeRunCounts serves every
// oracle of a session (the shape names the layer); single-threaded.
class ShapeRunCounts {
 public:
  ShapeRunCounts();
  // Counts one more run that met `shape` and says whether its check is due (the earlier
  // runs number 0 or a power of two).
  bool CountRun(const AttendedShape& shape);

 private:
  struct Entry {
    AttendedShape shape;
    int64_t runs;
  };
  std::vector<Entry> entries_;  // sorted by shape
};

class LayerOracle {
 public:
  LayerOracle(const SyntheticForward& synth, const StackConfig& config, int32_t layer);
  // As if constructed for `layer` of `config` over the same `synth` (whose seed may have
  // changed): every memo is forgotten, scratch capacity is kept.
  void Reset(const StackConfig& config, int32_t layer);
  // Checks attention by `counts` (see ShapeRunCounts; null: the first forward of each
  // shape in a run). Not owned; kept across Reset.
  void set_shape_run_counts(ShapeRunCounts* counts) { run_counts_ = counts; }
  // How many forwards had their attention arithmetic checked (CheckAttention) since Reset.
  int64_t attention_checks() const { return attention_checks_; }

  // After a recurrent forward of tokens [start, start + n) of `log` (so log.size() >=
  // start + n): the kernels' outputs, conv_out [rows x conv_dim] and y [rows x Hv*Dv] with
  // rows >= n (rows past n are padding), against the reference (spec §2.4): each real row's
  // conv output from the raw conv inputs of its window and the weights, and its read-out
  // y = S q̂ over the state after its token, within kDeltaTolerance; padded rows of y zero.
  // The states alone miss an output-only bug (a read-out scale, a tap order, the SiLU).
  Check CheckRecurrentOutputs(const MatF& conv_out, const MatF& y,
                              std::span<const model::Token> log, int64_t start, int64_t n);

  // The bytes of one snapshot unit of this layer (model::SnapshotUnits, spec §7): a KV or
  // window row's K and V, or one whole recurrent state.
  int64_t SnapshotUnitBytes() const {
    return spec_.kind == CacheKind::kRecurrent ? RecurrentStateBytes() : KvRowBytes(1);
  }
  // Live state after any step: CheckLiveBuffers, then the contents against ref.log().
  Check CheckLive(const LayerCache& cache, const model::RefCache& ref);
  // Everything of the live state but the contents: kind, offset, schedule flag, whether a
  // buffer / state exists, and its size (KV capacity, a window buffer's rows Dim, LiveBytes).
  Check CheckLiveBuffers(const LayerCache& cache, const model::RefCache& ref) const;
  // Live contents only: the offset is log.size() and the cache holds exactly `log` (KV rows
  // [0, offset), the rotating window, the recurrent conv tail and delta state). Unlike
  // CheckLive it ignores whether a buffer / state exists at offset 0 and the schedule
  // flag: a cache that a prefix manager freed and then rewound or restored legitimately
  // differs from a token log on both.
  Check CheckLiveContent(const LayerCache& cache, std::span<const model::Token> log);
  // A snapshot held by the driver against its reference.
  Check CheckSnapshot(const CacheSnapshot* prod, const model::RefSnap& ref);
  // The history a forward returned: rows, order, and which positions each query attends.
  // `log_after` is the log through the forward (a speculative forward is not in the
  // reference log yet, and may never be).
  // `trusted_rows` (full KV layers only, else ignored): history rows [0, trusted_rows)
  // are not compared, because the caller verified them at an earlier check and amortizes
  // re-reading them (RequestDriver::TrustedHistoryRows); their visibility still is, but
  // not what attention computes over them (CheckAttention runs on untrusted histories).
  Check CheckHistory(const History& history, std::span<const model::Token> log_after, int64_t start,
                     int64_t query_len, const Op& write, int64_t trusted_rows = 0,
                     HistorySource source = HistorySource::kWrite);

  // What View() returned with `log` (its size is the offset) in the cache: the history a
  // decode query at the last position would see, i.e. all of it (full KV) or the newest
  // min(offset, W) positions (rotating), in ring or logical order; nothing at offset 0.
  Check CheckView(const History& view, std::span<const model::Token> log);

  // Expected K (or V) row for `token` at position p.
  void FillRow(Tensor& out, int64_t row, int64_t p, const model::Token& token, bool is_value) const;
  const SyntheticForward& synth() const { return synth_; }

 private:
  // Rows slots[j] of k and v hold position first_position + j, whose token is tokens[j].
  Check CheckKvRows(TensorView k, TensorView v, std::span<const int64_t> slots,
                    std::span<const model::Token> tokens, int64_t first_position,
                    const char* where);
  // Slots 0 .. n-1 (a linear buffer), from a buffer grown on demand. Growing it moves it:
  // a span handed out earlier is dangling after a call with a larger n.
  std::span<const int64_t> Identity(int64_t n);
  // Bytes of one recurrent state (a live one or a snapshot's): spec §2.3's shapes.
  int64_t RecurrentStateBytes() const;
  // Spec §7, B = 1: `rows` K rows (Dk wide) and V rows (Dv wide) in the activation dtype.
  int64_t KvRowBytes(int64_t rows) const;
  // LiveBytes() against RecurrentStateBytes() (0 without a state).
  Check CheckRecurrentLiveBytes(const RecurrentCache& cache) const;
  Check CheckKvBuffer(const KvCache& cache, const model::RefCache& ref) const;
  Check CheckRotatingBuffer(const RotatingCache& cache, const model::RefCache& ref) const;
  // The rows of a KV / rotating buffer against `log` (its size is the offset); the buffer
  // exists whenever the offset is positive.
  Check CheckKvContent(const KvCache& cache, std::span<const model::Token> log);
  Check CheckRotatingContent(const RotatingCache& cache, std::span<const model::Token> log);
  // SizeBytes() against spec §7; `kv_rows` = the rows a KV or window snapshot must hold.
  Check CheckSnapshotBytes(const CacheSnapshot& prod, int64_t kv_rows) const;
  Check CheckRecurrentState(const Tensor& conv, const MatF& delta,
                            std::span<const model::Token> log, int64_t length, const char* where);
  // conv_w_, conv_b_ and conv_silu_ from the synthetic weights of this layer, and an empty
  // conv input memo of its width.
  void DeriveConvWeights();
  // The raw conv input row of position p (zeros for p < 0) for the token `log[p]`, from a
  // memo: a row is a pure function of (layer, p, h), the windows of consecutive forwards
  // overlap and the live tail re-reads the last ones, so a hit is what FillConvInput would
  // write. Valid until the next call.
  const float* ConvInput(int64_t p, std::span<const model::Token> log);
  // The logical mask of `write` over a forward of query_len tokens at `start` and a
  // history of key_len keys, as production attention takes it (logical_) and as the
  // reference states it (ref_mask_).
  void BuildMasks(const Op& write, int64_t start, int64_t query_len, int64_t key_len);
  // The rows each query attends under logical_ (in place, and through the materialized
  // mask for a write with a rectangle) against the reference's positions under ref_mask_.
  Check CheckVisible(const History& history, const std::vector<int64_t>& row_positions,
                     int64_t start, int64_t query_len, const Op& write, model::RefKind kind);
  // Forwards up to this many query x key cells also run production attention (Sdpa) against
  // the reference's softmax. Smaller than the materialized-mask check's cap: it reads every
  // visible row, and a decode on a long history would make each check O(history) again.
  static constexpr int64_t kAttendedCells = 64;
  // Longer decodes (one or two queries over up to kLongAttendedKeys rows) are checked too,
  // but sparsely (LongAttentionDue): a kernel that tiles, blocks or accumulates its keys in
  // chunks (an online softmax past 256 keys) goes wrong only on long histories, which the
  // 64-cell cap never reached.
  static constexpr int64_t kLongAttendedKeys = 4096;
  // The forwards CheckAttention may run on at all: up to kAttendedCells cells, or a decode
  // of one or two queries over up to kLongAttendedKeys rows.
  static bool WithinAttentionCap(int64_t query_len, int64_t keys) {
    return query_len * keys <= kAttendedCells || (query_len <= 2 && keys <= kLongAttendedKeys);
  }
  static bool LongAttentionDue(int64_t query_len, const History& history);
  // The applier's fields against the spec (rotating only; none for the other kinds).
  Check CheckApplier(const History& history, int64_t query_len, bool ring,
                     HistorySource source) const;
  // CheckHistory without CheckAttention; *all_compared says whether every row was compared
  // (none trusted), i.e. whether attention over them may be checked.
  Check CheckHistoryRows(const History& history, std::span<const model::Token> log_after,
                         int64_t start, int64_t query_len, const Op& write, int64_t trusted_rows,
                         HistorySource source, bool* all_compared);
  // CheckAttention for forwards up to kAttendedCells cells, but for a zero or plain causal
  // mask only on the forwards ShapeRunCounts describes (why: see the definition).
  Check CheckAttentionOnce(const History& history, std::span<const model::Token> log_after,
                           int64_t start, int64_t query_len);
  // For forwards up to kAttendedCells cells: Sdpa over the history under logical_, for
  // deterministic queries, against a double-precision softmax over the reference's
  // positions of the rows the synthetic forward wrote there. Catches what visible rows
  // cannot: a bias read from the wrong column, rows summed with the wrong weights.
  Check CheckAttention(const History& history, std::span<const model::Token> log_after,
                       int64_t start, int64_t query_len, model::RefKind kind);
  // `seen` (one forward's visible rows) against the reference's positions per query.
  Check CompareVisible(const VisibleSet& seen, const std::vector<int64_t>& row_positions,
                       int64_t start, int64_t query_len, const model::RefMask& mask,
                       model::RefKind kind);

  // The expected row (K or V) of token `t` at position p, from the memo: a row is a pure
  // function of (layer, p, t.h, K|V), so the memo keeps, per position, the rows of the last
  // hash asked for there and synthesizes only on a miss. A hit is exactly what FillRow
  // would write; only the synthesis is saved (long histories are re-checked after every
  // forward). Returns the memo tensor; the row is p.
  const Tensor& ExpectedRow(int64_t p, const model::Token& t, bool is_value);
  // actual[row] against the memo's row p of the same kind: bit-equal rows are equal;
  // otherwise RowEquals decides (NaN == NaN, -0 == +0, other dtypes).
  bool MatchesExpected(TensorView actual, int64_t row, int64_t p, const model::Token& t,
                       bool is_value);
  // Pairs j of [0, rows.size()): rows[j] of k and of v against the expected K and V rows of
  // position positions[j], whose token is tokens[positions[j] - token_base]. Returns the
  // first j where either differs (*is_value says which), or rows.size(). Same verdict as
  // MatchesExpected pair by pair; runs of consecutive rows and positions are compared as
  // one block of bits first (a whole live buffer is one run), row by row only on a miss.
  size_t FirstMismatch(TensorView k, TensorView v, std::span<const int64_t> rows,
                       std::span<const int64_t> positions, std::span<const model::Token> tokens,
                       int64_t token_base, bool* is_value);
  // Whether rows [row, row + n) of `actual` are bit-equal to the memo's rows [p, p + n).
  bool SameBlock(TensorView actual, int64_t row, int64_t p, int64_t n, bool is_value) const;

  const SyntheticForward& synth_;
  int32_t layer_;
  LayerSpec spec_;
  DType dtype_;              // the activation dtype: K rows and recurrent conv
  DType v_dtype_;            // V rows' (StackConfig::value_dtype)
  int64_t k_cols_, v_cols_;  // K and V row widths
  RecurrentDims dims_;
  model::RefGdnFolder folder_;
  // ExpectedRow's memo: rows [0, capacity) of K and V, the hash each holds, and whether set.
  Tensor memo_k_, memo_v_;
  std::vector<uint64_t> memo_h_;
  std::vector<uint8_t> memo_set_;
  // Scratch reused by every check, so checking after every step allocates nothing on the
  // passing path: identity slots, window slots, a history's row positions, the production
  // dispatch's visible rows, and one query's attended and expected position ranges.
  std::vector<int64_t> identity_, window_slots_, row_positions_;
  std::vector<model::PositionRange> seen_ranges_, want_ranges_;
  VisibleSet visible_, materialized_;
  AttentionMask logical_;    // BuildMasks' production mask
  model::RefMask ref_mask_;  // and the reference's
  bool block_bias_ = false;  // the block's array adds BlockBias to the cells it leaves open
  // The block whose array says "blocked" with the lowest float (open cells then), if any.
  std::optional<model::RefRect> lowest_block_;
  // The finite additive value of the forward's masks at (query position q, key position k):
  // 0, BlockBias, or the lowest float inside lowest_block_.
  double CellBias(int64_t q, int64_t k) const;
  std::vector<RelaxRect> relax_rect_side_, relax_wider_side_;  // its relaxations' pieces
  MatF query_;                                                 // CheckAttention's queries,
  std::vector<double> weights_;                                // one query's scores
  VecD expected_;                                              // and its reference output;
  MatF ref_k_, ref_v_;        // the expected rows at the history's positions
  SdpaScratch sdpa_scratch_;  // production attention's buffers
  MatF attention_out_;        // and its output
  // The shapes CheckAttentionOnce has met in this run, sorted.
  std::vector<AttendedShape> attended_;
  ShapeRunCounts* run_counts_ = nullptr;
  int64_t attention_checks_ = 0;
  MatF gdn_qkv_, gdn_ba_;  // the folder's input rows (its input function writes them)
  // CheckRecurrentOutputs': the conv weights in double (recurrent layers only, set by
  // Reset), the raw conv inputs of one forward's windows, and one row of each output.
  MatD conv_w_;
  VecD conv_b_;
  bool conv_silu_ = false;
  std::vector<const float*> conv_window_;  // a token's window rows, in ConvInput's memo
  MatD expected_y_;
  VecD conv_out_row_;
  // ConvInput's memo: row p % conv_memo_rows_ holds position conv_memo_key_[row] = (p, h);
  // the last row stays zero (positions before 0).
  static constexpr int64_t kConvMemoRows = 64;
  int64_t conv_memo_rows_ = kConvMemoRows;
  MatF conv_memo_;
  std::vector<std::pair<int64_t, uint64_t>> conv_memo_key_;
};

}  // namespace kvtwin::sim
