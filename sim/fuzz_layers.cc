// The layer-op fuzz family (kKv, kRotating, kRecurrent, kSpeculation; contract:
// sim/fuzz_input.h). Goal: every byte string is a lock-step run of Ops (sim/ops.h) on a small
// stack, and one mutated byte changes one decision, so libFuzzer's coverage feedback and the
// structure-aware mutator steer the run instead of fighting a decoder that resynchronizes.
// Method: a 4-byte header picks the stack; each 26-byte record is read field by field, one
// byte per field with a fixed range (field k = byte 25 - k), into a RawRecord, and only then
// resolved against the reference state of the LockstepDriver (slots modulo the pool,
// positions as value fields relative to the layer's offset, the window or a snapshot end).
// Records that resolve to an op the driver would not accept are skipped; the applied ops
// are recorded (when asked) as an ops trace that ReplayTrace runs to the same digest and
// verdict. A FuzzSession's driver and op buffer are reused across runs (LayerFuzzState).
//
// Header (field k = header byte 3 - k):
//   0 layers   kKv, kRotating: 1 + b % 2; kRecurrent: 1 + b % 3; kSpeculation: 3 + b % 2
//   1 window   W = 1 + b % 9 (rotating layers; the characteristic length everywhere)
//   2 dtype    b % 2: bf16, else f32; the model widths FuzzDimsOf(b) (bit 1: drawn)
//   3 seed     the run seed (TraceHeader::seed) = b
// Record fields (k; a value field is a mode byte k and its argument k + 1):
//   0 kind      b through the target's weights (kLayerKinds, kSpeculationKinds); with
//               more than kPoolCap snapshots held on the layer, a layer op is a close
//   1 layer     b % layers (forwards: only the anchor of the relax rectangle)
//   2 slot      b % (pool + 1), pool = -1 (close: b % pool)
//   3 slot2     as slot (merge child)
//   4 count     forward length / speculation drafts D (LengthOf: b < 128: 1 + b % 4;
//               b < 192: W - 1 + b % 3; else 1 + b % (2 W + 4)), or prepare offsets b % 4
//               (and a dense schedule when (b / 4) % 8 == 7, see PrepareOffsets)
//   5 pad       b % 5 == 0: 1 + (b / 5) % 3, else 0; kRecurrent: a padded write with
//               (b / 15) % 4 == 3 has no tokens (padding alone)
//   6 segmented b % 2
//   7 mask      b % 10: 0-6 causal, 7 block, 8 zero (b / 10 even) or array, 9 relax
//               (b / 10 even) or relax_block
//   8 isolated  b % 6 == 0 isolated; b % 6 == 1 abandoned after (b / 6) % (layers + 1) layers
//   9 accept    b < 192: accepted drafts b % (D + 1); else the first value field
//   10-13 rect  relax or block rectangle, relative to the write (see Rect); relax_block
//               takes its blocked rectangle from fields 22-25 (a forward reads no value
//               field past the first)
//   14-19 tokens 1 + (b + i / 6) % 6 for token i, from field 14 + i % 6
//   20/21, 22/23, 24/25 value fields: snapshot from, restore target, split point, accepted
//               drafts (accept >= 192), prepare offsets (the first; prepare also the second
//               and third). Anchor: the layer's offset; for accepted drafts D; for prepare
//               offset i + 1, offset i + 8. kSnapshotEnd: the ends of the snapshot in `slot`.
//               A snapshot's from is clamped at 0 (the trace format has no negative from).
// Single-threaded; deterministic in the bytes.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "sim/fuzz_families.h"
#include "sim/lockstep.h"
#include "sim/replay.h"
#include "sim/stack.h"
#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

constexpr size_t kHeaderBytes = 4;
constexpr size_t kTokenFields = 6;
constexpr size_t kValueFields = 3;
constexpr size_t kFirstValueField = 20;
constexpr size_t kRecordBytes = kFirstValueField + 2 * kValueFields;
// Enough ops to wrap windows, fill pools and chain snapshots. The driver's checks after every
// step are linear in the offset, so a run costs about records x offset: a full 64-record
// input takes ~1-3 ms in a release build, a few records tens of microseconds.
constexpr size_t kMaxRecords = 64;
// Past this many held snapshots a record on the layer closes one instead: every held
// snapshot is re-checked after every step, so an unbounded pool only slows the fuzzer.
constexpr int32_t kPoolCap = 12;
constexpr int kVocabulary = 6;  // equal tokens on different branches are common

// Kind weights per target, in OpKind order, summing to 256 so the kind byte maps uniformly.
using KindWeights = std::array<uint32_t, 10>;
//                                write snap rest merge split free prep take close spec
constexpr KindWeights kLayerKinds = {56, 28, 40, 20, 20, 6, 24, 24, 14, 24};
// Speculation first, with the ops that move state under it (writes, snapshots, restores,
// capture schedules) in between; merges and splits only keep the pool moving.
constexpr KindWeights kSpeculationKinds = {40, 24, 36, 4, 6, 4, 20, 24, 10, 88};

constexpr uint32_t Sum(const KindWeights& w) {
  uint32_t total = 0;
  for (const uint32_t x : w) total += x;
  return total;
}
static_assert(Sum(kLayerKinds) == 256 && Sum(kSpeculationKinds) == 256);

struct Shape {
  std::string preset;
  int32_t layers = 1;
  int64_t window = 1;
  StackDTypes dtypes;
  ModelDims dims;
  uint64_t seed = 0;
};

// A record's bytes, one per field, before any of them is given meaning.
struct RawRecord {
  uint8_t kind, layer, slot, slot2, count, pad, segmented, mask, isolated, accept;
  std::array<uint8_t, 4> rect;
  std::array<uint8_t, kTokenFields> tokens;
  std::array<std::array<uint8_t, 2>, kValueFields> values;  // {mode, argument}
};

uint8_t Field(FuzzedDataProvider& in) { return in.ConsumeIntegral<uint8_t>(); }

// Reads every field in field order, whatever the kind: the byte of field k never depends on
// the other fields, so the layout table (and the mutator) can address it.
RawRecord ReadRecord(std::span<const uint8_t> bytes) {
  KV_CHECK(bytes.size() == kRecordBytes, "a record is kRecordBytes long");
  FuzzedDataProvider in(bytes.data(), bytes.size());
  RawRecord r{};
  r.kind = Field(in);
  r.layer = Field(in);
  r.slot = Field(in);
  r.slot2 = Field(in);
  r.count = Field(in);
  r.pad = Field(in);
  r.segmented = Field(in);
  r.mask = Field(in);
  r.isolated = Field(in);
  r.accept = Field(in);
  for (uint8_t& b : r.rect) b = Field(in);
  for (uint8_t& b : r.tokens) b = Field(in);
  for (auto& v : r.values) {
    v[0] = Field(in);
    v[1] = Field(in);
  }
  KV_CHECK(in.remaining_bytes() == 0, "every record byte is one field");
  return r;
}

const char* PresetOf(FuzzTarget target) {
  switch (target) {
    case FuzzTarget::kKv:
      return "dense";
    case FuzzTarget::kRotating:
      return "rotating";
    case FuzzTarget::kRecurrent:
      return "recurrent";  // < 4 layers: no full KV layer, all gated-delta
    case FuzzTarget::kSpeculation:
      return "mixed";
    default:
      KV_CHECK(false, "not a layer-op target");
      return "";
  }
}

// Every check after a step costs time in layers x offset: full KV and rotating stacks get two
// layers at most (enough for layers at different offsets), recurrent ones three (still all
// gated-delta), the speculation stack one of each kind, sometimes plus a second full KV.
int32_t LayersOf(FuzzTarget target, uint8_t b) {
  if (target == FuzzTarget::kSpeculation) return 3 + b % 2;
  if (target == FuzzTarget::kRecurrent) return 1 + b % 3;
  return 1 + b % 2;
}

Shape ReadHeader(FuzzTarget target, std::span<const uint8_t> bytes) {
  FuzzedDataProvider in(bytes.data(), bytes.size());
  Shape s;
  s.preset = PresetOf(target);
  s.layers = LayersOf(target, Field(in));
  s.window = 1 + Field(in) % 9;
  const uint8_t dtype = Field(in);
  s.dtypes = FuzzDTypesOf(dtype);
  // A recurrent stack has no V rows: its inputs keep the header they had.
  if (target == FuzzTarget::kRecurrent) s.dtypes.v.reset();
  s.dims = FuzzDimsOf(dtype);
  s.seed = Field(in);
  return s;
}

OpKind KindOf(FuzzTarget target, uint8_t b) {
  const KindWeights& w = target == FuzzTarget::kSpeculation ? kSpeculationKinds : kLayerKinds;
  uint32_t r = b;
  for (size_t k = 0; k < w.size(); ++k) {
    if (r < w[k]) return static_cast<OpKind>(k);
    r -= w[k];
  }
  KV_CHECK(false, "kind weights must sum to 256");
  return OpKind::kWrite;
}

// b % (n + 1) with the value n naming the null snapshot (-1).
int32_t SlotOf(uint8_t b, int32_t pool) {
  const int32_t s = b % (pool + 1);
  return s == pool ? -1 : s;
}

// Mostly short forwards, a quarter at the window's edges (W - 1, W, W + 1: the wrap of a
// rotating layer inside one batched write), the rest up to 2 W + 4 (a write that wraps the
// ring twice). No longer: every check after a step costs time in the offset.
int64_t LengthOf(uint8_t b, int64_t window) {
  if (b < 128) return 1 + b % 4;
  if (b < 192) return std::max<int64_t>(1, window - 1 + b % 3);
  return 1 + b % (2 * window + 4);
}

// The value context of a layer op: its layer's offset, W, and the addressed snapshot's ends.
ValueContext LayerContext(const LockstepDriver& d, const Shape& s, int32_t layer, int32_t slot) {
  ValueContext c{d.ref(layer).Offset(), s.window, std::nullopt, std::nullopt};
  if (slot >= 0 && slot < d.pool_size(layer)) {
    const model::RefSnap& snap = d.pool_ref(layer, slot);
    KV_CHECK(snap.has_value(), "the pool holds no null snapshots");
    c.from = snap->from;
    c.to = snap->to;
  }
  return c;
}

int64_t Value(const RawRecord& r, size_t i, const ValueContext& c) {
  return ResolveValue(r.values[i][0], r.values[i][1], c);
}

// A mask rectangle of a forward of `length` tokens at `start` from four bytes, shaped like
// the generator's: queries inside the forward, keys from a little before it. Absolute and
// non-negative with hi >= lo, as the trace format requires.
MaskRect Rect(const std::array<uint8_t, 4>& b, int64_t start, int64_t length) {
  MaskRect r;
  r.q_lo = start + b[0] % length;
  r.q_hi = r.q_lo + 1 + b[1] % length;
  r.k_lo = std::max<int64_t>(0, start - 4 + b[2] % (length + 4));
  r.k_hi = r.k_lo + 1 + b[3] % (length + 4);
  return r;
}

// Mostly a real acceptance, uniform over 0..D: a partial commit is where the layers' rewinds
// differ. A quarter of the records take it from the first value field instead (anchor D,
// window W): D itself, D + 1 and beyond (clamped), negative ones, W - 1..W + 1.
int64_t Accepted(const RawRecord& r, int64_t drafts, int64_t window) {
  if (r.accept < 192) return r.accept % (drafts + 1);
  return Value(r, 0, ValueContext{drafts, window, std::nullopt, std::nullopt});
}

// kWrite (length = count) or kSpeculate (count drafts after the current token), into a
// cleared `op`.
void Forward(const RawRecord& r, OpKind kind, const LockstepDriver& d, const Shape& s,
             int32_t layer, Op& op) {
  op.kind = kind;
  const int64_t drafts = LengthOf(r.count, s.window);
  const int64_t length = kind == OpKind::kSpeculate ? drafts + 1 : drafts;
  op.tokens.reserve(static_cast<size_t>(length));
  for (int64_t i = 0; i < length; ++i) {
    const uint8_t b = r.tokens[static_cast<size_t>(i) % kTokenFields];
    op.tokens.push_back(1 + static_cast<int32_t>((b + i / kTokenFields) % kVocabulary));
  }
  op.pad = r.pad % 5 == 0 ? 1 + (r.pad / 5) % 3 : 0;
  // The recurrent target's stacks are recurrent layers only, where a write may be padding
  // alone: the state then exists at an offset that did not move (offset 0 on a fresh layer).
  if (kind == OpKind::kWrite && d.config().TakesPaddingAlone() && op.pad > 0 &&
      (r.pad / 15) % 4 == 3) {
    op.tokens.clear();
  }
  op.segmented = r.segmented % 2 == 1;
  const int m = r.mask % 10;
  const bool even = (r.mask / 10) % 2 == 0;
  op.mask = m < 7    ? MaskForm::kCausal
            : m == 7 ? MaskForm::kBlock
            : m == 8 ? (even ? MaskForm::kZero : MaskForm::kArray)
            : even   ? MaskForm::kRelax
                     : MaskForm::kRelaxBlock;
  const int64_t start = d.ref(layer).Offset();
  if (HasRect(op.mask)) op.rect = Rect(r.rect, start, length);
  if (HasBlockRect(op.mask)) {
    // A forward reads no value field past the first, so the second and third carry it.
    const std::array<uint8_t, 4> b = {r.values[1][0], r.values[1][1], r.values[2][0],
                                      r.values[2][1]};
    op.block = Rect(b, start, length);
  }
  if (kind == OpKind::kSpeculate) {
    op.isolated = r.isolated % 6 == 0;
    if (r.isolated % 6 == 1) op.abandon_after = (r.isolated / 6) % (s.layers + 1);
    op.value = Accepted(r, drafts, s.window);
  }
}

// Up to three offsets, each anchored 8 past the previous one (the first 8 past the layer's
// offset), so kRelative gives mostly ascending schedules ahead of the cache and sometimes a
// duplicate or one behind it; the other modes aim at the window or a snapshot end.
// Spare bits of the count byte ((b / 4) % 8 == 7) add a dense schedule: every position of
// the next 11 + b / 32 (11-18), merged into the others in order, which one long forward
// crosses at once (the op generator's dense prepares, at the fuzzer's reach).
void PrepareOffsets(const RawRecord& r, ValueContext c, std::vector<int64_t>& offsets) {
  const int64_t base = c.anchor;
  const size_t n = r.count % (kValueFields + 1);
  for (size_t i = 0; i < n; ++i) {
    c.anchor += 8;
    offsets.push_back(Value(r, i, c));
    c.anchor = offsets.back();
  }
  if ((r.count / 4) % 8 != 7) return;
  for (int64_t i = 1; i <= 11 + r.count / 32; ++i) offsets.push_back(base + i);
  std::sort(offsets.begin(), offsets.end());
  offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
}

// A one-layer op into a cleared `op`; false when the record names nothing (a close with an
// empty pool).
bool LayerOp(const RawRecord& r, OpKind kind, const LockstepDriver& d, const Shape& s,
             int32_t layer, Op& op) {
  op.kind = kind;
  op.layer = layer;
  const int32_t pool = d.pool_size(layer);
  if (pool > kPoolCap) op.kind = OpKind::kClose;
  if (op.kind == OpKind::kClose) {
    if (pool == 0) return false;
    op.slot = r.slot % pool;
    return true;
  }
  op.slot = SlotOf(r.slot, pool);
  const ValueContext c = LayerContext(d, s, layer, op.slot);
  switch (op.kind) {
    case OpKind::kSnapshot:
      op.slot = -1;  // not part of a snapshot op; only aims kSnapshotEnd
      op.value = std::max<int64_t>(0, Value(r, 0, c));
      break;
    case OpKind::kRestore:
    case OpKind::kSplit:
      op.value = Value(r, 0, c);
      break;
    case OpKind::kMerge:
      op.slot2 = SlotOf(r.slot2, pool);
      break;
    case OpKind::kPrepare:
      PrepareOffsets(r, c, op.offsets);
      op.slot = -1;
      break;
    default:  // kFree, kTake: nothing but the layer
      op.slot = -1;
      break;
  }
  return true;
}

// `op` as a default Op, its vectors' capacity kept: one Op is reused for every record
// when no trace is recorded.
void Clear(Op& op) {
  Op fresh;
  fresh.tokens = std::move(op.tokens);
  fresh.tokens.clear();
  fresh.offsets = std::move(op.offsets);
  fresh.offsets.clear();
  op = std::move(fresh);
}

// The record's op into `op` (cleared first); false when it names nothing.
bool Resolve(FuzzTarget target, const RawRecord& r, const LockstepDriver& d, const Shape& s,
             Op& op) {
  Clear(op);
  const OpKind kind = KindOf(target, r.kind);
  const int32_t layer = r.layer % d.num_layers();
  if (kind != OpKind::kWrite && kind != OpKind::kSpeculate)
    return LayerOp(r, kind, d, s, layer, op);
  Forward(r, kind, d, s, layer, op);
  return true;
}

TraceHeader HeaderFor(FuzzTarget target, const Shape& s) {
  TraceHeader h;
  h.kind = TraceKind::kOps;
  h.seed = s.seed;
  h.preset = s.preset;
  h.layers = s.layers;
  h.window = s.window;
  h.dtype = StackDTypesName(s.dtypes);
  h.dims = s.dims;
  h.source = std::string("fuzz target ") + FuzzTargetName(target);
  return h;
}

}  // namespace

FuzzLayout LayerFuzzLayout(FuzzTarget target) {
  KV_CHECK(target == FuzzTarget::kKv || target == FuzzTarget::kRotating ||
               target == FuzzTarget::kRecurrent || target == FuzzTarget::kSpeculation,
           "not a layer-op target");
  FuzzLayout layout;
  layout.header_bytes = kHeaderBytes;
  layout.record_bytes = kRecordBytes;
  for (size_t i = 0; i < kValueFields; ++i) layout.value_fields.push_back(kFirstValueField + 2 * i);
  layout.max_records = kMaxRecords;
  return layout;
}

FuzzRun RunLayerFuzz(FuzzTarget target, const FuzzParts& parts, LayerFuzzState& state,
                     ShapeRunCounts& counts, bool record_trace) {
  const Shape shape = ReadHeader(target, parts.header);
  Result<StackConfig> config =
      StackFromPreset(shape.preset, shape.layers, shape.window, shape.dtypes, shape.dims);
  KV_CHECK(config.ok(), config.status().ToString());
  FuzzRun run;
  run.trace.header = HeaderFor(target, shape);
  // The replay's value seed, so ReplayTrace(run.trace) reaches this run's digest.
  const uint64_t seed = TraceValueSeed(run.trace.header);
  if (state.driver) {
    state.driver->Reset(std::move(*config), seed);
  } else {
    state.driver = std::make_unique<LockstepDriver>(std::move(*config), seed);
  }
  // A fresh session checks what a driver without counts would; a reused one a subset.
  state.driver->set_shape_run_counts(&counts);
  LockstepDriver& driver = *state.driver;
  if (record_trace) run.trace.events.reserve(parts.records.size());
  for (const std::span<const uint8_t> bytes : parts.records) {
    Op& op = state.op;
    if (!Resolve(target, ReadRecord(bytes), driver, shape, op) || !driver.Valid(op)) continue;
    const Op& applied =
        record_trace ? std::get<Op>(run.trace.events.emplace_back(std::move(op))) : op;
    ++run.events;
    if (std::optional<Divergence> div = driver.Apply(applied)) {
      run.divergence = div->ToString();
      run.divergence_kind = DivergenceKind(div->mismatch.what);
      break;
    }
  }
  run.digest = driver.digest();
  run.attention_checks = driver.attention_checks();
  driver.Clear();  // this execution frees what it built (LockstepDriver::Clear)
  return run;
}

}  // namespace kvtwin::sim
