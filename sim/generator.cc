#include "sim/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace kvtwin::sim {
namespace {

int64_t StackSmallestWindow(const StackConfig& config) {
  int64_t w = 8;
  bool found = false;
  for (const LayerSpec& s : config.layers) {
    if (s.kind == CacheKind::kRotating && (!found || s.window < w)) {
      w = s.window;
      found = true;
    }
  }
  return w;
}

// The window the op lengths and draft counts follow: the stack's smallest, but at most 640
// (past every window of the bundled stages). A window of real models' size (4096) would
// otherwise make a third of the writes thousands of tokens long and a 1500-step run hold
// millions of rows; its edge is still crossed, since offsets pass it within a few writes.
int64_t SmallestWindow(const StackConfig& config) {
  constexpr int64_t kMaxFollowedWindow = 640;
  return std::min(StackSmallestWindow(config), kMaxFollowedWindow);
}

Op OpFor(OpKind kind, int32_t layer) {
  Op op;
  op.kind = kind;
  op.layer = layer;
  return op;
}

}  // namespace

std::string OpWeights::ToString() const {
  return fmt::format(
      "write={} snapshot={} restore={} merge={} split={} free={} prepare={} "
      "take={} close={} capture_spec={} speculate={}",
      write, snapshot, restore, merge, split, free, prepare, take, close, capture_spec, speculate);
}

int64_t OpGenerator::Pick(std::initializer_list<int64_t> values) {
  const auto i = static_cast<size_t>(rng_.Below(values.size()));
  return *(values.begin() + i);
}

Op OpGenerator::Next(const LockstepDriver& driver) {
  while (!pending_.empty()) {
    Pending p = pending_.front();
    pending_.pop_front();
    Op op = Resolve(driver, p);
    if (driver.Valid(op)) return op;
  }
  for (;;) {
    Op op = Fresh(driver);
    if (driver.Valid(op)) return op;
  }
}

Op OpGenerator::Fresh(const LockstepDriver& driver) {
  const int32_t layer =
      static_cast<int32_t>(rng_.Below(static_cast<uint64_t>(driver.num_layers())));
  // Keep pools small so every held snapshot is re-checked cheaply after each step.
  if (driver.pool_size(layer) > 12) {
    Op op = OpFor(OpKind::kClose, layer);
    op.slot = static_cast<int32_t>(rng_.Below(static_cast<uint64_t>(driver.pool_size(layer))));
    return op;
  }
  const std::array<uint32_t, 11> w = {weights_.write,        weights_.snapshot, weights_.restore,
                                      weights_.merge,        weights_.split,    weights_.free,
                                      weights_.prepare,      weights_.take,     weights_.close,
                                      weights_.capture_spec, weights_.speculate};
  uint64_t total = 0;
  for (uint32_t x : w) total += x;
  if (total == 0) return MakeWrite(driver, 1);
  uint64_t r = rng_.Below(total);
  size_t family = 0;
  while (r >= w[family]) r -= w[family++];
  Op op;
  op.layer = layer;
  switch (family) {
    case 0:
      return MaybePaddingAlone(driver, MakeWrite(driver, WriteLength(driver)));
    case 1:
      op.kind = OpKind::kSnapshot;
      op.value = rng_.Range(0, driver.ref(layer).Offset() + 1);
      return op;
    case 2:
      return MakeRestore(driver, layer);
    case 3:
      return MakeMerge(driver, layer);
    case 4:
      return MakeSplit(driver, layer);
    case 5:
      op.kind = OpKind::kFree;
      return op;
    case 6:
      return MakePrepare(driver, layer);
    case 7:
      op.kind = OpKind::kTake;
      return op;
    case 8:
      if (driver.pool_size(layer) == 0) return MakeWrite(driver, 1);
      op.kind = OpKind::kClose;
      op.slot = static_cast<int32_t>(rng_.Below(static_cast<uint64_t>(driver.pool_size(layer))));
      return op;
    case 9: {
      PlanSpeculation(driver);
      Pending first = pending_.front();
      pending_.pop_front();
      return Resolve(driver, first);
    }
    default:
      return MakeSpeculate(driver);
  }
}

int64_t OpGenerator::WriteLength(const LockstepDriver& driver) {
  const int64_t w = SmallestWindow(driver.config());
  // A layer with more than ten scheduled offsets ahead (a dense schedule, MakePrepare): one
  // forward past the last of them, so all are interior states of that forward. Checked
  // before any draw, so a stream without dense schedules is what it was.
  for (int32_t l = 0; l < driver.num_layers(); ++l) {
    const model::RefCache& ref = driver.ref(l);
    if (!ref.ScheduleActive()) continue;
    const int64_t off = ref.Offset();
    int64_t ahead = 0, last = off;
    for (const int64_t s : ref.Scheduled()) {
      if (s <= off) continue;
      ++ahead;
      last = std::max(last, s);
    }
    if (ahead > 10) return last - off + 1;
  }
  // Rarely a write of the 256-slot KV growth step or longer: an append past the capacity
  // from a step-aligned offset below it (after a rewind) grows by ceil(L / 256) * 256
  // slots, which only a long append distinguishes from growing by the shortfall; a whole
  // number of steps is where that ceiling is taken once too often.
  if (rng_.Below(48) == 0) return LongWriteLength();
  // Often when a KV layer stands at such an offset now (a rewind kept its capacity), since
  // the state is short-lived: the next short write leaves it.
  for (int32_t l = 0; l < driver.num_layers(); ++l) {
    const model::RefCache& ref = driver.ref(l);
    const int64_t off = ref.Offset();
    if (ref.kind() == model::RefKind::kKv && off % 256 == 0 && off < ref.kv_capacity()) {
      if (rng_.Chance(1, 4)) return LongWriteLength();
      break;
    }
  }
  // Sometimes exactly the length that brings a layer back to where one of its held
  // snapshots ends, after a restore or rewind took it below: the same position on another
  // branch, where that snapshot must still be told from the live state (MakeRestore). Layers
  // may stand at different offsets (a recurrent layer does not rewind with a KV one), so the
  // length is the layer's own distance, and a short one: every layer writes it, and a
  // layer far ahead would otherwise double its offset with each such write.
  if (rng_.Chance(1, 8)) {
    const auto layer = static_cast<int32_t>(rng_.Below(driver.config().layers.size()));
    const int32_t n = driver.pool_size(layer);
    if (n > 0) {
      const model::RefSnap& s =
          driver.pool_ref(layer, static_cast<int32_t>(rng_.Below(static_cast<uint64_t>(n))));
      const int64_t gap = s->to - driver.ref(layer).Offset();
      if (gap > 0 && gap <= 2 * w + 16) return gap;
    }
  }
  switch (rng_.Below(6)) {
    case 0:
    case 1:
      return 1;
    case 2:
      return rng_.Range(2, 4);
    case 3:
      return std::max<int64_t>(1, w + Pick({-1, 0, 1}));
    case 4:
      return rng_.Range(1, 2 * w + 3);
    default:
      return rng_.Range(1, 16);
  }
}

int64_t OpGenerator::LongWriteLength() {
  if (rng_.Chance(1, 3)) return Pick({256, 512});
  return rng_.Range(257, 600);
}

Op OpGenerator::MakeWrite(const LockstepDriver& driver, int64_t length) {
  Op op;
  op.kind = OpKind::kWrite;
  for (int64_t i = 0; i < length; ++i) {
    // A small vocabulary makes equal tokens at equal positions on different branches common,
    // which only the whole-prefix hash tells apart.
    op.tokens.push_back(static_cast<int32_t>(rng_.Below(6)));
  }
  if (rng_.Chance(1, 5)) op.pad = rng_.Range(1, 3);
  if (bucket_rng_.Chance(1, 24)) {
    const int64_t buckets[] = {64, 128, 256};
    const int64_t bucket = buckets[bucket_rng_.Below(std::size(buckets))];
    op.pad = std::max(op.pad, bucket - length);
  }
  op.segmented = rng_.Chance(1, 2);
  const uint64_t m = rng_.Below(12);
  op.mask = m < 7     ? MaskForm::kCausal
            : m == 7  ? MaskForm::kBlock
            : m == 8  ? MaskForm::kZero
            : m == 9  ? MaskForm::kRelax
            : m == 10 ? MaskForm::kRelaxBlock
                      : MaskForm::kArray;
  const int64_t start = driver.ref(0).Offset();
  // A rectangle over the write's queries; a block also reaches back into a window's older
  // keys, where a decode's ring gather decides which of them it hits.
  const auto rect = [&](int64_t back) {
    MaskRect r;
    r.q_lo = start + rng_.Range(0, length - 1);
    r.q_hi = r.q_lo + rng_.Range(1, length);
    r.k_lo = std::max<int64_t>(0, start + rng_.Range(-back, length - 1));
    r.k_hi = r.k_lo + rng_.Range(1, length + 4);
    return r;
  };
  const bool blocks = op.mask == MaskForm::kBlock || op.mask == MaskForm::kArray;
  if (HasRect(op.mask)) op.rect = rect(blocks ? 8 : 4);
  if (HasBlockRect(op.mask)) op.block = rect(8);
  return op;
}

// One write in three while some layer has no state (fresh or freed: the only way to state
// at offset 0), one in sixteen otherwise. Half of the first kind queue a snapshot of such a
// layer right after, of the state at offset 0 it then holds.
Op OpGenerator::MaybePaddingAlone(const LockstepDriver& driver, Op write) {
  if (!driver.config().TakesPaddingAlone()) return write;
  int32_t stateless = -1;
  for (int32_t l = 0; l < driver.num_layers(); ++l) {
    if (!driver.ref(l).HasState()) stateless = l;
  }
  if (!padding_rng_.Chance(1, stateless >= 0 ? 3 : 16)) return write;
  if (stateless >= 0 && padding_rng_.Chance(1, 2)) {
    Pending snapshot;
    snapshot.op = OpFor(OpKind::kSnapshot, stateless);
    pending_.push_back(snapshot);
  }
  Op op;
  op.kind = OpKind::kWrite;
  op.pad = padding_rng_.Range(1, 3);
  op.segmented = write.segmented;
  return op;
}

Op OpGenerator::MakeRestore(const LockstepDriver& driver, int32_t layer) {
  Op op = OpFor(OpKind::kRestore, layer);
  const int64_t offset = driver.ref(layer).Offset();
  const int32_t n = driver.pool_size(layer);
  if (n == 0 || rng_.Chance(1, 3)) {
    op.slot = -1;
    op.value = offset - Pick({0, 0, 1, 2, -1}) - (rng_.Chance(1, 4) ? rng_.Range(0, offset) : 0);
    return op;
  }
  op.slot = static_cast<int32_t>(rng_.Below(static_cast<uint64_t>(n)));
  // Often a snapshot that ends exactly where the layer is: taken on another branch, its
  // state differs from the live one at the same position, so a cache that skips the install
  // when the offsets agree (spec §2.3: the current offset is irrelevant) keeps the wrong
  // conversation's state.
  if (rng_.Chance(1, 3)) {
    const auto first = static_cast<int32_t>(rng_.Below(static_cast<uint64_t>(n)));
    for (int32_t i = 0; i < n; ++i) {
      const int32_t slot = (first + i) % n;
      if (driver.pool_ref(layer, slot)->to != offset) continue;
      op.slot = slot;
      op.value = offset;
      return op;
    }
  }
  const model::RefSnap& s = driver.pool_ref(layer, op.slot);
  switch (rng_.Below(6)) {
    case 0:
    case 1:
      op.value = s->to;
      break;
    case 2:
      op.value = s->to - 1;
      break;
    case 3:
      op.value = s->to + 1;
      break;
    case 4:
      op.value = s->from + rng_.Range(-1, 1);
      break;
    default:
      op.value = rng_.Range(-1, offset + 2);
      break;
  }
  return op;
}

Op OpGenerator::MakeMerge(const LockstepDriver& driver, int32_t layer) {
  Op op = OpFor(OpKind::kMerge, layer);
  const int32_t n = driver.pool_size(layer);
  if (n < 2) return MakeWrite(driver, 1);
  // Prefer adjacent pairs so full KV merges happen (non-adjacent ones are not allowed).
  std::vector<std::pair<int32_t, int32_t>> adjacent;
  for (int32_t a = 0; a < n; ++a) {
    for (int32_t b = 0; b < n; ++b) {
      if (a != b && driver.pool_ref(layer, a)->to == driver.pool_ref(layer, b)->from) {
        adjacent.emplace_back(a, b);
      }
    }
  }
  if (!adjacent.empty() && rng_.Chance(3, 4)) {
    std::tie(op.slot, op.slot2) = adjacent[static_cast<size_t>(rng_.Below(adjacent.size()))];
    return op;
  }
  op.slot = static_cast<int32_t>(rng_.Below(static_cast<uint64_t>(n)));
  op.slot2 = rng_.Chance(1, 6) ? -1 : static_cast<int32_t>(rng_.Below(static_cast<uint64_t>(n)));
  if (rng_.Chance(1, 8)) std::swap(op.slot, op.slot2);
  return op;
}

Op OpGenerator::MakeSplit(const LockstepDriver& driver, int32_t layer) {
  Op op = OpFor(OpKind::kSplit, layer);
  const int32_t n = driver.pool_size(layer);
  if (n == 0) return MakeWrite(driver, 1);
  op.slot = static_cast<int32_t>(rng_.Below(static_cast<uint64_t>(n)));
  const model::RefSnap& s = driver.pool_ref(layer, op.slot);
  op.value = rng_.Range(s->from - 1, s->to + 1);
  return op;
}

Op OpGenerator::MakePrepare(const LockstepDriver& driver, int32_t layer) {
  Op op = OpFor(OpKind::kPrepare, layer);
  const int64_t offset = driver.ref(layer).Offset();
  const auto count = rng_.Below(5);
  for (uint64_t i = 0; i < count; ++i) op.offsets.push_back(offset + rng_.Range(0, 10));
  // Now and then (about one prepare in 14, derived from the draws above, so the stream is
  // what it was) a dense schedule, every position of the next 11 to 21, which the next write
  // crosses in one forward (WriteLength): a cap on the interior states of one forward shows
  // only past ten of them.
  if (count >= 3 && (op.offsets[0] - offset) % 4 == 3) {
    const int64_t dense = 11 + (op.offsets[1] - offset);
    for (int64_t i = 1; i <= dense; ++i) op.offsets.push_back(offset + i);
  }
  // Sometimes a schedule that names a held snapshot's end ahead of the layer, and then a
  // restore of that snapshot before any write reaches it: the restore moves the layer onto a
  // scheduled offset, but only a write or the prepare itself captures (spec §2.1-§2.3), so a
  // cache that fills the slot on landing there hands the restored state back as a capture.
  if (rng_.Chance(1, 4)) {
    const int32_t n = driver.pool_size(layer);
    const auto first = static_cast<int32_t>(rng_.Below(static_cast<uint64_t>(std::max(n, 1))));
    for (int32_t i = 0; i < n; ++i) {
      const int32_t slot = (first + i) % n;
      const int64_t to = driver.pool_ref(layer, slot)->to;
      if (to <= offset) continue;
      op.offsets.push_back(to);
      Pending restore;
      restore.op = OpFor(OpKind::kRestore, layer);
      restore.op.slot = slot;
      restore.op.value = to;
      pending_.push_back(restore);
      break;
    }
  }
  std::sort(op.offsets.begin(), op.offsets.end());
  op.offsets.erase(std::unique(op.offsets.begin(), op.offsets.end()), op.offsets.end());
  if (rng_.Chance(1, 10) && !op.offsets.empty()) {  // malformed: behind, duplicate or unsorted
    switch (rng_.Below(3)) {
      case 0:
        op.offsets.insert(op.offsets.begin(), offset - 1);
        break;
      case 1:
        op.offsets.push_back(op.offsets.back());
        break;
      default:
        std::reverse(op.offsets.begin(), op.offsets.end());
        op.offsets.push_back(offset);
        break;
    }
  }
  return op;
}

Op OpGenerator::MakeSpeculate(const LockstepDriver& driver) {
  const int64_t w = SmallestWindow(driver.config());
  // Draft counts around the window make windows smaller than the forward (D + 1) common.
  const int64_t drafts = std::max<int64_t>(1, Pick({1, 1, 2, 3, 10, w - 1, w, w + 1}));
  Op op = MakeWrite(driver, drafts + 1);
  op.kind = OpKind::kSpeculate;
  op.isolated = rng_.Chance(1, 6);
  // Mostly a real acceptance count; sometimes one the commit must clamp: just outside the
  // forward, a small negative count (a runner's -1 for a failed step: Commit(-1) and
  // Commit(-2), which a clamp with no floor turns into a quiet rewind below the start), or
  // the extremes of the count's type (a runner's "accept all" sentinel), which a cache that
  // adds before it clamps overflows on.
  op.value = rng_.Chance(7, 8) ? rng_.Range(0, drafts)
                               : Pick({std::numeric_limits<int64_t>::min(), -3, -2, -1, drafts + 1,
                                       std::numeric_limits<int64_t>::max()});
  // Sometimes the caller drops the transaction before its commit, mid-stack or after the
  // whole forward, and only the destructor's rollback stands between the drafts and the cache.
  if (!op.isolated && rng_.Chance(1, 8)) {
    op.abandon_after = static_cast<int32_t>(rng_.Range(0, driver.num_layers()));
  }
  if (long_spec_rng_.Chance(1, 16)) {
    const int64_t long_drafts[] = {63, 64, 65, 127, 128, 129};
    const int64_t n = long_drafts[long_spec_rng_.Below(std::size(long_drafts))];
    while (static_cast<int64_t>(op.tokens.size()) < n + 1) {
      op.tokens.push_back(static_cast<int32_t>(long_spec_rng_.Below(6)));
    }
    // Committed tokens (value + 1) of 63, 64 or 65, 127, 128 or 129, or all of them.
    const int64_t commits[] = {62, 63, 64, 126, 127, 128, n};
    op.value = std::min(n, commits[long_spec_rng_.Below(std::size(commits))]);
  }
  return op;
}

void OpGenerator::PlanSpeculation(const LockstepDriver& driver) {
  const int64_t drafts = Pick({1, 2, 3, 10});
  const int64_t accepted = rng_.Range(0, drafts);
  const int32_t layers = driver.num_layers();
  for (int32_t l = 0; l < layers; ++l) {
    Pending p;
    p.op.kind = OpKind::kTake;  // drain any active schedule first
    p.op.layer = l;
    pending_.push_back(p);
    p.op.kind = OpKind::kPrepare;
    const int64_t before = driver.ref(l).Offset();
    for (int64_t i = 1; i <= drafts; ++i) p.op.offsets.push_back(before + i);
    pending_.push_back(p);
  }
  Pending write;
  write.op = MakeWrite(driver, drafts + 1);
  write.op.pad = 0;
  pending_.push_back(write);
  for (int32_t l = 0; l < layers; ++l) {
    Pending p;
    p.op.kind = OpKind::kTake;
    p.op.layer = l;
    pending_.push_back(p);
    if (accepted == drafts) continue;
    p.op.kind = OpKind::kRestore;
    p.op.value = driver.ref(l).Offset() + 1 + accepted;
    p.restore_accepted = true;
    pending_.push_back(p);
  }
}

Op OpGenerator::Resolve(const LockstepDriver& driver, Pending pending) {
  if (!pending.restore_accepted) return pending.op;
  // Live rewind first (KV, unwrapped windows); the driver's reference says whether it can.
  Op op = pending.op;
  op.slot = -1;
  const model::RefCache& ref = driver.ref(op.layer);
  model::RefCache probe = ref;
  if (probe.Restore(nullptr, op.value)) return op;
  for (int32_t i = driver.pool_size(op.layer) - 1; i >= 0; --i) {
    if (driver.pool_ref(op.layer, i)->to == op.value) {
      op.slot = i;
      break;
    }
  }
  return op;
}

}  // namespace kvtwin::sim
