// MultiSeqDriver, the after-op half: the whole-state checks run after every op (retention,
// cell sharing and contents, slot accounting, conv states, the ideal-conv watch), the row
// matching and provenance reports they share, and the digest. A sequence the model calls
// indeterminate (a Remove refused on a shared cell left it half-edited, spec §8 quirk 6) is
// left out of every comparison until the runner clears it.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <algorithm>
#include <utility>

#include "sim/multi_seq_driver.h"

namespace kvtwin::sim {
namespace {

SeqId S(int32_t seq) { return SeqId{seq}; }

bool RowEquals(const Tensor& a, const Tensor& b) { return a.Equals(b); }

std::string Tag(const model::MsEntry& e, bool is_value) {
  const int64_t pos = is_value ? e.written_pos : e.written_pos + e.Shift();
  return fmt::format(
      "pos {} h=0x{:06x} L0 {}{}", pos, e.token.h & 0xFFFFFF, is_value ? "V" : "K",
      e.shifts.empty() ? "" : fmt::format(" (written at {}, shifted)", e.written_pos));
}

uint64_t RowHash(const Tensor& row) {
  const MatF f = row.ToFloat();
  return XXH3_64bits(f.data(), static_cast<size_t>(f.size()) * sizeof(float));
}

}  // namespace

std::string MsCoverage::ToString() const {
  return fmt::format(
      "forwards={} reserves={} cache_full={} unequal_batches={} causal_off={} copy_prefix={} "
      "copy_prefix_partial={} removes_tail={} removes_whole={} removes_middle_shift={} "
      "removes_refused_shared={} removes_refused_no_shift={} cow_copies={} can_resume_true={} "
      "can_resume_false={} ideal_divergences={}",
      forwards, reserves, cache_full, unequal_batches, causal_off, copy_prefix, copy_prefix_partial,
      removes_tail, removes_whole, removes_middle_shift, removes_refused_shared,
      removes_refused_no_shift, cow_copies, can_resume_true, can_resume_false, ideal_divergences);
}

MsCoverage& MsCoverage::operator+=(const MsCoverage& o) {
  // Every counter, in declaration order (the same list as ToString).
  int64_t* mine[] = {&forwards,
                     &reserves,
                     &cache_full,
                     &unequal_batches,
                     &causal_off,
                     &copy_prefix,
                     &copy_prefix_partial,
                     &removes_tail,
                     &removes_whole,
                     &removes_middle_shift,
                     &removes_refused_shared,
                     &removes_refused_no_shift,
                     &cow_copies,
                     &can_resume_true,
                     &can_resume_false,
                     &ideal_divergences};
  const int64_t theirs[] = {o.forwards,
                            o.reserves,
                            o.cache_full,
                            o.unequal_batches,
                            o.causal_off,
                            o.copy_prefix,
                            o.copy_prefix_partial,
                            o.removes_tail,
                            o.removes_whole,
                            o.removes_middle_shift,
                            o.removes_refused_shared,
                            o.removes_refused_no_shift,
                            o.cow_copies,
                            o.can_resume_true,
                            o.can_resume_false,
                            o.ideal_divergences};
  static_assert(std::size(mine) == std::size(theirs));
  for (size_t i = 0; i < std::size(mine); ++i) *mine[i] += theirs[i];
  return *this;
}

Check MultiSeqDriver::CheckState() {
  if (Check c = CheckRetention()) return c;
  if (Check c = CheckCells()) return c;
  if (Check c = CheckSlots()) return c;
  if (Check c = CheckConv()) return c;
  return CheckIdeal();
}

Check MultiSeqDriver::CheckRetention() const {
  const std::vector<CausalCache::Cell>& cells = cache_->kv().cells();
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    if (!Determinate(s)) continue;
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

std::map<MultiSeqDriver::CellKey, std::vector<MultiSeqDriver::StoredRow>>
MultiSeqDriver::StoredCells() const {
  std::map<CellKey, std::vector<StoredRow>> out;
  const std::vector<CausalCache::Cell>& cells = cache_->kv().cells();
  for (size_t i = 0; i < cells.size(); ++i) {
    std::vector<int32_t> holders;
    for (int32_t s : cells[i].seqs) {
      if (Determinate(s)) holders.push_back(s);
    }
    if (holders.empty()) continue;
    const auto cell = static_cast<int64_t>(i);
    out[{cells[i].pos, holders}].push_back(
        {cell, cells[i].pos, cache_->kv().k().Rows(cell, 1), cache_->kv().VRow(cell)});
  }
  return out;
}

std::map<MultiSeqDriver::CellKey, std::vector<model::MsEntry>> MultiSeqDriver::ExpectedCells()
    const {
  // Entries with one logical cell id across sequences are one production cell.
  std::map<uint64_t, std::pair<model::MsEntry, std::vector<int32_t>>> by_id;
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    if (!Determinate(s)) continue;
    for (const model::MsEntry& e : model_.kv().Retained(S(s))) {
      auto [it, fresh] = by_id.try_emplace(e.cell, e, std::vector<int32_t>{});
      it->second.second.push_back(s);  // ascending: s grows
    }
  }
  std::map<CellKey, std::vector<model::MsEntry>> out;
  for (const auto& [id, entry] : by_id) out[{entry.first.pos, entry.second}].push_back(entry.first);
  return out;
}

Check MultiSeqDriver::CheckCells() const {
  // A cell is (position, determinate sequences holding it): equal keys are interchangeable,
  // so keys are compared as multisets and then rows matched within a key.
  using Key = CellKey;
  const std::map<Key, std::vector<StoredRow>> actual = StoredCells();
  const std::map<Key, std::vector<model::MsEntry>> expected = ExpectedCells();
  std::set<Key> keys;
  for (const auto& [key, rows] : actual) keys.insert(key);
  for (const auto& [key, entries] : expected) keys.insert(key);
  for (const Key& key : keys) {
    const size_t want = expected.contains(key) ? expected.at(key).size() : 0;
    const size_t got = actual.contains(key) ? actual.at(key).size() : 0;
    if (want != got) {
      return Mismatch{
          fmt::format("cells at position {} shared by sequences {}", key.first, key.second),
          std::to_string(want), std::to_string(got)};
    }
    const std::string where =
        fmt::format("stored cell of {} at position {}:", key.second, key.first);
    if (Check c = MatchRows(actual.at(key), expected.at(key), where)) return c;
  }
  return std::nullopt;
}

Check MultiSeqDriver::MatchRows(const std::vector<StoredRow>& rows,
                                std::vector<model::MsEntry> entries,
                                const std::string& where) const {
  std::vector<bool> used(entries.size(), false);
  for (const StoredRow& row : rows) {
    std::optional<size_t> pick, first, blank;
    for (size_t e = 0; e < entries.size(); ++e) {
      if (used[e] || entries[e].pos != row.pos) continue;
      if (!entries[e].has_data) {
        if (!blank) blank = e;
        continue;
      }
      if (!first) first = e;
      if (RowEquals(row.k, ExpectedRow(entries[e], false)) &&
          RowEquals(row.v, ExpectedRow(entries[e], true))) {
        pick = e;
        break;
      }
    }
    if (!pick) pick = blank;
    if (pick) {
      used[*pick] = true;
      continue;
    }
    KV_CHECK(first.has_value(), "row positions were compared before the rows");
    const model::MsEntry& want = entries[*first];
    const bool k_bad = !RowEquals(row.k, ExpectedRow(want, false));
    const Tensor& got = k_bad ? row.k : row.v;
    const Provenance p = DecodeRow(got, 0);
    const bool same_tag = p.valid && p.hash24 == (want.token.h & 0xFFFFFF);
    return Mismatch{
        fmt::format("{} cell {} (position {}) {} row", where, row.cell, row.pos, k_bad ? "K" : "V"),
        Tag(want, !k_bad),
        p.ToString() + (same_tag ? " (right hash, other values or position)" : "")};
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckSlots() const {
  std::vector<std::vector<int32_t>> mapped(static_cast<size_t>(config_.max_seqs));
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    if (std::optional<int32_t> slot = cache_->slot_of(s)) {
      mapped[static_cast<size_t>(*slot)].push_back(s);
    }
  }
  if (Check c = CheckSlotCounts(mapped)) return c;
  return CheckSlotGroups(mapped);
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

Check MultiSeqDriver::CheckSlotGroups(const std::vector<std::vector<int32_t>>& mapped) const {
  // The model's groups: one slot per group (copy-on-write runs inside ConvState, so a
  // cache without conv layers never unshares and only the mapped set is comparable).
  std::vector<int32_t> model_mapped;
  for (const std::vector<SeqId>& group : model_.SlotGroups()) {
    for (SeqId s : group) model_mapped.push_back(Raw(s));
  }
  std::sort(model_mapped.begin(), model_mapped.end());
  std::vector<int32_t> prod_mapped;
  for (const auto& seqs : mapped) prod_mapped.insert(prod_mapped.end(), seqs.begin(), seqs.end());
  std::sort(prod_mapped.begin(), prod_mapped.end());
  if (prod_mapped != model_mapped) {
    return Mismatch{"sequences mapped to a conv slot", fmt::format("{}", model_mapped),
                    fmt::format("{}", prod_mapped)};
  }
  if (config_.num_conv_layers == 0) return std::nullopt;
  std::vector<std::vector<int32_t>> prod_groups;
  for (const auto& seqs : mapped) {
    if (!seqs.empty()) prod_groups.push_back(seqs);
  }
  std::sort(prod_groups.begin(), prod_groups.end());
  std::vector<std::vector<int32_t>> model_groups;
  for (const std::vector<SeqId>& group : model_.SlotGroups()) {
    model_groups.emplace_back();
    for (SeqId s : group) model_groups.back().push_back(Raw(s));
  }
  if (prod_groups != model_groups ||
      static_cast<int64_t>(prod_groups.size()) != model_.LiveSlots()) {
    return Mismatch{"sequences sharing each live conv slot", fmt::format("{}", model_groups),
                    fmt::format("{}", prod_groups)};
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckConv() const {
  const int64_t d = config_.d_conv, w = config_.hidden;
  for (int32_t s = 0; s < config_.max_seqs; ++s) {
    const std::optional<int32_t> slot = cache_->slot_of(s);
    if (!slot || !Determinate(s)) continue;
    const std::optional<model::ConvRows> want =
        model_.ExpectedConv(S(s), model::ConvMode::kAsSpecified);
    if (!want) continue;  // stale rows: unpredictable by the spec
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
    if (!Determinate(s)) continue;
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
                    "CopyPrefix shares the current state / Remove resets it)",
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
    if (!Determinate(s)) continue;
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
