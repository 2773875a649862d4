// RefHybridCache: the original LFM2 hybrid cache (spec §2.9.1) over RefMultiSeqCache. A
// production slot is a group of sequences with one conv state; its refcount is the group's
// size. The ideal conv state is recomputed from the KV history on every query; the
// as-specified one is carried per group exactly as the original moves it (shift in on a
// forward, shared by CopyPrefix, dropped by Remove), so the two meet only while the
// original's shortcuts happen to be harmless.
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
}

Status RefHybridCache::Forward(const MsBatch& batch) {
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
  for (size_t k = 0; k < batch.size(); ++k) {
    KV_CHECK(batch[k].seq == order[k / per_seq],
             "the hybrid's batch must list each sequence's tokens contiguously");
  }
  KV_RETURN_IF_ERROR(AcquireSlots(order));
  ShiftIn(batch, order);
  kv_.Put();
  return Status::Ok();
}

Status RefHybridCache::AcquireSlots(const std::vector<SeqId>& order) {
  const int64_t slots = kv_.config().max_seqs;
  // Zeroing and copy-on-write rows are written by the forward's own graph: when the forward
  // fails, every slot this forward took keeps whatever rows it held before.
  std::vector<int64_t> taken;
  auto fail = [&](const char* what) {
    for (int64_t group : taken) groups_.at(group).state.reset();
    return ResourceExhausted(std::string(what) + ": all " + std::to_string(slots) +
                             " conv slots live");
  };
  for (SeqId seq : order) {
    if (group_of_.contains(seq)) continue;
    if (LiveSlots() >= slots) return fail("cache full allocating a slot");
    taken.push_back(NewGroup(seq, ZeroRows()));
  }
  // Copy-on-write at the forward's first ConvState, in batch order: a sequence whose
  // partners have all moved out owns the slot again and keeps it.
  for (SeqId seq : order) {
    const int64_t shared = group_of_.at(seq);
    if (groups_.at(shared).seqs.size() <= 1) continue;
    if (LiveSlots() >= slots) return fail("cache full in copy-on-write");
    std::optional<ConvRows> copy = groups_.at(shared).state;
    groups_.at(shared).seqs.erase(seq);
    taken.push_back(NewGroup(seq, std::move(copy)));
  }
  return Status::Ok();
}

void RefHybridCache::ShiftIn(const MsBatch& batch, const std::vector<SeqId>& order) {
  for (SeqId seq : order) {
    std::optional<ConvRows>& state = groups_.at(group_of_.at(seq)).state;
    if (!state.has_value()) continue;  // stale rows stay stale
    for (const MsToken& t : batch) {
      if (t.seq != seq) continue;
      ConvRow row = inputs_(t.pos, t.token);
      KV_CHECK(static_cast<int64_t>(row.size()) == width_, "conv input of the wrong width");
      state->erase(state->begin());
      state->push_back(std::move(row));
    }
  }
}

void RefHybridCache::CopyPrefix(SeqId src, SeqId dst, int64_t len) {
  kv_.CopyPrefix(src, dst, len);
  Release(dst);
  // src's current state, whatever len is (quirk 7); none when src has no slot (also when
  // src == dst: its slot was just released).
  auto it = group_of_.find(src);
  if (it == group_of_.end()) return;
  groups_.at(it->second).seqs.insert(dst);
  group_of_[dst] = it->second;
}

Status RefHybridCache::Remove(SeqId seq, int64_t begin, int64_t end) {
  KV_RETURN_IF_ERROR(kv_.Remove(seq, begin, end));
  Release(seq);  // any range: the next forward starts from zero rows
  return Status::Ok();
}

std::optional<ConvRows> RefHybridCache::ExpectedConv(SeqId seq, ConvMode mode) const {
  if (mode == ConvMode::kIdeal) return IdealConv(seq);
  auto it = group_of_.find(seq);
  if (it == group_of_.end()) return ZeroRows();
  return groups_.at(it->second).state;
}

bool RefHybridCache::ConvDivergesFromIdeal(SeqId seq) const {
  const std::optional<ConvRows> specified = ExpectedConv(seq, ConvMode::kAsSpecified);
  return !specified.has_value() || *specified != IdealConv(seq);
}

std::vector<std::vector<SeqId>> RefHybridCache::SlotGroups() const {
  std::vector<std::vector<SeqId>> out;
  for (const auto& [id, group] : groups_) out.emplace_back(group.seqs.begin(), group.seqs.end());
  std::sort(out.begin(), out.end());
  return out;
}

ConvRows RefHybridCache::ZeroRows() const {
  return ConvRows(static_cast<size_t>(d_conv_), ConvRow(static_cast<size_t>(width_), 0.0f));
}

ConvRows RefHybridCache::IdealConv(SeqId seq) const {
  const std::vector<MsEntry> history = kv_.History(seq);
  ConvRows rows = ZeroRows();
  const size_t keep = std::min(history.size(), rows.size());
  // The newest `keep` entries fill the newest rows; older rows stay zero.
  for (size_t k = 0; k < keep; ++k) {
    const MsEntry& e = history[history.size() - keep + k];
    ConvRow row = inputs_(e.written_pos, e.token);
    KV_CHECK(static_cast<int64_t>(row.size()) == width_, "conv input of the wrong width");
    rows[rows.size() - keep + k] = std::move(row);
  }
  return rows;
}

void RefHybridCache::Release(SeqId seq) {
  auto it = group_of_.find(seq);
  if (it == group_of_.end()) return;
  Group& group = groups_.at(it->second);
  group.seqs.erase(seq);
  if (group.seqs.empty()) groups_.erase(it->second);
  group_of_.erase(it);
}

int64_t RefHybridCache::NewGroup(SeqId seq, std::optional<ConvRows> state) {
  const int64_t id = next_group_++;
  groups_.emplace(id, Group{{seq}, std::move(state)});
  group_of_[seq] = id;
  return id;
}

}  // namespace kvtwin::model
