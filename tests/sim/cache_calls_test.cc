// Goal: LoggedCache is transparent and its log is exact. The request driver hands the
// manager LoggedCaches and compares Begin's Restore and Free calls with the reference's
// (spec §3.4 order), so a wrapper that changed an outcome, dropped or reordered a call, or
// named the wrong snapshot would make that check lie. Method: drive a KvCache through the
// wrapper and directly side by side; compare offsets, outcomes and the log entry by entry.
// The driver-level check itself is exercised by every request test and shown to fail by
// mutant 97 (an extra page-in restore into a cache already at its target). The attach and
// Close disciplines are pure functions of a log, tested here on hand-written logs, and in
// the driver by mutants 104, 180 and 181.
#include "sim/cache_calls.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "src/core/rng.h"
#include "src/kv_cache.h"
#include "unit/tagged_rows.h"

namespace kvtwin::sim {
namespace {

void Write(LayerCache& c, int64_t n) {
  const std::vector<float> tags = tagged::Positions(c.Offset(), n);
  static_cast<AttentionCache&>(c).Update(tagged::Keys(tags), tagged::Values(tags));
}

TEST(CacheCalls, LoggedCacheForwardsAndLogsRestoreAndFreeInOrder) {
  KvCache inner;
  std::vector<CacheCall> log;
  LoggedCache logged(&inner, 3, &log);
  Write(inner, 8);
  EXPECT_EQ(logged.kind(), CacheKind::kFullKv);
  EXPECT_EQ(logged.Offset(), 8);
  const SnapshotPtr snap = logged.Snapshot(4);  // [4, 8): logged, but moves no state
  ASSERT_NE(snap, nullptr);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].op, CacheCall::Op::kSnapshot);
  EXPECT_EQ(log[0].target, 4);
  log.clear();

  EXPECT_TRUE(logged.Restore(nullptr, 4));   // rewind
  EXPECT_FALSE(logged.Restore(nullptr, 6));  // past the live offset: refused, unchanged
  EXPECT_EQ(inner.Offset(), 4);
  EXPECT_TRUE(logged.Restore(snap.get(), 7));  // refill [4, 8), then rewind to 7
  EXPECT_EQ(inner.Offset(), 7);
  logged.Free();
  EXPECT_EQ(inner.Offset(), 0);

  const std::vector<CacheCall> want = {
      CacheCall::Restore(3, nullptr, 4, true),
      CacheCall::Restore(3, nullptr, 6, false),
      CacheCall::Restore(3, snap.get(), 7, true),
      CacheCall::Free(3),
  };
  EXPECT_EQ(log, want);
  EXPECT_EQ(log[2].from, 4);
  EXPECT_EQ(log[2].to, 8);
  EXPECT_EQ(DescribeCalls(log),
            "c3 restore(-,4) ok, c3 restore(-,6) refused, c3 restore(kv[4,8),7) ok, c3 free");
  EXPECT_EQ(DescribeCalls({}), "none");
}

// Split is logged with the tail it returned (the attach check reads it), and
// StateMovingCalls keeps exactly the Restore and Free calls, in order (Begin's comparison).
TEST(CacheCalls, SplitLogsItsTailAndStateMovingCallsFilters) {
  KvCache inner;
  std::vector<CacheCall> log;
  LoggedCache logged(&inner, 1, &log);
  Write(inner, 8);
  auto [head, tail] = logged.Split(logged.Snapshot(2), 5);
  ASSERT_NE(head, nullptr);
  ASSERT_NE(tail, nullptr);
  EXPECT_EQ(tail->from(), 5);
  auto [none, whole] = logged.Split(logged.Snapshot(6), 6);  // at the start: all tail
  EXPECT_EQ(none, nullptr);
  ASSERT_NE(whole, nullptr);
  EXPECT_TRUE(logged.Restore(nullptr, 3));
  logged.Free();
  EXPECT_EQ(DescribeCalls(log),
            "c1 snapshot(2), c1 split(at 5) -> tail [5,8), c1 snapshot(6), "
            "c1 split(at 6) -> tail [6,8), c1 restore(-,3) ok, c1 free");
  EXPECT_EQ(StateMovingCalls(log),
            (std::vector<CacheCall>{CacheCall::Restore(1, nullptr, 3, true), CacheCall::Free(1)}));
}

// SameStateMovingCalls (Begin's comparison, with no list built) agrees with comparing
// StateMovingCalls: seeded logs of restores, frees, snapshots and splits against wants that
// are their filtered lists, one call changed, dropped, added or moved, or other logs' lists.
TEST(CacheCalls, SameStateMovingCallsAgreesWithComparingTheFilteredList) {
  KvCache inner;
  Write(inner, 4);
  const SnapshotPtr a = inner.Snapshot(0);
  auto random_call = [&](Rng& rng) {
    const auto layer = static_cast<int32_t>(rng.Below(2));
    switch (rng.Below(3)) {
      case 0:
        return CacheCall::Free(layer);
      case 1:
        return CacheCall::Restore(layer, rng.Chance(1, 2) ? a.get() : nullptr,
                                  static_cast<int64_t>(rng.Below(3)), rng.Chance(1, 2));
      default: {
        // A logged Snapshot or Split: kept in the log, filtered out of the comparison.
        CacheCall c;
        c.op = rng.Chance(1, 2) ? CacheCall::Op::kSnapshot : CacheCall::Op::kSplit;
        c.cache = layer;
        c.target = static_cast<int64_t>(rng.Below(3));
        return c;
      }
    }
  };
  int equal = 0, different = 0;
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    Rng rng(seed);
    std::vector<CacheCall> log(rng.Below(7));
    for (CacheCall& c : log) c = random_call(rng);
    std::vector<CacheCall> want = StateMovingCalls(log);
    switch (rng.Below(5)) {
      case 0:
        break;  // the list itself
      case 1:
        if (!want.empty()) want[rng.Below(want.size())] = random_call(rng);
        break;
      case 2:
        if (!want.empty())
          want.erase(want.begin() + static_cast<std::ptrdiff_t>(rng.Below(want.size())));
        break;
      case 3:
        want.insert(want.begin() + static_cast<std::ptrdiff_t>(rng.Below(want.size() + 1)),
                    random_call(rng));
        break;
      default:
        if (want.size() > 1) std::swap(want.front(), want.back());
        break;
    }
    const bool same = StateMovingCalls(log) == want;
    ASSERT_EQ(SameStateMovingCalls(log, want), same) << "seed " << seed;
    equal += same;
    different += !same;
  }
  EXPECT_GT(equal, 100);
  EXPECT_GT(different, 100);
}

TEST(CacheCalls, CallsDifferInEveryField) {
  KvCache inner;
  Write(inner, 4);
  const SnapshotPtr a = inner.Snapshot(0);
  const SnapshotPtr b = inner.Snapshot(0);  // same range, another snapshot
  const CacheCall base = CacheCall::Restore(1, a.get(), 2, true);
  EXPECT_EQ(base, CacheCall::Restore(1, a.get(), 2, true));
  EXPECT_NE(base, CacheCall::Restore(1, b.get(), 2, true));  // identity, not contents
  EXPECT_NE(base, CacheCall::Restore(0, a.get(), 2, true));
  EXPECT_NE(base, CacheCall::Restore(1, a.get(), 3, true));
  EXPECT_NE(base, CacheCall::Restore(1, a.get(), 2, false));
  EXPECT_NE(base, CacheCall::Restore(1, nullptr, 2, true));
  EXPECT_NE(CacheCall::Free(1), CacheCall::Restore(1, nullptr, 0, true));
}

CacheCall SplitCall(int32_t cache, int64_t at, int64_t tail_from, int64_t tail_to) {
  return CacheCall::Split(cache, CacheKind::kFullKv, at, tail_from, tail_to);
}

// Spec §3.4 attachCapturedSnapshots: one Split per capture, a live Snapshot only for the
// evicted-head KV re-slice (right after its Split, from the split point, the tail starting
// past it), and never a restore or free.
TEST(CacheCalls, TheAttachDisciplineAllowsOnlySplitsAndTheEvictedHeadReslice) {
  const CacheCall kv_slice = CacheCall::Snapshot(0, CacheKind::kFullKv, 4);
  EXPECT_FALSE(CheckAttachCalls({}, "Attach").has_value());
  const std::vector<CacheCall> plain = {SplitCall(0, 4, 4, 8), SplitCall(1, 4, 4, 8)};
  EXPECT_FALSE(CheckAttachCalls(plain, "Attach").has_value());
  const std::vector<CacheCall> reslice = {SplitCall(0, 4, 6, 8), kv_slice, SplitCall(0, 8, -1, -1)};
  EXPECT_FALSE(CheckAttachCalls(reslice, "Attach").has_value());

  const std::vector<std::vector<CacheCall>> refused = {
      {kv_slice},                                                              // no Split before
      {SplitCall(0, 4, 4, 8), kv_slice},                                       // tail at the node
      {SplitCall(1, 4, 6, 8), kv_slice},                                       // another cache's
      {SplitCall(0, 4, 6, 8), CacheCall::Snapshot(0, CacheKind::kFullKv, 5)},  // not from 4
      {SplitCall(0, 4, 6, 8), CacheCall::Snapshot(0, CacheKind::kRotating, 4)},
      {SplitCall(0, 4, 4, 8), CacheCall::Restore(0, nullptr, 8, true)},
      {CacheCall::Free(1)},
  };
  for (const std::vector<CacheCall>& calls : refused) {
    const Check c = CheckAttachCalls(calls, "Attach");
    ASSERT_TRUE(c.has_value()) << DescribeCalls(calls);
    EXPECT_EQ(c->what.rfind("Attach cache calls (spec §3.4", 0), 0u) << c->what;
    EXPECT_EQ(c->actual, DescribeCalls(calls));  // the log up to the offending call
  }
  const Check restore = CheckAttachCalls(refused[5], "Close");
  ASSERT_TRUE(restore.has_value());
  EXPECT_EQ(restore->expected, "no restore or free");
  EXPECT_NE(restore->what.find("Close"), std::string::npos);
}

// Spec §3.4 close: the attach's calls, then pageOut's one Snapshot(node start) per non-null
// cache in cache order as the last calls, or none when it did not install.
TEST(CacheCalls, CloseEndsWithOnePageOutSnapshotPerCacheOrNone) {
  const std::vector<int32_t> caches = {0, 2};
  const CacheCall s0 = CacheCall::Snapshot(0, CacheKind::kFullKv, 5);
  const CacheCall s2 = CacheCall::Snapshot(2, CacheKind::kRecurrent, 5);
  const CacheCall split = SplitCall(0, 3, 3, 5);
  EXPECT_FALSE(CheckCloseCalls({}, caches, std::nullopt).has_value());
  EXPECT_FALSE(CheckCloseCalls(std::vector<CacheCall>{split}, caches, std::nullopt).has_value());
  EXPECT_FALSE(CheckCloseCalls(std::vector<CacheCall>{s0, s2}, caches, 5).has_value());
  EXPECT_FALSE(CheckCloseCalls(std::vector<CacheCall>{split, s0, s2}, caches, 5).has_value());

  struct Case {
    std::vector<CacheCall> calls;
    std::optional<int64_t> from;
  };
  const std::vector<Case> refused = {
      {{s0}, 5},                                               // one cache not paged out
      {{s2, s0}, 5},                                           // out of cache order
      {{s0, s2}, 4},                                           // from the wrong offset
      {{s0, s2, split}, 5},                                    // a call after the page-out
      {{s0, s2}, std::nullopt},                                // the node already had snapshots
      {{s0, s0, s2}, 5},                                       // a second snapshot
      {{CacheCall::Restore(0, nullptr, 5, true), s0, s2}, 5},  // a re-alignment
      {{split, CacheCall::Free(2)}, std::nullopt},
  };
  for (const Case& r : refused) {
    const Check c = CheckCloseCalls(r.calls, caches, r.from);
    ASSERT_TRUE(c.has_value()) << DescribeCalls(r.calls);
    EXPECT_EQ(c->what.rfind("Close cache calls (spec §3.4", 0), 0u) << c->what;
  }
  const Check missing = CheckCloseCalls(refused[0].calls, caches, 5);
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(missing->expected, "c0 snapshot(5), c2 snapshot(5) last");
  EXPECT_EQ(missing->actual, "c0 snapshot(5)");
  const Check extra = CheckCloseCalls(refused[4].calls, caches, std::nullopt);
  ASSERT_TRUE(extra.has_value());
  EXPECT_EQ(extra->expected, "no live snapshot here");  // the attach rule sees the extra one
}

}  // namespace
}  // namespace kvtwin::sim
