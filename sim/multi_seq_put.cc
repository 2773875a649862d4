// MultiSeqDriver, the Put of a forward: the batch's K/V rows scattered into its cells, and
// before it, on some forwards, a malformed Put that must be refused and change nothing.
#include <fmt/format.h>

#include <iterator>
#include <string>

#include "sim/multi_seq_driver.h"
#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

DType OtherDType(DType d) { return d == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32; }

// `t` with `rows` rows and `cols` columns in `dtype`: t's values where both have a cell, a
// value of its own elsewhere (never read by a cache that refuses the call).
Tensor Reshaped(const Tensor& t, DType dtype, int64_t rows, int64_t cols) {
  Tensor out(dtype, rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out.Set(r, c, r < t.rows() && c < t.cols() ? t.At(r, c) : 0.75f);
    }
  }
  return out;
}

}  // namespace

Check MultiSeqDriver::PutRows(const model::MsBatch& batch, const char* what) {
  const auto n = static_cast<int64_t>(batch.size());
  put_k_.EnsureShape(config_.dtype, n, config_.kv_cols);
  put_v_.EnsureShape(config_.dtype, n, config_.kv_cols);
  for (int64_t i = 0; i < n; ++i) {
    const model::MsToken& t = batch[static_cast<size_t>(i)];
    synth_.FillKvRow(put_k_, i, 0, t.pos, t.token.h, false);
    synth_.FillKvRow(put_v_, i, 0, t.pos, t.token.h, true);
  }
  if (Check c = ProbeRefusedPut()) return c;
  if (Status s = cache_->Put(put_k_, put_v_); !s.ok()) {
    return Mismatch{fmt::format("{} outcome", what), Status::Ok().ToString(), s.ToString()};
  }
  return std::nullopt;
}

// One forward in three first hands Put a malformed pair: one side in the other dtype, a
// column too many, or a row too many or too few, the other side right (as a caller whose
// V projection alone is off would). Spec §2.8 (and §8's list of what is not transactional,
// which does not name Put) make that an InvalidArgument that writes nothing, so the rows of
// the forward's cells must read as before, bit for bit; a Put that checks and scatters one
// side before looking at the other would already have overwritten those cells. A pure
// function of the step, so a replay or a shrink makes the same calls.
Check MultiSeqDriver::ProbeRefusedPut() {
  if (steps_ % 3 != 2 || put_k_.rows() == 0) return std::nullopt;
  const CausalCache& kv = cache_->kv();
  const std::vector<int64_t> cells = kv.locations();
  const auto n = static_cast<int64_t>(cells.size());
  // The rows as they stand: what a refused Put must leave.
  const int64_t cols = config_.kv_cols;
  held_k_.EnsureShape(config_.dtype, n, cols);
  held_v_.EnsureShape(config_.dtype, n, cols);
  for (int64_t i = 0; i < n; ++i) {
    held_k_.CopyRows(i, kv.k(), cells[static_cast<size_t>(i)], 1);
    kv.VRowInto(cells[static_cast<size_t>(i)], v_row_);
    held_v_.CopyRows(i, v_row_, 0, 1);
  }
  // The malformations, one per probe in turn: which side is off and how.
  struct Malformed {
    bool k_side;
    bool other_dtype;
    int64_t extra_cols, extra_rows;  // extra_rows -1: one row fewer (one more for a batch of 1)
    const char* what;
  };
  static constexpr Malformed kMalformed[] = {{false, true, 0, 0, "V in the other dtype"},
                                             {false, false, 1, 0, "V a column too wide"},
                                             {true, true, 0, 0, "K in the other dtype"},
                                             {true, false, 1, 0, "K a column too wide"},
                                             {false, false, 0, 1, "V a row too many"},
                                             {true, false, 0, -1, "K with another row count"}};
  const Malformed& m = kMalformed[static_cast<size_t>(steps_ / 3) % std::size(kMalformed)];
  const int64_t rows = m.extra_rows >= 0 ? n + m.extra_rows : (n > 1 ? n - 1 : n + 1);
  const Tensor bad = Reshaped(m.k_side ? put_k_ : put_v_,
                              m.other_dtype ? OtherDType(config_.dtype) : config_.dtype, rows,
                              cols + m.extra_cols);
  const Status s = m.k_side ? cache_->Put(bad, put_v_) : cache_->Put(put_k_, bad);
  const std::string call = fmt::format("Put with {} ({} rows)", m.what, n);
  if (s.code() != StatusCode::kInvalidArgument) {
    return Mismatch{call + " outcome", "InvalidArgument", s.ToString()};
  }
  ++coverage_.refused_puts;
  if (kv.locations() != cells)
    return ListMismatch(call + ": the forward's cells", cells, kv.locations());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t cell = cells[static_cast<size_t>(i)];
    kv.VRowInto(cell, v_row_);
    const bool k_same = kv.k().Rows(cell, 1).Equals(TensorView(held_k_).Rows(i, 1));
    const bool v_same = TensorView(v_row_).Equals(TensorView(held_v_).Rows(i, 1));
    if (!k_same || !v_same) {
      const char* side = k_same ? "V" : "K";
      const float want = k_same ? held_v_.At(i, 0) : held_k_.At(i, 0);
      const float got = k_same ? v_row_.At(0, 0) : kv.k().At(cell, 0);
      return Mismatch{fmt::format("{} row of cell {} after a refused {}", side, cell, call),
                      fmt::format("unchanged (column 0: {})", want),
                      fmt::format("overwritten (column 0: {})", got)};
    }
  }
  return std::nullopt;
}

}  // namespace kvtwin::sim
