// RefMultiSeqCache: the ggml multi-sequence causal cache (spec §2.8, §5.2) as per-sequence
// entry logs. Each rule is transcribed from §2.8 in sequence terms: a production cell is the
// set of entries sharing one logical cell id, "the sequence is in the cell" is "the
// sequence holds a retained entry with that id", and the cell's position is the entries'
// position (entries of one id move together, since only unshared cells are shifted).
// Storage order never matters to an observable the model predicts; where it would (a
// refused Remove), the sequence is declared indeterminate instead.
#include "model/ref_multi_seq.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace kvtwin::model {
namespace {

std::string SeqName(SeqId seq) { return "sequence " + std::to_string(Raw(seq)); }

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

std::vector<int64_t> Positions(const std::vector<MsEntry>& entries) {
  std::vector<int64_t> out;
  out.reserve(entries.size());
  for (const MsEntry& e : entries) out.push_back(e.pos);
  return out;
}

// Drops the entries in [begin, end) and moves those at pos >= end by delta; the keys of the
// moved cells (retained entries) are shifted when a callback exists.
std::vector<MsEntry> CutAndMove(std::vector<MsEntry> entries, int64_t begin, int64_t end,
                                int64_t delta, bool shift_keys) {
  std::vector<MsEntry> kept;
  for (MsEntry& e : entries) {
    if (e.pos >= begin && e.pos < end) continue;
    if (e.pos >= end) {
      e.pos += delta;
      if (e.retained && shift_keys) e.shifts.push_back(delta);
    }
    kept.push_back(std::move(e));
  }
  return kept;
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

int64_t MsEntry::Shift() const { return std::accumulate(shifts.begin(), shifts.end(), int64_t{0}); }

RefMultiSeqCache::RefMultiSeqCache(MultiSeqConfig config) : config_(config) {
  KV_CHECK(config_.window >= 0 && config_.memory >= config_.window, "memory must cover the window");
  KV_CHECK(config_.chunk >= 1 && config_.max_seqs >= 1 && config_.cells >= 0,
           "chunk and max_seqs are at least 1");
}

Status RefMultiSeqCache::Forward(const MsBatch& batch) {
  KV_RETURN_IF_ERROR(StartForward(batch));
  Put();
  return Status::Ok();
}

Status RefMultiSeqCache::StartForward(const MsBatch& batch) {
  KV_CHECK(!batch.empty(), "a forward writes at least one token");
  KV_CHECK(!AnyIndeterminate(), "clear the indeterminate sequence before the next forward");
  for (const MsToken& t : batch) KV_CHECK(t.pos >= 0, "negative position");
  EndForward();
  if (config_.memory != kUnbounded) Prune(batch);
  const int64_t needed = static_cast<int64_t>(batch.size());
  const int64_t used = *UsedCells();
  if (config_.cells != kUnbounded && used + needed > config_.cells) {
    return ResourceExhausted("cache full: " + std::to_string(used) + " of " +
                             std::to_string(config_.cells) + " cells live, batch of " +
                             std::to_string(needed));
  }
  const uint64_t first = next_cell_;
  std::set<SeqId> touched;
  for (const MsToken& t : batch) {
    seqs_[t.seq].entries.push_back(
        MsEntry{t.pos, t.token, t.pos, {}, next_cell_++, /*retained=*/true, /*has_data=*/false});
    touched.insert(t.seq);
  }
  for (SeqId seq : touched) Sort(seqs_[seq].entries);
  last_batch_ = batch;
  put_ = std::make_pair(first, next_cell_);
  return Status::Ok();
}

void RefMultiSeqCache::Put() {
  KV_CHECK(put_.has_value(), "Put without a successful StartForward just before");
  for (auto& [id, seq] : seqs_) {
    for (MsEntry& e : seq.entries) {
      if (e.cell >= put_->first && e.cell < put_->second) e.has_data = true;
    }
  }
  put_.reset();
}

void RefMultiSeqCache::Prune(const MsBatch& batch) {
  // lowest: the smallest batch position of a sequence in the batch, else its largest held
  // position + 1.
  std::map<SeqId, int64_t> lowest;
  for (const MsToken& t : batch) {
    auto [it, fresh] = lowest.try_emplace(t.seq, t.pos);
    if (!fresh) it->second = std::min(it->second, t.pos);
  }
  for (auto& [id, seq] : seqs_) {
    int64_t low = 0;
    if (auto it = lowest.find(id); it != lowest.end()) {
      low = it->second;
    } else {
      const std::vector<int64_t> held = RetainedPositions(id);
      if (held.empty()) continue;
      low = held.back() + 1;
    }
    for (MsEntry& e : seq.entries) {
      if (e.retained && e.pos < low - config_.memory) e.retained = false;
    }
  }
}

void RefMultiSeqCache::CopyPrefix(SeqId src, SeqId dst, int64_t len) {
  KV_CHECK(len >= 0, "negative prefix length");
  EndForward();
  std::vector<MsEntry> copied;
  // dst leaves every cell first, so a copy onto itself finds nothing left to copy.
  if (src != dst) {
    for (const MsEntry& e : Determined(src).entries) {
      if (e.pos < len) copied.push_back(e);
    }
  }
  Seq& to = seqs_[dst];
  to.entries = std::move(copied);
  to.determinate = true;
}

Status RefMultiSeqCache::Remove(SeqId seq, int64_t begin, int64_t end) {
  KV_CHECK(0 <= begin && begin <= end, "Remove range [" + std::to_string(begin) + ", " +
                                           std::to_string(end) + ") inverted or negative");
  const bool finite = end != kUnbounded;
  KV_CHECK(!finite || !AnyIndeterminate(),
           "a shifting Remove while a sequence is indeterminate (sharing unknown)");
  EndForward();
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return Status::Ok();
  Seq& s = it->second;
  if (!s.determinate) {
    KV_CHECK(begin == 0 && !finite, SeqName(seq) + " is indeterminate: only a full Remove");
    seqs_.erase(it);
    return Status::Ok();
  }
  const int64_t delta = finite ? begin - end : 0;
  for (const MsEntry& e : s.entries) {
    if (finite && e.retained && e.pos >= end && SharedWithOther(seq, e.cell)) {
      // The original has already changed cells before this one, in storage order.
      s.determinate = false;
      return Unsupported("shifting cells shared by multiple sequences not supported");
    }
  }
  s.entries = CutAndMove(std::move(s.entries), begin, end, delta, config_.shift_supported);
  Sort(s.entries);
  const bool holds =
      std::any_of(s.entries.begin(), s.entries.end(), [](const MsEntry& e) { return e.retained; });
  if (s.entries.empty()) seqs_.erase(it);
  // A sequence left without cells returns before the shift (and its callback check).
  if (!holds) return Status::Ok();
  if (finite && !config_.shift_supported) {
    return Unsupported("shifting not supported: no RoPE shift callback (positions moved)");
  }
  return Status::Ok();
}

bool RefMultiSeqCache::CanResume(SeqId seq, int64_t pos) const {
  const std::vector<int64_t> held = RetainedPositions(seq);  // aborts when indeterminate
  if (config_.memory == kUnbounded) return true;
  if (held.empty()) return false;
  return std::max<int64_t>(0, pos - config_.window) >= held.front() && pos <= held.back() + 1;
}

std::vector<MsEntry> RefMultiSeqCache::Visible(const MsBatch& batch, size_t i,
                                               bool causal_disabled) const {
  KV_CHECK(last_batch_.has_value() && *last_batch_ == batch,
           "Visible answers for the batch of the last operation, a successful StartForward");
  KV_CHECK(i < batch.size(), "batch index out of range");
  const int64_t p = batch[i].pos;
  const int64_t chunk_start = config_.chunk == kUnbounded ? 0 : p - p % config_.chunk;
  const int64_t window_start = p - config_.window;  // p >= 0: no overflow
  std::vector<MsEntry> out;
  for (const MsEntry& e : Determined(batch[i].seq).entries) {
    if (!e.retained) continue;
    if (!causal_disabled && e.pos > p) continue;
    if (e.pos < chunk_start || e.pos < window_start) continue;
    out.push_back(e);
  }
  return out;
}

std::vector<int64_t> RefMultiSeqCache::VisiblePositions(const MsBatch& batch, size_t i,
                                                        bool causal_disabled) const {
  return Positions(Visible(batch, i, causal_disabled));
}

std::vector<MsEntry> RefMultiSeqCache::Retained(SeqId seq) const {
  std::vector<MsEntry> out;
  for (const MsEntry& e : Determined(seq).entries) {
    if (e.retained) out.push_back(e);
  }
  return out;
}

std::vector<int64_t> RefMultiSeqCache::RetainedPositions(SeqId seq) const {
  return Positions(Retained(seq));
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
  // Sorted by (pos, cell): the last entry of each position is the newest write.
  for (const MsEntry& e : Determined(seq).entries) {
    if (!out.empty() && out.back().pos == e.pos) out.pop_back();
    out.push_back(e);
  }
  return out;
}

std::vector<SeqId> RefMultiSeqCache::Sequences() const {
  std::vector<SeqId> out;
  for (const auto& [id, seq] : seqs_) {
    const bool holds = std::any_of(seq.entries.begin(), seq.entries.end(),
                                   [](const MsEntry& e) { return e.retained; });
    if (holds || !seq.determinate) out.push_back(id);
  }
  return out;
}

bool RefMultiSeqCache::Determinate(SeqId seq) const {
  const Seq* s = Find(seq);
  return s == nullptr || s->determinate;
}

std::optional<int64_t> RefMultiSeqCache::UsedCells() const {
  if (AnyIndeterminate()) return std::nullopt;
  std::set<uint64_t> cells;
  for (const auto& [id, seq] : seqs_) {
    for (const MsEntry& e : seq.entries) {
      if (e.retained) cells.insert(e.cell);
    }
  }
  return static_cast<int64_t>(cells.size());
}

void RefMultiSeqCache::Sort(std::vector<MsEntry>& entries) {
  std::sort(entries.begin(), entries.end(), [](const MsEntry& a, const MsEntry& b) {
    return a.pos != b.pos ? a.pos < b.pos : a.cell < b.cell;
  });
}

const RefMultiSeqCache::Seq* RefMultiSeqCache::Find(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

const RefMultiSeqCache::Seq& RefMultiSeqCache::Determined(SeqId seq) const {
  static const Seq kEmpty;
  const Seq* s = Find(seq);
  if (s == nullptr) return kEmpty;
  KV_CHECK(s->determinate, SeqName(seq) + " is indeterminate after a refused Remove");
  return *s;
}

bool RefMultiSeqCache::AnyIndeterminate() const {
  return std::any_of(seqs_.begin(), seqs_.end(),
                     [](const auto& kv) { return !kv.second.determinate; });
}

bool RefMultiSeqCache::SharedWithOther(SeqId seq, uint64_t cell) const {
  for (const auto& [id, other] : seqs_) {
    if (id == seq) continue;
    for (const MsEntry& e : other.entries) {
      if (e.retained && e.cell == cell) return true;
    }
  }
  return false;
}

void RefMultiSeqCache::EndForward() {
  last_batch_.reset();
  put_.reset();
}

}  // namespace kvtwin::model
