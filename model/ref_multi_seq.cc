// RefMultiSeqCache, the forward half: Init's rules, StartForward (window maintenance,
// first-fit placement, the current range) and Put, what a forward's queries see, and the
// read-only views. Each rule is transcribed from §2.8 in sequence terms: "the sequence is in
// cell i" is "the sequence holds a retained entry with index i", and the cell's position is
// the entries' position (entries sharing a cell move together, since only unshared cells
// are shifted). The sequence edits live in ref_multi_seq_edit.cc.
#include "model/ref_multi_seq.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

namespace kvtwin::model {
namespace {

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

std::vector<int64_t> Positions(const std::vector<MsEntry>& entries) {
  std::vector<int64_t> out;
  out.reserve(entries.size());
  for (const MsEntry& e : entries) out.push_back(e.pos);
  return out;
}

// Widens an inclusive span [first, last] by one cell index.
void Widen(std::optional<MsSpan>& span, int64_t index) {
  if (!span) {
    span = MsSpan{index, index};
    return;
  }
  span->first = std::min(span->first, index);
  span->second = std::max(span->second, index);
}

}  // namespace

Result<MultiSeqConfig> ResolveMultiSeqConfig(const MultiSeqInit& init) {
  KV_CHECK(init.max_seqs >= 1 && init.capacity >= 1 && init.max_batch >= 1 && init.padding >= 1 &&
               init.chunk >= 1,
           "max_seqs, capacity, max_batch, padding and chunk are at least 1");
  KV_CHECK(init.window >= 0 && init.memory >= 0, "negative window or memory");
  MultiSeqConfig config;
  config.window = init.window;
  config.chunk = init.chunk;
  config.max_seqs = init.max_seqs;
  config.shift_supported = init.shift_supported;
  config.padding = init.padding;
  config.max_batch = init.max_batch;
  int64_t memory = init.memory == 0 ? init.window : init.memory;
  // Room for a stop token that will not be part of the follow-on sequence.
  if (init.window != kUnbounded && init.max_seqs > 1) {
    memory = std::max(memory, init.window + 1);
  }
  if (memory >= init.capacity) memory = kUnbounded;
  if (memory < init.window) {
    return InvalidArgument("memory " + std::to_string(memory) + " below the window " +
                           std::to_string(init.window));
  }
  config.memory = memory;
  const int64_t cells = memory == kUnbounded ? init.max_seqs * init.capacity
                                             : init.max_seqs * memory + init.max_batch;
  config.cells = RoundUp(cells, init.padding);
  return config;
}

int64_t MsRows::Shift() const { return std::accumulate(shifts.begin(), shifts.end(), int64_t{0}); }
int64_t MsEntry::Shift() const { return std::accumulate(shifts.begin(), shifts.end(), int64_t{0}); }

RefMultiSeqCache::RefMultiSeqCache(MultiSeqConfig config) : config_(config) {
  KV_CHECK(config_.window >= 0 && config_.memory >= config_.window, "memory must cover the window");
  KV_CHECK(
      config_.chunk >= 1 && config_.max_seqs >= 1 && config_.cells >= 0 && config_.padding >= 1,
      "chunk, max_seqs and padding are at least 1");
}

Status RefMultiSeqCache::Forward(const MsBatch& batch) {
  KV_RETURN_IF_ERROR(StartForward(batch));
  Put();
  return Status::Ok();
}

Status RefMultiSeqCache::StartForward(const MsBatch& batch) {
  KV_CHECK(!batch.empty(), "a forward writes at least one token");
  for (const MsToken& t : batch) KV_CHECK(t.pos >= 0, "negative position");
  EndForward();
  // Step 1: the current range starts as the cells window maintenance marks, or (unbounded
  // memory) as the union of the batch's sequences' ranges, stale ones included.
  std::optional<MsSpan> current;
  if (config_.memory != kUnbounded) {
    Prune(batch, current);
  } else {
    for (const MsToken& t : batch) {
      if (auto it = ranges_.find(t.seq); it != ranges_.end()) {
        Widen(current, it->second.first);
        Widen(current, it->second.second);
      }
    }
  }
  // Step 2: the first n free cells in index order.
  std::vector<int64_t> locations = FirstFree(batch.size());
  if (locations.size() < batch.size()) {
    return ResourceExhausted("cache full: " + std::to_string(UsedCells()) + " of " +
                             std::to_string(config_.cells) + " cells live, batch of " +
                             std::to_string(batch.size()));
  }
  // Step 3: token i becomes cell locations[i]; its sequence's range and the current range
  // grow to cover it.
  std::set<SeqId> touched;
  for (size_t i = 0; i < batch.size(); ++i) {
    const MsToken& t = batch[i];
    const int64_t at = locations[i];
    seqs_[t.seq].entries.push_back(
        MsEntry{t.pos, t.token, t.pos, {}, next_cell_++, at, /*retained=*/true, false});
    std::optional<MsSpan> range;
    if (auto it = ranges_.find(t.seq); it != ranges_.end()) range = it->second;
    Widen(range, at);
    ranges_[t.seq] = *range;
    Widen(current, at);
    touched.insert(t.seq);
    high_water_ = std::max(high_water_, at + 1);
  }
  for (SeqId seq : touched) Sort(seqs_[seq].entries);
  const int64_t pad = config_.padding;
  current_ = MsSpan{current->first / pad * pad, RoundUp(current->second + 1, pad)};
  last_batch_ = batch;
  locations_ = std::move(locations);
  put_pending_ = true;
  return Status::Ok();
}

std::vector<int64_t> RefMultiSeqCache::FirstFree(size_t n) const {
  const std::vector<uint8_t>& occupied = Occupied();
  const auto known = static_cast<int64_t>(occupied.size());
  std::vector<int64_t> out;
  out.reserve(n);
  for (int64_t i = 0; out.size() < n && i < config_.cells; ++i) {
    if (i >= known || occupied[static_cast<size_t>(i)] == 0) out.push_back(i);
  }
  return out;
}

void RefMultiSeqCache::Put() {
  KV_CHECK(put_pending_ && last_batch_.has_value(),
           "Put without a successful StartForward just before");
  for (size_t i = 0; i < last_batch_->size(); ++i) {
    const MsToken& t = (*last_batch_)[i];
    rows_[locations_[i]] = MsRows{t.token, t.pos, {}};
    if (!edited_in_forward_) {
      for (MsEntry& e : seqs_.at(t.seq).entries) {
        if (e.retained && e.index == locations_[i]) e.has_data = true;
      }
      continue;
    }
    // After edits the cell may hold other sequences (a CopyPrefix shared it) or none.
    for (auto& [id, seq] : seqs_) {
      for (MsEntry& e : seq.entries) {
        if (e.retained && e.index == locations_[i]) e.has_data = true;
      }
    }
  }
  put_pending_ = false;
  edited_in_forward_ = false;
}

void RefMultiSeqCache::ReservePut(const MsBatch& batch) {
  const auto n = static_cast<int64_t>(batch.size());
  KV_CHECK(n > 0 && (config_.cells == kUnbounded || n <= config_.cells),
           "a reserve Put of more tokens than cells");
  for (int64_t i = 0; i < n; ++i) {
    const MsToken& t = batch[static_cast<size_t>(i)];
    rows_[i] = MsRows{t.token, t.pos, {}};
  }
  // Cells past the placed ones hold rows now, so the cell list reaches them.
  high_water_ = std::max(high_water_, n);
}

void RefMultiSeqCache::Prune(const MsBatch& batch, std::optional<MsSpan>& current) {
  // lowest: the smallest batch position of a sequence in the batch, else its largest held
  // position + 1.
  std::map<SeqId, int64_t> lowest;
  for (const MsToken& t : batch) {
    auto [it, fresh] = lowest.try_emplace(t.seq, t.pos);
    if (!fresh) it->second = std::min(it->second, t.pos);
  }
  const std::map<SeqId, int64_t> in_batch = lowest;
  for (const auto& [id, seq] : seqs_) {
    if (in_batch.contains(id)) continue;
    const std::vector<int64_t> held = RetainedPositions(id);
    if (held.empty()) {
      ranges_.erase(id);  // no cell left to keep in a new range
      continue;
    }
    lowest[id] = *std::max_element(held.begin(), held.end()) + 1;
  }
  for (const auto& [id, low] : lowest) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    const bool batched = in_batch.contains(id);
    std::optional<MsSpan> range;
    for (MsEntry& e : it->second.entries) {
      if (!e.retained) continue;
      if (e.pos < low - config_.memory) {
        e.retained = false;
        continue;
      }
      Widen(range, e.index);
      if (batched && e.pos >= low - config_.window) Widen(current, e.index);
    }
    if (range) {
      ranges_[id] = *range;
    } else {
      ranges_.erase(id);
    }
  }
}

const std::vector<int64_t>& RefMultiSeqCache::Locations() const {
  KV_CHECK(last_batch_.has_value(), "Locations answers for a successful StartForward");
  return locations_;
}

MsSpan RefMultiSeqCache::CurrentRange() const {
  KV_CHECK(last_batch_.has_value(), "CurrentRange answers for a successful StartForward");
  return current_;
}

std::vector<MsEntry> RefMultiSeqCache::Visible(const MsBatch& batch, size_t i,
                                               bool causal_disabled) const {
  std::vector<MsEntry> out;
  VisibleInto(batch, i, causal_disabled, out);
  return out;
}

void RefMultiSeqCache::VisibleInto(const MsBatch& batch, size_t i, bool causal_disabled,
                                   std::vector<MsEntry>& out) const {
  KV_CHECK(last_batch_.has_value() && *last_batch_ == batch,
           "Visible answers for the batch of the last operation, a successful StartForward");
  VisibleOverInto(batch, i, causal_disabled, current_, out);
}

void RefMultiSeqCache::VisibleCellsInto(const MsBatch& batch,
                                        const std::vector<int64_t>& causal_off,
                                        std::vector<std::vector<MsVisibleCell>>& out) const {
  KV_CHECK(last_batch_.has_value() && *last_batch_ == batch,
           "Visible answers for the batch of the last operation, a successful StartForward");
  // Each sequence's retained cells in the current range, by cell index (VisibleOverInto's
  // order), built at its first token.
  std::vector<std::pair<SeqId, std::vector<MsVisibleCell>>> by_seq;
  out.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    auto it = std::find_if(by_seq.begin(), by_seq.end(),
                           [&](const auto& s) { return s.first == batch[i].seq; });
    if (it == by_seq.end()) {
      std::vector<MsVisibleCell> cells;
      for (const MsEntry& e : Of(batch[i].seq).entries) {
        if (e.retained && e.index >= current_.first && e.index < current_.second) {
          cells.push_back({e.index, e.pos});
        }
      }
      std::sort(cells.begin(), cells.end(),
                [](const MsVisibleCell& a, const MsVisibleCell& b) { return a.index < b.index; });
      it = by_seq.emplace(by_seq.end(), batch[i].seq, std::move(cells));
    }
    const bool off = std::find(causal_off.begin(), causal_off.end(), static_cast<int64_t>(i)) !=
                     causal_off.end();
    out[i].clear();
    for (const MsVisibleCell& c : it->second) {
      if (Attends(batch[i].pos, c.pos, off)) out[i].push_back(c);
    }
  }
}

void RefMultiSeqCache::ReserveVisibleInto(const MsBatch& batch, size_t i, bool causal_disabled,
                                          std::vector<MsEntry>& out) const {
  VisibleOverInto(batch, i, causal_disabled, MsSpan{0, std::numeric_limits<int64_t>::max()}, out);
}

void RefMultiSeqCache::VisibleOverInto(const MsBatch& batch, size_t i, bool causal_disabled,
                                       MsSpan range, std::vector<MsEntry>& out) const {
  KV_CHECK(i < batch.size(), "batch index out of range");
  out.clear();
  // The mask's columns are the current range; a cell outside it is not in the view at all.
  for (const MsEntry& e : Of(batch[i].seq).entries) {
    if (!e.retained || e.index < range.first || e.index >= range.second) continue;
    if (Attends(batch[i].pos, e.pos, causal_disabled)) out.push_back(e);
  }
  std::sort(out.begin(), out.end(),
            [](const MsEntry& a, const MsEntry& b) { return a.index < b.index; });
}

bool RefMultiSeqCache::Attends(int64_t p, int64_t pos, bool causal_disabled) const {
  if (!causal_disabled && pos > p) return false;
  const int64_t chunk_start = config_.chunk == kUnbounded ? 0 : p - p % config_.chunk;
  const int64_t window_start = p - config_.window;  // p >= 0: no overflow
  return pos >= chunk_start && pos >= window_start;
}

std::vector<int64_t> RefMultiSeqCache::VisiblePositions(const MsBatch& batch, size_t i,
                                                        bool causal_disabled) const {
  return Positions(Visible(batch, i, causal_disabled));
}

std::vector<MsEntry> RefMultiSeqCache::Retained(SeqId seq) const {
  std::vector<MsEntry> out;
  for (const MsEntry& e : Of(seq).entries) {
    if (e.retained) out.push_back(e);
  }
  return out;
}

std::vector<int64_t> RefMultiSeqCache::RetainedPositions(SeqId seq) const {
  std::vector<int64_t> out;
  RetainedPositionsInto(seq, out);
  return out;
}

void RefMultiSeqCache::RetainedPositionsInto(SeqId seq, std::vector<int64_t>& out) const {
  out.clear();
  for (const MsEntry& e : Of(seq).entries) {
    if (e.retained) out.push_back(e.pos);
  }
}

std::vector<int64_t> RefMultiSeqCache::RetainedAtLeast(SeqId seq) const {
  std::vector<int64_t> held = RetainedPositions(seq);
  if (held.empty()) return held;
  const int64_t from = held.back() + 1 - config_.window;
  std::erase_if(held, [from](int64_t pos) { return pos < from; });
  return held;
}

std::vector<MsEntry> RefMultiSeqCache::History(SeqId seq) const {
  std::vector<MsEntry> out;
  HistoryInto(seq, out);
  return out;
}

void RefMultiSeqCache::HistoryInto(SeqId seq, std::vector<MsEntry>& out) const {
  out.clear();
  // Sorted by (pos, cell): the last entry of each position is the newest write.
  for (const MsEntry& e : Of(seq).entries) {
    if (!out.empty() && out.back().pos == e.pos) {
      out.back() = e;
    } else {
      out.push_back(e);
    }
  }
}

std::vector<SeqId> RefMultiSeqCache::Sequences() const {
  std::vector<SeqId> out;
  for (const auto& [id, seq] : seqs_) {
    if (std::any_of(seq.entries.begin(), seq.entries.end(),
                    [](const MsEntry& e) { return e.retained; })) {
      out.push_back(id);
    }
  }
  return out;
}

int64_t RefMultiSeqCache::UsedCells() const {
  const std::vector<uint8_t>& occupied = Occupied();
  return std::count(occupied.begin(), occupied.end(), uint8_t{1});
}

std::vector<MsCell> RefMultiSeqCache::Cells() const {
  std::vector<MsCell> out;
  CellsInto(out);
  return out;
}

void RefMultiSeqCache::CellsInto(std::vector<MsCell>& out) const {
  const int64_t n = config_.cells == kUnbounded ? high_water_ : config_.cells;
  out.resize(static_cast<size_t>(n));
  for (MsCell& cell : out) {  // as fresh cells, but each sequence list keeps its capacity
    cell.pos = 0;
    cell.seqs.clear();
    cell.rows.reset();
  }
  for (const auto& [id, seq] : seqs_) {  // ascending ids: each cell's list ascends
    for (const MsEntry& e : seq.entries) {
      if (!e.retained) continue;
      MsCell& cell = out.at(static_cast<size_t>(e.index));
      KV_CHECK(cell.seqs.empty() || cell.pos == e.pos,
               "entries sharing cell " + std::to_string(e.index) + " disagree on its position");
      cell.pos = e.pos;
      cell.seqs.push_back(id);
    }
  }
  for (const auto& [index, rows] : rows_) out.at(static_cast<size_t>(index)).rows = rows;
}

void RefMultiSeqCache::Sort(std::vector<MsEntry>& entries) {
  std::sort(entries.begin(), entries.end(), [](const MsEntry& a, const MsEntry& b) {
    return a.pos != b.pos ? a.pos < b.pos : a.cell < b.cell;
  });
}

const RefMultiSeqCache::Seq& RefMultiSeqCache::Of(SeqId seq) const {
  static const Seq kEmpty;
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? kEmpty : it->second;
}

const std::vector<uint8_t>& RefMultiSeqCache::Occupied() const {
  occupied_.assign(static_cast<size_t>(high_water_), 0);
  for (const auto& [id, seq] : seqs_) {
    for (const MsEntry& e : seq.entries) {
      if (!e.retained) continue;
      const auto at = static_cast<size_t>(e.index);
      if (at >= occupied_.size()) occupied_.resize(at + 1, 0);
      occupied_[at] = 1;
    }
  }
  return occupied_;
}

void RefMultiSeqCache::EndForward() {
  last_batch_.reset();
  locations_.clear();
  put_pending_ = false;
  edited_in_forward_ = false;
}

}  // namespace kvtwin::model
