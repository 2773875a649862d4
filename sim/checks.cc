#include "sim/checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace kvtwin::sim {
model::RefKind ToRefKind(CacheKind kind) {
  switch (kind) {
    case CacheKind::kFullKv:
      return model::RefKind::kKv;
    case CacheKind::kRotating:
      return model::RefKind::kRotating;
    case CacheKind::kRecurrent:
      return model::RefKind::kRecurrent;
  }
  return model::RefKind::kKv;
}

namespace {

model::RefGdnToken GdnToken(const SyntheticForward& synth, DType dtype, int32_t layer,
                            const RecurrentDims& d, int64_t p, const model::Token& t) {
  MatF qkv(1, d.conv_dim());
  MatF ba(1, 2 * d.num_v_heads);
  synth.FillGdnInput(qkv, ba, 0, dtype, layer, p, t.h, d);
  const int64_t qk = d.num_k_heads * d.head_k_dim;
  model::RefGdnToken out;
  VecD row = qkv.row(0).transpose().cast<double>();
  out.q = row.segment(0, qk);
  out.k = row.segment(qk, qk);
  out.v = row.segment(2 * qk, d.num_v_heads * d.head_v_dim);
  VecD b = ba.row(0).transpose().cast<double>();
  out.beta_raw = b.segment(0, d.num_v_heads);
  out.alpha_raw = b.segment(d.num_v_heads, d.num_v_heads);
  return out;
}

model::RefGdnParams RefParams(const GdnParams& p) {
  model::RefGdnParams out;
  out.dims = {p.dims.num_k_heads, p.dims.num_v_heads, p.dims.head_k_dim, p.dims.head_v_dim};
  out.dt_bias = p.dt_bias.cast<double>();
  out.a_exp = p.a_exp.cast<double>();
  return out;
}

std::string DescribeRow(const Tensor& t, int64_t row) { return DecodeRow(t, row).ToString(); }

std::string ExpectedTag(int64_t p, uint64_t h, int32_t layer, bool is_value) {
  return fmt::format("pos {} h=0x{:06x} L{} {}", p, h & 0xFFFFFF, layer, is_value ? "V" : "K");
}

// Element-wise as floats, NaN equal to NaN. Typed loops: this runs on every stored row
// after every op, and a per-element dtype dispatch was a third of a fuzz execution.
bool RowEquals(const Tensor& a, int64_t ra, const Tensor& b, int64_t rb) {
  if (a.dtype() != b.dtype() || a.cols() != b.cols()) return false;
  KV_CHECK(ra >= 0 && ra < a.rows() && rb >= 0 && rb < b.rows(), "row out of range");
  return a.Visit([&](const auto& ma) {
    return b.Visit([&](const auto& mb) {
      for (int64_t c = 0; c < ma.cols(); ++c) {
        const auto x = static_cast<float>(ma(ra, c));
        const auto y = static_cast<float>(mb(rb, c));
        if (!(x == y) && !(std::isnan(x) && std::isnan(y))) return false;
      }
      return true;
    });
  });
}

}  // namespace

Result<std::vector<int64_t>> RotatingWindowSlots(int64_t offset, int64_t idx, int64_t rows,
                                                 int64_t window) {
  std::vector<int64_t> slots;
  if (offset <= window) {  // R1: slot i holds position i
    if (idx != offset || rows < offset) {
      return FailedPrecondition(
          fmt::format("linear regime needs idx == offset <= rows; "
                      "offset {} idx {} rows {}",
                      offset, idx, rows));
    }
    for (int64_t i = 0; i < offset; ++i) slots.push_back(i);
  } else if (rows == window) {  // R2: logical j at (idx + j) mod W
    if (idx < 0 || idx > window) {
      return FailedPrecondition(fmt::format("ring cursor {} outside [0, {}]", idx, window));
    }
    for (int64_t j = 0; j < window; ++j) slots.push_back((idx + j) % window);
  } else if (rows > window && idx == rows) {  // R3: oversize linear, window = trailing W
    for (int64_t j = rows - window; j < rows; ++j) slots.push_back(j);
  } else {
    return FailedPrecondition(fmt::format("no storage regime fits offset {} idx {} rows {} W {}",
                                          offset, idx, rows, window));
  }
  return slots;
}

LayerOracle::LayerOracle(const SyntheticForward& synth, const StackConfig& config, int32_t layer)
    : synth_(synth),
      layer_(layer),
      spec_(config.layers[static_cast<size_t>(layer)]),
      dtype_(config.dtype),
      cols_(config.kv_cols()),
      dims_(config.recurrent),
      folder_(RefParams(synth.GdnParamsFor(layer, config.recurrent)),
              [this](int64_t p, const model::Token& t) {
                return GdnToken(synth_, dtype_, layer_, dims_, p, t);
              }) {}

void LayerOracle::FillRow(Tensor& out, int64_t row, int64_t p, const model::Token& token,
                          bool is_value) const {
  synth_.FillKvRow(out, row, layer_, p, token.h, is_value);
}

const Tensor& LayerOracle::ExpectedRow(int64_t p, const model::Token& t, bool is_value) {
  KV_CHECK(p >= 0, "negative position");
  const auto at = static_cast<size_t>(p);
  if (at >= memo_h_.size()) {
    const int64_t rows = std::max<int64_t>(64, 2 * (p + 1));
    if (memo_k_.empty()) {
      memo_k_ = Tensor(dtype_, rows, cols_);
      memo_v_ = Tensor(dtype_, rows, cols_);
    } else {
      memo_k_.ResizeRows(rows);
      memo_v_.ResizeRows(rows);
    }
    memo_h_.resize(static_cast<size_t>(rows));
    memo_set_.resize(static_cast<size_t>(rows), 0);
  }
  // Bit 0: K is set for memo_h_[at]; bit 1: V is.
  const uint8_t bit = is_value ? 2 : 1;
  if (memo_h_[at] != t.h) {
    memo_h_[at] = t.h;
    memo_set_[at] = 0;
  }
  Tensor& memo = is_value ? memo_v_ : memo_k_;
  if ((memo_set_[at] & bit) == 0) {
    FillRow(memo, p, p, t, is_value);
    memo_set_[at] |= bit;
  }
  return memo;
}

bool LayerOracle::MatchesExpected(const Tensor& actual, int64_t row, int64_t p,
                                  const model::Token& t, bool is_value) {
  const Tensor& want = ExpectedRow(p, t, is_value);
  if (actual.dtype() == want.dtype() && actual.cols() == want.cols() && row >= 0 &&
      row < actual.rows()) {
    const bool same_bits = actual.Visit([&](const auto& ma) {
      return want.Visit([&](const auto& mb) {
        using A = std::decay_t<decltype(*ma.data())>;
        using B = std::decay_t<decltype(*mb.data())>;
        if constexpr (std::is_same_v<A, B>) {
          return std::memcmp(ma.data() + row * ma.cols(), mb.data() + p * mb.cols(),
                             static_cast<size_t>(ma.cols()) * sizeof(A)) == 0;
        } else {
          return false;
        }
      });
    });
    if (same_bits) return true;
  }
  return RowEquals(actual, row, want, p);
}

Check LayerOracle::CheckKvRows(const Tensor& k, const Tensor& v, const std::vector<int64_t>& slots,
                               const model::TokenLog& log, int64_t first_position,
                               const std::string& where) {
  for (size_t j = 0; j < slots.size(); ++j) {
    const int64_t p = first_position + static_cast<int64_t>(j);
    const model::Token& t = log[static_cast<size_t>(p)];
    for (int is_value = 0; is_value < 2; ++is_value) {
      const Tensor& actual = is_value ? v : k;
      if (!MatchesExpected(actual, slots[j], p, t, is_value != 0)) {
        const Provenance got = DecodeRow(actual, slots[j]);
        const bool same_tag = got.valid && got.position == p && got.hash24 == (t.h & 0xFFFFFF);
        return Mismatch{fmt::format("{} slot {} (logical position {})", where, slots[j], p),
                        ExpectedTag(p, t.h, layer_, is_value != 0),
                        got.ToString() + (same_tag ? " (right tag, other values)" : "")};
      }
    }
  }
  return std::nullopt;
}

Check LayerOracle::CheckLive(const LayerCache& cache, const model::RefCache& ref) {
  if (cache.Offset() != ref.Offset()) {
    return Mismatch{"offset", std::to_string(ref.Offset()), std::to_string(cache.Offset())};
  }
  if (cache.ScheduleActive() != ref.ScheduleActive()) {
    return Mismatch{"capture schedule active", ref.ScheduleActive() ? "yes" : "no",
                    cache.ScheduleActive() ? "yes" : "no"};
  }
  switch (cache.kind()) {
    case CacheKind::kFullKv:
      return CheckKvLive(static_cast<const KvCache&>(cache), ref);
    case CacheKind::kRotating:
      return CheckRotatingLive(static_cast<const RotatingCache&>(cache), ref);
    case CacheKind::kRecurrent: {
      const auto& rec = static_cast<const RecurrentCache&>(cache);
      if (rec.HasState() != ref.HasState()) {
        return Mismatch{"recurrent state exists", ref.HasState() ? "yes" : "no",
                        rec.HasState() ? "yes" : "no"};
      }
      if (!rec.HasState()) return std::nullopt;
      return CheckRecurrentState(rec.conv(), rec.delta(), ref.log(), ref.Offset(), "live");
    }
  }
  return std::nullopt;
}

Check LayerOracle::CheckLiveContent(const LayerCache& cache, const model::TokenLog& log) {
  const auto offset = static_cast<int64_t>(log.size());
  if (cache.Offset() != offset) {
    return Mismatch{"offset", std::to_string(offset), std::to_string(cache.Offset())};
  }
  if (offset == 0) return std::nullopt;  // nothing to hold, whatever was allocated
  switch (cache.kind()) {
    case CacheKind::kFullKv:
      return CheckKvContent(static_cast<const KvCache&>(cache), log);
    case CacheKind::kRotating:
      return CheckRotatingContent(static_cast<const RotatingCache&>(cache), log);
    case CacheKind::kRecurrent: {
      const auto& rec = static_cast<const RecurrentCache&>(cache);
      if (!rec.HasState()) return Mismatch{"recurrent state exists", "yes", "no"};
      return CheckRecurrentState(rec.conv(), rec.delta(), log, offset, "live");
    }
  }
  return std::nullopt;
}

Check LayerOracle::CheckKvLive(const KvCache& cache, const model::RefCache& ref) {
  if (cache.HasBuffer() != ref.HasState()) {
    return Mismatch{"kv buffer exists", ref.HasState() ? "yes" : "no",
                    cache.HasBuffer() ? "yes" : "no"};
  }
  return CheckKvContent(cache, ref.log());
}

Check LayerOracle::CheckKvContent(const KvCache& cache, const model::TokenLog& log) {
  const auto offset = static_cast<int64_t>(log.size());
  if (offset > 0 && !cache.HasBuffer()) return Mismatch{"kv buffer exists", "yes", "no"};
  // Growth truncates to the offset before adding a step, so only Cap >= offset holds.
  if (cache.Capacity() < cache.Offset()) {
    return Mismatch{"kv capacity", fmt::format(">= {}", cache.Offset()),
                    std::to_string(cache.Capacity())};
  }
  std::vector<int64_t> slots(static_cast<size_t>(offset));
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int64_t>(i);
  return CheckKvRows(cache.keys(), cache.values(), slots, log, 0, "live kv");
}

Check LayerOracle::CheckRotatingLive(const RotatingCache& cache, const model::RefCache& ref) {
  if (cache.HasBuffer() != ref.HasState()) {
    return Mismatch{"window buffer exists", ref.HasState() ? "yes" : "no",
                    cache.HasBuffer() ? "yes" : "no"};
  }
  if (!cache.HasBuffer()) return std::nullopt;
  return CheckRotatingContent(cache, ref.log());
}

Check LayerOracle::CheckRotatingContent(const RotatingCache& cache, const model::TokenLog& log) {
  if (!cache.HasBuffer()) {
    return log.empty() ? std::nullopt : Check(Mismatch{"window buffer exists", "yes", "no"});
  }
  auto slots =
      RotatingWindowSlots(cache.Offset(), cache.ring_idx(), cache.buffer_rows(), cache.window());
  if (!slots.ok())
    return Mismatch{"window storage regime", "R1, R2 or R3", slots.status().message()};
  const int64_t first = static_cast<int64_t>(log.size()) - static_cast<int64_t>(slots->size());
  return CheckKvRows(cache.keys(), cache.values(), *slots, log, first, "live window");
}

Check LayerOracle::CheckRecurrentState(const Tensor& conv, const MatF& delta,
                                       const model::TokenLog& log, int64_t length,
                                       const std::string& where) {
  if (conv.dtype() != dtype_ || conv.rows() != dims_.conv_tail || conv.cols() != dims_.conv_dim()) {
    return Mismatch{where + " conv shape",
                    fmt::format("{}[{}x{}]", DTypeName(dtype_), dims_.conv_tail, dims_.conv_dim()),
                    conv.ShapeString()};
  }
  MatF x = MatF::Zero(1, dims_.conv_dim());
  const auto positions = model::ExpectedConvTailPositions(length, dims_.conv_tail);
  for (int64_t r = 0; r < dims_.conv_tail; ++r) {
    const int64_t p = positions[static_cast<size_t>(r)];
    x.setZero();
    if (p >= 0)
      synth_.FillConvInput(x, 0, dtype_, layer_, p, log[static_cast<size_t>(p)].h,
                           dims_.conv_dim());
    for (int64_t c = 0; c < dims_.conv_dim(); ++c) {
      if (conv.At(r, c) != x(0, c)) {
        return Mismatch{fmt::format("{} conv tail row {} (position {}) column {}", where, r, p, c),
                        fmt::format("{}", x(0, c)), fmt::format("{}", conv.At(r, c))};
      }
    }
  }
  const MatD expected = folder_.StateAfter(log, length);
  if (delta.rows() != expected.rows() || delta.cols() != expected.cols()) {
    return Mismatch{where + " delta shape", fmt::format("{}x{}", expected.rows(), expected.cols()),
                    fmt::format("{}x{}", delta.rows(), delta.cols())};
  }
  for (Eigen::Index i = 0; i < expected.size(); ++i) {
    const double e = expected.data()[i];
    const double a = static_cast<double>(delta.data()[i]);
    if (!(std::abs(a - e) <= kDeltaTolerance * std::max(1.0, std::abs(e)))) {
      return Mismatch{fmt::format("{} delta state after {} tokens, element {} (tolerance {})",
                                  where, length, i, kDeltaTolerance),
                      fmt::format("{:.7g}", e), fmt::format("{:.7g}", a)};
    }
  }
  return std::nullopt;
}

Check LayerOracle::CheckSnapshot(const CacheSnapshot* prod, const model::RefSnap& ref) {
  if ((prod == nullptr) != !ref.has_value()) {
    return Mismatch{"snapshot presence", ref ? "a snapshot" : "null", prod ? "a snapshot" : "null"};
  }
  if (prod == nullptr) return std::nullopt;
  if (prod->to() != ref->to || (spec_.kind == CacheKind::kFullKv && prod->from() != ref->from)) {
    return Mismatch{"snapshot range", fmt::format("[{}, {})", ref->from, ref->to),
                    fmt::format("[{}, {})", prod->from(), prod->to())};
  }
  if (prod->kind() == CacheKind::kFullKv) {
    const auto& s = static_cast<const KvSnapshot&>(*prod);
    const int64_t n = ref->to - ref->from;
    if (s.k().rows() != n || s.v().rows() != n) {
      return Mismatch{"kv snapshot rows", std::to_string(n), std::to_string(s.k().rows())};
    }
    model::TokenLog log(static_cast<size_t>(ref->from));  // positions below from are unused
    log.insert(log.end(), ref->tokens.begin(), ref->tokens.end());
    std::vector<int64_t> slots(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = i;
    return CheckKvRows(s.k(), s.v(), slots, log, ref->from, "kv snapshot");
  }
  if (prod->kind() == CacheKind::kRotating) {
    const auto& s = static_cast<const RotatingSnapshot&>(*prod);
    auto slots = RotatingWindowSlots(s.to(), s.idx(), s.k().rows(), spec_.window);
    if (!slots.ok())
      return Mismatch{"snapshot window regime", "R1, R2 or R3", slots.status().message()};
    const int64_t first = s.to() - static_cast<int64_t>(slots->size());
    return CheckKvRows(s.k(), s.v(), *slots, ref->tokens, first, "window snapshot");
  }
  const auto& s = static_cast<const RecurrentSnapshot&>(*prod);
  return CheckRecurrentState(s.conv(), s.delta(), ref->tokens, s.offset(), "recurrent snapshot");
}

Check LayerOracle::CheckHistory(const History& history, const model::TokenLog& log_after,
                                int64_t start, int64_t query_len, const Op& write) {
  const model::RefKind kind = ToRefKind(spec_.kind);
  const auto expected = model::ExpectedHistoryPositions(kind, spec_.window, start, query_len);
  const auto k_len = static_cast<int64_t>(expected.size());
  if (history.length != k_len) {
    return Mismatch{"history length", std::to_string(k_len), std::to_string(history.length)};
  }
  const bool ring = spec_.kind == CacheKind::kRotating && query_len == 1;
  if (spec_.kind == CacheKind::kRotating && !history.has_applier) {
    return Mismatch{"rotating history applier", "present", "missing"};
  }
  std::vector<int64_t> row_positions(static_cast<size_t>(k_len));
  for (int64_t s = 0; s < k_len; ++s) {
    const int64_t j = ring ? (((s - history.applier.ring_idx) % k_len) + k_len) % k_len : s;
    row_positions[static_cast<size_t>(s)] = expected[static_cast<size_t>(j)];
  }
  for (int64_t s = 0; s < k_len; ++s) {
    const int64_t p = row_positions[static_cast<size_t>(s)];
    const model::Token& t = log_after[static_cast<size_t>(p)];
    for (int is_value = 0; is_value < 2; ++is_value) {
      const Tensor& actual = is_value ? *history.v : *history.k;
      if (!MatchesExpected(actual, s, p, t, is_value != 0)) {
        return Mismatch{fmt::format("history row {} of {} (write [{}, {}))", s, k_len, start,
                                    start + query_len),
                        ExpectedTag(p, t.h, layer_, is_value != 0), DescribeRow(actual, s)};
      }
    }
  }
  return CheckVisible(history, row_positions, start, query_len, write, kind);
}

Check LayerOracle::CheckView(const History& view, const model::TokenLog& log) {
  const auto offset = static_cast<int64_t>(log.size());
  if (offset == 0) {
    if (view.length == 0) return std::nullopt;
    return Mismatch{"View() history length at offset 0", "0", std::to_string(view.length)};
  }
  // A view is what the decode of the last token saw: same rows, same visibility.
  if (Check c = CheckHistory(view, log, offset - 1, 1, Op{})) {
    c->what = "View(): " + c->what;
    return c;
  }
  return std::nullopt;
}

Check LayerOracle::CheckVisible(const History& history, const std::vector<int64_t>& row_positions,
                                int64_t start, int64_t query_len, const Op& write,
                                model::RefKind kind) {
  AttentionMask logical =
      write.mask == MaskForm::kZero ? AttentionMask::Zero() : AttentionMask::Causal();
  model::RefMask ref_mask;
  ref_mask.causal = write.mask != MaskForm::kZero;
  if (write.mask == MaskForm::kRelax) {
    RelaxRect rect{write.rect_q_lo, write.rect_q_hi, write.rect_k_lo, write.rect_k_hi};
    auto relaxed = logical.Relax({rect});
    KV_CHECK(relaxed.ok(), relaxed.status().ToString());
    logical = *relaxed;
    ref_mask.rects.push_back({rect.q_lo, rect.q_hi, rect.k_lo, rect.k_hi});
  }
  auto visible = VisibleRows(history, logical, start, query_len);
  if (!visible.ok())
    return Mismatch{"attention dispatch", "visible rows", visible.status().message()};
  std::vector<int64_t> seen;
  for (int64_t q = 0; q < query_len; ++q) {
    seen.clear();
    for (int64_t r : (*visible)[static_cast<size_t>(q)])
      seen.push_back(row_positions[static_cast<size_t>(r)]);
    if (!std::is_sorted(seen.begin(), seen.end())) std::sort(seen.begin(), seen.end());
    const auto want =
        model::ExpectedVisible(kind, spec_.window, start, query_len, start + q, ref_mask);
    if (seen != want) {
      return Mismatch{fmt::format("positions attended by the query at {}", start + q),
                      fmt::format("{}", fmt::join(want, ",")),
                      fmt::format("{}", fmt::join(seen, ","))};
    }
  }
  return std::nullopt;
}

}  // namespace kvtwin::sim
