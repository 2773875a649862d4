// Goal: every cache kind behaves like its reference under arbitrary operation sequences.
// Method: rapidcheck state machines (rc::state). The model is the reference itself
// (model::RefCache plus the pool of reference snapshots the driver holds); the system under
// test is a one-layer LockstepDriver, which applies each op to the production cache and to
// its own reference and checks offsets, contents, snapshot contents and outcomes after
// every step. Commands are writes of random length (with padding and mask forms), snapshots,
// restores to reachable and unreachable targets, merges, splits, frees, capture schedules
// (valid and malformed), takes and closes. Seeds and case counts are pinned through
// PinnedParams below (an RC_PARAMS set by the caller wins); a failure prints the shrunk
// command sequence.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <cstdlib>

#include "model/ref_cache.h"
#include "sim/lockstep.h"

namespace kvtwin {
// Lets rapidcheck print the dtype of a counterexample.
inline void showValue(DType dtype, std::ostream& os) { os << DTypeName(dtype); }
}  // namespace kvtwin

namespace kvtwin::sim {
namespace {

struct Model {
  model::RefCache ref;
  std::vector<model::RefSnap> pool;  // non-null reference snapshots, driver pool order
  int64_t window = 0;
};

void Push(Model& m, model::RefSnap s) {
  if (s) m.pool.push_back(std::move(s));
}

model::RefSnap TakeSlot(Model& m, int32_t slot) {
  if (slot < 0) return std::nullopt;
  model::RefSnap s = std::move(m.pool[static_cast<size_t>(slot)]);
  m.pool.erase(m.pool.begin() + slot);
  return s;
}

int32_t AnySlot(const Model& m) {
  return *rc::gen::inRange<int32_t>(0, static_cast<int32_t>(m.pool.size()));
}

Op GenWrite(const Model& m) {
  Op op;
  op.kind = OpKind::kWrite;
  const int64_t max_len = std::max<int64_t>(4, 2 * m.window + 3);
  op.tokens = *rc::gen::container<std::vector<int32_t>>(
      static_cast<size_t>(*rc::gen::inRange<int64_t>(1, max_len + 1)), rc::gen::inRange(0, 5));
  op.pad = *rc::gen::weightedElement<int64_t>({{4, 0}, {1, 1}, {1, 3}});
  op.segmented = *rc::gen::arbitrary<bool>();
  op.mask = *rc::gen::weightedElement<MaskForm>(
      {{6, MaskForm::kCausal}, {1, MaskForm::kZero}, {1, MaskForm::kRelax}});
  const int64_t start = m.ref.Offset();
  const auto n = static_cast<int64_t>(op.tokens.size());
  op.rect_q_lo = start + *rc::gen::inRange<int64_t>(0, n);
  op.rect_q_hi = op.rect_q_lo + *rc::gen::inRange<int64_t>(1, n + 1);
  op.rect_k_lo = std::max<int64_t>(0, start + *rc::gen::inRange<int64_t>(-3, n));
  op.rect_k_hi = op.rect_k_lo + *rc::gen::inRange<int64_t>(1, n + 4);
  return op;
}

int64_t GenTarget(const Model& m, int32_t slot) {
  const int64_t offset = m.ref.Offset();
  const int64_t anchor = slot >= 0 ? m.pool[static_cast<size_t>(slot)]->to : offset;
  return *rc::gen::oneOf(rc::gen::just(anchor), rc::gen::inRange<int64_t>(anchor - 2, anchor + 2),
                         rc::gen::inRange<int64_t>(-1, offset + 3));
}

Op GenOp(const Model& m) {
  Op op;
  op.layer = 0;
  const bool has = !m.pool.empty();
  op.kind = *rc::gen::weightedElement<OpKind>({{8, OpKind::kWrite},
                                               {3, OpKind::kSnapshot},
                                               {5, OpKind::kRestore},
                                               {has ? 2u : 0u, OpKind::kMerge},
                                               {has ? 2u : 0u, OpKind::kSplit},
                                               {1, OpKind::kFree},
                                               {2, OpKind::kPrepare},
                                               {2, OpKind::kTake},
                                               {has ? 1u : 0u, OpKind::kClose}});
  const int64_t offset = m.ref.Offset();
  switch (op.kind) {
    case OpKind::kWrite:
      return GenWrite(m);
    case OpKind::kSnapshot:
      op.value = *rc::gen::inRange<int64_t>(0, offset + 2);
      break;
    case OpKind::kRestore:
      op.slot = has && *rc::gen::arbitrary<bool>() ? AnySlot(m) : -1;
      op.value = GenTarget(m, op.slot);
      break;
    case OpKind::kMerge: {
      op.slot = AnySlot(m);
      op.slot2 = *rc::gen::oneOf(rc::gen::just(-1),
                                 rc::gen::inRange<int32_t>(0, static_cast<int32_t>(m.pool.size())));
      for (int32_t b = 0; b < static_cast<int32_t>(m.pool.size()); ++b) {  // prefer adjacency
        if (b != op.slot &&
            m.pool[static_cast<size_t>(op.slot)]->to == m.pool[static_cast<size_t>(b)]->from &&
            *rc::gen::arbitrary<bool>()) {
          op.slot2 = b;
        }
      }
      break;
    }
    case OpKind::kSplit: {
      op.slot = AnySlot(m);
      const auto& s = m.pool[static_cast<size_t>(op.slot)];
      op.value = *rc::gen::inRange<int64_t>(s->from - 1, s->to + 2);
      break;
    }
    case OpKind::kPrepare: {
      auto offs = *rc::gen::container<std::vector<int64_t>>(
          rc::gen::inRange<int64_t>(offset - 1, offset + 9));
      if (*rc::gen::weightedElement<bool>({{4, true}, {1, false}})) {
        std::sort(offs.begin(), offs.end());
        offs.erase(std::unique(offs.begin(), offs.end()), offs.end());
        offs.erase(std::remove(offs.begin(), offs.end(), offset - 1), offs.end());
      }
      op.offsets = offs;
      break;
    }
    case OpKind::kClose:
      op.slot = AnySlot(m);
      break;
    default:
      break;
  }
  return op;
}

struct OpCommand : rc::state::Command<Model, LockstepDriver> {
  Op op;

  explicit OpCommand(const Model& m) : op(GenOp(m)) {}

  void checkPreconditions(const Model& m) const override {
    const auto n = static_cast<int32_t>(m.pool.size());
    auto ok = [n](int32_t s, bool null_ok) { return (null_ok && s == -1) || (s >= 0 && s < n); };
    switch (op.kind) {
      case OpKind::kRestore:
      case OpKind::kSplit:
        RC_PRE(ok(op.slot, true));
        break;
      case OpKind::kClose:
        RC_PRE(ok(op.slot, false));
        break;
      case OpKind::kMerge: {
        RC_PRE(ok(op.slot, true) && ok(op.slot2, true) && (op.slot != op.slot2 || op.slot == -1));
        if (m.ref.kind() == model::RefKind::kKv && op.slot >= 0 && op.slot2 >= 0) {
          RC_PRE(m.pool[static_cast<size_t>(op.slot)]->to ==
                 m.pool[static_cast<size_t>(op.slot2)]->from);
        }
        break;
      }
      default:
        break;
    }
  }

  void apply(Model& m) const override {
    switch (op.kind) {
      case OpKind::kWrite: {
        model::TokenLog t;  // hashes do not matter to the model's bookkeeping
        for (int32_t id : op.tokens) t.push_back({id, 0});
        m.ref.Write(t);
        break;
      }
      case OpKind::kSnapshot:
        Push(m, m.ref.Snapshot(op.value));
        break;
      case OpKind::kRestore: {
        const model::RefSnap* s = op.slot < 0 ? nullptr : &m.pool[static_cast<size_t>(op.slot)];
        (void)m.ref.Restore(s ? &**s : nullptr, op.value);
        break;
      }
      case OpKind::kMerge: {
        model::RefSnap p, c;
        if (op.slot > op.slot2) {
          p = TakeSlot(m, op.slot);
          c = TakeSlot(m, op.slot2);
        } else {
          c = TakeSlot(m, op.slot2);
          p = TakeSlot(m, op.slot);
        }
        Push(m, m.ref.Merge(std::move(p), std::move(c)));
        break;
      }
      case OpKind::kSplit: {
        auto [a, b] = m.ref.Split(TakeSlot(m, op.slot), op.value);
        Push(m, std::move(a));
        Push(m, std::move(b));
        break;
      }
      case OpKind::kFree:
        m.ref.Free();
        break;
      case OpKind::kPrepare:
        (void)m.ref.PrepareSnapshots(op.offsets);
        break;
      case OpKind::kTake:
        for (auto& s : m.ref.TakeSnapshots()) Push(m, std::move(s));
        break;
      case OpKind::kClose:
        TakeSlot(m, op.slot);
        break;
      case OpKind::kSpeculate: {
        model::TokenLog t;
        for (int32_t id : op.tokens) t.push_back({id, 0});
        if (!op.isolated) m.ref.CommitSpeculation(t, op.value + 1);
        break;
      }
    }
  }

  void run(const Model&, LockstepDriver& sut) const override {
    RC_ASSERT(sut.Valid(op));
    if (auto d = sut.Apply(op)) RC_FAIL(d->ToString());
  }

  void show(std::ostream& os) const override { os << op.ToString(); }
};

// The default tier is deterministic: a pinned seed and 500 cases per property, set before
// rapidcheck reads its configuration on first use. An RC_PARAMS from the caller wins, so
// longer or reproducing campaigns need no rebuild.
const bool kPinnedParams = [] {
  return setenv("RC_PARAMS", "seed=20261121 max_success=500", /*overwrite=*/0) == 0;
}();

void CheckKind(CacheKind kind) {
  ASSERT_TRUE(kPinnedParams);
  const int64_t window = *rc::gen::element<int64_t>(1, 2, 3, 4, 8);
  const DType dtype = *rc::gen::element(DType::kFloat32, DType::kBFloat16);
  StackConfig config;
  config.preset = "single";
  config.dtype = dtype;
  config.layers = {LayerSpec{kind, kind == CacheKind::kRotating ? window : 0}};
  Model initial{kind == CacheKind::kFullKv     ? model::RefCache::Kv()
                : kind == CacheKind::kRotating ? model::RefCache::Rotating(window)
                                               : model::RefCache::Recurrent(),
                {},
                window};
  LockstepDriver sut(config, *rc::gen::arbitrary<uint64_t>());
  rc::state::check(initial, sut, rc::state::gen::execOneOfWithArgs<OpCommand>());
}

RC_GTEST_PROP(LayerStateMachine, FullKvCacheMatchesReference, ()) { CheckKind(CacheKind::kFullKv); }
RC_GTEST_PROP(LayerStateMachine, RotatingCacheMatchesReference, ()) {
  CheckKind(CacheKind::kRotating);
}
RC_GTEST_PROP(LayerStateMachine, RecurrentCacheMatchesReference, ()) {
  CheckKind(CacheKind::kRecurrent);
}

}  // namespace
}  // namespace kvtwin::sim
