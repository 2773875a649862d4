// The mask algebra and SDPA dispatch of spec §2.5 for B = 1. Masks are kept symbolic
// (causal flag, rectangles) as long as possible and materialized only where the dispatch
// needs an array, exactly like the MLX code, so "pure causal" stays recognizable.
#include "src/attention_mask.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include "src/core/check.h"

namespace kvtwin {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Absolute position of key column 0 when the K keys end with the newest query
// (spec §2.5: oldest = max(0, off + L - K)).
int64_t OldestPosition(int64_t offset, int64_t query_len, int64_t key_len) {
  return std::max<int64_t>(0, offset + query_len - key_len);
}

// The first key column query q of a sliding-window prefill may see: keys older than
// offset + q - W + 1 fall outside the W keys ending at the query.
int64_t WindowStart(int64_t offset, int64_t q, int64_t window, int64_t oldest, int64_t key_len) {
  return std::clamp<int64_t>(offset + q - window + 1 - oldest, 0, key_len);
}

// A rectangle changes nothing when it is empty or lies inside the causal triangle (every
// cell already has k <= q); keeping it would only push the mask off the causal fast path.
bool IsNoOpRect(const RelaxRect& r) {
  return r.q_lo >= r.q_hi || r.k_lo >= r.k_hi || r.k_hi - 1 <= r.q_lo;
}

// One broadcast axis: equal sizes, or one side of size 1. -1 means incompatible.
int64_t BroadcastDim(int64_t a, int64_t b) {
  if (a == b || b == 1) return a;
  if (a == 1) return b;
  return -1;
}

bool BroadcastsTo(const MatF& m, int64_t rows, int64_t cols) {
  return (m.rows() == rows || m.rows() == 1) && (m.cols() == cols || m.cols() == 1);
}

// The one refusal of a caller's mask array that does not broadcast to [rows x cols], shared
// by every path of the dispatch so that none can take such an array to Intersect's abort.
Status CheckBroadcasts(const AttentionMask& mask, int64_t rows, int64_t cols) {
  const std::optional<MatF>& m = mask.array();
  if (!m.has_value() || BroadcastsTo(*m, rows, cols)) return Status::Ok();
  return InvalidArgument("mask array [" + std::to_string(m->rows()) + " x " +
                         std::to_string(m->cols()) + "] does not broadcast to [" +
                         std::to_string(rows) + " x " + std::to_string(cols) + "]");
}

// REQUIRES: BroadcastsTo(m, rows, cols).
MatF BroadcastTo(const MatF& m, int64_t rows, int64_t cols) {
  KV_CHECK(BroadcastsTo(m, rows, cols), "mask array does not broadcast to the target shape");
  return m.replicate(m.rows() == rows ? 1 : rows, m.cols() == cols ? 1 : cols);
}

// Additive sum with broadcasting ([L x K], [1 x K], [L x 1]); shapes that cannot meet are
// a caller bug because Intersect has no error channel.
MatF AddArrays(MatF a, const MatF& b) {
  if (a.rows() == b.rows() && a.cols() == b.cols()) {
    a += b;  // in place: an L x K mask is megabytes at long contexts
    return a;
  }
  const int64_t rows = BroadcastDim(a.rows(), b.rows());
  const int64_t cols = BroadcastDim(a.cols(), b.cols());
  KV_CHECK(rows >= 0 && cols >= 0, "Intersect: mask arrays of incompatible shapes");
  return BroadcastTo(a, rows, cols) + BroadcastTo(b, rows, cols);
}

// Spec §2.5: both sides relaxed -> pairwise geometric intersection; one side relaxed ->
// kept only if the other side is not causal (a causal side blocks every cell they reopen).
std::vector<RelaxRect> IntersectRects(const AttentionMask& a, const AttentionMask& b) {
  if (a.rects().empty() || b.rects().empty()) {
    if (!a.rects().empty() && !b.causal()) return a.rects();
    if (!b.rects().empty() && !a.causal()) return b.rects();
    return {};
  }
  std::vector<RelaxRect> out;
  for (const RelaxRect& x : a.rects()) {
    for (const RelaxRect& y : b.rects()) {
      const RelaxRect r{std::max(x.q_lo, y.q_lo), std::min(x.q_hi, y.q_hi),
                        std::max(x.k_lo, y.k_lo), std::min(x.k_hi, y.k_hi)};
      if (!IsNoOpRect(r)) out.push_back(r);
    }
  }
  return out;
}

// Resets the cells of `r` (absolute positions) to 0 in a materialized mask whose row 0 is
// query `offset` and column 0 is key `oldest`.
void ResetRect(const RelaxRect& r, int64_t offset, int64_t oldest, MatF& out) {
  const int64_t q_lo = std::clamp<int64_t>(r.q_lo - offset, 0, out.rows());
  const int64_t q_hi = std::clamp<int64_t>(r.q_hi - offset, 0, out.rows());
  const int64_t k_lo = std::clamp<int64_t>(r.k_lo - oldest, 0, out.cols());
  const int64_t k_hi = std::clamp<int64_t>(r.k_hi - oldest, 0, out.cols());
  for (int64_t q = q_lo; q < q_hi; ++q) {
    for (int64_t k = k_lo; k < k_hi; ++k) out(q, k) = 0.0f;
  }
}

// Logical (oldest-first) columns into ring-slot order: slot s holds logical column
// (s - ring_idx) mod K (spec §2.2 R2: logical j lives in slot (idx + j) mod W).
MatF RotateColumns(const MatF& logical, int64_t ring_idx) {
  const int64_t key_len = logical.cols();
  if (key_len == 0) return logical;
  MatF out(logical.rows(), key_len);
  for (int64_t s = 0; s < key_len; ++s) {
    const int64_t j = ((s - ring_idx) % key_len + key_len) % key_len;
    out.col(s) = logical.col(j);
  }
  return out;
}

// Decode / View: a non-trivial logical mask, gathered into the ring layout of the keys.
Result<AttentionMask> RotateDecodeMask(const RotatingApplier& applier, const AttentionMask& logical,
                                       int64_t offset) {
  const int64_t key_len = applier.key_len;
  const std::optional<MatF>& array = logical.array();
  if (array.has_value() && array->cols() != 1 && array->cols() != key_len) {
    return InvalidArgument("rotating applier: mask K width " + std::to_string(array->cols()) +
                           " must be 1 or " + std::to_string(key_len));
  }
  if (array.has_value() && !logical.causal()) {
    // A pure array (rectangles need causal): a width-1 K axis is the same for every key,
    // so it needs no gather; otherwise gather every row as MLX does.
    if (array->cols() == 1) return logical;
    return AttentionMask::Array(RotateColumns(*array, applier.ring_idx));
  }
  if (array.has_value() && array->rows() != 1) {
    return InvalidArgument("rotating applier: a decode mask has 1 query row, got " +
                           std::to_string(array->rows()));
  }
  return AttentionMask::Array(RotateColumns(logical.AsArray(offset, 1, key_len), applier.ring_idx));
}

// Adds rows [lo, hi) to the query being filled, merged into its last range when adjacent.
void AddRows(VisibleSet& out, int64_t lo, int64_t hi) {
  if (hi <= lo) return;
  const bool has_last = out.ranges.size() > static_cast<size_t>(out.begin.back());
  if (has_last && out.ranges.back().hi == lo) {
    out.ranges.back().hi = hi;
  } else {
    out.ranges.push_back(RowRange{lo, hi});
  }
}

// The rows of `ranges`, one by one, appended to `rows`.
void ExpandRows(std::span<const RowRange> ranges, std::vector<int64_t>& rows) {
  for (const RowRange& r : ranges) {
    for (int64_t j = r.lo; j < r.hi; ++j) rows.push_back(j);
  }
}

// Closes the query being filled (the next query starts at the current end).
void EndQuery(VisibleSet& out) { out.begin.push_back(static_cast<int64_t>(out.ranges.size())); }

// No mask, or pure causal at L = 1: every row.
void AllRows(int64_t query_len, int64_t key_len, VisibleSet& out) {
  for (int64_t i = 0; i < query_len; ++i) {
    AddRows(out, 0, key_len);
    EndQuery(out);
  }
}

// The kernel's causal mode is bottom-right aligned: query i sees row j iff j <= i + K - L.
void BottomRightCausalRows(int64_t query_len, int64_t key_len, VisibleSet& out) {
  for (int64_t i = 0; i < query_len; ++i) {
    AddRows(out, 0, std::min(key_len, i + key_len - query_len + 1));
    EndQuery(out);
  }
}

// Array mode: a cell is visible iff its additive value is above -inf.
void FiniteCells(const MatF& mask, VisibleSet& out) {
  for (int64_t i = 0; i < mask.rows(); ++i) {
    for (int64_t j = 0; j < mask.cols(); ++j) {
      if (mask(i, j) > kNegInf) AddRows(out, j, j + 1);
    }
    EndQuery(out);
  }
}

// The cells of AsArray(offset, L, K) that are above -inf, found without materializing it,
// so a caller that needs only visibility does not build (and page-fault in) an L x K array
// per forward. Exact, from the float rules AsArray follows: a causal cell after the query
// and outside every rectangle holds -inf + a, which is -inf or NaN whatever the array value
// a, so it is never visible; any other cell holds 0 + a, visible iff a > -inf (NaN is not).
// So per query: the open keys are the causal prefix plus the rectangles' reopened keys, and
// the array (when there is one) is scanned only there, along its contiguous row.
// With `window` > 0 the mask is intersected with SlidingWindowMask(offset, L, K, window) as
// well (the rotating prefill): that adds -inf before each query's window start and 0 from
// it, so keys before the start are closed whatever the mask holds and the rest keep their
// value (a + 0 = a). For a causal mask where the window hides nothing this is the kernel's
// bottom-right causal mode, as the materialized path resolves it, since a rotating
// history never holds more keys than positions (K <= offset + L, so oldest + K = offset + L).
void FiniteCellsOf(const AttentionMask& mask, int64_t offset, int64_t query_len, int64_t key_len,
                   int64_t window, VisibleSet& out) {
  const int64_t oldest = OldestPosition(offset, query_len, key_len);
  const std::optional<MatF>& array = mask.array();
  // The causal prefix and one range per rectangle: on the stack for the few rectangles a
  // mask usually has (this runs per forward).
  constexpr size_t kInlineRanges = 8;
  std::array<RowRange, kInlineRanges> inline_open;
  std::vector<RowRange> heap_open;
  const size_t max_open = 1 + (mask.causal() ? mask.rects().size() : 0);
  if (max_open > kInlineRanges) heap_open.resize(max_open);
  const std::span<RowRange> storage =
      max_open > kInlineRanges ? std::span<RowRange>(heap_open) : std::span<RowRange>(inline_open);
  for (int64_t q = 0; q < query_len; ++q) {
    const int64_t pos = offset + q;
    const int64_t causal_end =
        mask.causal() ? std::clamp<int64_t>(pos - oldest + 1, 0, key_len) : key_len;
    size_t n_open = 0;
    storage[n_open++] = RowRange{0, causal_end};
    if (mask.causal()) {
      for (const RelaxRect& r : mask.rects()) {
        if (pos < r.q_lo || pos >= r.q_hi) continue;
        const int64_t lo = std::max(causal_end, r.k_lo - oldest);
        const int64_t hi = std::min(key_len, r.k_hi - oldest);
        if (lo < hi) storage[n_open++] = RowRange{lo, hi};
      }
      std::sort(storage.begin(), storage.begin() + static_cast<std::ptrdiff_t>(n_open),
                [](const RowRange& x, const RowRange& y) { return x.lo < y.lo; });
    }
    // Keys before it are decided (the open ranges may overlap), or outside the window.
    int64_t done = window > 0 ? WindowStart(offset, q, window, oldest, key_len) : 0;
    for (const RowRange& range : storage.first(n_open)) {
      const int64_t lo = std::max(range.lo, done);
      if (lo >= range.hi) continue;
      done = range.hi;
      if (!array.has_value()) {
        AddRows(out, lo, range.hi);
        continue;
      }
      const MatF& a = *array;
      const int64_t row = a.rows() == 1 ? 0 : q;
      for (int64_t k = lo; k < range.hi;) {
        while (k < range.hi && !(a(row, a.cols() == 1 ? 0 : k) > kNegInf)) ++k;
        const int64_t run = k;
        while (k < range.hi && a(row, a.cols() == 1 ? 0 : k) > kNegInf) ++k;
        AddRows(out, run, k);
      }
    }
    EndQuery(out);
  }
}

// The SDPA dispatch of spec §2.5 (B = 1, no padding): applier, then zero / pure causal /
// materialized array. Replaces `out` with the visible rows of each query and, in array mode
// when `want_bias`, returns the materialized additive mask (its finite values bias the
// scores of visible rows); without `want_bias` array mode reads the cells in place.
Result<std::optional<MatF>> Resolve(const History& history, const AttentionMask& logical,
                                    int64_t offset, int64_t query_len, VisibleSet& out,
                                    bool want_bias) {
  KV_CHECK(query_len >= 0 && history.length >= 0, "negative query or history length");
  const int64_t key_len = history.length;
  out.begin.assign(1, 0);
  out.ranges.clear();
  // Only an applier builds a new mask; otherwise the caller's is used in place.
  std::optional<AttentionMask> applied;
  if (history.has_applier) {
    KV_CHECK(history.applier.key_len == key_len, "applier K differs from the history length");
    // A rotating prefill in place, whatever its mask: the window is a per-query floor on
    // the mask's own open keys, where the materialized path builds an L x K window array
    // and its intersection for every forward. An array that does not broadcast to [L x K]
    // is refused as the dispatch below refuses it (Intersect with a window array would
    // abort on it instead).
    if (!want_bias && history.applier.query_len > 1 && history.applier.query_len == query_len &&
        history.applier.window > 0) {
      if (Status s = CheckBroadcasts(logical, query_len, key_len); !s.ok()) return s;
      FiniteCellsOf(logical, offset, query_len, key_len, history.applier.window, out);
      return std::optional<MatF>();
    }
    Result<AttentionMask> result = ApplyRotating(history.applier, logical, offset);
    if (!result.ok()) return result.status();
    applied = std::move(result).value();
  }
  const AttentionMask& mask = applied ? *applied : logical;
  if (mask.IsZero() || (mask.IsPureCausal() && query_len == 1)) {
    AllRows(query_len, key_len, out);
    return std::optional<MatF>();
  }
  if (mask.IsPureCausal()) {
    BottomRightCausalRows(query_len, key_len, out);
    return std::optional<MatF>();
  }
  if (Status s = CheckBroadcasts(mask, query_len, key_len); !s.ok()) return s;
  if (!want_bias) {
    FiniteCellsOf(mask, offset, query_len, key_len, /*window=*/0, out);
    return std::optional<MatF>();
  }
  MatF materialized = mask.AsArray(offset, query_len, key_len);
  FiniteCells(materialized, out);
  return std::optional<MatF>(std::move(materialized));
}

// Softmax attention of one query over its visible rows. Plain loops in a fixed order keep
// the float result independent of vectorization (gcc and clang digests must agree).
void AttendOne(const MatF& q, int64_t i, const MatF& keys, const MatF& values,
               std::span<const int64_t> rows, const std::optional<MatF>& bias, float scale,
               std::vector<float>& scores, MatF& out) {
  if (rows.empty()) return;  // a query that sees nothing keeps its zero row
  scores.resize(rows.size());
  float max_score = kNegInf;
  for (size_t n = 0; n < rows.size(); ++n) {
    float dot = 0.0f;
    for (int64_t d = 0; d < q.cols(); ++d) dot += q(i, d) * keys(rows[n], d);
    scores[n] = scale * dot + (bias.has_value() ? (*bias)(i, rows[n]) : 0.0f);
    max_score = std::max(max_score, scores[n]);
  }
  float denom = 0.0f;
  for (size_t n = 0; n < rows.size(); ++n) {
    scores[n] = std::exp(scores[n] - max_score);
    denom += scores[n];
  }
  for (size_t n = 0; n < rows.size(); ++n) {
    for (int64_t d = 0; d < values.cols(); ++d) out(i, d) += scores[n] * values(rows[n], d);
  }
  for (int64_t d = 0; d < values.cols(); ++d) out(i, d) /= denom;
}

}  // namespace

AttentionMask AttentionMask::Zero() { return AttentionMask(); }

AttentionMask AttentionMask::Causal() {
  AttentionMask m;
  m.causal_ = true;
  return m;
}

AttentionMask AttentionMask::Array(MatF additive) {
  AttentionMask m;
  m.array_ = std::move(additive);
  return m;
}

Result<AttentionMask> AttentionMask::Relax(const std::vector<RelaxRect>& rects) const {
  // Rectangles reopen causal cells; a mask without the causal flag has none to reopen
  // (the owner of a pure array should edit it directly).
  if (!causal_) {
    return InvalidArgument(array_.has_value() ? "Relax on a pure array mask"
                                              : "Relax on a zero mask");
  }
  AttentionMask out = *this;
  for (const RelaxRect& r : rects) {
    if (!IsNoOpRect(r)) out.rects_.push_back(r);
  }
  return out;
}

AttentionMask AttentionMask::Intersect(AttentionMask a, AttentionMask b) {
  if (a.IsZero()) return b;
  if (b.IsZero()) return a;
  AttentionMask out;
  out.causal_ = a.causal_ || b.causal_;
  out.rects_ = IntersectRects(a, b);
  if (a.array_.has_value() && b.array_.has_value()) {
    out.array_ = AddArrays(std::move(*a.array_), *b.array_);
  } else {
    out.array_ = a.array_.has_value() ? std::move(a.array_) : std::move(b.array_);
  }
  return out;
}

MatF AttentionMask::AsArray(int64_t offset, int64_t query_len, int64_t key_len) const {
  KV_CHECK(query_len >= 0 && key_len >= 0, "negative mask shape");
  const int64_t oldest = OldestPosition(offset, query_len, key_len);
  MatF out = MatF::Zero(query_len, key_len);
  if (causal_) {
    for (int64_t q = 0; q < query_len; ++q) {
      for (int64_t k = 0; k < key_len; ++k) {
        if (oldest + k > offset + q) out(q, k) = kNegInf;
      }
    }
  }
  for (const RelaxRect& r : rects_) ResetRect(r, offset, oldest, out);
  if (array_.has_value()) {
    if (array_->rows() == query_len && array_->cols() == key_len) {
      out += *array_;
    } else {
      out += BroadcastTo(*array_, query_len, key_len);
    }
  }
  return out;
}

AttentionMask SlidingWindowMask(int64_t offset, int64_t query_len, int64_t key_len,
                                int64_t window) {
  if (window <= 0) return AttentionMask::Zero();
  const int64_t oldest = OldestPosition(offset, query_len, key_len);
  MatF out(query_len, key_len);
  bool blocked = false;
  for (int64_t q = 0; q < query_len; ++q) {
    const int64_t count = WindowStart(offset, q, window, oldest, key_len);
    out.row(q).head(count).setConstant(kNegInf);
    out.row(q).tail(key_len - count).setZero();
    blocked = blocked || count > 0;
  }
  return blocked ? AttentionMask::Array(std::move(out)) : AttentionMask::Zero();
}

Result<AttentionMask> ApplyRotating(const RotatingApplier& applier, const AttentionMask& logical,
                                    int64_t offset) {
  KV_CHECK(applier.query_len >= 1 && applier.key_len >= 0, "malformed rotating applier");
  if (applier.query_len > 1) {
    // Prefill: the buffer is in logical order, so the window is an ordinary array mask. A
    // caller's array that does not broadcast to [L x K] is refused here, as the dispatch
    // refuses it without an applier; Intersect would abort on it whenever the window hides
    // a key.
    if (Status s = CheckBroadcasts(logical, applier.query_len, applier.key_len); !s.ok()) {
      return s;
    }
    return AttentionMask::Intersect(
        logical, SlidingWindowMask(offset, applier.query_len, applier.key_len, applier.window));
  }
  // Decode / View: storage already enforces the window and every stored key is at or
  // before the query, so zero and causal reduce to no mask.
  if (logical.IsZero() || logical.IsPureCausal()) return AttentionMask::Zero();
  return RotateDecodeMask(applier, logical, offset);
}

Result<std::vector<std::vector<int64_t>>> VisibleRows(const History& history,
                                                      const AttentionMask& logical, int64_t offset,
                                                      int64_t query_len) {
  VisibleSet set;
  if (Status s = VisibleRowsInto(history, logical, offset, query_len, set); !s.ok()) return s;
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(set.queries()));
  for (int64_t q = 0; q < set.queries(); ++q) ExpandRows(set.Of(q), rows[static_cast<size_t>(q)]);
  return rows;
}

Status VisibleRowsInto(const History& history, const AttentionMask& logical, int64_t offset,
                       int64_t query_len, VisibleSet& out) {
  Result<std::optional<MatF>> bias =
      Resolve(history, logical, offset, query_len, out, /*want_bias=*/false);
  return bias.ok() ? Status::Ok() : bias.status();
}

Status MaterializedVisibleRowsInto(const History& history, const AttentionMask& logical,
                                   int64_t offset, int64_t query_len, VisibleSet& out) {
  Result<std::optional<MatF>> bias =
      Resolve(history, logical, offset, query_len, out, /*want_bias=*/true);
  return bias.ok() ? Status::Ok() : bias.status();
}

Result<MatF> Sdpa(const MatF& q, const History& history, const AttentionMask& logical,
                  int64_t offset, float scale) {
  SdpaScratch scratch;
  MatF out;
  if (Status s = SdpaInto(q, history, logical, offset, scale, scratch, out); !s.ok()) return s;
  return out;
}

Status SdpaInto(const MatF& q, const History& history, const AttentionMask& logical, int64_t offset,
                float scale, SdpaScratch& scratch, MatF& out) {
  KV_CHECK(history.length == 0 || (history.k != nullptr && history.v != nullptr),
           "history rows without K/V tensors");
  if (history.k != nullptr && q.cols() != history.k->cols()) {
    return InvalidArgument("Sdpa: query width " + std::to_string(q.cols()) +
                           " differs from key width " + std::to_string(history.k->cols()));
  }
  // Only an additive array can bias a visible score: causal, rectangles and the rotating
  // window are 0 or -inf per cell, so without an array every visible cell's bias is +0 and
  // the rows alone say everything (scale * dot + 0.0f equals scale * dot but for the sign
  // of a zero, which exp cannot see). Resolving them in place spares an L x K array per
  // forward: a rotating prefill's window, or a relaxed causal mask.
  const bool want_bias = logical.array().has_value();
  Result<std::optional<MatF>> bias =
      Resolve(history, logical, offset, q.rows(), scratch.visible, want_bias);
  if (!bias.ok()) return bias.status();
  out.setZero(q.rows(), history.v != nullptr ? history.v->cols() : 0);
  if (history.length == 0) return Status::Ok();
  // Rows past the history's length are stale: AttendOne reads only visible rows.
  history.k->RowsToFloatInto(0, history.length, scratch.keys);
  history.v->RowsToFloatInto(0, history.length, scratch.values);
  for (int64_t i = 0; i < q.rows(); ++i) {
    scratch.rows.clear();
    ExpandRows(scratch.visible.Of(i), scratch.rows);
    AttendOne(q, i, scratch.keys, scratch.values, scratch.rows, *bias, scale, scratch.scores, out);
  }
  return Status::Ok();
}

}  // namespace kvtwin
