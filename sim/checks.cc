#include "sim/checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
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

// The reference's view of the synthetic forward's gated-delta inputs for (layer, p, h);
// qkv and ba are the caller's scratch rows, out keeps its sizes from the previous token.
void GdnToken(const SyntheticForward& synth, DType dtype, int32_t layer, const RecurrentDims& d,
              int64_t p, const model::Token& t, MatF& qkv, MatF& ba, model::RefGdnToken& out) {
  qkv.resize(1, d.conv_dim());
  ba.resize(1, 2 * d.num_v_heads);
  synth.FillGdnInput(qkv, ba, 0, dtype, layer, p, t.h, d);
  const int64_t qk = d.num_k_heads * d.head_k_dim;
  const auto row = qkv.row(0).transpose().cast<double>();
  out.q = row.segment(0, qk);
  out.k = row.segment(qk, qk);
  out.v = row.segment(2 * qk, d.num_v_heads * d.head_v_dim);
  const auto b = ba.row(0).transpose().cast<double>();
  out.beta_raw = b.segment(0, d.num_v_heads);
  out.alpha_raw = b.segment(d.num_v_heads, d.num_v_heads);
}

model::RefGdnParams RefParams(const GdnParams& p) {
  model::RefGdnParams out;
  out.dims = {p.dims.num_k_heads, p.dims.num_v_heads, p.dims.head_k_dim, p.dims.head_v_dim};
  out.dt_bias = p.dt_bias.cast<double>();
  out.a_exp = p.a_exp.cast<double>();
  return out;
}

// The gated-delta parameters the folder needs, for a recurrent layer only: no other kind
// folds a state, and deriving them is allocations per layer per fuzz execution (Reset).
model::RefGdnParams FolderParams(const SyntheticForward& synth, const StackConfig& config,
                                 int32_t layer) {
  if (config.layers[static_cast<size_t>(layer)].kind != CacheKind::kRecurrent) return {};
  return RefParams(synth.GdnParamsFor(layer, config.dims.recurrent));
}

// Every check below dispatches on the production object's kind, so an object of another kind
// than the layer's (a cache or a snapshot from the wrong constructor) is reported first.
Check CheckKind(const char* what, CacheKind layer, CacheKind actual) {
  if (actual == layer) return std::nullopt;
  return Mismatch{what, CacheKindName(layer), CacheKindName(actual)};
}

std::string DescribeRow(TensorView t, int64_t row) { return DecodeRow(t, row).ToString(); }

std::string ExpectedTag(int64_t p, uint64_t h, int32_t layer, bool is_value) {
  return fmt::format("pos {} h=0x{:06x} L{} {}", p, h & 0xFFFFFF, layer, is_value ? "V" : "K");
}

// Element-wise as floats, NaN equal to NaN. Typed loops: this runs on every stored row
// after every op, and a per-element dtype dispatch was a third of a fuzz execution.
bool RowEquals(TensorView a, int64_t ra, TensorView b, int64_t rb) {
  if (a.dtype() != b.dtype() || a.cols() != b.cols()) return false;
  // `a` is the production's tensor: a row it lacks is a divergence; `b` is the reference's.
  if (ra < 0 || ra >= a.rows()) return false;
  KV_CHECK(rb >= 0 && rb < b.rows(), "expected row out of range");
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

bool SameBits(TensorView a, int64_t ra, TensorView b, int64_t rb, int64_t n) {
  if (a.dtype() != b.dtype() || a.cols() != b.cols()) return false;
  if (ra < 0 || ra + n > a.rows() || rb < 0 || rb + n > b.rows()) return false;
  // No elements (an MLA layer's V, or no rows): equal, and memcmp may not see the null data().
  if (n == 0 || a.cols() == 0) return true;
  return a.Visit([&](const auto& ma) {
    return b.Visit([&](const auto& mb) {
      using A = std::decay_t<decltype(*ma.data())>;
      using B = std::decay_t<decltype(*mb.data())>;
      if constexpr (std::is_same_v<A, B>) {
        return std::memcmp(ma.data() + ra * ma.cols(), mb.data() + rb * mb.cols(),
                           static_cast<size_t>(n * ma.cols()) * sizeof(A)) == 0;
      } else {
        return false;
      }
    });
  });
}

Status RotatingWindowSlotsInto(int64_t offset, int64_t idx, int64_t rows, int64_t window,
                               std::vector<int64_t>& slots) {
  slots.clear();
  if (offset <= window) {  // R1: slot i holds position i
    // Spec §4.1: Dim <= W too. Growth stops at the window (min(step, W - offset)), and a
    // batched write leaves at most offset rows, so more than W rows is an overgrown buffer.
    if (idx != offset || rows < offset || rows > window) {
      return FailedPrecondition(
          fmt::format("linear regime needs idx == offset <= rows <= W; "
                      "offset {} idx {} rows {} W {}",
                      offset, idx, rows, window));
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
  return Status::Ok();
}

Result<std::vector<int64_t>> RotatingWindowSlots(int64_t offset, int64_t idx, int64_t rows,
                                                 int64_t window) {
  std::vector<int64_t> slots;
  if (Status s = RotatingWindowSlotsInto(offset, idx, rows, window, slots); !s.ok()) return s;
  return slots;
}

LayerOracle::LayerOracle(const SyntheticForward& synth, const StackConfig& config, int32_t layer)
    : synth_(synth),
      layer_(layer),
      spec_(config.layers[static_cast<size_t>(layer)]),
      dtype_(config.dtype),
      v_dtype_(config.value_dtype()),
      k_cols_(config.k_cols()),
      v_cols_(config.v_cols()),
      dims_(config.dims.recurrent),
      folder_(FolderParams(synth, config, layer),
              [this](int64_t p, const model::Token& t, model::RefGdnToken& out) {
                GdnToken(synth_, dtype_, layer_, dims_, p, t, gdn_qkv_, gdn_ba_, out);
              }) {
  // A fuzz execution builds a fresh oracle and its histories stay short: sizing the scratch
  // once for a typical run beats growing it by doubling (allocations dominate under ASan),
  // but no larger, since ASan fills and faults in every byte of a fresh allocation. Rows:
  // a fuzz run's offsets stay below ~100; ranges: one per causal query of one forward.
  constexpr size_t kTypicalRows = 64;
  constexpr size_t kTypicalRanges = 32;
  for (auto* v : {&identity_, &window_slots_, &row_positions_}) v->reserve(kTypicalRows);
  for (auto* v : {&seen_ranges_, &want_ranges_}) v->reserve(kTypicalRanges);
  visible_.begin.reserve(kTypicalRanges);
  visible_.ranges.reserve(kTypicalRanges);
  DeriveConvWeights();
}

void LayerOracle::DeriveConvWeights() {
  // Recurrent layers only, like the folder's parameters: the others never read them.
  if (spec_.kind != CacheKind::kRecurrent) return;
  const ConvWeights conv = synth_.ConvParams(layer_, dims_);
  conv_w_ = conv.w.cast<double>();
  conv_b_ = conv.bias.cast<double>();
  conv_silu_ = conv.silu;
  // Rows depend on the seed, the layer and the dtype: all are forgotten.
  // At least a window's rows, so a window's rows never evict one another.
  conv_memo_rows_ = std::max<int64_t>(kConvMemoRows, dims_.conv_tail + 1);
  conv_memo_.setZero(conv_memo_rows_ + 1, dims_.conv_dim());
  conv_memo_key_.assign(static_cast<size_t>(conv_memo_rows_), {-1, 0});
}

const float* LayerOracle::ConvInput(int64_t p, std::span<const model::Token> log) {
  if (p < 0) return conv_memo_.row(conv_memo_rows_).data();
  KV_CHECK(p < static_cast<int64_t>(log.size()), "a conv input past the log");
  const int64_t row = p % conv_memo_rows_;
  const std::pair<int64_t, uint64_t> key{p, log[static_cast<size_t>(p)].h};
  auto& held = conv_memo_key_[static_cast<size_t>(row)];
  if (held != key) {
    synth_.FillConvInput(conv_memo_, row, dtype_, layer_, p, key.second, dims_.conv_dim());
    held = key;
  }
  return conv_memo_.row(row).data();
}

void LayerOracle::Reset(const StackConfig& config, int32_t layer) {
  layer_ = layer;
  spec_ = config.layers[static_cast<size_t>(layer)];
  dims_ = config.dims.recurrent;
  folder_.Reset(FolderParams(synth_, config, layer));
  DeriveConvWeights();
  // Memo rows depend on the seed and the layer: all are recomputed. The tensors are kept
  // when their shape still fits (a new seed alone); every other member is scratch that a
  // check writes before it reads.
  if (dtype_ != config.dtype || v_dtype_ != config.value_dtype() || k_cols_ != config.k_cols() ||
      v_cols_ != config.v_cols()) {
    memo_k_ = Tensor();
    memo_v_ = Tensor();
    memo_h_.clear();
    memo_set_.clear();
  }
  dtype_ = config.dtype;
  v_dtype_ = config.value_dtype();
  k_cols_ = config.k_cols();
  v_cols_ = config.v_cols();
  std::fill(memo_set_.begin(), memo_set_.end(), uint8_t{0});
  attended_.clear();
  attention_checks_ = 0;
}

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
      memo_k_ = Tensor(dtype_, rows, k_cols_);
      memo_v_ = Tensor(v_dtype_, rows, v_cols_);
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

bool LayerOracle::MatchesExpected(TensorView actual, int64_t row, int64_t p, const model::Token& t,
                                  bool is_value) {
  const Tensor& want = ExpectedRow(p, t, is_value);
  return SameBits(actual, row, want, p, 1) || RowEquals(actual, row, want, p);
}

bool LayerOracle::SameBlock(TensorView actual, int64_t row, int64_t p, int64_t n,
                            bool is_value) const {
  return SameBits(actual, row, is_value ? memo_v_ : memo_k_, p, n);
}

size_t LayerOracle::FirstMismatch(TensorView k, TensorView v, std::span<const int64_t> rows,
                                  std::span<const int64_t> positions,
                                  std::span<const model::Token> tokens, int64_t token_base,
                                  bool* is_value) {
  KV_CHECK(rows.size() == positions.size(), "one position per row");
  const auto token = [&](size_t j) -> const model::Token& {
    const int64_t i = positions[j] - token_base;
    KV_CHECK(i >= 0 && i < static_cast<int64_t>(tokens.size()), "a checked row without its token");
    return tokens[static_cast<size_t>(i)];
  };
  // Fill the memo for every pair first: a block compare reads it for a whole run. Most
  // rows were filled by an earlier check of the same history: test that inline (this loop
  // runs over the whole history of every forward).
  for (size_t j = 0; j < rows.size(); ++j) {
    const model::Token& t = token(j);
    const auto at = static_cast<size_t>(positions[j]);
    if (at < memo_h_.size() && memo_h_[at] == t.h && memo_set_[at] == 3) continue;
    static_cast<void>(ExpectedRow(positions[j], t, false));
    static_cast<void>(ExpectedRow(positions[j], t, true));
  }
  size_t j = 0;
  while (j < rows.size()) {
    size_t end = j + 1;
    while (end < rows.size() && rows[end] == rows[end - 1] + 1 &&
           positions[end] == positions[end - 1] + 1) {
      ++end;
    }
    const auto n = static_cast<int64_t>(end - j);
    if (!SameBlock(k, rows[j], positions[j], n, false) ||
        !SameBlock(v, rows[j], positions[j], n, true)) {
      for (size_t i = j; i < end; ++i) {
        for (int kind = 0; kind < 2; ++kind) {
          if (!MatchesExpected(kind != 0 ? v : k, rows[i], positions[i], token(i), kind != 0)) {
            *is_value = kind != 0;
            return i;
          }
        }
      }
    }
    j = end;
  }
  return rows.size();
}

std::span<const int64_t> LayerOracle::Identity(int64_t n) {
  KV_CHECK(n >= 0, "negative slot count");
  while (static_cast<int64_t>(identity_.size()) < n)
    identity_.push_back(static_cast<int64_t>(identity_.size()));
  return std::span<const int64_t>(identity_).first(static_cast<size_t>(n));
}

Check LayerOracle::CheckKvRows(TensorView k, TensorView v, std::span<const int64_t> slots,
                               std::span<const model::Token> tokens, int64_t first_position,
                               const char* where) {
  KV_CHECK(tokens.size() >= slots.size(), "a checked slot without its token");
  // Slots taken from the identity buffer must survive the positions taken below.
  const std::less<const int64_t*> before;
  const bool slots_in_identity = !identity_.empty() && !before(slots.data(), identity_.data()) &&
                                 before(slots.data(), identity_.data() + identity_.size());
  KV_CHECK(!slots_in_identity || first_position + static_cast<int64_t>(slots.size()) <=
                                     static_cast<int64_t>(identity_.size()),
           "Identity() would move the slots it handed out");
  const std::span<const int64_t> positions =
      Identity(first_position + static_cast<int64_t>(slots.size()))
          .subspan(static_cast<size_t>(first_position));
  // K and V hold one row per slot (spec §2.1's K[B,H,Cap,Dk] and V[B,H,Cap,Dv]), also when V
  // has no columns (an MLA layer), where its row count is all there is to check.
  if (k.rows() != v.rows()) {
    return Mismatch{fmt::format("{} V rows", where), std::to_string(k.rows()),
                    std::to_string(v.rows())};
  }
  bool is_value = false;
  const size_t j = FirstMismatch(k, v, slots, positions, tokens, first_position, &is_value);
  if (j == slots.size()) return std::nullopt;
  const int64_t p = positions[j];
  const model::Token& t = tokens[j];
  const TensorView actual = is_value ? v : k;
  const Provenance got = DecodeRow(actual, slots[j]);
  const bool same_tag = got.valid && got.position == p && got.hash24 == (t.h & 0xFFFFFF);
  return Mismatch{fmt::format("{} slot {} (logical position {})", where, slots[j], p),
                  ExpectedTag(p, t.h, layer_, is_value),
                  got.ToString() + (same_tag ? " (right tag, other values)" : "")};
}

Check LayerOracle::CheckLive(const LayerCache& cache, const model::RefCache& ref) {
  if (Check c = CheckLiveBuffers(cache, ref)) return c;
  switch (cache.kind()) {
    case CacheKind::kFullKv:
      return CheckKvContent(static_cast<const KvCache&>(cache), ref.log());
    case CacheKind::kRotating:
      return CheckRotatingContent(static_cast<const RotatingCache&>(cache), ref.log());
    case CacheKind::kRecurrent: {
      const auto& rec = static_cast<const RecurrentCache&>(cache);
      if (!rec.HasState()) return std::nullopt;
      return CheckRecurrentState(rec.conv(), rec.delta(), ref.log(), ref.Offset(), "live");
    }
  }
  return std::nullopt;
}

Check LayerOracle::CheckLiveBuffers(const LayerCache& cache, const model::RefCache& ref) const {
  if (Check c = CheckKind("live cache kind", spec_.kind, cache.kind())) return c;
  if (cache.Offset() != ref.Offset()) {
    return Mismatch{"offset", std::to_string(ref.Offset()), std::to_string(cache.Offset())};
  }
  if (cache.ScheduleActive() != ref.ScheduleActive()) {
    return Mismatch{"capture schedule active", ref.ScheduleActive() ? "yes" : "no",
                    cache.ScheduleActive() ? "yes" : "no"};
  }
  switch (cache.kind()) {
    case CacheKind::kFullKv:
      return CheckKvBuffer(static_cast<const KvCache&>(cache), ref);
    case CacheKind::kRotating:
      return CheckRotatingBuffer(static_cast<const RotatingCache&>(cache), ref);
    case CacheKind::kRecurrent: {
      const auto& rec = static_cast<const RecurrentCache&>(cache);
      if (rec.HasState() != ref.HasState()) {
        return Mismatch{"recurrent state exists", ref.HasState() ? "yes" : "no",
                        rec.HasState() ? "yes" : "no"};
      }
      return CheckRecurrentLiveBytes(rec);
    }
  }
  return std::nullopt;
}

Check LayerOracle::CheckRecurrentLiveBytes(const RecurrentCache& cache) const {
  // A state is a conv tail and a delta matrix, nothing else, whatever was written.
  const int64_t bytes = cache.HasState() ? RecurrentStateBytes() : 0;
  if (cache.LiveBytes() == bytes) return std::nullopt;
  return Mismatch{"recurrent LiveBytes (spec §2.3)", std::to_string(bytes),
                  std::to_string(cache.LiveBytes())};
}

int64_t LayerOracle::KvRowBytes(int64_t rows) const {
  return rows * (k_cols_ * ElementBytes(dtype_) + v_cols_ * ElementBytes(v_dtype_));
}

int64_t LayerOracle::RecurrentStateBytes() const {
  // Spec §2.3, B = 1: conv [tail x conv_dim] in the activation dtype, delta [Hv x Dv x Dk]
  // always float32.
  return dims_.conv_tail * dims_.conv_dim() * ElementBytes(dtype_) +
         dims_.delta_rows() * dims_.head_k_dim * ElementBytes(DType::kFloat32);
}

Check LayerOracle::CheckLiveContent(const LayerCache& cache, std::span<const model::Token> log) {
  if (Check c = CheckKind("live cache kind", spec_.kind, cache.kind())) return c;
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
      if (Check c = CheckRecurrentLiveBytes(rec)) return c;
      return CheckRecurrentState(rec.conv(), rec.delta(), log, offset, "live");
    }
  }
  return std::nullopt;
}

Check LayerOracle::CheckKvBuffer(const KvCache& cache, const model::RefCache& ref) const {
  if (cache.HasBuffer() != ref.HasState()) {
    return Mismatch{"kv buffer exists", ref.HasState() ? "yes" : "no",
                    cache.HasBuffer() ? "yes" : "no"};
  }
  if (cache.Capacity() != ref.kv_capacity()) {
    return Mismatch{"kv capacity (spec §2.1 growth)", std::to_string(ref.kv_capacity()),
                    std::to_string(cache.Capacity())};
  }
  // K and V buffers of that many slots at the stack's width and dtype.
  const int64_t bytes = cache.HasBuffer() ? KvRowBytes(ref.kv_capacity()) : 0;
  if (cache.LiveBytes() != bytes) {
    return Mismatch{"kv LiveBytes", std::to_string(bytes), std::to_string(cache.LiveBytes())};
  }
  return std::nullopt;
}

Check LayerOracle::CheckKvContent(const KvCache& cache, std::span<const model::Token> log) {
  const auto offset = static_cast<int64_t>(log.size());
  if (offset > 0 && !cache.HasBuffer()) return Mismatch{"kv buffer exists", "yes", "no"};
  // Growth truncates to the offset before adding a step, so only Cap >= offset holds.
  if (cache.Capacity() < cache.Offset()) {
    return Mismatch{"kv capacity", fmt::format(">= {}", cache.Offset()),
                    std::to_string(cache.Capacity())};
  }
  return CheckKvRows(cache.keys(), cache.values(), Identity(offset), log, 0, "live kv");
}

Check LayerOracle::CheckRotatingBuffer(const RotatingCache& cache,
                                       const model::RefCache& ref) const {
  if (cache.HasBuffer() != ref.HasState()) {
    return Mismatch{"window buffer exists", ref.HasState() ? "yes" : "no",
                    cache.HasBuffer() ? "yes" : "no"};
  }
  // Dim is the reference's (spec §2.2: growth steps, the oversize cut, a batched write's
  // W - 1 kept rows, a restored snapshot's rows): the content check reads a buffer of any
  // Dim its regime allows, and only the bytes show a buffer grown or kept differently.
  if (cache.HasBuffer() && cache.buffer_rows() != ref.rotating_rows()) {
    return Mismatch{"window buffer rows Dim (spec §2.2)", std::to_string(ref.rotating_rows()),
                    std::to_string(cache.buffer_rows())};
  }
  // LiveBytes is the K and V buffers of Dim rows each.
  const int64_t bytes = cache.HasBuffer() ? KvRowBytes(ref.rotating_rows()) : 0;
  if (cache.LiveBytes() != bytes) {
    return Mismatch{"window LiveBytes", std::to_string(bytes), std::to_string(cache.LiveBytes())};
  }
  return std::nullopt;
}

Check LayerOracle::CheckRotatingContent(const RotatingCache& cache,
                                        std::span<const model::Token> log) {
  if (!cache.HasBuffer()) {
    return log.empty() ? std::nullopt : Check(Mismatch{"window buffer exists", "yes", "no"});
  }
  const Status regime = RotatingWindowSlotsInto(cache.Offset(), cache.ring_idx(),
                                                cache.buffer_rows(), cache.window(), window_slots_);
  if (!regime.ok()) return Mismatch{"window storage regime", "R1, R2 or R3", regime.message()};
  const size_t first = log.size() - window_slots_.size();
  return CheckKvRows(cache.keys(), cache.values(), window_slots_,
                     std::span<const model::Token>(log).subspan(first), static_cast<int64_t>(first),
                     "live window");
}

Check LayerOracle::CheckRecurrentState(const Tensor& conv, const MatF& delta,
                                       std::span<const model::Token> log, int64_t length,
                                       const char* where) {
  // Callers checked the kind (CheckKind): only a recurrent layer's folder has parameters.
  KV_CHECK(spec_.kind == CacheKind::kRecurrent, "a recurrent state checked on another layer");
  if (conv.dtype() != dtype_ || conv.rows() != dims_.conv_tail || conv.cols() != dims_.conv_dim()) {
    return Mismatch{std::string(where) + " conv shape",
                    fmt::format("{}[{}x{}]", DTypeName(dtype_), dims_.conv_tail, dims_.conv_dim()),
                    conv.ShapeString()};
  }
  // model::ExpectedConvTailPositions, one row at a time: row r holds length - tail + r.
  for (int64_t r = 0; r < dims_.conv_tail; ++r) {
    const int64_t p = length - dims_.conv_tail + r;
    const float* x = ConvInput(p, log);
    for (int64_t c = 0; c < dims_.conv_dim(); ++c) {
      if (conv.At(r, c) != x[c]) {
        return Mismatch{fmt::format("{} conv tail row {} (position {}) column {}", where, r, p, c),
                        fmt::format("{}", x[c]), fmt::format("{}", conv.At(r, c))};
      }
    }
  }
  const MatD& expected = folder_.StateAfter(log, length);
  if (delta.rows() != expected.rows() || delta.cols() != expected.cols()) {
    return Mismatch{std::string(where) + " delta shape",
                    fmt::format("{}x{}", expected.rows(), expected.cols()),
                    fmt::format("{}x{}", delta.rows(), delta.cols())};
  }
  for (Eigen::Index i = 0; i < expected.size(); ++i) {
    const double e = expected.data()[i];
    const double a = static_cast<double>(delta.data()[i]);
    if (!WithinDeltaTolerance(a, e)) {
      return Mismatch{fmt::format("{} delta state after {} tokens, element {} (tolerance {})",
                                  where, length, i, kDeltaTolerance),
                      fmt::format("{:.7g}", e), fmt::format("{:.7g}", a)};
    }
  }
  return std::nullopt;
}

Check LayerOracle::CheckSnapshotBytes(const CacheSnapshot& prod, int64_t kv_rows) const {
  // Spec §7: K and V rows of the snapshot's range, or one whole recurrent state.
  const int64_t expected =
      prod.kind() == CacheKind::kRecurrent ? RecurrentStateBytes() : KvRowBytes(kv_rows);
  if (prod.SizeBytes() == expected) return std::nullopt;
  return Mismatch{"snapshot SizeBytes (spec §7)", std::to_string(expected),
                  std::to_string(prod.SizeBytes())};
}

Check LayerOracle::CheckSnapshot(const CacheSnapshot* prod, const model::RefSnap& ref) {
  if ((prod == nullptr) != !ref.has_value()) {
    return Mismatch{"snapshot presence", ref ? "a snapshot" : "null", prod ? "a snapshot" : "null"};
  }
  if (prod == nullptr) return std::nullopt;
  if (Check c = CheckKind("snapshot kind", spec_.kind, prod->kind())) return c;
  // The range's start: a KV snapshot's first position; a window snapshot's label, which
  // spec §2.2 fixes per path (the caller's `from`, 0 at a capture's start boundary, o -
  // min(o, W) at a capture's end) and restores ignore, compared where the reference models
  // the snapshot (rows known); a recurrent snapshot carries only its offset (§2.3), which
  // the production interface names at both ends (src/cache.h) while the reference labels
  // the state [0, offset).
  const bool recurrent = spec_.kind == CacheKind::kRecurrent;
  const bool from_fixed = recurrent || spec_.kind == CacheKind::kFullKv ||
                          (spec_.kind == CacheKind::kRotating && ref->rows > 0);
  const int64_t want_from = recurrent ? ref->to : ref->from;
  if (prod->to() != ref->to || (from_fixed && prod->from() != want_from)) {
    return Mismatch{"snapshot range", fmt::format("[{}, {})", want_from, ref->to),
                    fmt::format("[{}, {})", prod->from(), prod->to())};
  }
  // Sizes first: the trie's byte counter and the eviction budget are sums of SizeBytes(), so
  // a wrong size is consistent everywhere else and only shows as evictions coming late.
  if (prod->kind() == CacheKind::kRotating) {
    // A clone of State() = slots [0, min(offset, Dim)), and while the window is linear
    // (offset <= W) the buffer holds every position, so Dim >= offset: exactly `to` rows,
    // never the grow padding above them.
    const auto& s = static_cast<const RotatingSnapshot&>(*prod);
    if (ref->rows > 0 && s.k().rows() != ref->rows) {
      return Mismatch{"window snapshot rows (a clone of State() or a window slice, spec §7)",
                      std::to_string(ref->rows), std::to_string(s.k().rows())};
    }
    // A reference built from a range alone (the trie's soundness walk) does not know the
    // rows; while the window is linear (to <= W) every clone holds exactly `to`.
    if (s.to() <= spec_.window && s.k().rows() != s.to()) {
      return Mismatch{"window snapshot rows (a clone of State())", std::to_string(s.to()),
                      std::to_string(s.k().rows())};
    }
    if (Check c = CheckSnapshotBytes(*prod, s.k().rows())) return c;
  } else if (Check c = CheckSnapshotBytes(*prod, ref->to - ref->from)) {
    return c;
  }
  if (prod->kind() == CacheKind::kFullKv) {
    const auto& s = static_cast<const KvSnapshot&>(*prod);
    const int64_t n = ref->to - ref->from;
    if (s.k().rows() != n || s.v().rows() != n) {
      return Mismatch{"kv snapshot rows", std::to_string(n), std::to_string(s.k().rows())};
    }
    // A KV snapshot's tokens are those of [from, to). Its slots 0..n-1 and its positions
    // from..to-1 share the identity buffer: the longer span first, as growing it moves it.
    const std::span<const int64_t> ids = Identity(ref->to);
    return CheckKvRows(s.k(), s.v(), ids.first(static_cast<size_t>(n)), ref->tokens, ref->from,
                       "kv snapshot");
  }
  if (prod->kind() == CacheKind::kRotating) {
    const auto& s = static_cast<const RotatingSnapshot&>(*prod);
    const Status regime =
        RotatingWindowSlotsInto(s.to(), s.idx(), s.k().rows(), spec_.window, window_slots_);
    if (!regime.ok()) return Mismatch{"snapshot window regime", "R1, R2 or R3", regime.message()};
    // A window snapshot's tokens start at position 0.
    const size_t first = static_cast<size_t>(s.to()) - window_slots_.size();
    return CheckKvRows(s.k(), s.v(), window_slots_,
                       std::span<const model::Token>(ref->tokens).subspan(first),
                       static_cast<int64_t>(first), "window snapshot");
  }
  const auto& s = static_cast<const RecurrentSnapshot&>(*prod);
  return CheckRecurrentState(s.conv(), s.delta(), ref->tokens, s.offset(), "recurrent snapshot");
}

Check LayerOracle::CheckHistory(const History& history, std::span<const model::Token> log_after,
                                int64_t start, int64_t query_len, const Op& write,
                                int64_t trusted_rows, HistorySource source) {
  bool all_compared = false;
  if (Check c = CheckHistoryRows(history, log_after, start, query_len, write, trusted_rows, source,
                                 &all_compared)) {
    return c;
  }
  // Attention reads every row; only over rows compared just now does a difference convict
  // attention itself rather than a trusted row.
  if (!all_compared) return std::nullopt;
  return CheckAttentionOnce(history, log_after, start, query_len);
}

Check LayerOracle::CheckAttentionOnce(const History& history,
                                      std::span<const model::Token> log_after, int64_t start,
                                      int64_t query_len) {
  if (query_len * history.length > kAttendedCells && !LongAttentionDue(query_len, history)) {
    return std::nullopt;
  }
  // Why once per shape is enough for these masks: with no rectangle and no array, which
  // rows each query attends depends on the shape alone (spec §2.5: all rows, or the
  // bottom-right causal rows, gathered through the ring for a rotating decode), the rows and
  // the positions they hold were just compared, and CheckVisible compared the rows each
  // query attends. What is left for Sdpa is arithmetic over them, whose control flow is the
  // shape's. A planted bug in it shows on the first forward of its shape. The driver checks
  // after every step, so without this the attention check was over half of a layer fuzz
  // target's time (O(cells x columns) scalar work per forward, the row check one memcmp).
  // A rectangle or an array is checked on every forward: there the rows depend on it.
  const model::RefKind kind = ToRefKind(spec_.kind);
  if (!logical_.IsZero() && !logical_.IsPureCausal()) {
    return CheckAttention(history, log_after, start, query_len, kind);
  }
  const AttendedShape shape{layer_,
                            spec_.kind,
                            spec_.window,
                            k_cols_,
                            v_cols_,
                            query_len,
                            history.length,
                            logical_.IsPureCausal(),
                            history.has_applier,
                            history.applier.key_len,
                            history.applier.query_len,
                            history.applier.window,
                            history.applier.ring_idx,
                            history.k != nullptr ? history.k->dtype() : dtype_};
  // Sorted, cleared per run with its capacity kept: once a run as large has been, a run
  // allocates nothing here.
  const auto at = std::lower_bound(attended_.begin(), attended_.end(), shape);
  if (at != attended_.end() && *at == shape) return std::nullopt;
  attended_.insert(at, shape);
  if (run_counts_ != nullptr && !run_counts_->CountRun(shape)) return std::nullopt;
  return CheckAttention(history, log_after, start, query_len, kind);
}

bool LayerOracle::LongAttentionDue(int64_t query_len, const History& history) {
  // Lengths 64k and 64k + 1 (so a growing decode is checked every 64 tokens, on both sides of
  // every power-of-two tile edge from 64 up), and every ring decode of a rotating layer (its
  // length stays the window; the ring cursor makes each new shape). O(length) per check.
  const int64_t keys = history.length;
  return WithinAttentionCap(query_len, keys) && (keys % 64 <= 1 || history.has_applier);
}

ShapeRunCounts::ShapeRunCounts() {
  // A fuzz target's shapes number in the hundreds to low thousands. Reserved once, so an
  // execution that meets a new shape does not allocate what it does not free (libFuzzer
  // re-runs such an execution to search it for leaks).
  constexpr size_t kTypicalShapes = 4096;
  entries_.reserve(kTypicalShapes);
}

bool ShapeRunCounts::CountRun(const AttendedShape& shape) {
  const auto by_shape = [](const Entry& e, const AttendedShape& s) { return e.shape < s; };
  auto at = std::lower_bound(entries_.begin(), entries_.end(), shape, by_shape);
  if (at == entries_.end() || at->shape != shape) at = entries_.insert(at, {shape, 0});
  const int64_t earlier = at->runs++;
  return earlier == 0 || (earlier & (earlier - 1)) == 0;
}

// Spec §2.1, §2.2 and §2.5: only a rotating history carries an applier, and it is {K = the
// returned length, L = the write's length (1 for a single-token write or View: ring layout),
// W, ringIdx = the cursor}. Attention reads only some fields on some paths (a ring layout
// never reads W, a prefill never reads ringIdx), so each is held to the spec here rather
// than through the visibility it happens to produce.
Check LayerOracle::CheckApplier(const History& history, int64_t query_len, bool ring,
                                HistorySource source) const {
  if (spec_.kind != CacheKind::kRotating) {
    if (!history.has_applier) return std::nullopt;
    return Mismatch{"history applier of a non-rotating cache", "none", "present"};
  }
  if (!history.has_applier) return Mismatch{"rotating history applier", "present", "missing"};
  const RotatingApplier& a = history.applier;
  const auto field = [](const char* name, int64_t want, int64_t got) -> Check {
    if (want == got) return std::nullopt;
    return Mismatch{fmt::format("rotating history applier {}", name), std::to_string(want),
                    std::to_string(got)};
  };
  if (Check c = field("K", history.length, a.key_len)) return c;
  if (Check c = field("L", ring ? 1 : query_len, a.query_len)) return c;
  if (Check c = field("W", spec_.window, a.window)) return c;
  // The cursor of a ring layout names a slot of the K rows, or K itself for a buffer not yet
  // wrapped; any other value only works for a kernel that reduces it modulo K. The rows'
  // order pins it modulo K (CheckHistoryRows); the range pins it whole. A live decode leaves
  // it one past the slot it wrote (spec §2.2 update step 5: idx += 1 after a wrap to 0), so
  // never at 0; a View's may be 0 (an oversize window, §2.2 View), a wrapper's is unfixed.
  if (ring) {
    const int64_t lo = source == HistorySource::kWrite ? 1 : 0;
    if (a.ring_idx < lo || a.ring_idx > history.length) {
      return Mismatch{"rotating history applier ringIdx",
                      fmt::format("in [{}, {}]", lo, history.length), std::to_string(a.ring_idx)};
    }
  }
  // A live batched write concatenates: the buffer it returns is in logical order and the
  // cursor after it is idx := Dim = K (spec §2.2, concat step 5; Update step 4 returns
  // ringIdx = idx after the write). Attention never reads it there, so only this shows a
  // wrong one before the next decode does. A wrapper's batched history has no fixed cursor.
  if (!ring && source == HistorySource::kWrite) {
    if (Check c = field("ringIdx of a batched write", history.length, a.ring_idx)) return c;
  }
  return std::nullopt;
}

Check LayerOracle::CheckHistoryRows(const History& history, std::span<const model::Token> log_after,
                                    int64_t start, int64_t query_len, const Op& write,
                                    int64_t trusted_rows, HistorySource source,
                                    bool* all_compared) {
  const model::RefKind kind = ToRefKind(spec_.kind);
  const model::PositionRange expected =
      model::ExpectedHistoryRange(kind, spec_.window, start, query_len);
  const int64_t k_len = expected.end - expected.first;
  if (history.length != k_len) {
    return Mismatch{"history length", std::to_string(k_len), std::to_string(history.length)};
  }
  const bool ring = spec_.kind == CacheKind::kRotating && query_len == 1;
  if (Check c = CheckApplier(history, query_len, ring, source)) return c;
  if (history.k == nullptr || history.v == nullptr) {
    return Mismatch{"history tensors", "K and V", "null"};
  }
  if (history.k->rows() != history.v->rows()) {  // as in CheckKvRows
    return Mismatch{fmt::format("history V rows (write [{}, {}))", start, start + query_len),
                    std::to_string(history.k->rows()), std::to_string(history.v->rows())};
  }
  std::vector<int64_t>& row_positions = row_positions_;
  row_positions.resize(static_cast<size_t>(k_len));
  for (int64_t s = 0; s < k_len; ++s) {
    const int64_t j = ring ? (((s - history.applier.ring_idx) % k_len) + k_len) % k_len : s;
    row_positions[static_cast<size_t>(s)] = expected.first + j;
  }
  // A full KV history maps row s to position s; only there may a prefix be trusted.
  const int64_t skip = spec_.kind == CacheKind::kFullKv && expected.first == 0
                           ? std::clamp<int64_t>(trusted_rows, 0, k_len)
                           : 0;
  const auto rows = Identity(k_len).subspan(static_cast<size_t>(skip));
  bool is_value = false;
  const auto s =
      skip + static_cast<int64_t>(FirstMismatch(
                 *history.k, *history.v, rows,
                 std::span<const int64_t>(row_positions).subspan(static_cast<size_t>(skip)),
                 log_after, 0, &is_value));
  if (s < k_len) {
    const int64_t p = row_positions[static_cast<size_t>(s)];
    const model::Token& t = log_after[static_cast<size_t>(p)];
    return Mismatch{
        fmt::format("history row {} of {} (write [{}, {}))", s, k_len, start, start + query_len),
        ExpectedTag(p, t.h, layer_, is_value), DescribeRow(is_value ? *history.v : *history.k, s)};
  }
  BuildMasks(write, start, query_len, history.length);
  *all_compared = skip == 0;
  return CheckVisible(history, row_positions, start, query_len, write, kind);
}

Check LayerOracle::CheckView(const History& view, std::span<const model::Token> log) {
  const auto offset = static_cast<int64_t>(log.size());
  if (offset == 0) {
    if (view.length == 0) return std::nullopt;
    return Mismatch{"View() history length at offset 0", "0", std::to_string(view.length)};
  }
  // A view is what the decode of the last token saw: same rows, same visibility.
  bool all_compared = false;
  Check c =
      CheckHistoryRows(view, log, offset - 1, 1, Op{}, 0, HistorySource::kView, &all_compared);
  if (!c && all_compared) c = CheckAttentionOnce(view, log, offset - 1, 1);
  if (c) c->what = "View(): " + c->what;
  return c;
}

}  // namespace kvtwin::sim
