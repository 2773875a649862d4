// LayerOracle's attention checks: which history rows each query of a forward attends
// (the SDPA dispatch of spec §2.5 in place and through the materialized mask, against the
// reference's positions) and, for small forwards, what production attention computes over
// them (Sdpa against a double-precision softmax over the reference's positions and the
// synthetic rows written there).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sim/checks.h"

namespace kvtwin::sim {

namespace {

// Appends the positions of history rows [r.lo, r.hi) as ranges; false if the rows are not
// all in the history. row_positions is a rotation
// of consecutive positions (CheckHistory builds it: identity plus the oldest position, or
// the ring order of a decode), so a row range whose end positions are as far apart as its
// rows maps to one position range; only the range holding a ring's wrap goes row by row.
bool AddPositions(const RowRange& r, const std::vector<int64_t>& row_positions,
                  std::vector<model::PositionRange>& out) {
  if (r.lo < 0 || r.lo >= r.hi || r.hi > static_cast<int64_t>(row_positions.size())) return false;
  const int64_t first = row_positions[static_cast<size_t>(r.lo)];
  const int64_t last = row_positions[static_cast<size_t>(r.hi - 1)];
  if (last - first == r.hi - 1 - r.lo) {
    out.push_back(model::PositionRange{first, last + 1});
    return true;
  }
  for (int64_t row = r.lo; row < r.hi; ++row) {
    const int64_t p = row_positions[static_cast<size_t>(row)];
    out.push_back(model::PositionRange{p, p + 1});
  }
  return true;
}

// Sorts `ranges` by start and returns the first position two of them hold, if any.
std::optional<int64_t> FirstRepeatedPosition(std::vector<model::PositionRange>& ranges) {
  const auto by_first = [](const model::PositionRange& a, const model::PositionRange& b) {
    return a.first < b.first;
  };
  if (!std::is_sorted(ranges.begin(), ranges.end(), by_first)) {
    std::sort(ranges.begin(), ranges.end(), by_first);
  }
  int64_t covered = std::numeric_limits<int64_t>::min();  // the end of the ranges so far
  for (const model::PositionRange& r : ranges) {
    if (r.first < covered) return r.first;
    covered = std::max(covered, r.end);
  }
  return std::nullopt;
}

// "0..4,7,9..12": positions, runs written first..last.
std::string FormatRanges(const std::vector<model::PositionRange>& ranges) {
  std::string out;
  for (const model::PositionRange& r : ranges) {
    if (!out.empty()) out += ',';
    out += r.end - r.first == 1 ? fmt::format("{}", r.first)
                                : fmt::format("{}..{}", r.first, r.end - 1);
  }
  return out;
}

// The finite additive value of a biased block array at (query position q, key position k).
// Spec §2.5's arrays are additive: a finite value other than 0 leaves its cell open and
// biases its score, and two arrays add cell by cell. With only 0 and -inf, adding, taking
// the minimum and dropping the array's finite part all give the same cells and scores.
// Multiples of 1/4 in [-0.75, 0.75], and on one query row in four 256 lower, on another
// 128 higher: a constant per row leaves the softmax as it was, but only a kernel that takes
// its maximum over the biased scores keeps exp in range (a row of visible scores all 256
// below the unbiased maximum underflows to 0 / 0, one 128 above overflows). Every value is
// exact in float, and the sums production rounds stay within 1e-5 of the reference's.
double BlockBias(int64_t q, int64_t k) {
  const double shift = q % 4 == 1 ? -256.0 : q % 4 == 3 ? 128.0 : 0.0;
  return shift + 0.25 * static_cast<double>((3 * q + 5 * k) % 7 - 3);
}

// Whether a blocked rectangle spans every query of the forward, and every key of its
// history of `key_len` keys (columns oldest first from max(0, start + L - K), spec §2.5
// AsArray).
struct BlockSpan {
  bool every_query = false, every_key = false;
};
BlockSpan SpanOf(const model::RefRect& block, int64_t start, int64_t query_len, int64_t key_len) {
  const int64_t oldest = std::max<int64_t>(0, start + query_len - key_len);
  return {block.q_lo <= start && start + query_len <= block.q_hi,
          block.k_lo <= oldest && oldest + key_len <= block.k_hi};
}

// The additive array of a blocked rectangle [q_lo, q_hi) x [k_lo, k_hi) over the forward's
// history: -inf on the block's cells, 0 elsewhere, or BlockBias when `biased` (a full
// [L x K] array only). In the narrowest shape that says it, so the dispatch's broadcasts
// are exercised too: [1 x K] when the block spans every query of the forward, [L x 1] when
// it spans every key, else [L x K]. `lowest` (biased arrays only): the block's cells hold
// the lowest finite float instead of -inf, as masks built the Hugging Face way do
// (torch.finfo(float32).min). Spec §2.5 blocks only -inf, so those cells stay open with a
// bias no score survives: they weigh nothing beside any other visible key, and a query
// that sees only them averages them (float and double both round every score to it).
MatF BlockArray(const model::RefRect& block, int64_t start, int64_t query_len, int64_t key_len,
                bool biased, bool lowest) {
  const int64_t oldest = std::max<int64_t>(0, start + query_len - key_len);
  const auto [every_query, every_key] = SpanOf(block, start, query_len, key_len);
  const bool key_broadcast = every_key && !every_query;
  const int64_t rows = every_query ? 1 : query_len;
  const int64_t cols = key_broadcast ? 1 : key_len;
  KV_CHECK(!biased || (rows == query_len && cols == key_len), "a broadcast array biased");
  MatF a = MatF::Zero(rows, cols);
  for (int64_t q = 0; q < rows; ++q) {
    const int64_t p = start + q;
    const bool blocked_query = every_query || (block.q_lo <= p && p < block.q_hi);
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t pk = oldest + k;
      if (blocked_query && (key_broadcast || (block.k_lo <= pk && pk < block.k_hi))) {
        a(q, k) =
            lowest ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
      } else if (biased) {
        a(q, k) = static_cast<float>(BlockBias(p, pk));
      }
    }
  }
  return a;
}

// `r` as the pieces left by cutting it at query row `row` and at key column `column` (each
// optional, strictly inside r), row-major: together they cover exactly r's cells.
void AddPieces(const model::RefRect& r, std::optional<int64_t> row, std::optional<int64_t> column,
               std::vector<RelaxRect>& out) {
  KV_CHECK(!row || (r.q_lo < *row && *row < r.q_hi), "query cut outside the rectangle");
  KV_CHECK(!column || (r.k_lo < *column && *column < r.k_hi), "key cut outside the rectangle");
  const int64_t q_cut = row.value_or(r.q_hi);
  const int64_t k_cut = column.value_or(r.k_hi);
  for (const auto& [q_lo, q_hi] : {std::pair{r.q_lo, q_cut}, std::pair{q_cut, r.q_hi}}) {
    for (const auto& [k_lo, k_hi] : {std::pair{r.k_lo, k_cut}, std::pair{k_cut, r.k_hi}}) {
      if (q_lo < q_hi && k_lo < k_hi) out.push_back(RelaxRect{q_lo, q_hi, k_lo, k_hi});
    }
  }
}

// The production sides of a kRelaxBlock mask, `rect` and `wider` (which contains it), each
// cut into pieces covering exactly its cells, chosen from the op and the forward alone.
// Why: whole, each side is one rectangle and meets one of the other side's, so an Intersect
// that kept only some of a rectangle's overlaps would pass; spec §2.5 wants every pair.
// With both cuts, rect is cut by rows and wider by columns, so every piece of one side meets
// every piece of the other (cuts along one line would pair the pieces one to one again);
// with one, only wider is cut. The row is just past the forward's first query in rect, so
// rect's top piece holds the query reading most of its reopened keys (k > q); the column is
// the first past k_lo whose left part still reopens a cell of rect (column - 1 > q_lo), so
// that piece reopens cells with both pieces of wider, most of them with the right one.
void CutRelaxSides(const model::RefRect& rect, const model::RefRect& wider, int64_t start,
                   std::vector<RelaxRect>& rect_side, std::vector<RelaxRect>& wider_side) {
  std::optional<int64_t> row = std::max(rect.q_lo, start) + 1;
  std::optional<int64_t> column = std::max(rect.k_lo + 1, rect.q_lo + 2);
  if (*row >= rect.q_hi) row.reset();
  if (*column >= rect.k_hi) column.reset();
  if (row && column) {
    AddPieces(rect, row, std::nullopt, rect_side);
    AddPieces(wider, std::nullopt, column, wider_side);
  } else {
    AddPieces(rect, std::nullopt, std::nullopt, rect_side);
    AddPieces(wider, row, column, wider_side);
  }
}

// A kRelax rectangle as the production side states it, chosen from the op and the forward
// alone: whole (one time in three, and whenever its keys are fewer than 3), or as
// overlapping pieces whose union is exactly its cells: its key range cut into n = 2 or 8
// windows, each overlapping the next, plus a one-key piece at the second window's start,
// nested in the first two windows (or equal to one of them when the keys are few). Why:
// spec §2.5 relaxes the union of the rectangles, and the in-place dispatch sorts a query's
// open ranges and skips what earlier ones covered; one rectangle, or the disjoint pieces of
// kRelaxBlock, never puts a range inside another, and 8 windows open more ranges per query
// than the dispatch keeps on its stack. One cut in two lists its windows from the highest
// keys down: spec §2.5 relaxes the union whatever the order, so a reader that assumes the
// rectangles arrive in key order (and skips a later one starting below an earlier one's
// end) loses keys only there; ascending windows and the nested piece never show it.
void RelaxPieces(const model::RefRect& r, int64_t start, std::vector<RelaxRect>& out) {
  const int64_t width = r.k_hi - r.k_lo;
  const int64_t pick = (r.q_lo + r.k_hi + start) % 3;
  if (pick == 0 || width < 3) {
    out.push_back(RelaxRect{r.q_lo, r.q_hi, r.k_lo, r.k_hi});
    return;
  }
  const int64_t n = pick == 1 ? 2 : 8;
  const bool descending = ((r.q_hi + r.k_lo + start) / 3) % 2 == 1;
  const auto bound = [&](int64_t i) { return r.k_lo + i * width / (n + 1); };
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = descending ? n - 1 - j : j;
    if (bound(i) < bound(i + 2)) out.push_back(RelaxRect{r.q_lo, r.q_hi, bound(i), bound(i + 2)});
  }
  out.push_back(RelaxRect{r.q_lo, r.q_hi, bound(1), bound(1) + 1});
}

// A blocked rectangle as the production side states it, chosen from the op and the forward
// alone: one array (one time in three), or the arrays of the whole block and of its
// top-left quarter, intersected in either order; their blocked cells are the block's. Why:
// only here do two arrays meet, which spec §2.5 adds cell by cell, broadcasting a side of
// one row or column; the whole block's array is often narrower ([1 x K] or [L x 1]) than
// the quarter's, so either side of that broadcast is exercised.
size_t BlockPieces(const model::RefRect& b, int64_t start, std::array<model::RefRect, 2>& out) {
  const model::RefRect quarter{b.q_lo, b.q_lo + (b.q_hi - b.q_lo + 1) / 2, b.k_lo,
                               b.k_lo + (b.k_hi - b.k_lo + 1) / 2};
  switch ((b.q_lo + b.k_hi + start) % 3) {
    case 1:
      out = {b, quarter};
      return 2;
    case 2:
      out = {quarter, b};
      return 2;
    default:
      out[0] = b;
      return 1;
  }
}

// Masks up to this many cells are also resolved through the materialized L x K array, the
// form an attention kernel consumes; larger ones only in place (building the array per
// forward is what the in-place resolution exists to avoid).
constexpr int64_t kMaterializedCells = 4096;

// |production - reference| <= tolerance * max(1, |reference|) per output element: float
// accumulation over at most kAttendedCells keys against double.
constexpr double kAttentionTolerance = 1e-4;

}  // namespace

void LayerOracle::BuildMasks(const Op& write, int64_t start, int64_t query_len, int64_t key_len) {
  AttentionMask& logical = logical_;
  model::RefMask& ref_mask = ref_mask_;
  // Most checks (every view, every plain write) want the mask the last one left: reassigning
  // it would free and rebuild its members each time.
  const bool causal = !IsNonCausal(write.mask);
  if (!(causal ? logical.IsPureCausal() : logical.IsZero())) {
    logical = causal ? AttentionMask::Causal() : AttentionMask::Zero();
  }
  ref_mask.causal = causal;
  ref_mask.rects.clear();
  ref_mask.blocks.clear();
  block_bias_ = false;
  lowest_block_.reset();
  const auto ref_rect = [](const MaskRect& r) {
    return model::RefRect{r.q_lo, r.q_hi, r.k_lo, r.k_hi};
  };
  const model::RefRect rect = ref_rect(write.rect);
  const auto relax = [](const AttentionMask& m, const std::vector<RelaxRect>& rects) {
    Result<AttentionMask> relaxed = m.Relax(rects);
    KV_CHECK(relaxed.ok(), relaxed.status().ToString());
    return std::move(relaxed).value();
  };
  std::vector<RelaxRect>& rect_side = relax_rect_side_;
  std::vector<RelaxRect>& wider_side = relax_wider_side_;
  rect_side.clear();
  wider_side.clear();
  if (write.mask == MaskForm::kCausal && (start + query_len) % 5 == 0) {
    // One plain causal forward in five (views, checked as their last token's decode,
    // included) is stated as a relaxation intersected with plain causal, which blocks every
    // cell the relaxation reopens (spec §2.5): still pure causal. Only here does a causal
    // side without rectangles meet a relaxed one.
    rect_side.push_back(RelaxRect{start, start + query_len, start + 1, start + query_len + 1});
    const AttentionMask decoy = relax(AttentionMask::Causal(), rect_side);
    logical = (start / 5) % 2 == 0 ? AttentionMask::Intersect(decoy, AttentionMask::Causal())
                                   : AttentionMask::Intersect(AttentionMask::Causal(), decoy);
    rect_side.clear();
  }
  if (write.mask == MaskForm::kRelax) {
    // The reference states the rectangle whole; production gets it whole or in pieces.
    RelaxPieces(rect, start, rect_side);
    ref_mask.rects.push_back(rect);
    // Every other forward also relaxes a second span in a second call, as a model relaxing
    // span by span would: one query at the last piece's far corner seeing two keys from
    // there, a span that touches the piece corner to corner (back-to-back media). Relax
    // must keep the rectangles it had and keep the two apart (a bounding box opens more);
    // the reference states it as a second rectangle. One in two of those relaxes the later
    // span first: nothing orders a mask's rectangles by position (a model may relax its
    // media spans in any order), so no reader may stop at the first one past a forward.
    const RelaxRect last = rect_side.back();
    const RelaxRect span{last.q_hi, last.q_hi + 1, last.k_hi, last.k_hi + 2};
    const bool second = (start + query_len + rect.q_lo) % 2 == 0;
    const bool later_first = second && ((start + rect.k_lo) / 2) % 2 == 0;
    const auto relax_span = [&] {
      wider_side.assign(1, span);
      logical = relax(logical, wider_side);
      wider_side.clear();
      ref_mask.rects.push_back(model::RefRect{span.q_lo, span.q_hi, span.k_lo, span.k_hi});
    };
    if (later_first) relax_span();
    logical = relax(logical, rect_side);
    if (second && !later_first) relax_span();
  }
  if (write.mask == MaskForm::kRelaxBlock) {
    // Composed as a model would stack two relaxed masks, the rectangle and a wider one
    // around it (strictly wider on every side that can grow), whose intersection (spec
    // §2.5: pairwise geometric) is the rectangle again: the same logical mask, built
    // through the algebra's two-sided case, each side in pieces (CutRelaxSides). The
    // reference states the rectangle whole. The intersection is symmetric, so one forward
    // in two lists the wider side first: an Intersect that takes one axis of a pair from
    // its first side (right only while that side is the smaller) shows only then.
    const model::RefRect wider{std::max<int64_t>(0, rect.q_lo - 1), rect.q_hi + 2,
                               std::max<int64_t>(0, rect.k_lo - 2), rect.k_hi + 1};
    CutRelaxSides(rect, wider, start, rect_side, wider_side);
    const AttentionMask inner = relax(logical, rect_side);
    const AttentionMask outer = relax(AttentionMask::Causal(), wider_side);
    logical = (start + rect.q_hi) % 2 == 0 ? AttentionMask::Intersect(inner, outer)
                                           : AttentionMask::Intersect(outer, inner);
    ref_mask.rects.push_back(rect);
  }
  if (write.mask == MaskForm::kBlock || write.mask == MaskForm::kRelaxBlock ||
      write.mask == MaskForm::kArray) {
    // On a zero mask (kArray) the intersection is the array alone: a pure array mask.
    const model::RefRect block = HasBlockRect(write.mask) ? ref_rect(write.block) : rect;
    // Every other forward whose whole-block array is [L x K] biases the cells it leaves
    // open (BlockBias), chosen from the op and the forward alone; a quarter never does.
    const BlockSpan span = SpanOf(block, start, query_len, key_len);
    block_bias_ = !span.every_query && !span.every_key && (block.k_hi + start) % 2 == 0;
    // Half of the biased blocks without a relaxed rectangle (which would reopen some of
    // their cells to 0) say "blocked" with the lowest float (BlockArray); the quarter array
    // a block may meet keeps -inf, so the reference blocks only that quarter.
    const bool lowest =
        block_bias_ && write.mask != MaskForm::kRelaxBlock && (block.q_lo + query_len) % 2 == 0;
    if (lowest) lowest_block_ = block;
    std::array<model::RefRect, 2> pieces;
    bool bias_left = block_bias_;  // one array carries it (a small quarter can equal the block)
    const size_t n_pieces = BlockPieces(block, start, pieces);
    size_t biased_piece = n_pieces;  // none
    for (size_t i = 0; i < n_pieces; ++i) {
      const model::RefRect& r = pieces[i];
      const bool biased = bias_left && r.q_lo == block.q_lo && r.q_hi == block.q_hi &&
                          r.k_lo == block.k_lo && r.k_hi == block.k_hi;
      bias_left &= !biased;
      if (biased) biased_piece = i;
      AttentionMask array = AttentionMask::Array(
          BlockArray(pieces[i], start, query_len, key_len, biased, biased && lowest));
      // Either order: spec §2.5's intersection is symmetric, and only the array first sends
      // a relaxed second side through Intersect's "other side not causal" case.
      logical = (block.k_lo + query_len + static_cast<int64_t>(i)) % 2 == 0
                    ? AttentionMask::Intersect(logical, array)
                    : AttentionMask::Intersect(array, logical);
    }
    // A block array in a broadcast shape meets, one forward in three, an all-zero array of
    // the other broadcast shape first: the same mask, but Intersect has to add [L x 1] and
    // [1 x K] into [L x K] (when L == K the two hold as many cells and only their shapes
    // tell them apart).
    const std::optional<MatF>& array = logical.array();
    const bool per_key = array->rows() == 1 && query_len > 1;
    const bool per_query = array->cols() == 1 && key_len > 1;
    if ((per_key || per_query) && (start + query_len + block.q_hi) % 3 == 0) {
      logical = AttentionMask::Intersect(
          AttentionMask::Array(per_key ? MatF::Zero(query_len, 1) : MatF::Zero(1, key_len)),
          logical);
    }
    if (!lowest) {
      ref_mask.blocks.push_back(block);  // the reference states the block whole
    } else {
      // The other piece's -inf cells (the quarter, which may be the whole block again).
      for (size_t i = 0; i < n_pieces; ++i) {
        if (i != biased_piece) ref_mask.blocks.push_back(pieces[i]);
      }
    }
  }
}

double LayerOracle::CellBias(int64_t q, int64_t k) const {
  if (!block_bias_) return 0.0;
  const std::optional<model::RefRect>& b = lowest_block_;
  if (b && b->q_lo <= q && q < b->q_hi && b->k_lo <= k && k < b->k_hi) {
    return double{std::numeric_limits<float>::lowest()};
  }
  return BlockBias(q, k);
}

Check LayerOracle::CheckVisible(const History& history, const std::vector<int64_t>& row_positions,
                                int64_t start, int64_t query_len, const Op& write,
                                model::RefKind kind) {
  const AttentionMask& logical = logical_;
  const Status dispatch = VisibleRowsInto(history, logical, start, query_len, visible_);
  if (!dispatch.ok()) return Mismatch{"attention dispatch", "visible rows", dispatch.message()};
  if (Check c = CompareVisible(visible_, row_positions, start, query_len, ref_mask_, kind))
    return c;
  if (!HasRect(write.mask) || query_len * history.length > kMaterializedCells) return std::nullopt;
  const Status materialized =
      MaterializedVisibleRowsInto(history, logical, start, query_len, materialized_);
  if (!materialized.ok()) {
    return Mismatch{"attention dispatch through the materialized mask", "visible rows",
                    materialized.message()};
  }
  if (materialized_.begin == visible_.begin && materialized_.ranges == visible_.ranges) {
    return std::nullopt;
  }
  Check c = CompareVisible(materialized_, row_positions, start, query_len, ref_mask_, kind);
  // The in-place rows matched the reference, so the materialized ones cannot.
  KV_CHECK(c.has_value(), "two different visible sets both matched the reference");
  c->what = "through the materialized mask, " + c->what;
  return c;
}

Check LayerOracle::CheckAttention(const History& history, std::span<const model::Token> log_after,
                                  int64_t start, int64_t query_len, model::RefKind kind) {
  KV_CHECK(WithinAttentionCap(query_len, history.length), "attention checked on a large forward");
  ++attention_checks_;
  MatF& q = query_;
  q.resize(query_len, k_cols_);
  for (int64_t i = 0; i < query_len; ++i) synth_.FillQueryRow(q, i, layer_, start + i);
  const float scale = 1.0f / std::sqrt(static_cast<float>(k_cols_));
  MatF& got = attention_out_;
  if (Status s = SdpaInto(q, history, logical_, start, scale, sdpa_scratch_, got); !s.ok()) {
    return Mismatch{"attention (Sdpa)", "an output", s.message()};
  }
  // One row per query of V's width: checked apart, as the element loop below reads nothing of
  // a zero-width V (an MLA layer, whose output is L x 0 from the cache's history).
  if (got.rows() != query_len || got.cols() != v_cols_) {
    return Mismatch{
        fmt::format("attention output shape (write [{}, {}))", start, start + query_len),
        fmt::format("{} x {}", query_len, v_cols_), fmt::format("{} x {}", got.rows(), got.cols())};
  }
  // The rows the synthetic forward wrote at the history's positions, as float, once: the
  // memo holds them (the row check just read them) at their positions, so rows
  // [held.first, held.end) of the memo, in one conversion.
  const model::PositionRange held =
      model::ExpectedHistoryRange(kind, spec_.window, start, query_len);
  const int64_t n_held = held.end - held.first;
  for (int64_t p = held.first; p < held.end; ++p) {
    const model::Token& t = log_after[static_cast<size_t>(p)];
    static_cast<void>(ExpectedRow(p, t, false));
    static_cast<void>(ExpectedRow(p, t, true));
  }
  memo_k_.RowsToFloatInto(held.first, n_held, ref_k_);
  memo_v_.RowsToFloatInto(held.first, n_held, ref_v_);
  std::vector<model::PositionRange>& want = want_ranges_;
  std::vector<double>& weights = weights_;
  VecD& expected = expected_;
  expected.resize(v_cols_);
  for (int64_t i = 0; i < query_len; ++i) {
    // The reference: softmax over the positions the query may attend (all additive values
    // there are 0), of the rows the synthetic forward wrote at those positions.
    model::ExpectedVisibleRangesInto(kind, spec_.window, start, query_len, start + i, ref_mask_,
                                     want);
    weights.clear();
    double max_score = -std::numeric_limits<double>::infinity();
    for (const model::PositionRange& r : want) {
      for (int64_t p = r.first; p < r.end; ++p) {
        const float* k = ref_k_.row(p - held.first).data();
        double dot = 0;
        for (int64_t c = 0; c < k_cols_; ++c) dot += double{q(i, c)} * double{k[c]};
        // A biased block array adds its finite value to every cell it leaves open.
        weights.push_back(double{scale} * dot + CellBias(start + i, p));
        max_score = std::max(max_score, weights.back());
      }
    }
    expected.setZero();
    double denom = 0;
    size_t n = 0;
    for (const model::PositionRange& r : want) {
      for (int64_t p = r.first; p < r.end; ++p, ++n) {
        const double w = std::exp(weights[n] - max_score);
        denom += w;
        expected += w * ref_v_.row(p - held.first).transpose().cast<double>();
      }
    }
    if (n > 0) expected /= denom;  // a query that may attend nothing gets a zero row
    for (int64_t c = 0; c < v_cols_; ++c) {
      const double e = expected[c];
      const double a = got(i, c);
      if (!(std::abs(a - e) <= kAttentionTolerance * std::max(1.0, std::abs(e)))) {
        return Mismatch{fmt::format("attention output of the query at {}, element {} "
                                    "(write [{}, {}), tolerance {})",
                                    start + i, c, start, start + query_len, kAttentionTolerance),
                        fmt::format("{:.7g}", e), fmt::format("{:.7g}", a)};
      }
    }
  }
  return std::nullopt;
}

Check LayerOracle::CompareVisible(const VisibleSet& seen_rows,
                                  const std::vector<int64_t>& row_positions, int64_t start,
                                  int64_t query_len, const model::RefMask& mask,
                                  model::RefKind kind) {
  std::vector<model::PositionRange>& seen = seen_ranges_;
  std::vector<model::PositionRange>& want = want_ranges_;
  for (int64_t q = 0; q < query_len; ++q) {
    seen.clear();
    for (const RowRange& r : seen_rows.Of(q)) {
      if (!AddPositions(r, row_positions, seen)) {
        return Mismatch{fmt::format("rows attended by the query at {}", start + q),
                        fmt::format("within [0, {})", row_positions.size()),
                        fmt::format("[{}, {})", r.lo, r.hi)};
      }
    }
    // Each key is attended once: a row returned twice would weigh twice in the softmax,
    // yet the canonical form below merges the repeat away.
    if (std::optional<int64_t> twice = FirstRepeatedPosition(seen)) {
      return Mismatch{fmt::format("positions attended by the query at {}", start + q), "each once",
                      fmt::format("{} twice", *twice)};
    }
    model::CanonicalizeRanges(seen);
    model::ExpectedVisibleRangesInto(kind, spec_.window, start, query_len, start + q, mask, want);
    if (seen != want) {
      return Mismatch{fmt::format("positions attended by the query at {}", start + q),
                      FormatRanges(want), FormatRanges(seen)};
    }
  }
  return std::nullopt;
}

}  // namespace kvtwin::sim
