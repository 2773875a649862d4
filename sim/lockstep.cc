#include "sim/lockstep.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <utility>

#include "sim/forward.h"
#include "src/core/check.h"
#include "src/kernels.h"
#include "src/recurrent_cache.h"
#include "src/rotating_cache.h"

namespace kvtwin::sim {
std::string Divergence::ToString() const {
  return fmt::format("divergence at step {} ({}), layer {}:\n  {}\n  expected: {}\n  actual:   {}",
                     step, op, layer, mismatch.what, mismatch.expected, mismatch.actual);
}

LockstepDriver::LockstepDriver(StackConfig config, uint64_t seed) : synth_(seed) {
  Reset(std::move(config), seed);
}

void LockstepDriver::Reset(StackConfig config, uint64_t seed) {
  config_ = std::move(config);
  const Status valid = config_.Validate();
  KV_CHECK(valid.ok(), valid.ToString());
  synth_ = SyntheticForward(seed);
  steps_ = 0;
  digest_ = 0;
  divergence_.reset();
  held_.clear();
  auto caches = BuildCaches(config_);
  // A smaller stack parks its surplus layers and a larger one takes them back, so a reused
  // driver keeps their oracles and buffers: a fuzz input's layer count changes often, and a
  // layer built anew is allocations its execution does not free.
  while (layers_.size() > caches.size()) {
    ClearLayer(layers_.back());
    spare_layers_.push_back(std::move(layers_.back()));
    layers_.pop_back();
  }
  while (layers_.size() < caches.size()) {
    if (spare_layers_.empty()) {
      layers_.emplace_back();
    } else {
      layers_.push_back(std::move(spare_layers_.back()));
      spare_layers_.pop_back();
    }
  }
  for (size_t i = 0; i < caches.size(); ++i) {
    const LayerSpec& spec = config_.layers[i];
    const auto index = static_cast<int32_t>(i);
    Layer& layer = layers_[i];
    layer.cache = std::move(caches[i]);
    layer.ref = spec.kind == CacheKind::kFullKv     ? model::RefCache::Kv()
                : spec.kind == CacheKind::kRotating ? model::RefCache::Rotating(spec.window)
                                                    : model::RefCache::Recurrent();
    if (layer.oracle) {
      layer.oracle->Reset(config_, index);
    } else {
      layer.oracle = std::make_unique<LayerOracle>(synth_, config_, index);
      layer.oracle->set_shape_run_counts(run_counts_);
    }
    layer.pool.clear();
    layer.conv_weights = {};
    layer.gdn_params = {};
    if (spec.kind == CacheKind::kRecurrent) {
      layer.conv_weights = synth_.ConvParams(index, config_.dims.recurrent);
      layer.gdn_params = synth_.GdnParamsFor(index, config_.dims.recurrent);
    }
  }
}

void LockstepDriver::set_shape_run_counts(ShapeRunCounts* counts) {
  run_counts_ = counts;
  for (std::vector<Layer>* layers : {&layers_, &spare_layers_}) {
    for (Layer& layer : *layers) layer.oracle->set_shape_run_counts(counts);
  }
}

int64_t LockstepDriver::attention_checks() const {
  int64_t n = 0;
  for (const Layer& layer : layers_) n += layer.oracle->attention_checks();
  return n;
}

void LockstepDriver::ClearLayer(Layer& layer) {
  layer.cache.reset();
  layer.ref = model::RefCache::Kv();
  layer.pool.clear();
  layer.conv_weights = {};
  layer.gdn_params = {};
}

void LockstepDriver::Clear() {
  for (Layer& layer : layers_) ClearLayer(layer);
  divergence_.reset();
}

int32_t LockstepDriver::pool_size(int32_t layer) const {
  return static_cast<int32_t>(layers_[static_cast<size_t>(layer)].pool.size());
}

const model::RefSnap& LockstepDriver::pool_ref(int32_t layer, int32_t slot) const {
  return layers_[static_cast<size_t>(layer)].pool[static_cast<size_t>(slot)].ref;
}

bool LockstepDriver::Valid(const Op& op) const {
  if (op.kind == OpKind::kWrite || op.kind == OpKind::kSpeculate) {
    // What the trace reader accepts, so every valid op can be written and read back: a
    // speculation forwards the current token and at least one draft, and a relaxed mask's
    // rectangle is non-negative and ordered; a write of padding alone (no tokens) runs on
    // recurrent layers only (attention caches advance by every row they are given).
    const size_t min_tokens = op.kind == OpKind::kSpeculate ? 2 : 1;
    if (op.pad < 0 || op.pad > 64) return false;
    if (op.tokens.size() < min_tokens) {
      const bool padding_alone = op.kind == OpKind::kWrite && op.tokens.empty() && op.pad > 0;
      if (!padding_alone || !config_.TakesPaddingAlone()) return false;
    }
    if (op.abandon_after < -1 || op.abandon_after > num_layers()) return false;
    if (op.kind == OpKind::kWrite && op.abandon_after != -1) return false;
    if ((HasRect(op.mask) && !op.rect.Valid()) || (HasBlockRect(op.mask) && !op.block.Valid())) {
      return false;
    }
    for (const Layer& l : layers_) {
      if (l.ref.Offset() + static_cast<int64_t>(op.tokens.size()) > kMaxPosition) return false;
    }
    return true;
  }
  if (op.layer < 0 || op.layer >= num_layers()) return false;
  const int32_t n = pool_size(op.layer);
  auto slot_ok = [n](int32_t s, bool allow_null) {
    return (allow_null && s == -1) || (s >= 0 && s < n);
  };
  switch (op.kind) {
    case OpKind::kSnapshot:
      return op.value >= 0;
    case OpKind::kRestore:
      return slot_ok(op.slot, true);
    case OpKind::kSplit:
      return slot_ok(op.slot, true);
    case OpKind::kClose:
      return slot_ok(op.slot, false);
    case OpKind::kMerge: {
      if (!slot_ok(op.slot, true) || !slot_ok(op.slot2, true)) return false;
      if (op.slot == op.slot2 && op.slot != -1) return false;
      // Full KV merges need adjacent ranges (a precondition of KvCache::Merge).
      if (config_.layers[static_cast<size_t>(op.layer)].kind != CacheKind::kFullKv) return true;
      if (op.slot < 0 || op.slot2 < 0) return true;
      const auto& p = pool_ref(op.layer, op.slot);
      const auto& c = pool_ref(op.layer, op.slot2);
      return p->to == c->from;
    }
    default:
      return true;
  }
}

std::optional<Divergence> LockstepDriver::Apply(const Op& op) {
  KV_CHECK(!divergence_.has_value(), "the driver already diverged");
  KV_CHECK(Valid(op), "invalid op: " + op.ToString());
  ++steps_;
  Fold(static_cast<uint64_t>(op.kind));
  if (op.kind == OpKind::kSpeculate) {
    int32_t at = -1;
    if (Check c = Speculate(op, &at)) {
      divergence_ = Divergence{steps_ - 1, at, op.ToString(), *c};
      return divergence_;
    }
  }
  for (int32_t i = 0; i < num_layers(); ++i) {
    if (op.kind == OpKind::kSpeculate) break;
    if (op.kind != OpKind::kWrite && i != op.layer) continue;
    Check c = ApplyToLayer(op, layers_[static_cast<size_t>(i)], i);
    if (c) {
      divergence_ = Divergence{steps_ - 1, i, op.ToString(), *c};
      return divergence_;
    }
  }
  for (int32_t i = 0; i < num_layers(); ++i) {
    Layer& layer = layers_[static_cast<size_t>(i)];
    if (Check c = CheckLayer(layer, i)) {
      divergence_ = Divergence{steps_ - 1, i, op.ToString(), *c};
      return divergence_;
    }
    FoldLayer(layer);
  }
  int32_t at = -1;
  if (Check c = CheckHeld(&at)) {
    divergence_ = Divergence{steps_ - 1, at, op.ToString(), *c};
    return divergence_;
  }
  return std::nullopt;
}

namespace {

// Spec §2.2: a restore installs a copy of the snapshot's buffer, slot for slot, with
// idx := snap.idx (a clamp to a lower target: idx := target), and a live rewind leaves the
// buffer with idx := target. The live checks read the window through the cursor, so a
// restore that lays the same window out another way (rotated into logical order with the
// cursor at W, say) passes them, and so does every later write, which lands where that
// cursor says; only the layout and the cursor themselves show it.
Check CheckRingRestore(const RotatingCache& cache, const CacheSnapshot* snap, int64_t target,
                       int64_t before) {
  if (snap == nullptr) {
    if (target == before || cache.ring_idx() == target) return std::nullopt;
    return Mismatch{"ring cursor after a live rewind (spec §2.2: idx := target)",
                    std::to_string(target), std::to_string(cache.ring_idx())};
  }
  const auto& s = static_cast<const RotatingSnapshot&>(*snap);
  const int64_t idx = target < s.to() ? target : s.idx();
  if (cache.ring_idx() != idx) {
    return Mismatch{
        "ring cursor after a restore (spec §2.2: idx := snap.idx, or the target "
        "when clamped)",
        std::to_string(idx), std::to_string(cache.ring_idx())};
  }
  const int64_t rows = s.k().rows();
  if (cache.buffer_rows() != rows || !SameBits(cache.keys(), 0, s.k(), 0, rows) ||
      !SameBits(cache.values(), 0, s.v(), 0, rows)) {
    return Mismatch{
        "window buffer after a restore (spec §2.2: a copy of the snapshot's, slot "
        "for slot)",
        fmt::format("{} rows as the snapshot holds them", rows),
        fmt::format("{} rows, not bit-identical", cache.buffer_rows())};
  }
  return std::nullopt;
}

}  // namespace

Check LockstepDriver::ApplyToLayer(const Op& op, Layer& layer, int32_t index) {
  auto take_entry = [&layer](int32_t slot) {
    if (slot < 0) return PoolEntry{};
    PoolEntry e = std::move(layer.pool[static_cast<size_t>(slot)]);
    layer.pool.erase(layer.pool.begin() + slot);
    return e;
  };
  switch (op.kind) {
    case OpKind::kWrite:
      return Write(op, layer, index);
    case OpKind::kSnapshot:
      return AddToPool(layer, layer.cache->Snapshot(op.value), layer.ref.Snapshot(op.value),
                       "Snapshot result");
    case OpKind::kRestore: {
      const PoolEntry* e = op.slot < 0 ? nullptr : &layer.pool[static_cast<size_t>(op.slot)];
      const int64_t before = layer.cache->Offset();
      const bool actual = layer.cache->Restore(e ? e->prod.get() : nullptr, op.value);
      const bool expected = layer.ref.Restore(e && e->ref ? &*e->ref : nullptr, op.value);
      Fold(actual);
      if (actual != expected) {
        return Mismatch{"Restore outcome", expected ? "true" : "false", actual ? "true" : "false"};
      }
      if (!actual || layer.cache->kind() != CacheKind::kRotating) return std::nullopt;
      return CheckRingRestore(static_cast<const RotatingCache&>(*layer.cache),
                              e ? e->prod.get() : nullptr, op.value, before);
    }
    case OpKind::kMerge: {
      // Take the higher slot first so the lower index stays valid.
      PoolEntry first, second;
      if (op.slot > op.slot2) {
        first = take_entry(op.slot);
        second = take_entry(op.slot2);
      } else {
        second = take_entry(op.slot2);
        first = take_entry(op.slot);
      }
      SnapshotPtr prod = layer.cache->Merge(std::move(first.prod), std::move(second.prod));
      model::RefSnap ref = layer.ref.Merge(std::move(first.ref), std::move(second.ref));
      return AddToPool(layer, std::move(prod), std::move(ref), "Merge result");
    }
    case OpKind::kSplit: {
      PoolEntry e = take_entry(op.slot);
      auto [p, c] = layer.cache->Split(std::move(e.prod), op.value);
      auto [rp, rc] = layer.ref.Split(std::move(e.ref), op.value);
      if (Check m = AddToPool(layer, std::move(p), std::move(rp), "Split parent half")) return m;
      return AddToPool(layer, std::move(c), std::move(rc), "Split child half");
    }
    case OpKind::kFree:
      layer.cache->Free();
      layer.ref.Free();
      // One Free in two, by the step, so replays and shrinks make the same calls.
      if (layer.cache->kind() == CacheKind::kRecurrent && steps_ % 2 == 0) {
        return ProbeReadAlone(layer);
      }
      return std::nullopt;
    case OpKind::kPrepare: {
      const Status actual = layer.cache->PrepareSnapshots(op.offsets);
      const Status expected = layer.ref.PrepareSnapshots(op.offsets);
      Fold(static_cast<uint64_t>(actual.code()));
      if (actual.code() != expected.code()) {
        return Mismatch{"PrepareSnapshots outcome", expected.ToString(), actual.ToString()};
      }
      return std::nullopt;
    }
    case OpKind::kTake:
      return Take(layer);
    case OpKind::kClose:
      take_entry(op.slot);
      return std::nullopt;
    case OpKind::kSpeculate:
      break;  // spans every layer: Apply runs it through Speculate
  }
  return std::nullopt;
}

// Spec §2.3: Get creates the zero state when none exists, so a forward dropped between a
// freed layer's Get and its Put (an error or a cancellation mid-graph) leaves state at
// offset 0 with nothing written: it exists, has its LiveBytes and a non-null Snapshot. Every
// driver's Get otherwise comes with its Put, where a Get that left the state unmarked until
// Put (mutant 307) showed in no comparison. The probe frees the layer again, which leaves it
// as the op's Free did, so the pools, later outcomes and a recorded trace's replay are the
// same with or without it.
Check LockstepDriver::ProbeReadAlone(Layer& layer) {
  static_cast<RecurrentCache&>(*layer.cache).Get(config_.dtype);
  layer.ref.ReadState();
  Check c = layer.oracle->CheckLive(*layer.cache, layer.ref);
  if (!c) {
    const SnapshotPtr snap = layer.cache->Snapshot(0);
    c = layer.oracle->CheckSnapshot(snap.get(), layer.ref.Snapshot(0));
  }
  layer.cache->Free();
  layer.ref.Free();
  if (c) c->what = "after a Free, a Get without its Put: " + c->what;
  return c;
}

Check LockstepDriver::Take(Layer& layer) {
  std::vector<SnapshotPtr> actual = layer.cache->TakeSnapshots();
  std::vector<model::RefSnap> expected = layer.ref.TakeSnapshots();
  Fold(actual.size());
  if (actual.size() != expected.size()) {
    return Mismatch{"TakeSnapshots entries", std::to_string(expected.size()),
                    std::to_string(actual.size())};
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const std::string what = fmt::format("TakeSnapshots entry {}", i);
    if (Check m = AddToPool(layer, std::move(actual[i]), std::move(expected[i]), what.c_str())) {
      return m;
    }
  }
  return std::nullopt;
}

Check LockstepDriver::AddToPool(Layer& layer, SnapshotPtr prod, model::RefSnap ref,
                                const char* what) {
  Fold(prod != nullptr);
  if (Check m = layer.oracle->CheckSnapshot(prod.get(), ref)) {
    m->what = std::string(what) + ": " + m->what;
    return m;
  }
  if (prod != nullptr) layer.pool.push_back(PoolEntry{std::move(prod), std::move(ref)});
  return std::nullopt;
}

void LockstepDriver::TokensInto(const Layer& layer, const Op& op, model::TokenLog& out) const {
  out.clear();
  uint64_t h = layer.ref.log().empty() ? synth_.seed() : layer.ref.log().back().h;
  for (int32_t id : op.tokens) {
    h = NextHash(h, id);
    out.push_back(model::Token{id, h});
  }
}

Check LockstepDriver::Write(const Op& op, Layer& layer, int32_t index) {
  model::TokenLog& tokens = write_tokens_;
  TokensInto(layer, op, tokens);
  const int64_t start = layer.ref.Offset();
  const History history = Forward(*layer.cache, op, layer, index, tokens);
  layer.ref.Write(tokens);
  const auto n = static_cast<int64_t>(tokens.size());
  if (layer.cache->kind() == CacheKind::kRecurrent) {
    return layer.oracle->CheckRecurrentOutputs(scratch_.kernels.conv.out, scratch_.kernels.scan.y,
                                               layer.ref.log(), start, n);
  }
  if (Check c = layer.oracle->CheckHistory(history, layer.ref.log(), start, n, op)) return c;
  Hold(index, "Update", history);
  return std::nullopt;
}

History LockstepDriver::Forward(LayerCache& target, const Op& op, const Layer& layer, int32_t index,
                                std::span<const model::Token> tokens, int64_t skip) {
  const History history =
      ForwardSynthetic(target, config_, synth_, index, layer.ref.Offset() + skip, tokens,
                       &layer.conv_weights, &layer.gdn_params, op.pad, op.segmented, &scratch_);
  Fold(static_cast<uint64_t>(history.length));
  return history;
}

Check LockstepDriver::CheckLayer(Layer& layer, int32_t index) {
  if (Check m = layer.oracle->CheckLive(*layer.cache, layer.ref)) return m;
  if (layer.cache->kind() != CacheKind::kRecurrent) {
    const History view = static_cast<const AttentionCache&>(*layer.cache).View();
    if (Check m = layer.oracle->CheckView(view, layer.ref.log())) return m;
    Hold(index, "View", view);
  }
  for (size_t i = 0; i < layer.pool.size(); ++i) {
    const PoolEntry& e = layer.pool[i];
    if (Check m = layer.oracle->CheckSnapshot(e.prod.get(), e.ref)) {
      m->what = fmt::format("held snapshot #{}: {}", i, m->what);
      return m;
    }
  }
  return std::nullopt;
}

uint64_t HashHistory(const History& h) {
  uint64_t hash = XXH3_64bits(&h.length, sizeof(h.length));
  for (const Tensor* t : {h.k, h.v}) {
    if (t == nullptr || h.length == 0) continue;
    // A buffer rebuilt shorter behind the History: its rows are gone, which is a change
    // (reading them would leave the tensor).
    if (t->rows() < h.length) return ~XXH3_64bits_withSeed(&h.length, sizeof(h.length), hash);
    const TensorView rows = TensorView(*t).Rows(0, h.length);
    hash = XXH3_64bits_withSeed(rows.data(), static_cast<size_t>(rows.Bytes()), hash);
  }
  const int64_t applier[] = {h.has_applier ? 1 : 0, h.applier.key_len, h.applier.query_len,
                             h.applier.window, h.applier.ring_idx};
  return XXH3_64bits_withSeed(applier, sizeof(applier), hash);
}

void LockstepDriver::Hold(int32_t index, const char* what, const History& history) {
  if (history.k == nullptr) return;
  held_.push_back(HeldHistory{index, what, history, HashHistory(history)});
}

Check LockstepDriver::CheckHeld(int32_t* layer) {
  Check c;
  for (const HeldHistory& held : held_) {
    if (HashHistory(held.history) == held.hash) continue;
    *layer = held.layer;
    c = Mismatch{fmt::format("the {}() History of layer {} changed before that layer was next "
                             "mutated (src/cache.h: its rows stay valid until then), after the "
                             "later layers' calls and the checks' View()",
                             held.what, held.layer),
                 fmt::format("rows hash {:016x}", held.hash),
                 fmt::format("rows hash {:016x}", HashHistory(held.history))};
    break;
  }
  held_.clear();
  return c;
}

void LockstepDriver::Fold(uint64_t value) {
  digest_ = XXH3_64bits_withSeed(&value, sizeof(value), digest_);
}

void LockstepDriver::FoldLayer(const Layer& layer) {
  Fold(static_cast<uint64_t>(layer.cache->Offset()));
  Fold(layer.pool.size());
  if (layer.cache->kind() == CacheKind::kRecurrent) {
    const auto& rec = static_cast<const RecurrentCache&>(*layer.cache);
    if (!rec.HasState()) return;
    const MatF& delta = rec.delta();
    digest_ = XXH3_64bits_withSeed(delta.data(), static_cast<size_t>(delta.size()) * sizeof(float),
                                   digest_);
  } else if (layer.cache->kind() == CacheKind::kRotating) {
    Fold(static_cast<uint64_t>(static_cast<const RotatingCache&>(*layer.cache).ring_idx()));
  }
}

}  // namespace kvtwin::sim
