// Generators of one lock-step Op for the stack state machines, steered by the StackModel.
// Why the shapes: a sliding window only shows its bugs past its boundaries, so write lengths
// and draft counts cluster around a window of the stack (W - 1, W, W + 1, up to 2W + 3) and
// writes are frequent enough that rings wrap; speculations commit mostly a real acceptance
// count but sometimes one the commit must clamp, sometimes nothing (isolated); snapshots,
// restores, merges and splits take their arguments from the per-layer pools so that most
// of them succeed, and a minority probe the refusals. Capture schedules stay active until a
// take on their layer, so speculations regularly run over scheduled offsets.
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "prop/stack_model.h"

namespace kvtwin::sim::prop {

// A rotating layer's window (each may have its own), else the model's fallback.
inline int64_t GenWindow(const StackModel& m) {
  std::vector<int64_t> windows;
  for (const LayerModel& l : m.layers) {
    if (l.ref.kind() == model::RefKind::kRotating) windows.push_back(l.ref.window());
  }
  if (windows.empty()) return m.fallback_window;
  return *rc::gen::elementOf(windows);
}

// Decode steps, lengths at the window boundary, and batches long enough to wrap a ring.
inline int64_t GenWriteLength(const StackModel& m) {
  const int64_t w = GenWindow(m);
  const int64_t max_len = std::max<int64_t>(4, 2 * w + 3);
  // Rarely (1 in 29) longer than the KV cache's 256-slot growth step (see
  // OpGenerator::WriteLength).
  return *rc::gen::weightedOneOf<int64_t>(
      {{16, rc::gen::inRange<int64_t>(1, max_len + 1)},
       {8, rc::gen::just<int64_t>(1)},
       {4, rc::gen::elementOf(std::vector<int64_t>{std::max<int64_t>(1, w - 1), w, w + 1})},
       {1, rc::gen::inRange<int64_t>(257, 601)}});
}

// A write of `length` tokens with padding, the segmented form and a mask like any forward.
inline Op GenWrite(const StackModel& m, int64_t length) {
  Op op;
  op.kind = OpKind::kWrite;
  op.tokens = *rc::gen::container<std::vector<int32_t>>(static_cast<size_t>(length),
                                                        rc::gen::inRange(0, 5));
  op.pad = *rc::gen::weightedElement<int64_t>({{4, 0}, {1, 1}, {1, 3}});
  op.segmented = *rc::gen::arbitrary<bool>();
  op.mask = *rc::gen::weightedElement<MaskForm>({{12, MaskForm::kCausal},
                                                 {2, MaskForm::kZero},
                                                 {2, MaskForm::kRelax},
                                                 {2, MaskForm::kBlock},
                                                 {1, MaskForm::kRelaxBlock},
                                                 {2, MaskForm::kArray}});
  if (!HasRect(op.mask)) return op;
  // Rectangles are absolute; layers may stand at different offsets, so anchor at one.
  const int32_t anchor = *rc::gen::inRange<int32_t>(0, m.num_layers());
  const int64_t start = m.at(anchor).ref.Offset();
  // A block reaches further back, into the older keys of a window a decode gathers.
  const auto rect = [&](int64_t back) {
    MaskRect r;
    r.q_lo = start + *rc::gen::inRange<int64_t>(0, length);
    r.q_hi = r.q_lo + *rc::gen::inRange<int64_t>(1, length + 1);
    r.k_lo = std::max<int64_t>(0, start + *rc::gen::inRange<int64_t>(-back, length));
    r.k_hi = r.k_lo + *rc::gen::inRange<int64_t>(1, length + 4);
    return r;
  };
  op.rect = rect(op.mask == MaskForm::kBlock || op.mask == MaskForm::kArray ? 8 : 3);
  if (HasBlockRect(op.mask)) op.block = rect(8);
  return op;
}

// [current, d1..dD] with D around a window, so forwards longer than a window are common.
inline Op GenSpeculate(const StackModel& m) {
  const int64_t w = GenWindow(m);
  const int64_t drafts =
      std::max<int64_t>(1, *rc::gen::elementOf(std::vector<int64_t>{1, 2, 3, 10, w - 1, w, w + 1}));
  Op op = GenWrite(m, drafts + 1);
  op.kind = OpKind::kSpeculate;
  op.isolated = *rc::gen::weightedElement<bool>({{5, false}, {1, true}});
  op.value = *rc::gen::weightedOneOf<int64_t>(
      {{7, rc::gen::inRange<int64_t>(0, drafts + 1)},
       {1, rc::gen::elementOf(std::vector<int64_t>{-2, -1, drafts + 1, drafts + 5})}});
  // Sometimes dropped before its commit, mid-stack or after the whole forward.
  if (!op.isolated && *rc::gen::weightedElement<bool>({{7, false}, {1, true}})) {
    op.abandon_after = *rc::gen::inRange<int32_t>(0, m.num_layers() + 1);
  }
  return op;
}

inline int32_t AnySlot(const LayerModel& l) {
  return *rc::gen::inRange<int32_t>(0, static_cast<int32_t>(l.pool.size()));
}

// Restore targets: a snapshot's end (or the live offset), its neighbours, or anywhere.
inline int64_t GenTarget(const LayerModel& l, int32_t slot) {
  const int64_t offset = l.ref.Offset();
  const int64_t anchor = slot >= 0 ? l.pool[static_cast<size_t>(slot)]->to : offset;
  // A snapshot's start too: a target at or below it refills the range, then rewinds.
  const int64_t start = slot >= 0 ? l.pool[static_cast<size_t>(slot)]->from : offset;
  return *rc::gen::oneOf(rc::gen::just(anchor), rc::gen::inRange<int64_t>(anchor - 2, anchor + 2),
                         rc::gen::inRange<int64_t>(start - 1, start + 1),
                         rc::gen::inRange<int64_t>(-1, offset + 3));
}

// Parent and child slots; adjacent pairs are preferred so full KV merges happen at all.
inline void GenMergeSlots(const LayerModel& l, Op& op) {
  op.slot = AnySlot(l);
  op.slot2 = *rc::gen::oneOf(rc::gen::just(-1),
                             rc::gen::inRange<int32_t>(0, static_cast<int32_t>(l.pool.size())));
  for (int32_t b = 0; b < static_cast<int32_t>(l.pool.size()); ++b) {
    if (b != op.slot &&
        l.pool[static_cast<size_t>(op.slot)]->to == l.pool[static_cast<size_t>(b)]->from &&
        *rc::gen::arbitrary<bool>()) {
      op.slot2 = b;
    }
  }
}

// Mostly well-formed schedules at or just ahead of the layer; sometimes malformed ones.
inline std::vector<int64_t> GenScheduleOffsets(int64_t offset) {
  auto offs =
      *rc::gen::container<std::vector<int64_t>>(rc::gen::inRange<int64_t>(offset - 1, offset + 12));
  if (*rc::gen::weightedElement<bool>({{4, true}, {1, false}})) {
    std::sort(offs.begin(), offs.end());
    offs.erase(std::unique(offs.begin(), offs.end()), offs.end());
    offs.erase(std::remove(offs.begin(), offs.end(), offset - 1), offs.end());
  }
  return offs;
}

inline OpKind GenKind(const LayerModel& l) {
  const bool has = !l.pool.empty();
  // Held snapshots are re-checked after every step: keep pools small.
  const uint32_t close = !has ? 0u : l.pool.size() > 8 ? 8u : 1u;
  return *rc::gen::weightedElement<OpKind>({{8, OpKind::kWrite},
                                            {5, OpKind::kSpeculate},
                                            {3, OpKind::kSnapshot},
                                            {5, OpKind::kRestore},
                                            {has ? 2u : 0u, OpKind::kMerge},
                                            {has ? 2u : 0u, OpKind::kSplit},
                                            {1, OpKind::kFree},
                                            {3, OpKind::kPrepare},
                                            {2, OpKind::kTake},
                                            {close, OpKind::kClose}});
}

inline Op GenOp(const StackModel& m) {
  Op op;
  op.layer = *rc::gen::inRange<int32_t>(0, m.num_layers());
  const LayerModel& l = m.at(op.layer);
  op.kind = GenKind(l);
  switch (op.kind) {
    case OpKind::kWrite:
      return GenWrite(m, GenWriteLength(m));
    case OpKind::kSpeculate:
      return GenSpeculate(m);
    case OpKind::kSnapshot:
      op.value = *rc::gen::inRange<int64_t>(0, l.ref.Offset() + 2);
      break;
    case OpKind::kRestore:
      op.slot = !l.pool.empty() && *rc::gen::arbitrary<bool>() ? AnySlot(l) : -1;
      op.value = GenTarget(l, op.slot);
      break;
    case OpKind::kMerge:
      GenMergeSlots(l, op);
      break;
    case OpKind::kSplit: {
      op.slot = AnySlot(l);
      const model::RefSnap& s = l.pool[static_cast<size_t>(op.slot)];
      op.value = *rc::gen::inRange<int64_t>(s->from - 1, s->to + 2);
      break;
    }
    case OpKind::kPrepare:
      op.offsets = GenScheduleOffsets(l.ref.Offset());
      break;
    case OpKind::kClose:
      op.slot = AnySlot(l);
      break;
    default:
      break;
  }
  return op;
}

}  // namespace kvtwin::sim::prop
