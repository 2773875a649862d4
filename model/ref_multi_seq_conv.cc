// RefHybridCache: the original LFM2 hybrid cache (spec §2.9.1) over RefMultiSeqCache. Slots
// are modelled physically -- refcounts, the sequence map, the LIFO free stack and the rows
// each slot holds -- because which slot a sequence gets is an observable of the original
// (§6.14: "LIFO reuse", "recycled slot returned"). The ideal conv state is recomputed from
// the KV history on every query; the as-specified one is carried in the slots exactly as the
// original moves it (zeroed on allocation, shifted in by a forward, copied on write, shared
// by CopyPrefix, released by Remove), so the two meet only while the original's shortcuts
// happen to be harmless.
#include <algorithm>
#include <string>
#include <utility>

#include "model/ref_multi_seq.h"

namespace kvtwin::model {

RefHybridCache::RefHybridCache(MultiSeqConfig config, int64_t d_conv, int64_t width,
                               ConvInputFn inputs)
    : kv_(config), d_conv_(d_conv), width_(width), inputs_(std::move(inputs)) {
  KV_CHECK(d_conv_ >= 1 && width_ >= 1, "a conv state has at least one row and one column");
  KV_CHECK(inputs_ != nullptr, "the hybrid reference needs the conv inputs of tokens");
  const int32_t n = kv_.config().max_seqs;
  // A never-written slot reads as zeros (buffers are allocated zero-filled).
  slots_.assign(static_cast<size_t>(n), Slot{0, ZeroRows()});
  // The stack's top is back(): initialised so the first allocation returns 0, then 1, ...
  for (int32_t slot = n - 1; slot >= 0; --slot) free_.push_back(slot);
}

Status RefHybridCache::StartForward(const MsBatch& batch) {
  batch_.reset();
  cur_seqs_.clear();
  cur_slots_.clear();
  taken_.clear();
  writable_.reset();
  KV_RETURN_IF_ERROR(kv_.StartForward(batch));
  std::vector<SeqId> order;  // first appearance
  std::map<SeqId, size_t> counts;
  for (const MsToken& t : batch) {
    if (counts[t.seq]++ == 0) order.push_back(t.seq);
  }
  const size_t per_seq = batch.size() / order.size();
  for (SeqId seq : order) {
    if (counts[seq] != per_seq) {
      return Unsupported("sequences contribute unequal token counts (KV already updated)");
    }
  }
  std::vector<int32_t> fresh;
  for (SeqId seq : order) {
    if (slot_of_.contains(seq)) continue;
    const std::optional<int32_t> slot = Pop();
    if (!slot) {
      // The slots popped so far stay mapped, never zeroed: they keep the rows they held.
      return ResourceExhausted("cache full allocating a conv slot: all " +
                               std::to_string(slots_.size()) + " live");
    }
    slots_[static_cast<size_t>(*slot)].refs = 1;
    slot_of_[seq] = *slot;
    fresh.push_back(*slot);
  }
  for (int32_t slot : fresh) slots_[static_cast<size_t>(slot)].rows = ZeroRows();
  taken_ = fresh;
  batch_ = batch;
  cur_seqs_ = order;
  for (SeqId seq : order) cur_slots_.push_back(slot_of_.at(seq));
  return Status::Ok();
}

Status RefHybridCache::ConvState() {
  KV_CHECK(batch_.has_value(), "ConvState without a successful StartForward");
  if (writable_) return *writable_;
  writable_ = Status::Ok();
  // Copy-on-write in batch order: a sequence whose partners have all moved out owns the
  // slot again and keeps it.
  for (size_t i = 0; i < cur_seqs_.size(); ++i) {
    const int32_t shared = slot_of_.at(cur_seqs_[i]);
    Slot& old = slots_[static_cast<size_t>(shared)];
    if (old.refs <= 1) continue;
    const std::optional<int32_t> copy = Pop();
    if (!copy) {
      writable_ = ResourceExhausted("cache full in copy-on-write: all " +
                                    std::to_string(slots_.size()) + " conv slots live");
      ForgetTaken();
      return *writable_;
    }
    --old.refs;
    slots_[static_cast<size_t>(*copy)] = Slot{1, old.rows};
    slot_of_[cur_seqs_[i]] = *copy;
    cur_slots_[i] = *copy;
    taken_.push_back(*copy);
  }
  return *writable_;
}

void RefHybridCache::FinishForward() {
  KV_CHECK(batch_.has_value() && (!writable_ || writable_->ok()),
           "FinishForward after a forward that failed");
  if (writable_) ShiftIn(*batch_, cur_seqs_, cur_slots_);
  kv_.Put();
  batch_.reset();
}

Status RefHybridCache::Forward(const MsBatch& batch, bool reads_conv) {
  KV_RETURN_IF_ERROR(StartForward(batch));
  if (reads_conv) KV_RETURN_IF_ERROR(ConvState());
  FinishForward();
  return Status::Ok();
}

void RefHybridCache::ForgetTaken() {
  // Zeroing and copies are part of the forward's graph, which never runs.
  for (int32_t slot : taken_) slots_[static_cast<size_t>(slot)].rows.reset();
  batch_.reset();
}

void RefHybridCache::ReserveConvWrite(const MsBatch& batch) {
  std::vector<SeqId> order;  // first appearance
  for (const MsToken& t : batch) {
    if (std::find(order.begin(), order.end(), t.seq) == order.end()) order.push_back(t.seq);
  }
  KV_CHECK(order.size() <= slots_.size(), "a reserve pass with more sequences than slots");
  std::vector<int32_t> fake(order.size());
  for (size_t i = 0; i < fake.size(); ++i) fake[i] = static_cast<int32_t>(i);
  ShiftIn(batch, order, fake);
}

void RefHybridCache::ShiftIn(const MsBatch& batch, const std::vector<SeqId>& seqs,
                             const std::vector<int32_t>& slots) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::optional<ConvRows>& rows = slots_[static_cast<size_t>(slots[i])].rows;
    if (!rows.has_value()) continue;  // unknown rows stay unknown
    for (const MsToken& t : batch) {
      if (t.seq != seqs[i]) continue;
      ConvRow row = inputs_(t.pos, t.token);
      KV_CHECK(static_cast<int64_t>(row.size()) == width_, "conv input of the wrong width");
      rows->erase(rows->begin());
      rows->push_back(std::move(row));
    }
  }
}

void RefHybridCache::CopyPrefix(SeqId src, SeqId dst, int64_t len) {
  kv_.CopyPrefix(src, dst, len);
  Release(dst);
  // src's current state, whatever len is (quirk 7); none when src has no slot (also when
  // src == dst: its slot was just released).
  auto it = slot_of_.find(src);
  if (it == slot_of_.end()) return;
  ++slots_[static_cast<size_t>(it->second)].refs;
  slot_of_[dst] = it->second;
}

Status RefHybridCache::Remove(SeqId seq, int64_t begin, int64_t end, int64_t failing_shift_call) {
  KV_RETURN_IF_ERROR(kv_.Remove(seq, begin, end, failing_shift_call));
  Release(seq);  // any range: the next forward starts from zero rows
  return Status::Ok();
}

std::optional<ConvRows> RefHybridCache::ExpectedConv(SeqId seq, ConvMode mode) const {
  ConvRows rows;
  if (!ExpectedConvInto(seq, mode, rows)) return std::nullopt;
  return rows;
}

bool RefHybridCache::ExpectedConvInto(SeqId seq, ConvMode mode, ConvRows& out) const {
  if (mode == ConvMode::kIdeal) {
    IdealConvInto(seq, out);
    return true;
  }
  auto it = slot_of_.find(seq);
  if (it == slot_of_.end()) {  // its next slot is zeroed
    ZeroRowsInto(out);
    return true;
  }
  const std::optional<ConvRows>& rows = slots_[static_cast<size_t>(it->second)].rows;
  if (!rows.has_value()) return false;
  out = *rows;
  return true;
}

bool RefHybridCache::ConvDivergesFromIdeal(SeqId seq) const {
  if (!ExpectedConvInto(seq, ConvMode::kAsSpecified, specified_scratch_)) return true;
  IdealConvInto(seq, ideal_scratch_);
  return specified_scratch_ != ideal_scratch_;
}

std::vector<std::vector<SeqId>> RefHybridCache::SlotGroups() const {
  std::map<int32_t, std::vector<SeqId>> by_slot;
  for (const auto& [seq, slot] : slot_of_) by_slot[slot].push_back(seq);  // ascending seqs
  std::vector<std::vector<SeqId>> out;
  for (auto& [slot, seqs] : by_slot) out.push_back(std::move(seqs));
  std::sort(out.begin(), out.end());
  return out;
}

int64_t RefHybridCache::LiveSlots() const {
  return std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.refs > 0; });
}

std::optional<int32_t> RefHybridCache::SlotOf(SeqId seq) const {
  auto it = slot_of_.find(seq);
  if (it == slot_of_.end()) return std::nullopt;
  return it->second;
}

bool RefHybridCache::SlotRowsInto(int32_t slot, ConvRows& out) const {
  KV_CHECK(slot >= 0 && slot < static_cast<int32_t>(slots_.size()), "slot out of range");
  const std::optional<ConvRows>& rows = slots_[static_cast<size_t>(slot)].rows;
  if (!rows.has_value()) return false;
  out = *rows;
  return true;
}

int32_t RefHybridCache::RefCount(int32_t slot) const {
  KV_CHECK(slot >= 0 && slot < static_cast<int32_t>(slots_.size()), "slot out of range");
  return slots_[static_cast<size_t>(slot)].refs;
}

ConvRows RefHybridCache::ZeroRows() const {
  ConvRows rows;
  ZeroRowsInto(rows);
  return rows;
}

void RefHybridCache::ZeroRowsInto(ConvRows& out) const {
  out.resize(static_cast<size_t>(d_conv_));
  for (ConvRow& row : out) row.assign(static_cast<size_t>(width_), 0.0f);
}

void RefHybridCache::IdealConvInto(SeqId seq, ConvRows& rows) const {
  kv_.HistoryInto(seq, history_scratch_);
  const std::vector<MsEntry>& history = history_scratch_;
  ZeroRowsInto(rows);
  const size_t keep = std::min(history.size(), rows.size());
  // The newest `keep` entries fill the newest rows; older rows stay zero.
  for (size_t k = 0; k < keep; ++k) {
    const MsEntry& e = history[history.size() - keep + k];
    ConvRow row = inputs_(e.written_pos, e.token);
    KV_CHECK(static_cast<int64_t>(row.size()) == width_, "conv input of the wrong width");
    rows[rows.size() - keep + k] = std::move(row);
  }
}

void RefHybridCache::Release(SeqId seq) {
  auto it = slot_of_.find(seq);
  if (it == slot_of_.end()) return;
  Slot& slot = slots_[static_cast<size_t>(it->second)];
  KV_CHECK(slot.refs >= 1, "a mapped slot without references");
  if (--slot.refs == 0) free_.push_back(it->second);  // keeps its rows until handed out
  slot_of_.erase(it);
}

std::optional<int32_t> RefHybridCache::Pop() {
  if (free_.empty()) return std::nullopt;
  const int32_t slot = free_.back();
  free_.pop_back();
  return slot;
}

}  // namespace kvtwin::model
