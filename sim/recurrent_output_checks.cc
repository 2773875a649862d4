// LayerOracle's recurrent output check (spec §2.4): what a recurrent forward hands the rest
// of the model, the conv output and the gated-delta read-out y, against the double-precision
// reference. The state checks compare what the cache keeps; a kernel can keep the right
// state and still output wrong rows (a read-out scaled like the key, taps read in the wrong
// order, a missing SiLU), which only these rows show.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "sim/checks.h"

namespace kvtwin::sim {
Check LayerOracle::CheckRecurrentOutputs(const MatF& conv_out, const MatF& y,
                                         std::span<const model::Token> log, int64_t start,
                                         int64_t n) {
  KV_CHECK(spec_.kind == CacheKind::kRecurrent, "recurrent outputs checked on another layer");
  KV_CHECK(start >= 0 && n >= 0 && start + n <= static_cast<int64_t>(log.size()),
           "the forward's tokens must be in the log");
  const int64_t channels = dims_.conv_dim();
  const int64_t width = dims_.delta_rows();
  if (conv_out.rows() < n || conv_out.cols() != channels || y.rows() != conv_out.rows() ||
      y.cols() != width) {
    return Mismatch{"recurrent forward output shapes",
                    fmt::format("conv [>= {} x {}], y [same rows x {}]", n, channels, width),
                    fmt::format("conv [{} x {}], y [{} x {}]", conv_out.rows(), conv_out.cols(),
                                y.rows(), y.cols())};
  }
  const int64_t tail = dims_.conv_tail;
  conv_window_.resize(static_cast<size_t>(tail + 1));
  // Every row of the forward, padded ones too (spec §2.4.1: a padded row convolves zeroed
  // inputs, and the real rows before it still reach it through the taps).
  for (int64_t t = 0; t < conv_out.rows(); ++t) {
    const int64_t p = start + t;
    // The raw conv inputs of positions p - tail .. p, oldest first (zeros before 0 and past
    // the real tokens). The memo holds at least a window's rows, so they stay put while this
    // one is read.
    for (int64_t r = 0; r <= tail; ++r) {
      const int64_t q = p - tail + r;
      conv_window_[static_cast<size_t>(r)] = ConvInput(q < start + n ? q : -1, log);
    }
    model::RefConvRow(conv_window_, conv_w_, conv_b_, conv_silu_, conv_out_row_);
    for (int64_t c = 0; c < channels; ++c) {
      if (!WithinDeltaTolerance(conv_out(t, c), conv_out_row_(c))) {
        return Mismatch{fmt::format("recurrent conv output {}row {} (position {}) channel {} "
                                    "(tolerance {})",
                                    t < n ? "" : "padded ", t, p, c, kDeltaTolerance),
                        fmt::format("{:.7g}", conv_out_row_(c)),
                        fmt::format("{:.7g}", conv_out(t, c))};
      }
    }
  }
  // y over the state after each token: folded once here and memoized, so the state check
  // after the step is a lookup.
  folder_.ReadOuts(log, start, start + n, expected_y_);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < width; ++j) {
      if (!WithinDeltaTolerance(y(t, j), expected_y_(t, j))) {
        return Mismatch{fmt::format("recurrent read-out y row {} (position {}) element {} "
                                    "(tolerance {})",
                                    t, start + t, j, kDeltaTolerance),
                        fmt::format("{:.7g}", expected_y_(t, j)), fmt::format("{:.7g}", y(t, j))};
      }
    }
  }
  // Spec §2.4.2: a padded token is an identity step with q zeroed, so its y is zero.
  for (int64_t t = n; t < y.rows(); ++t) {
    for (int64_t j = 0; j < width; ++j) {
      if (y(t, j) != 0.0f) {
        return Mismatch{fmt::format("recurrent read-out y of padded row {} element {}", t, j), "0",
                        fmt::format("{:.7g}", y(t, j))};
      }
    }
  }
  return std::nullopt;
}

}  // namespace kvtwin::sim
