// StackModel: the state-machine model of a layer stack for the rapidcheck properties. One
// model::RefCache and one pool of reference snapshots per layer, in the driver's pool order,
// so commands can pick slots and arguments that the lock-step driver will accept and that
// land near interesting boundaries. The model only steers generation and preconditions: the
// driver checks the production caches against its own references, so token hashes do not
// matter here (they are 0). Writes and speculations touch every layer, every other op its
// op.layer, exactly as LockstepDriver::Apply does. Single-threaded value type.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "model/ref_cache.h"
#include "sim/ops.h"
#include "sim/stack.h"
#include "sim/synthetic.h"

namespace kvtwin::sim::prop {

struct LayerModel {
  model::RefCache ref;
  std::vector<model::RefSnap> pool;  // non-null reference snapshots, driver pool order
};

struct StackModel {
  std::vector<LayerModel> layers;
  // The window draft counts are chosen around when the stack has no rotating layer.
  int64_t fallback_window = 4;

  int32_t num_layers() const { return static_cast<int32_t>(layers.size()); }
  LayerModel& at(int32_t layer) { return layers[static_cast<size_t>(layer)]; }
  const LayerModel& at(int32_t layer) const { return layers[static_cast<size_t>(layer)]; }
  const model::RefSnap& snap(int32_t layer, int32_t slot) const {
    return at(layer).pool[static_cast<size_t>(slot)];
  }
};

inline StackModel MakeStackModel(const StackConfig& config, int64_t fallback_window) {
  StackModel m;
  m.fallback_window = fallback_window;
  for (const LayerSpec& spec : config.layers) {
    m.layers.push_back({spec.kind == CacheKind::kFullKv     ? model::RefCache::Kv()
                        : spec.kind == CacheKind::kRotating ? model::RefCache::Rotating(spec.window)
                                                            : model::RefCache::Recurrent(),
                        {}});
  }
  return m;
}

// LockstepDriver::Valid, answered from the model (a disagreement is a test bug that the
// command's run() reports).
inline bool ValidFor(const StackModel& m, const Op& op) {
  if (op.kind == OpKind::kWrite || op.kind == OpKind::kSpeculate) {
    if (op.tokens.empty() || op.pad < 0 || op.pad > 64) return false;
    for (const LayerModel& l : m.layers) {
      if (l.ref.Offset() + static_cast<int64_t>(op.tokens.size()) > kMaxPosition) return false;
    }
    return true;
  }
  if (op.layer < 0 || op.layer >= m.num_layers()) return false;
  const auto n = static_cast<int32_t>(m.at(op.layer).pool.size());
  auto ok = [n](int32_t s, bool null_ok) { return (null_ok && s == -1) || (s >= 0 && s < n); };
  switch (op.kind) {
    case OpKind::kSnapshot:
      return op.value >= 0;
    case OpKind::kRestore:
    case OpKind::kSplit:
      return ok(op.slot, true);
    case OpKind::kClose:
      return ok(op.slot, false);
    case OpKind::kMerge: {
      if (!ok(op.slot, true) || !ok(op.slot2, true)) return false;
      if (op.slot == op.slot2 && op.slot != -1) return false;
      // Full KV merges need adjacent ranges (a precondition of KvCache::Merge).
      if (m.at(op.layer).ref.kind() != model::RefKind::kKv || op.slot < 0 || op.slot2 < 0) {
        return true;
      }
      return m.snap(op.layer, op.slot)->to == m.snap(op.layer, op.slot2)->from;
    }
    default:
      return true;
  }
}

inline void PushSnap(LayerModel& l, model::RefSnap s) {
  if (s) l.pool.push_back(std::move(s));
}

inline model::RefSnap TakeSlot(LayerModel& l, int32_t slot) {
  if (slot < 0) return std::nullopt;
  model::RefSnap s = std::move(l.pool[static_cast<size_t>(slot)]);
  l.pool.erase(l.pool.begin() + slot);
  return s;
}

inline model::TokenLog ModelTokens(const Op& op) {
  model::TokenLog t;
  for (int32_t id : op.tokens) t.push_back({id, 0});
  return t;
}

// One layer's share of a per-layer op (everything but writes and speculations).
inline void ApplyToLayer(LayerModel& l, const Op& op) {
  switch (op.kind) {
    case OpKind::kSnapshot:
      PushSnap(l, l.ref.Snapshot(op.value));
      break;
    case OpKind::kRestore: {
      const model::RefSnap* s = op.slot < 0 ? nullptr : &l.pool[static_cast<size_t>(op.slot)];
      (void)l.ref.Restore(s ? &**s : nullptr, op.value);
      break;
    }
    case OpKind::kMerge: {
      // The higher slot first, so the lower index stays valid (as the driver does).
      model::RefSnap p, c;
      if (op.slot > op.slot2) {
        p = TakeSlot(l, op.slot);
        c = TakeSlot(l, op.slot2);
      } else {
        c = TakeSlot(l, op.slot2);
        p = TakeSlot(l, op.slot);
      }
      PushSnap(l, l.ref.Merge(std::move(p), std::move(c)));
      break;
    }
    case OpKind::kSplit: {
      auto [a, b] = l.ref.Split(TakeSlot(l, op.slot), op.value);
      PushSnap(l, std::move(a));
      PushSnap(l, std::move(b));
      break;
    }
    case OpKind::kFree:
      l.ref.Free();
      break;
    case OpKind::kPrepare:
      (void)l.ref.PrepareSnapshots(op.offsets);
      break;
    case OpKind::kTake:
      for (auto& s : l.ref.TakeSnapshots()) PushSnap(l, std::move(s));
      break;
    case OpKind::kClose:
      TakeSlot(l, op.slot);
      break;
    case OpKind::kWrite:
    case OpKind::kSpeculate:
      break;  // stack-wide: ApplyToModel
  }
}

inline void ApplyToModel(StackModel& m, const Op& op) {
  if (op.kind == OpKind::kWrite) {
    for (LayerModel& l : m.layers) l.ref.Write(ModelTokens(op));
  } else if (op.kind == OpKind::kSpeculate) {
    // Current plus the accepted drafts; CommitSpeculation clamps out-of-range counts.
    if (op.isolated) return;
    if (op.abandon_after >= 0) {
      // Dropped without a commit: the layers its forward reached commit nothing.
      for (int32_t i = 0; i < op.abandon_after; ++i) {
        m.at(i).ref.CommitSpeculation(ModelTokens(op), 0);
      }
      return;
    }
    for (LayerModel& l : m.layers) l.ref.CommitSpeculation(ModelTokens(op), op.value + 1);
  } else {
    ApplyToLayer(m.at(op.layer), op);
  }
}

}  // namespace kvtwin::sim::prop
