// HybridCache: the original LFM2 hybrid cache (spec §2.9.1, historical ollama `01cf7445f`,
// model/models/lfm2/cache.go). Attention layers use an embedded multi-sequence CausalCache
// (spec §2.8); every KV operation delegates to it first. Short-conv layers keep a conv
// state of d_conv x hidden values per sequence, stored per layer as a buffer of max_seqs
// rows (one row per slot, the d_conv x hidden state flattened; the transpose of Go's
// [d_conv·hidden, max_seqs] layout, same semantics) in the cache dtype. A buffer is
// allocated lazily, zero-filled, on the layer's first ConvState / UpdateConvState.
//
// Sequences reach conv rows through slots with reference counts. A slot is free (on the
// free list, a LIFO stack that first hands out 0, then 1, ...) or referenced by the
// sequences mapped to it; CopyPrefix makes the destination share the source's slot, and
// the first ConvState of a forward gives every current sequence whose slot is shared a
// private copy (copy-on-write). Invariants (KV_CHECKed where they are relied on): every
// mapped sequence's slot has a refcount >= 1, equal to the number of sequences mapped to
// it; a free slot has refcount 0.
//
// What is not transactional, kept as in Go: StartForward updates the KV side before it
// can refuse a batch whose sequences contribute unequal token counts (Unsupported), and a
// "cache full" during slot allocation leaves the slots allocated so far mapped but not
// zeroed; a copy-on-write that runs out of slots keeps the remaps done before the failure.
// The failure is remembered and returned by every ConvState of that forward.
//
// Two documented weaknesses of this version (spec §8 quirk 7), reproduced on purpose;
// the reference model flags both, so a run that depends on them reports a divergence:
//   1. CopyPrefix(src, dst, len) shares src's *current* conv state whatever `len` is;
//      it is only right when len equals src's length.
//   2. Remove(seq, begin, end) releases the sequence's conv state for *any* range, while
//      the KV side keeps the rest, so the next forward of that sequence starts from a
//      zero conv state instead of the state after position begin − 1.
//
// Errors are Status values: ResourceExhausted "cache full", Unsupported for unequal
// per-sequence token counts, and whatever the KV side returns. Single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "src/causal_cache.h"
#include "src/core/status.h"
#include "src/core/tensor.h"

namespace kvtwin {

struct HybridConfig {
  // The attention side. Its max_seqs is also the slot count, and its dtype is the cache
  // dtype of the conv buffers too (Go's Init passes one dtype to both).
  CausalConfig kv;
  int32_t num_conv_layers = 1;
  int64_t d_conv = 2;  // L_cache − 1: the conv tail rows carried between forwards
  int64_t hidden = 4;  // conv channels
  int64_t conv_cols() const { return d_conv * hidden; }
};

class HybridCache {
 public:
  // Errors: InvalidArgument for a negative layer count or non-positive d_conv / hidden,
  // and whatever CausalCache::Create refuses.
  static Result<HybridCache> Create(HybridConfig config);

  // KV StartForward first (its error is returned unchanged), then the conv side: the
  // current sequences are the batch's unique sequences in first-appearance order, each of
  // which must contribute seq_tokens = batch / num_seqs tokens (else Unsupported, with
  // the KV side already updated). Reserving: fake slots 0..num_seqs−1, nothing mapped
  // and (a choice following Go's stated intent) no copy-on-write later in the forward.
  // Otherwise every unmapped sequence gets a new slot with refcount 1 (ResourceExhausted
  // "cache full" if none is free), and every newly allocated slot is zeroed in every
  // allocated layer buffer. Starts a new forward: copy-on-write pending, no error.
  Status StartForward(std::span<const BatchToken> batch, bool reserve = false);
  Status Put(const Tensor& k, const Tensor& v) { return kv_.Put(k, v); }
  CausalCache::View Get() const { return kv_.Get(); }

  // The current sequences' conv states, [num_seqs rows, d_conv·hidden cols] in the cache
  // dtype; row i is current sequence i's slot row. The first call of a forward runs
  // copy-on-write for every current sequence whose slot is shared (refcount > 1): a new
  // slot, the old one decremented, the sequence remapped, the old slot's row copied in
  // every allocated layer buffer. If that runs out of slots, this and every later call of
  // the forward return ResourceExhausted "cache full".
  // REQUIRES: 0 <= layer < num_conv_layers; the last StartForward succeeded.
  Result<Tensor> ConvState(int32_t layer);
  // Stores `rows` (any dtype; values rounded to the cache dtype) as the current sequences'
  // conv states. REQUIRES: 0 <= layer < num_conv_layers; rows is [num_seqs, d_conv·hidden];
  // a ConvState of this forward succeeded (before it, the write could land in a slot that
  // another sequence still shares).
  void UpdateConvState(int32_t layer, const Tensor& rows);

  // KV CopyPrefix first (its error is returned before the slots change); then dst's slot
  // is released (decremented, freed at 0) and, if src has a slot, dst shares it (refcount
  // incremented) — whatever len is (weakness 1).
  Status CopyPrefix(int32_t src, int32_t dst, int64_t len);
  // KV Remove first; if it fails, its error is returned and the slot is kept (Go returns
  // before touching the slot), though the KV metadata may already have changed. On
  // success the sequence's slot is released and unmapped for any range (weakness 2).
  Status Remove(int32_t seq, int64_t begin, int64_t end);
  bool CanResume(int32_t seq, int64_t pos) const { return kv_.CanResume(seq, pos); }

  // The raw allocator (Go's allocSlot / freeSlot). Neither touches refcounts or the
  // sequence map; they are public so tests can reach states the sequence API cannot (a
  // full allocator, since mapped sequences never outnumber slots; out-of-range frees).
  // AllocSlot pops the free list's top, or returns ResourceExhausted "cache full".
  Result<int32_t> AllocSlot();
  // Pushes `slot`; a slot outside [0, max_seqs) is ignored.
  void FreeSlot(int32_t slot);

  // Read-only state for checkers.
  const HybridConfig& config() const { return config_; }
  const CausalCache& kv() const { return kv_; }
  CausalCache& mutable_kv() { return kv_; }  // SetCausal, set_shift
  std::optional<int32_t> slot_of(int32_t seq) const;
  int32_t ref_count(int32_t slot) const;  // REQUIRES: 0 <= slot < max_seqs
  // A copy of the free list; back() is handed out next.
  std::vector<int32_t> free_slots() const { return free_slots_; }
  // The current forward: its sequences (a copy, like Go's Seqs), their slots (fake ones
  // when reserving), and tokens per sequence. Empty / 0 before the first forward and after
  // a failed StartForward.
  std::vector<int32_t> seqs() const { return cur_seqs_; }
  std::vector<int32_t> slots() const { return cur_slots_; }
  int64_t num_seqs() const { return static_cast<int64_t>(cur_seqs_.size()); }
  int64_t seq_tokens() const { return cur_seq_tokens_; }
  // Go's IsSupportedForBatch: the forward has sequences and tokens per sequence.
  bool supported_for_batch() const { return cur_seq_tokens_ > 0 && !cur_seqs_.empty(); }
  bool layer_allocated(int32_t layer) const;
  // The stored row of `slot` in `layer` as [1, d_conv·hidden]; zeros if the layer's buffer
  // is not allocated yet (which is what it would hold).
  Tensor SlotRow(int32_t layer, int32_t slot) const;

 private:
  HybridCache(HybridConfig config, CausalCache kv);

  int32_t max_slots() const { return config_.kv.max_seqs; }
  DType dtype() const { return config_.kv.dtype; }
  void ClearForward();
  // The current sequences, seq_tokens and slots of a batch the KV side accepted.
  Status DeriveForward(std::span<const BatchToken> batch, bool reserve);
  Status AssignSlots(bool reserve);
  // Decrements seq's slot (freeing it at 0) and unmaps seq; no-op if seq has no slot.
  void ReleaseSlot(int32_t seq);
  void ZeroSlots(std::span<const int32_t> slots);
  Status EnsureWritable();
  Tensor& Buffer(int32_t layer);  // allocates lazily
  void CheckForward(int32_t layer) const;

  HybridConfig config_;
  CausalCache kv_;

  std::map<int32_t, int32_t> slot_for_seq_;
  std::vector<int32_t> ref_count_;           // per slot
  std::vector<int32_t> free_slots_;          // stack: back() is next
  std::vector<std::optional<Tensor>> conv_;  // per layer: [max_seqs, d_conv·hidden]

  std::vector<int32_t> cur_seqs_;
  std::vector<int32_t> cur_slots_;
  int64_t cur_seq_tokens_ = 0;
  bool forward_ready_ = false;  // the last StartForward succeeded
  bool reserving_ = false;
  bool writable_ensured_ = false;  // copy-on-write already ran in this forward
  Status writable_error_;          // its failure, returned by every ConvState
};

}  // namespace kvtwin
