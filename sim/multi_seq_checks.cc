// MultiSeqDriver, the after-op half: the whole-state checks run after every op (retention,
// every cell by index with its rows, the per-sequence cell ranges, slot accounting against
// the model's physical allocator, conv states, the ideal-conv watch), the row comparison and
// provenance reports they share, and the digest.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <algorithm>
#include <set>
#include <utility>

#include "sim/multi_seq_driver.h"

namespace kvtwin::sim {
namespace {

SeqId S(int32_t seq) { return SeqId{seq}; }

std::string Tag(const model::MsRows& rows, bool is_value) {
  const int64_t pos = is_value ? rows.written_pos : rows.written_pos + rows.Shift();
  return fmt::format(
      "pos {} h=0x{:06x} L0 {}{}", pos, rows.token.h & 0xFFFFFF, is_value ? "V" : "K",
      rows.shifts.empty() ? "" : fmt::format(" (written at {}, shifted)", rows.written_pos));
}

std::string DescribeCell(bool free, int64_t pos, const std::vector<int32_t>& seqs) {
  return free ? std::string("free") : fmt::format("pos {} of sequences {}", pos, seqs);
}

// Row `row` of `t` as floats, converted as Tensor::RowsToFloat converts, into `scratch`.
const float* RowFloats(const Tensor& t, int64_t row, std::vector<float>& scratch) {
  KV_CHECK(row >= 0 && row < t.rows(), "row range out of tensor");
  const int64_t cols = t.cols();
  scratch.resize(static_cast<size_t>(cols));
  Eigen::Map<MatF> out(scratch.data(), 1, cols);
  t.Visit([&](const auto& m) { out = m.middleRows(row, 1).template cast<float>(); });
  return scratch.data();
}

// The hash of row `row` of `t` as floats: the same bytes as hashing t.Rows(row, 1).ToFloat().
uint64_t RowHash(const Tensor& t, int64_t row, std::vector<float>& scratch) {
  const float* f = RowFloats(t, row, scratch);
  return XXH3_64bits(f, static_cast<size_t>(t.cols()) * sizeof(float));
}

// Bit-equality of row `ra` of `a` and row `rb` of `b`, as Tensor::Equals on one-row copies
// (dtype, width and every byte).
bool SameRow(const Tensor& a, int64_t ra, const Tensor& b, int64_t rb) {
  KV_CHECK(ra >= 0 && ra < a.rows() && rb >= 0 && rb < b.rows(), "row range out of tensor");
  return SameBits(a, ra, b, rb, 1);
}

}  // namespace

const std::vector<MsCoverage::Field>& MsCoverage::Fields() {
  // Every counter, in declaration order: ToString, += and the coverage floors of the
  // tests all walk this one list.
  static const std::vector<Field> fields = {
      {"forwards", &MsCoverage::forwards},
      {"reserves", &MsCoverage::reserves},
      {"reserve_puts", &MsCoverage::reserve_puts},
      {"reserve_conv_writes", &MsCoverage::reserve_conv_writes},
      {"cache_full", &MsCoverage::cache_full},
      {"unequal_batches", &MsCoverage::unequal_batches},
      {"unequal_newcomers", &MsCoverage::unequal_newcomers},
      {"unequal_even_totals", &MsCoverage::unequal_even_totals},
      {"causal_off", &MsCoverage::causal_off},
      {"copy_prefix", &MsCoverage::copy_prefix},
      {"copy_prefix_partial", &MsCoverage::copy_prefix_partial},
      {"removes_tail", &MsCoverage::removes_tail},
      {"removes_whole", &MsCoverage::removes_whole},
      {"removes_middle_shift", &MsCoverage::removes_middle_shift},
      {"removes_refused_shared", &MsCoverage::removes_refused_shared},
      {"removes_refused_no_shift", &MsCoverage::removes_refused_no_shift},
      {"removes_shift_failed", &MsCoverage::removes_shift_failed},
      {"cow_copies", &MsCoverage::cow_copies},
      {"can_resume_true", &MsCoverage::can_resume_true},
      {"can_resume_false", &MsCoverage::can_resume_false},
      {"ideal_divergences", &MsCoverage::ideal_divergences},
      {"rewrites", &MsCoverage::rewrites},
      {"cache_full_pruned", &MsCoverage::cache_full_pruned},
      {"unordered_batches", &MsCoverage::unordered_batches},
      {"joins", &MsCoverage::joins},
      {"removes_degenerate", &MsCoverage::removes_degenerate},
      {"half_edited_ops", &MsCoverage::half_edited_ops},
      {"causal_reset_calls", &MsCoverage::causal_reset_calls},
      {"removes_far_end", &MsCoverage::removes_far_end},
      {"far_batches", &MsCoverage::far_batches},
      {"last_position_batches", &MsCoverage::last_position_batches},
      {"high_id_batches", &MsCoverage::high_id_batches},
      {"forward_edits", &MsCoverage::forward_edits},
      {"forward_edits_on_batch", &MsCoverage::forward_edits_on_batch},
      {"big_cache_forwards", &MsCoverage::big_cache_forwards},
      {"deep_batches", &MsCoverage::deep_batches},
      {"refused_puts", &MsCoverage::refused_puts},
      {"interleaved_batches", &MsCoverage::interleaved_batches},
  };
  return fields;
}

Mismatch ListMismatch(const std::string& what, const std::vector<int64_t>& want,
                      const std::vector<int64_t>& got) {
  KV_CHECK(want != got, "a list mismatch of equal lists");
  const auto [w, g] = std::mismatch(want.begin(), want.end(), got.begin(), got.end());
  const auto at = static_cast<size_t>(w - want.begin());
  return Mismatch{fmt::format("{} (first difference at index {}: {} expected, {} actual)", what, at,
                              want.size(), got.size()),
                  IntRuns(want), IntRuns(got)};
}

std::string MsCoverage::ToString() const {
  std::string out;
  for (const auto& [name, member] : Fields())
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", name, this->*member);
  return out;
}

MsCoverage& MsCoverage::operator+=(const MsCoverage& o) {
  for (const auto& [name, member] : Fields()) this->*member += o.*member;
  return *this;
}

Check MultiSeqDriver::CheckState() {
  if (Check c = CheckRetention()) return c;
  if (Check c = CheckCells()) return c;
  if (Check c = CheckRanges()) return c;
  if (Check c = CheckSlots()) return c;
  if (Check c = CheckConv()) return c;
  return CheckIdeal();
}

Check MultiSeqDriver::CheckRetention() {
  const std::vector<CausalCache::Cell>& cells = cache_->kv().cells();
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    std::vector<int64_t>& held = held_;
    held.clear();
    for (const CausalCache::Cell& cell : cells) {
      if (cell.seqs.contains(s)) held.push_back(cell.pos);
    }
    std::sort(held.begin(), held.end());
    std::vector<int64_t>& expected = want_held_;
    model_.kv().RetainedPositionsInto(S(s), expected);
    if (held != expected) {
      return ListMismatch(fmt::format("positions held by s{}", s), expected, held);
    }
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckCells() {
  // Cell by cell: first-fit placement makes the index of every token's cell exact.
  const CausalCache& kv = cache_->kv();
  const std::vector<CausalCache::Cell>& actual = kv.cells();
  model_.kv().CellsInto(cells_);
  const std::vector<model::MsCell>& expected = cells_;
  if (actual.size() != expected.size()) {
    return Mismatch{"cell count", std::to_string(expected.size()), std::to_string(actual.size())};
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const model::MsCell& want = expected[i];
    const std::set<int32_t>& got = actual[i].seqs;
    const bool same_seqs = std::equal(want.seqs.begin(), want.seqs.end(), got.begin(), got.end(),
                                      [](SeqId a, int32_t b) { return Raw(a) == b; });
    if (!same_seqs || (!want.seqs.empty() && want.pos != actual[i].pos)) {
      std::vector<int32_t> want_seqs;
      for (SeqId s : want.seqs) want_seqs.push_back(Raw(s));
      const std::vector<int32_t> got_seqs(got.begin(), got.end());
      return Mismatch{fmt::format("cell {}: position and sequences", i),
                      DescribeCell(want_seqs.empty(), want.pos, want_seqs),
                      DescribeCell(got_seqs.empty(), actual[i].pos, got_seqs)};
    }
    if (!want.rows) continue;  // never written: whatever the buffer started with
    const auto cell = static_cast<int64_t>(i);
    kv.VRowInto(cell, v_row_);
    if (Check c = CheckRow(-1, cell, want.rows, kv.k(), cell, v_row_, 0)) return c;
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckRanges() const {
  // The ranges feed the current range of the next forward (unbounded memory), stale ones too.
  auto text = [](std::optional<model::MsSpan> r) {
    return r ? fmt::format("[{}, {}]", r->first, r->second) : std::string("none");
  };
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    std::optional<model::MsSpan> want, got;
    if (auto it = model_.kv().Ranges().find(S(s)); it != model_.kv().Ranges().end()) {
      want = it->second;
    }
    if (auto it = cache_->kv().ranges().find(s); it != cache_->kv().ranges().end()) {
      if (it->second.first <= it->second.second) got = it->second;  // else an empty range
    }
    if (want != got) {
      return Mismatch{fmt::format("cell range [first, last] of s{}", s), text(want), text(got)};
    }
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckRow(int64_t view_row, int64_t index,
                               const std::optional<model::MsRows>& want, const Tensor& k,
                               int64_t k_row, const Tensor& v, int64_t v_row) {
  if (!want) return std::nullopt;  // never written: whatever the buffer started with
  ExpectRows(index, *want);
  const bool k_bad = !SameRow(k, k_row, memo_k_, index);
  if (!k_bad && SameRow(v, v_row, memo_v_, index)) return std::nullopt;
  const Provenance p = k_bad ? DecodeRow(k, k_row) : DecodeRow(v, v_row);
  const bool same_tag = p.valid && p.hash24 == (want->token.h & 0xFFFFFF);
  const std::string where = view_row < 0 ? "stored" : fmt::format("view row {}:", view_row);
  return Mismatch{fmt::format("{} cell {} {} row", where, index, k_bad ? "K" : "V"),
                  Tag(*want, !k_bad),
                  p.ToString() + (same_tag ? " (right hash, other values or position)" : "")};
}

void MultiSeqDriver::ExpectRows(int64_t index, const model::MsRows& rows) {
  KV_CHECK(index >= 0, "negative cell index");
  const auto at = static_cast<size_t>(index);
  if (at >= memo_key_.size()) {
    const int64_t cells = model_.kv().config().cells;
    const int64_t n = std::max(index + 1, cells == model::kUnbounded ? 2 * (index + 1) : cells);
    if (memo_k_.empty()) {
      memo_k_ = Tensor(config_.dtype, n, config_.kv_cols);
      memo_v_ = Tensor(config_.dtype, n, config_.kv_cols);
    } else {
      memo_k_.ResizeRows(n);
      memo_v_.ResizeRows(n);
    }
    memo_key_.resize(static_cast<size_t>(n));
  }
  if (memo_key_[at] == rows) return;
  // As SyntheticForward::KvRow fills a fresh row; K then takes the RoPE shifts in order.
  synth_.FillKvRow(memo_k_, index, 0, rows.written_pos, rows.token.h, false);
  for (int64_t delta : rows.shifts) ShiftPositionTag(memo_k_, index, delta);
  synth_.FillKvRow(memo_v_, index, 0, rows.written_pos, rows.token.h, true);
  memo_key_[at] = rows;
}

Check MultiSeqDriver::CheckSlots(bool current) {
  std::vector<std::vector<int32_t>>& mapped = mapped_;
  mapped.resize(static_cast<size_t>(config_.max_seqs));
  for (std::vector<int32_t>& seqs : mapped) seqs.clear();
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    if (std::optional<int32_t> slot = cache_->slot_of(s)) {
      if (*slot < 0 || *slot >= config_.max_seqs) {
        return Mismatch{fmt::format("slot of s{}", s), "a slot in range", std::to_string(*slot)};
      }
      mapped[static_cast<size_t>(*slot)].push_back(s);
    }
  }
  if (Check c = CheckSlotCounts()) return c;
  return CheckSlotModel(current);
}

Check MultiSeqDriver::CheckSlotCounts() {
  const std::vector<std::vector<int32_t>>& mapped = mapped_;
  const int32_t n = config_.max_seqs;
  std::vector<int32_t>& on_free = on_free_;
  on_free.assign(static_cast<size_t>(n), 0);
  for (int32_t slot : cache_->free_slots()) {
    if (slot >= 0 && slot < n) ++on_free[static_cast<size_t>(slot)];
  }
  for (int32_t slot = 0; slot < n; ++slot) {
    const auto& seqs = mapped[static_cast<size_t>(slot)];
    const int32_t refs = cache_->ref_count(slot);
    const int32_t free = on_free[static_cast<size_t>(slot)];
    if (refs != static_cast<int32_t>(seqs.size())) {
      return Mismatch{fmt::format("refcount of slot {}{}", slot, seqs.empty() ? " (leaked)" : ""),
                      fmt::format("{} (sequences {})", seqs.size(), seqs), std::to_string(refs)};
    }
    if ((refs == 0) != (free == 1) || free > 1) {
      return Mismatch{fmt::format("free-list entries of slot {} (refcount {})", slot, refs),
                      refs == 0 ? "1" : "0", std::to_string(free)};
    }
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckSlotModel(bool current) const {
  auto text = [](std::optional<int32_t> slot) {
    return slot ? std::to_string(*slot) : std::string("none");
  };
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    const std::optional<int32_t> want = model_.SlotOf(S(s));
    const std::optional<int32_t> got = cache_->slot_of(s);
    if (want != got) {
      return Mismatch{fmt::format("slot of s{}", s), text(want), text(got)};
    }
  }
  for (int32_t slot = 0; slot < config_.max_seqs; ++slot) {
    if (model_.RefCount(slot) != cache_->ref_count(slot)) {
      return Mismatch{fmt::format("refcount of slot {}", slot),
                      std::to_string(model_.RefCount(slot)),
                      std::to_string(cache_->ref_count(slot))};
    }
  }
  if (cache_->free_slots() != model_.FreeSlots()) {
    return Mismatch{"free slot stack, bottom to top (LIFO: the top is handed out next)",
                    fmt::format("{}", model_.FreeSlots()), fmt::format("{}", cache_->free_slots())};
  }
  if (current && cache_->slots() != model_.CurrentSlots()) {
    return Mismatch{"slots of the current forward's sequences",
                    fmt::format("{}", model_.CurrentSlots()), fmt::format("{}", cache_->slots())};
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckConv() {
  const int64_t d = config_.d_conv, w = config_.hidden;
  // Zeros read the same from a buffer and from none, so the allocation is compared itself.
  for (int32_t layer = 0; layer < config_.num_conv_layers; ++layer) {
    const bool want = conv_allocated_[static_cast<size_t>(layer)] != 0;
    if (cache_->layer_allocated(layer) != want) {
      return Mismatch{
          fmt::format("conv buffer of L{} allocated (lazily, on its first ConvState)", layer),
          want ? "yes" : "no", want ? "no" : "yes"};
    }
  }
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    const std::optional<int32_t> slot = cache_->slot_of(s);
    if (!slot) continue;
    const model::ConvRows* want = &conv_want_;
    if (!model_.ExpectedConvInto(S(s), model::ConvMode::kAsSpecified, conv_want_)) {
      continue;  // a failed forward took the slot: its rows are unknown
    }
    for (int32_t layer = 0; layer < config_.num_conv_layers; ++layer) {
      const float* got = RowFloats(cache_->SlotRow(layer, *slot), 0, floats_);
      for (int64_t j = 0; j < d; ++j) {
        const float* g = got + j * w;
        const float* e = (*want)[static_cast<size_t>(j)].data() + layer * w;
        if (!std::equal(g, g + w, e)) {
          return Mismatch{fmt::format("conv state L{} of s{} (slot {}) row {}", layer, s, *slot, j),
                          DescribeConv(layer, e), DescribeConv(layer, g)};
        }
      }
    }
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckIdeal() {
  if (config_.num_conv_layers == 0) return std::nullopt;  // no conv state to be wrong
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    if (!model_.ConvDivergesFromIdeal(S(s))) {
      ideal_diverged_.erase(s);
      continue;
    }
    if (!ideal_diverged_.insert(s).second) continue;
    ++coverage_.ideal_divergences;
    if (config_.conv != ConvExpectation::kIdeal) continue;
    const model::ConvRows ideal = *model_.ExpectedConv(S(s), model::ConvMode::kIdeal);
    const std::optional<model::ConvRows> spec =
        model_.ExpectedConv(S(s), model::ConvMode::kAsSpecified);
    std::vector<std::string> want, got;
    for (const model::ConvRow& r : ideal) want.push_back(DescribeConv(0, r.data()));
    if (spec) {
      for (const model::ConvRow& r : *spec) got.push_back(DescribeConv(0, r.data()));
    }
    return Mismatch{
        fmt::format("conv state of s{} differs from the ideal semantics (documented weakness: "
                    "CopyPrefix shares the current state / Remove resets it / the KV log moved "
                    "without the conv state / a reserve pass wrote its fake slots)",
                    s),
        fmt::format("{}", fmt::join(want, "; ")),
        spec ? fmt::format("{}", fmt::join(got, "; ")) : "stale rows"};
  }
  return std::nullopt;
}

std::string MultiSeqDriver::DescribeConv(int32_t layer, const float* row) const {
  const int64_t w = config_.hidden;
  if (std::all_of(row, row + w, [](float x) { return x == 0.0f; })) return "zeros";
  // Provenance: the token whose conv input this row is, searched over every history.
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    for (const model::MsEntry& e : model_.kv().History(S(s))) {
      const model::ConvRow in = ConvInput(e.written_pos, e.token.h);
      if (std::equal(row, row + w, in.data() + layer * w)) {
        return fmt::format("input of s{} pos {} (h=0x{:06x})", s, e.written_pos,
                           e.token.h & 0xFFFFFF);
      }
    }
  }
  return fmt::format("[{}, ...] (no known input)", row[0]);
}

void MultiSeqDriver::Fold(uint64_t value) {
  digest_ = XXH3_64bits_withSeed(&value, sizeof(value), digest_);
}

void MultiSeqDriver::FoldState() {
  const CausalCache& kv = cache_->kv();
  for (int64_t i = 0; i < kv.num_cells(); ++i) {
    const CausalCache::Cell& cell = kv.cells()[static_cast<size_t>(i)];
    if (cell.seqs.empty()) continue;
    Fold(static_cast<uint64_t>(i));
    Fold(static_cast<uint64_t>(cell.pos));
    for (int32_t s : cell.seqs) Fold(static_cast<uint64_t>(s));
    Fold(RowHash(kv.k(), i, floats_));
    kv.VRowInto(i, v_row_);
    Fold(RowHash(v_row_, 0, floats_));
  }
  for (int32_t slot = 0; slot < config_.max_seqs; ++slot) {
    Fold(static_cast<uint64_t>(cache_->ref_count(slot)));
    Fold(static_cast<uint64_t>(cache_->slot_of(slot).value_or(-1)));
    for (int32_t layer = 0; layer < config_.num_conv_layers; ++layer) {
      Fold(RowHash(cache_->SlotRow(layer, slot), 0, floats_));
    }
  }
  for (int32_t slot : cache_->free_slots()) Fold(static_cast<uint64_t>(slot));
}

}  // namespace kvtwin::sim
