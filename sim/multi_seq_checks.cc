// MultiSeqDriver, the after-op half: the whole-state checks run after every op (retention,
// every cell by index with its rows, the per-sequence cell ranges, slot accounting against
// the model's physical allocator, conv states, the ideal-conv watch), the row comparison and
// provenance reports they share, and the digest.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <algorithm>
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

uint64_t RowHash(const Tensor& row) {
  const MatF f = row.ToFloat();
  return XXH3_64bits(f.data(), static_cast<size_t>(f.size()) * sizeof(float));
}

}  // namespace

const std::vector<MsCoverage::Field>& MsCoverage::Fields() {
  // Every counter, in declaration order: ToString, += and the coverage floors of the
  // tests all walk this one list.
  static const std::vector<Field> fields = {
      {"forwards", &MsCoverage::forwards},
      {"reserves", &MsCoverage::reserves},
      {"cache_full", &MsCoverage::cache_full},
      {"unequal_batches", &MsCoverage::unequal_batches},
      {"causal_off", &MsCoverage::causal_off},
      {"copy_prefix", &MsCoverage::copy_prefix},
      {"copy_prefix_partial", &MsCoverage::copy_prefix_partial},
      {"removes_tail", &MsCoverage::removes_tail},
      {"removes_whole", &MsCoverage::removes_whole},
      {"removes_middle_shift", &MsCoverage::removes_middle_shift},
      {"removes_refused_shared", &MsCoverage::removes_refused_shared},
      {"removes_refused_no_shift", &MsCoverage::removes_refused_no_shift},
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
  };
  return fields;
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

Check MultiSeqDriver::CheckRetention() const {
  const std::vector<CausalCache::Cell>& cells = cache_->kv().cells();
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    std::vector<int64_t> held;
    for (const CausalCache::Cell& cell : cells) {
      if (cell.seqs.contains(s)) held.push_back(cell.pos);
    }
    std::sort(held.begin(), held.end());
    const std::vector<int64_t> expected = model_.kv().RetainedPositions(S(s));
    if (held != expected) {
      return Mismatch{fmt::format("positions held by s{}", s), fmt::format("{}", expected),
                      fmt::format("{}", held)};
    }
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckCells() const {
  // Cell by cell: first-fit placement makes the index of every token's cell exact.
  const std::vector<CausalCache::Cell>& actual = cache_->kv().cells();
  const std::vector<model::MsCell> expected = model_.kv().Cells();
  if (actual.size() != expected.size()) {
    return Mismatch{"cell count", std::to_string(expected.size()), std::to_string(actual.size())};
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const model::MsCell& want = expected[i];
    std::vector<int32_t> want_seqs;
    for (SeqId s : want.seqs) want_seqs.push_back(Raw(s));
    const std::vector<int32_t> got_seqs(actual[i].seqs.begin(), actual[i].seqs.end());
    if (want_seqs != got_seqs || (!want_seqs.empty() && want.pos != actual[i].pos)) {
      return Mismatch{fmt::format("cell {}: position and sequences", i),
                      DescribeCell(want_seqs.empty(), want.pos, want_seqs),
                      DescribeCell(got_seqs.empty(), actual[i].pos, got_seqs)};
    }
    const auto cell = static_cast<int64_t>(i);
    if (Check c = CheckRow("stored", cell, want.rows, cache_->kv().k().Rows(cell, 1),
                           cache_->kv().VRow(cell))) {
      return c;
    }
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

Check MultiSeqDriver::CheckRow(const std::string& where, int64_t index,
                               const std::optional<model::MsRows>& want, const Tensor& k,
                               const Tensor& v) const {
  if (!want) return std::nullopt;  // never written: whatever the buffer started with
  const bool k_bad = !k.Equals(ExpectedRow(*want, false));
  if (!k_bad && v.Equals(ExpectedRow(*want, true))) return std::nullopt;
  const Tensor& got = k_bad ? k : v;
  const Provenance p = DecodeRow(got, 0);
  const bool same_tag = p.valid && p.hash24 == (want->token.h & 0xFFFFFF);
  return Mismatch{fmt::format("{} cell {} {} row", where, index, k_bad ? "K" : "V"),
                  Tag(*want, !k_bad),
                  p.ToString() + (same_tag ? " (right hash, other values or position)" : "")};
}

Tensor MultiSeqDriver::ExpectedRow(const model::MsRows& rows, bool is_value) const {
  Tensor row =
      synth_.KvRow(config_.dtype, config_.kv_cols, 0, rows.written_pos, rows.token.h, is_value);
  if (!is_value) {
    for (int64_t delta : rows.shifts) ShiftPositionTag(row, 0, delta);
  }
  return row;
}

Check MultiSeqDriver::CheckSlots(bool current) const {
  std::vector<std::vector<int32_t>> mapped(static_cast<size_t>(config_.max_seqs));
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    if (std::optional<int32_t> slot = cache_->slot_of(s)) {
      if (*slot < 0 || *slot >= config_.max_seqs) {
        return Mismatch{fmt::format("slot of s{}", s), "a slot in range", std::to_string(*slot)};
      }
      mapped[static_cast<size_t>(*slot)].push_back(s);
    }
  }
  if (Check c = CheckSlotCounts(mapped)) return c;
  return CheckSlotModel(current);
}

Check MultiSeqDriver::CheckSlotCounts(const std::vector<std::vector<int32_t>>& mapped) const {
  const int32_t n = config_.max_seqs;
  std::vector<int32_t> on_free(static_cast<size_t>(n), 0);
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

Check MultiSeqDriver::CheckConv() const {
  const int64_t d = config_.d_conv, w = config_.hidden;
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    const std::optional<int32_t> slot = cache_->slot_of(s);
    if (!slot) continue;
    const std::optional<model::ConvRows> want =
        model_.ExpectedConv(S(s), model::ConvMode::kAsSpecified);
    if (!want) continue;  // a failed forward took the slot: its rows are unknown
    for (int32_t layer = 0; layer < config_.num_conv_layers; ++layer) {
      const MatF got = cache_->SlotRow(layer, *slot).ToFloat();
      for (int64_t j = 0; j < d; ++j) {
        const float* g = got.data() + j * w;
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
                    "without the conv state)",
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
    Fold(RowHash(kv.k().Rows(i, 1)));
    Fold(RowHash(kv.VRow(i)));
  }
  for (int32_t slot = 0; slot < config_.max_seqs; ++slot) {
    Fold(static_cast<uint64_t>(cache_->ref_count(slot)));
    Fold(static_cast<uint64_t>(cache_->slot_of(slot).value_or(-1)));
    for (int32_t layer = 0; layer < config_.num_conv_layers; ++layer) {
      Fold(RowHash(cache_->SlotRow(layer, slot)));
    }
  }
  for (int32_t slot : cache_->free_slots()) Fold(static_cast<uint64_t>(slot));
}

}  // namespace kvtwin::sim
