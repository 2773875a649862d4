// AttentionMask: the mask algebra of spec §2.5 for one sequence (B = 1), and the "SDPA
// dispatch" that decides which history rows each query attends. Forms: zero (no mask),
// pure causal, causal plus relaxation rectangles (absolute positions), additive array
// (0 = allowed, -inf = blocked; shape [L x K], [1 x K] or [L x 1]). Rectangles that change
// nothing are dropped so a mask stays "pure causal". Value type; single-threaded.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "src/cache.h"
#include "src/core/status.h"
#include "src/core/tensor.h"

namespace kvtwin {

struct RelaxRect {
  int64_t q_lo, q_hi, k_lo, k_hi;  // reopens q in [q_lo, q_hi), k in [k_lo, k_hi)
  friend bool operator==(const RelaxRect&, const RelaxRect&) = default;
};

class AttentionMask {
 public:
  static AttentionMask Zero();
  static AttentionMask Causal();
  static AttentionMask Array(MatF additive);

  // Adds rectangles; an error on a zero or pure array mask. No-op rectangles are dropped.
  Result<AttentionMask> Relax(const std::vector<RelaxRect>& rects) const;
  // Additive intersection with the rules of spec §2.5.
  // By value: a temporary's array is moved, not copied (masks are L x K at long contexts).
  static AttentionMask Intersect(AttentionMask a, AttentionMask b);

  bool IsZero() const { return !causal_ && rects_.empty() && !array_.has_value(); }
  bool IsPureCausal() const { return causal_ && rects_.empty() && !array_.has_value(); }
  bool causal() const { return causal_; }
  const std::vector<RelaxRect>& rects() const { return rects_; }
  const std::optional<MatF>& array() const { return array_; }

  // [L x K] additive mask for queries at absolute positions offset..offset+L-1 over K keys
  // whose column 0 is absolute position max(0, offset + L - K).
  MatF AsArray(int64_t offset, int64_t query_len, int64_t key_len) const;

 private:
  bool causal_ = false;
  std::vector<RelaxRect> rects_;
  std::optional<MatF> array_;
};

// Blocks keys older than the W-key window of each query (zero mask if nothing is blocked
// or window <= 0).
AttentionMask SlidingWindowMask(int64_t offset, int64_t query_len, int64_t key_len, int64_t window);

// The rotating applier (spec §2.5): decode/View (query_len 1) rotates a materialized mask
// into ring order; prefill intersects with the sliding window. Errors: a decode's array mask
// whose K width is neither 1 nor key_len, or a prefill's that does not broadcast to [L x K].
Result<AttentionMask> ApplyRotating(const RotatingApplier& applier, const AttentionMask& logical,
                                    int64_t offset);

// For each of the L queries (absolute offset..offset+L-1), the history rows it attends, in
// row order. Follows the SDPA dispatch: applier (if any) then zero / pure causal (bottom-
// right aligned) / materialized array.
Result<std::vector<std::vector<int64_t>>> VisibleRows(const History& history,
                                                      const AttentionMask& logical, int64_t offset,
                                                      int64_t query_len);
// Rows [lo, hi) of a history.
struct RowRange {
  int64_t lo = 0, hi = 0;
  friend bool operator==(const RowRange&, const RowRange&) = default;
};

// The visible rows of every query of one forward, run-length encoded: query i attends the
// ranges [begin[i], begin[i + 1]), ascending, disjoint and never adjacent, so a causal
// query is one range however long the history, and a caller asking per forward pays for
// the mask's structure rather than L x K. Flat, so reusing one VisibleSet reuses two
// buffers.
struct VisibleSet {
  std::vector<int64_t> begin;  // query_len + 1 entries
  std::vector<RowRange> ranges;
  int64_t queries() const { return begin.empty() ? 0 : static_cast<int64_t>(begin.size()) - 1; }
  std::span<const RowRange> Of(int64_t query) const {
    const auto b = static_cast<size_t>(begin[static_cast<size_t>(query)]);
    const auto e = static_cast<size_t>(begin[static_cast<size_t>(query) + 1]);
    return std::span<const RowRange>(ranges).subspan(b, e - b);
  }
};
// VisibleRows into `out` (its previous contents replaced, its capacity kept).
Status VisibleRowsInto(const History& history, const AttentionMask& logical, int64_t offset,
                       int64_t query_len, VisibleSet& out);
// The same rows read off the materialized L x K mask (AsArray) that Sdpa, like a kernel
// taking an additive bias, consumes: its finite cells. VisibleRowsInto finds them without
// building the array, by the float rules AsArray follows; a checker can hold both to the
// reference where L x K is small.
Status MaterializedVisibleRowsInto(const History& history, const AttentionMask& logical,
                                   int64_t offset, int64_t query_len, VisibleSet& out);

// Plain scaled dot-product attention of q [L x D] over the history through the same
// dispatch (float math), for parity tests and the simulator's attention check. A query
// whose mask leaves it no row gets a zero output row (not the NaN of an empty softmax).
Result<MatF> Sdpa(const MatF& q, const History& history, const AttentionMask& logical,
                  int64_t offset, float scale);
// Sdpa's buffers, kept by a caller that runs it often (the simulator's attention check), so
// that a call allocates nothing once they have grown; only a mask with an additive array
// (its values bias the scores) or a relaxed decode over a rotating ring is still materialized.
struct SdpaScratch {
  VisibleSet visible;
  MatF keys, values;
  std::vector<int64_t> rows;
  std::vector<float> scores;
};
// Sdpa into `out` (resized to [L x Dv]), through `scratch`: the same result and errors.
Status SdpaInto(const MatF& q, const History& history, const AttentionMask& logical, int64_t offset,
                float scale, SdpaScratch& scratch, MatF& out);

}  // namespace kvtwin
