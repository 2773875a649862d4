#include "src/hybrid_cache.h"

#include <string>
#include <utility>

namespace kvtwin {

Result<HybridCache> HybridCache::Create(HybridConfig config) {
  if (config.num_conv_layers < 0) return InvalidArgument("negative conv layer count");
  if (config.d_conv <= 0 || config.hidden <= 0) {
    return InvalidArgument("conv state needs positive d_conv and hidden");
  }
  Result<CausalCache> kv = CausalCache::Create(config.kv);
  if (!kv.ok()) return kv.status();
  return HybridCache(std::move(config), std::move(kv).value());
}

HybridCache::HybridCache(HybridConfig config, CausalCache kv)
    : config_(std::move(config)), kv_(std::move(kv)) {
  const int32_t n = max_slots();
  KV_CHECK(n > 0, "the causal cache accepted a non-positive max_seqs");
  ref_count_.assign(static_cast<size_t>(n), 0);
  // Pushed from the highest index down so that the stack hands out 0 first (Go's Init).
  for (int32_t slot = n - 1; slot >= 0; --slot) free_slots_.push_back(slot);
  conv_.resize(static_cast<size_t>(config_.num_conv_layers));
}

Status HybridCache::StartForward(std::span<const BatchToken> batch, bool reserve) {
  // Whatever fails below, the previous forward is over: ConvState must not run on it.
  ClearForward();
  KV_RETURN_IF_ERROR(kv_.StartForward(batch, reserve));
  if (Status status = DeriveForward(batch, reserve); !status.ok()) {
    ClearForward();
    return status;
  }
  reserving_ = reserve;
  // A reserve forward maps nothing, so there is nothing to unshare: marking copy-on-write
  // as done keeps it from remapping real sequences (Go's reserve comment: "without
  // modifying permanent state"; its code left the flag of the previous forward).
  writable_ensured_ = reserve;
  writable_error_ = Status::Ok();
  forward_ready_ = true;
  return Status::Ok();
}

void HybridCache::ClearForward() {
  forward_ready_ = false;
  cur_seqs_.clear();
  cur_slots_.clear();
  cur_seq_tokens_ = 0;
}

Status HybridCache::DeriveForward(std::span<const BatchToken> batch, bool reserve) {
  // Short-conv sees the batch as a [seq_tokens, num_seqs] grid, so every sequence must
  // bring the same number of tokens.
  std::map<int32_t, int64_t> counts;
  for (const BatchToken& token : batch) {
    if (counts[token.seq]++ == 0) cur_seqs_.push_back(token.seq);
  }
  // The KV side has already refused an empty batch.
  KV_CHECK(!cur_seqs_.empty(), "hybrid forward of an empty batch");
  const int64_t want = static_cast<int64_t>(batch.size()) / num_seqs();
  for (int32_t seq : cur_seqs_) {
    if (counts[seq] != want) {
      return Unsupported("sequences of a batch contribute unequal token counts (seq " +
                         std::to_string(seq) + ": " + std::to_string(counts[seq]) + ", want " +
                         std::to_string(want) + ")");
    }
  }
  cur_seq_tokens_ = want;
  return AssignSlots(reserve);
}

Status HybridCache::AssignSlots(bool reserve) {
  const int64_t n = num_seqs();
  if (reserve) {
    if (n > max_slots()) return InvalidArgument("reserve batch has more sequences than slots");
    for (int32_t i = 0; i < static_cast<int32_t>(n); ++i) cur_slots_.push_back(i);
    return Status::Ok();
  }
  std::vector<int32_t> fresh;  // only these hold stale rows of earlier owners
  for (int32_t seq : cur_seqs_) {
    auto it = slot_for_seq_.find(seq);
    if (it == slot_for_seq_.end()) {
      // On "cache full" the slots taken so far stay mapped and unzeroed (Go returns here).
      Result<int32_t> slot = AllocSlot();
      if (!slot.ok()) return slot.status();
      it = slot_for_seq_.emplace(seq, *slot).first;
      ref_count_[static_cast<size_t>(*slot)] = 1;
      fresh.push_back(*slot);
    }
    cur_slots_.push_back(it->second);
  }
  ZeroSlots(fresh);
  return Status::Ok();
}

Result<int32_t> HybridCache::AllocSlot() {
  if (free_slots_.empty()) return ResourceExhausted("cache full");
  const int32_t slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void HybridCache::FreeSlot(int32_t slot) {
  if (slot < 0 || slot >= max_slots()) return;  // Go's bounds check: ignored, not fatal
  free_slots_.push_back(slot);
}

void HybridCache::ReleaseSlot(int32_t seq) {
  const auto it = slot_for_seq_.find(seq);
  if (it == slot_for_seq_.end()) return;
  int32_t& refs = ref_count_[static_cast<size_t>(it->second)];
  KV_CHECK(refs > 0, "a mapped slot has refcount " + std::to_string(refs));
  if (--refs == 0) FreeSlot(it->second);
  slot_for_seq_.erase(it);
}

void HybridCache::ZeroSlots(std::span<const int32_t> slots) {
  if (slots.empty()) return;
  const Tensor zero(dtype(), 1, config_.conv_cols());
  for (std::optional<Tensor>& buffer : conv_) {
    if (!buffer) continue;  // an unallocated layer is all zeros already
    for (int32_t slot : slots) buffer->CopyRows(slot, zero, 0, 1);
  }
}

Status HybridCache::EnsureWritable() {
  for (size_t i = 0; i < cur_seqs_.size(); ++i) {
    const int32_t old_slot = cur_slots_[i];
    if (ref_count_[static_cast<size_t>(old_slot)] <= 1) continue;
    // Remaps done for earlier sequences stay if this allocation fails (as in Go).
    Result<int32_t> fresh = AllocSlot();
    if (!fresh.ok()) return fresh.status();
    --ref_count_[static_cast<size_t>(old_slot)];
    ref_count_[static_cast<size_t>(*fresh)] = 1;
    slot_for_seq_[cur_seqs_[i]] = *fresh;
    cur_slots_[i] = *fresh;
    // Every allocated layer, not only the one asked for: the other layers' ConvState of
    // this forward will read the new slot too. A bit-exact copy (Go casts to f32 and back).
    for (std::optional<Tensor>& buffer : conv_) {
      if (buffer) buffer->CopyRows(*fresh, *buffer, old_slot, 1);
    }
  }
  return Status::Ok();
}

void HybridCache::CheckForward(int32_t layer) const {
  KV_CHECK(layer >= 0 && layer < config_.num_conv_layers,
           "conv layer " + std::to_string(layer) + " out of range");
  KV_CHECK(forward_ready_, "conv state used without a successful StartForward");
  KV_CHECK(cur_slots_.size() == cur_seqs_.size(), "one slot per current sequence");
  if (reserving_) return;
  for (size_t i = 0; i < cur_seqs_.size(); ++i) {
    const std::optional<int32_t> slot = slot_of(cur_seqs_[i]);
    KV_CHECK(slot == cur_slots_[i],
             "sequence " + std::to_string(cur_seqs_[i]) + " changed slot inside a forward");
  }
}

Tensor& HybridCache::Buffer(int32_t layer) {
  std::optional<Tensor>& buffer = conv_[static_cast<size_t>(layer)];
  if (!buffer) buffer.emplace(dtype(), static_cast<int64_t>(max_slots()), config_.conv_cols());
  return *buffer;
}

Result<Tensor> HybridCache::ConvState(int32_t layer) {
  CheckForward(layer);
  if (!writable_ensured_) {
    // Go runs EnsureWritable only when some current slot is shared; EnsureWritable skips
    // unshared ones itself, so calling it unconditionally is the same.
    writable_error_ = EnsureWritable();
    writable_ensured_ = true;
  }
  if (!writable_error_.ok()) return writable_error_;
  const Tensor& buffer = Buffer(layer);
  Tensor out(dtype(), num_seqs(), config_.conv_cols());
  for (size_t i = 0; i < cur_slots_.size(); ++i) {
    out.CopyRows(static_cast<int64_t>(i), buffer, cur_slots_[i], 1);
  }
  return out;
}

void HybridCache::UpdateConvState(int32_t layer, const Tensor& rows) {
  CheckForward(layer);
  KV_CHECK(writable_ensured_ && writable_error_.ok(),
           "UpdateConvState before a successful ConvState of this forward");
  KV_CHECK(rows.rows() == num_seqs() && rows.cols() == config_.conv_cols(),
           "conv state rows " + rows.ShapeString() + " do not match the forward");
  // Go casts to f32 before SetRows into the cache dtype: the stored value is the f32 value
  // rounded once to the cache dtype.
  const Tensor stored = Tensor::FromFloat(dtype(), rows.ToFloat());
  Tensor& buffer = Buffer(layer);
  for (size_t i = 0; i < cur_slots_.size(); ++i) {
    buffer.CopyRows(cur_slots_[i], stored, static_cast<int64_t>(i), 1);
  }
}

Status HybridCache::CopyPrefix(int32_t src, int32_t dst, int64_t len) {
  KV_RETURN_IF_ERROR(kv_.CopyPrefix(src, dst, len));
  // Released before src is looked up: with src == dst the sequence ends up unmapped, the
  // same as the KV side, which drops dst's cells before copying src's.
  ReleaseSlot(dst);
  const auto it = slot_for_seq_.find(src);
  if (it == slot_for_seq_.end()) return Status::Ok();  // dst gets a fresh slot on use
  slot_for_seq_[dst] = it->second;
  ++ref_count_[static_cast<size_t>(it->second)];
  return Status::Ok();
}

Status HybridCache::Remove(int32_t seq, int64_t begin, int64_t end) {
  KV_RETURN_IF_ERROR(kv_.Remove(seq, begin, end));
  // The conv state after any position depends on every earlier one, and this version
  // keeps no checkpoints: drop it (weakness 2).
  ReleaseSlot(seq);
  return Status::Ok();
}

std::optional<int32_t> HybridCache::slot_of(int32_t seq) const {
  const auto it = slot_for_seq_.find(seq);
  if (it == slot_for_seq_.end()) return std::nullopt;
  return it->second;
}

int32_t HybridCache::ref_count(int32_t slot) const {
  KV_CHECK(slot >= 0 && slot < max_slots(), "slot " + std::to_string(slot) + " out of range");
  return ref_count_[static_cast<size_t>(slot)];
}

bool HybridCache::layer_allocated(int32_t layer) const {
  KV_CHECK(layer >= 0 && layer < config_.num_conv_layers, "conv layer out of range");
  return conv_[static_cast<size_t>(layer)].has_value();
}

Tensor HybridCache::SlotRow(int32_t layer, int32_t slot) const {
  KV_CHECK(slot >= 0 && slot < max_slots(), "slot " + std::to_string(slot) + " out of range");
  if (!layer_allocated(layer)) return Tensor(dtype(), 1, config_.conv_cols());
  return conv_[static_cast<size_t>(layer)]->Rows(slot, 1);
}

}  // namespace kvtwin
