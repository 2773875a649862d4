// Goal: pin the reference cache (model/ref_cache.h) to the spec, since it is the oracle the
// simulator trusts: the boolean contract of cache-semantics.md §1.2 row by row for each
// kind, the fakes of §5.1, the capture schedule of §1.3 with the shapes of §6.6, the
// PrepareSnapshots error classes, and the attention positions of §5.2 / §6.4.
// Method: tokens carry id = 1000 * branch + position, so every log, snapshot and capture
// reads back as the positions (and branch) it holds; expectations are hand-computed from
// the spec text, never from the code under test.
#include "model/ref_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "src/core/rng.h"

namespace kvtwin::model {
namespace {

constexpr int32_t kBranch = 1000;

// Tokens of positions [begin, end) on `branch`.
TokenLog Run(int64_t begin, int64_t end, int32_t branch = 0) {
  TokenLog log;
  for (int64_t p = begin; p < end; ++p) {
    const int32_t id = branch * kBranch + static_cast<int32_t>(p);
    log.push_back(Token{id, static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull});
  }
  return log;
}

// The ids Run(begin, end, branch) carries.
std::vector<int32_t> Ids(int64_t begin, int64_t end, int32_t branch = 0) {
  std::vector<int32_t> ids;
  for (const Token& t : Run(begin, end, branch)) ids.push_back(t.id);
  return ids;
}

std::vector<int32_t> IdsOf(std::span<const Token> log) {
  std::vector<int32_t> ids;
  for (const Token& t : log) ids.push_back(t.id);
  return ids;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `count` single-token writes continuing the log on `branch`.
void WriteSingles(RefCache& cache, int64_t count, int32_t branch = 0) {
  for (int64_t i = 0; i < count; ++i) {
    cache.Write(Run(cache.Offset(), cache.Offset() + 1, branch));
  }
}

// One batched write of `count` tokens continuing the log on `branch`.
void WriteBatch(RefCache& cache, int64_t count, int32_t branch = 0) {
  cache.Write(Run(cache.Offset(), cache.Offset() + count, branch));
}

// Used as ASSERT_TRUE(SnapIs(...)) so that a test stops before it dereferences a snapshot
// the model failed to produce.
::testing::AssertionResult SnapIs(const RefSnap& snap, int64_t from, int64_t to,
                                  const std::vector<int32_t>& ids) {
  if (!snap.has_value()) return ::testing::AssertionFailure() << "null snapshot";
  if (snap->from != from || snap->to != to || IdsOf(snap->tokens) != ids) {
    return ::testing::AssertionFailure()
           << "snapshot [" << snap->from << ", " << snap->to << ") with "
           << ::testing::PrintToString(IdsOf(snap->tokens)) << ", want [" << from << ", " << to
           << ") with " << ::testing::PrintToString(ids);
  }
  return ::testing::AssertionSuccess();
}

// ---- Full KV (§1.2 row 1, §2.1, §5.1 KV fake) ----

TEST(RefKvCache, SnapshotHoldsExactlyFromToOffset) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  ASSERT_TRUE(SnapIs(kv.Snapshot(4), 4, 10, Ids(4, 10)));
}

TEST(RefKvCache, SnapshotIsNullWithoutStateOrForAnEmptyRange) {
  RefCache kv = RefCache::Kv();
  EXPECT_FALSE(kv.Snapshot(0).has_value());
  WriteBatch(kv, 3);
  EXPECT_FALSE(kv.Snapshot(3).has_value());
  EXPECT_FALSE(kv.Snapshot(5).has_value());
  kv.Free();
  EXPECT_FALSE(kv.Snapshot(0).has_value());
}

TEST(RefKvCache, LiveRewindAcceptsAnyTargetUpToTheOffset) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  EXPECT_FALSE(kv.Restore(nullptr, 11));
  EXPECT_EQ(kv.Offset(), 10);
  EXPECT_TRUE(kv.Restore(nullptr, 10));
  EXPECT_TRUE(kv.Restore(nullptr, 4));
  EXPECT_EQ(IdsOf(kv.log()), Ids(0, 4));
  EXPECT_TRUE(kv.Restore(nullptr, 0));
  EXPECT_EQ(kv.Offset(), 0);
}

TEST(RefKvCache, RestoreRefusesANegativeTarget) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  const RefSnap snap = kv.Snapshot(0);
  ASSERT_TRUE(snap.has_value());
  EXPECT_FALSE(kv.Restore(nullptr, -1));
  EXPECT_FALSE(kv.Restore(&*snap, -1));
  EXPECT_EQ(kv.Offset(), 10);
}

TEST(RefKvCache, RestoreNeedsTheBaseBeforeTheSnapshot) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  const RefSnap snap = kv.Snapshot(5);
  ASSERT_TRUE(snap.has_value());
  kv.Free();
  EXPECT_FALSE(kv.Restore(&*snap, 10));  // offset 0 < snapshot start 5
  EXPECT_EQ(kv.Offset(), 0);
  WriteBatch(kv, 4, /*branch=*/1);
  EXPECT_FALSE(kv.Restore(&*snap, 10));  // one token short of the base
  WriteBatch(kv, 1, /*branch=*/1);
  ASSERT_TRUE(kv.Restore(&*snap, 10));
  // log[:from] of the live branch, then the snapshot's tokens.
  EXPECT_EQ(IdsOf(kv.log()), Concat(Ids(0, 5, 1), Ids(5, 10)));
}

TEST(RefKvCache, RestoreRefusesATargetBeyondTheSnapshotEnd) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  const RefSnap snap = kv.Snapshot(0);
  ASSERT_TRUE(snap.has_value());
  RefCache fresh = RefCache::Kv();
  EXPECT_FALSE(fresh.Restore(&*snap, 11));
  EXPECT_EQ(fresh.Offset(), 0);
  EXPECT_FALSE(fresh.HasState());
}

TEST(RefKvCache, RestoreIntoAFreshCacheRebuildsTheHistory) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  const RefSnap snap = kv.Snapshot(0);
  ASSERT_TRUE(snap.has_value());
  RefCache fresh = RefCache::Kv();
  ASSERT_TRUE(fresh.Restore(&*snap, 10));
  EXPECT_EQ(fresh.Offset(), 10);
  EXPECT_TRUE(fresh.HasState());
  EXPECT_EQ(IdsOf(fresh.log()), Ids(0, 10));
}

TEST(RefKvCache, RestoreTruncatesInsideTheSnapshot) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  const RefSnap snap = kv.Snapshot(5);
  ASSERT_TRUE(snap.has_value());
  ASSERT_TRUE(kv.Restore(nullptr, 5));
  WriteBatch(kv, 3, /*branch=*/1);
  ASSERT_TRUE(kv.Restore(&*snap, 7));
  EXPECT_EQ(IdsOf(kv.log()), Ids(0, 7));
}

TEST(RefKvCache, RestoreBelowTheSnapshotStartActsAsARewind) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  const RefSnap snap = kv.Snapshot(5);
  ASSERT_TRUE(snap.has_value());
  ASSERT_TRUE(kv.Restore(&*snap, 3));
  EXPECT_EQ(IdsOf(kv.log()), Ids(0, 3));
}

TEST(RefKvCache, RestoreOfNullNeverCreatesState) {
  RefCache kv = RefCache::Kv();
  EXPECT_TRUE(kv.Restore(nullptr, 0));
  EXPECT_FALSE(kv.HasState());
  EXPECT_FALSE(kv.Snapshot(0).has_value());
}

TEST(RefKvCache, SplitDividesAnEdgeAtThePosition) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  auto [parent, child] = kv.Split(kv.Snapshot(0), 5);
  ASSERT_TRUE(SnapIs(parent, 0, 5, Ids(0, 5)));
  ASSERT_TRUE(SnapIs(child, 5, 10, Ids(5, 10)));
  RefCache fresh = RefCache::Kv();
  ASSERT_TRUE(fresh.Restore(&*parent, 5));
  EXPECT_EQ(fresh.Offset(), 5);
  ASSERT_TRUE(fresh.Restore(&*child, 10));
  EXPECT_EQ(IdsOf(fresh.log()), Ids(0, 10));
}

TEST(RefKvCache, SplitAtOrOutsideTheEdgeKeepsTheWholeSnapshotOnOneSide) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  const RefSnap whole = kv.Snapshot(2);
  ASSERT_TRUE(whole.has_value());
  for (int64_t at : {0, 2}) {
    auto [parent, child] = kv.Split(whole, at);
    EXPECT_FALSE(parent.has_value());
    ASSERT_TRUE(SnapIs(child, 2, 10, Ids(2, 10)));
  }
  for (int64_t at : {10, 12}) {
    auto [parent, child] = kv.Split(whole, at);
    ASSERT_TRUE(SnapIs(parent, 2, 10, Ids(2, 10)));
    EXPECT_FALSE(child.has_value());
  }
}

TEST(RefKvCache, SplitOfNullIsANullPair) {
  auto [parent, child] = RefCache::Kv().Split(std::nullopt, 3);
  EXPECT_FALSE(parent.has_value());
  EXPECT_FALSE(child.has_value());
}

TEST(RefKvCache, SplitThenMergeRestoresTheOriginalEdge) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  auto [parent, child] = kv.Split(kv.Snapshot(0), 6);
  const RefSnap merged = kv.Merge(parent, child);
  ASSERT_TRUE(SnapIs(merged, 0, 10, Ids(0, 10)));
  RefCache fresh = RefCache::Kv();
  ASSERT_TRUE(fresh.Restore(&*merged, 10));
  EXPECT_EQ(fresh.Offset(), 10);
}

TEST(RefKvCache, MergeWithANullSideIsNull) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  const RefSnap snap = kv.Snapshot(0);
  ASSERT_TRUE(snap.has_value());
  EXPECT_FALSE(kv.Merge(snap, std::nullopt).has_value());
  EXPECT_FALSE(kv.Merge(std::nullopt, snap).has_value());
}

TEST(RefKvCacheDeathTest, MergeOfNonAdjacentEdgesAborts) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 10);
  auto [parent, child] = kv.Split(kv.Snapshot(0), 5);
  EXPECT_DEATH(static_cast<void>(kv.Merge(child, parent)), "non-adjacent");
}

TEST(RefKvCache, FreeDropsStateLogAndSchedule) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 3);
  ASSERT_TRUE(kv.PrepareSnapshots({12}).ok());
  kv.Free();
  EXPECT_EQ(kv.Offset(), 0);
  EXPECT_FALSE(kv.HasState());
  EXPECT_FALSE(kv.ScheduleActive());
  EXPECT_TRUE(kv.TakeSnapshots().empty());
}

// ---- Rotating, sliding window (§1.2 row 2, §2.2, §5.1 sliding fake) ----

TEST(RefRotatingCache, LiveRewindIsRefusedAfterTheWindowWrapped) {
  RefCache rot = RefCache::Rotating(4);
  WriteSingles(rot, 5);
  EXPECT_FALSE(rot.Restore(nullptr, 4));
  WriteSingles(rot, 5);
  EXPECT_FALSE(rot.Restore(nullptr, 3));
  EXPECT_EQ(rot.Offset(), 10);
}

TEST(RefRotatingCache, LiveRewindIsAllowedUpToAFullUnwrappedWindow) {
  RefCache rot = RefCache::Rotating(8);
  WriteBatch(rot, 2);
  WriteSingles(rot, 6);
  ASSERT_TRUE(rot.Restore(nullptr, 2));  // offset 8 == W has not wrapped
  WriteBatch(rot, 3, /*branch=*/1);
  EXPECT_EQ(IdsOf(rot.log()), Concat(Ids(0, 2), Ids(2, 5, 1)));
}

TEST(RefRotatingCache, LiveRestoreAtOrBeyondTheOffsetSucceedsOnlyAtTheOffset) {
  RefCache rot = RefCache::Rotating(4);
  WriteSingles(rot, 10);
  EXPECT_TRUE(rot.Restore(nullptr, 10));
  EXPECT_FALSE(rot.Restore(nullptr, 11));
  EXPECT_EQ(rot.Offset(), 10);
}

TEST(RefRotatingCache, RestoreRefusesANegativeTarget) {
  RefCache rot = RefCache::Rotating(4);
  WriteSingles(rot, 3);
  const RefSnap snap = rot.Snapshot(0);
  ASSERT_TRUE(snap.has_value());
  EXPECT_FALSE(rot.Restore(nullptr, -1));
  EXPECT_FALSE(rot.Restore(&*snap, -1));
  EXPECT_EQ(rot.Offset(), 3);
}

TEST(RefRotatingCache, SnapshotIsTheWholeLogEndingAtTheOffset) {
  RefCache rot = RefCache::Rotating(4);
  EXPECT_FALSE(rot.Snapshot(0).has_value());
  WriteSingles(rot, 10);
  ASSERT_TRUE(SnapIs(rot.Snapshot(6), 6, 10, Ids(0, 10)));  // `from` only labels the range
  EXPECT_FALSE(rot.Snapshot(10).has_value());
}

TEST(RefRotatingCache, SnapshotRestoreIgnoresTheCurrentOffset) {
  RefCache rot = RefCache::Rotating(4);
  WriteSingles(rot, 10);
  const RefSnap snap = rot.Snapshot(0);
  ASSERT_TRUE(snap.has_value());
  WriteSingles(rot, 5);
  ASSERT_TRUE(rot.Restore(&*snap, 10));
  EXPECT_EQ(IdsOf(rot.log()), Ids(0, 10));
  RefCache fresh = RefCache::Rotating(4);
  ASSERT_TRUE(fresh.Restore(&*snap, 10));
  EXPECT_TRUE(fresh.HasState());
  EXPECT_EQ(fresh.Offset(), 10);
}

TEST(RefRotatingCache, ClampingAFullWindowSnapshotIsRefused) {
  RefCache rot = RefCache::Rotating(4);
  WriteSingles(rot, 10);
  const RefSnap snap = rot.Snapshot(0);
  ASSERT_TRUE(snap.has_value());
  EXPECT_FALSE(rot.Restore(&*snap, 9));
  EXPECT_EQ(rot.Offset(), 10);
}

TEST(RefRotatingCache, ClampingAnUnwrappedSnapshotIsAllowed) {
  RefCache rot = RefCache::Rotating(4);
  WriteSingles(rot, 4);
  const RefSnap snap = rot.Snapshot(0);  // to == W: not wrapped
  ASSERT_TRUE(snap.has_value());
  WriteSingles(rot, 3);
  ASSERT_TRUE(rot.Restore(&*snap, 2));
  EXPECT_EQ(IdsOf(rot.log()), Ids(0, 2));
}

TEST(RefRotatingCache, RestoreBeyondTheSnapshotEndIsRefused) {
  RefCache rot = RefCache::Rotating(4);
  WriteSingles(rot, 3);
  const RefSnap snap = rot.Snapshot(0);
  ASSERT_TRUE(snap.has_value());
  WriteSingles(rot, 2);
  EXPECT_FALSE(rot.Restore(&*snap, 4));
  EXPECT_EQ(rot.Offset(), 5);
}

TEST(RefRotatingCache, RestoreOfNullNeverCreatesState) {
  RefCache rot = RefCache::Rotating(4);
  EXPECT_TRUE(rot.Restore(nullptr, 0));
  EXPECT_FALSE(rot.Restore(nullptr, 1));
  EXPECT_FALSE(rot.HasState());
}

TEST(RefRotatingCache, MergeKeepsTheChildAndSplitKeepsNothingForTheParent) {
  RefCache rot = RefCache::Rotating(4);
  WriteSingles(rot, 3);
  const RefSnap parent = rot.Snapshot(0);
  ASSERT_TRUE(parent.has_value());
  WriteSingles(rot, 3);
  const RefSnap child = rot.Snapshot(3);
  ASSERT_TRUE(child.has_value());
  ASSERT_TRUE(SnapIs(rot.Merge(parent, child), 3, 6, Ids(0, 6)));
  EXPECT_FALSE(rot.Merge(parent, std::nullopt).has_value());
  auto [left, right] = rot.Split(child, 4);
  EXPECT_FALSE(left.has_value());
  ASSERT_TRUE(SnapIs(right, 3, 6, Ids(0, 6)));
}

// ---- Rotating buffer rows Dim (§2.2 update / concat / restore, §7 snapshot sizes) ----

// Decodes grow a linear buffer by min(256, W - offset) once the offset reaches its rows,
// and stop at W; the ring then stays at W rows.
TEST(RefRotatingRows, DecodesGrowByTheStepUpToTheWindow) {
  RefCache rot = RefCache::Rotating(600);
  EXPECT_EQ(rot.rotating_rows(), 0);
  WriteSingles(rot, 1);
  EXPECT_EQ(rot.rotating_rows(), 256);
  WriteSingles(rot, 255);  // offset 256 = rows: the next decode grows
  EXPECT_EQ(rot.rotating_rows(), 256);
  WriteSingles(rot, 1);
  EXPECT_EQ(rot.rotating_rows(), 512);
  WriteSingles(rot, 256);  // offset 513: grew by min(256, 600 - 512) = 88 at offset 512
  EXPECT_EQ(rot.rotating_rows(), 600);
  WriteSingles(rot, 200);  // wrapped
  EXPECT_EQ(rot.rotating_rows(), 600);
}

// A batched write keeps min(offset, W - 1) old rows and appends all L; the next decode
// cuts the oversize buffer to W.
TEST(RefRotatingRows, ABatchKeepsWMinusOneOldRowsAndADecodeCutsToW) {
  RefCache rot = RefCache::Rotating(8);
  WriteBatch(rot, 5);
  EXPECT_EQ(rot.rotating_rows(), 5);
  WriteBatch(rot, 6);  // min(5, 7) + 6
  EXPECT_EQ(rot.rotating_rows(), 11);
  WriteBatch(rot, 3);  // min(11, 7) + 3
  EXPECT_EQ(rot.rotating_rows(), 10);
  WriteSingles(rot, 1);
  EXPECT_EQ(rot.rotating_rows(), 8);
  WriteBatch(rot, 2);  // a wrapped ring of 8 is linearized, then 7 kept
  EXPECT_EQ(rot.rotating_rows(), 9);
}

// A live rewind keeps the buffer (the grow padding and the rows above the target); the
// next batch cuts it to the offset first.
TEST(RefRotatingRows, ALiveRewindKeepsTheRowsAndABatchCutsToTheOffset) {
  RefCache rot = RefCache::Rotating(300);
  WriteSingles(rot, 10);
  EXPECT_EQ(rot.rotating_rows(), 256);
  ASSERT_TRUE(rot.Restore(nullptr, 4));
  EXPECT_EQ(rot.rotating_rows(), 256);
  WriteSingles(rot, 1);  // offset 4 < 256 rows: no growth
  EXPECT_EQ(rot.rotating_rows(), 256);
  WriteBatch(rot, 3);  // min(5, 299) + 3
  EXPECT_EQ(rot.rotating_rows(), 8);
}

// Snapshots: an eager clone holds min(offset, Dim) rows (never the grow padding), a capture
// right after a batch is the window slice of min(o, W) rows; a restore installs the
// snapshot's rows, and Free drops the buffer.
TEST(RefRotatingRows, SnapshotsHoldStateOrWindowRowsAndRestoreInstallsThem) {
  RefCache rot = RefCache::Rotating(4);
  WriteSingles(rot, 2);
  const RefSnap linear = rot.Snapshot(0);
  ASSERT_TRUE(linear.has_value());
  EXPECT_EQ(linear->rows, 2);  // the buffer has 4 rows, State() 2
  ASSERT_TRUE(rot.PrepareSnapshots({5, 9}).ok());
  WriteBatch(rot, 8);  // rows min(2, 3) + 8 = 10; captures at 5 and 9 (start 2 excluded)
  EXPECT_EQ(rot.rotating_rows(), 10);
  const RefSnap oversize = rot.Snapshot(0);
  ASSERT_TRUE(oversize.has_value());
  EXPECT_EQ(oversize->rows, 10);  // a clone of the oversize State()
  const std::vector<RefSnap> taken = rot.TakeSnapshots();
  ASSERT_EQ(taken.size(), 2u);
  ASSERT_TRUE(taken[0].has_value() && taken[1].has_value());
  EXPECT_EQ(taken[0]->rows, 4);  // min(5, W)
  EXPECT_EQ(taken[1]->rows, 4);
  ASSERT_TRUE(rot.Restore(&*oversize, 10));
  EXPECT_EQ(rot.rotating_rows(), 10);
  ASSERT_TRUE(rot.Restore(&*linear, 1));  // clamped: the rows stay the snapshot's
  EXPECT_EQ(rot.rotating_rows(), 2);
  ASSERT_TRUE(rot.Restore(&*taken[0], 5));
  EXPECT_EQ(rot.rotating_rows(), 4);
  rot.Free();
  EXPECT_EQ(rot.rotating_rows(), 0);
  EXPECT_EQ(SnapshotUnits(*oversize), 10);
}

// A single-token write's capture is an eager clone of State(): W rows once wrapped.
TEST(RefRotatingRows, ADecodeCaptureClonesTheState) {
  RefCache rot = RefCache::Rotating(3);
  WriteBatch(rot, 6);  // 6 rows
  ASSERT_TRUE(rot.PrepareSnapshots({7}).ok());
  WriteSingles(rot, 1);  // cut to 3
  const std::vector<RefSnap> taken = rot.TakeSnapshots();
  ASSERT_EQ(taken.size(), 1u);
  ASSERT_TRUE(taken[0].has_value());
  EXPECT_EQ(taken[0]->rows, 3);
}

// ---- Recurrent (§1.2 row 3, §2.3, §5.1 recurrent fake) ----

TEST(RefRecurrentCache, RestoreRequiresTheExactSnapshotOffset) {
  RefCache rec = RefCache::Recurrent();
  WriteBatch(rec, 10);
  const RefSnap snap = rec.Snapshot(0);
  ASSERT_TRUE(snap.has_value());
  WriteBatch(rec, 5);
  EXPECT_FALSE(rec.Restore(&*snap, 5));
  EXPECT_FALSE(rec.Restore(&*snap, 15));
  EXPECT_EQ(rec.Offset(), 15);
  ASSERT_TRUE(rec.Restore(&*snap, 10));
  EXPECT_EQ(IdsOf(rec.log()), Ids(0, 10));
}

TEST(RefRecurrentCache, LiveRestoreSucceedsOnlyAtTheCurrentOffset) {
  RefCache rec = RefCache::Recurrent();
  WriteBatch(rec, 10);
  EXPECT_FALSE(rec.Restore(nullptr, 9));
  EXPECT_FALSE(rec.Restore(nullptr, 11));
  EXPECT_FALSE(rec.Restore(nullptr, -1));
  EXPECT_TRUE(rec.Restore(nullptr, 10));
  EXPECT_EQ(rec.Offset(), 10);
}

TEST(RefRecurrentCache, RestoreForwardOrIntoAFreedCacheIsFine) {
  RefCache rec = RefCache::Recurrent();
  WriteBatch(rec, 10);
  const RefSnap snap = rec.Snapshot(0);
  ASSERT_TRUE(snap.has_value());
  rec.Free();
  ASSERT_TRUE(rec.Restore(&*snap, 10));
  EXPECT_TRUE(rec.HasState());
  RefCache other = RefCache::Recurrent();
  WriteBatch(other, 3, /*branch=*/1);
  ASSERT_TRUE(other.Restore(&*snap, 10));
  EXPECT_EQ(IdsOf(other.log()), Ids(0, 10));
}

TEST(RefRecurrentCache, SnapshotIsTheWholeStateAndIgnoresFrom) {
  RefCache rec = RefCache::Recurrent();
  EXPECT_FALSE(rec.Snapshot(0).has_value());
  WriteBatch(rec, 10);
  ASSERT_TRUE(SnapIs(rec.Snapshot(7), 0, 10, Ids(0, 10)));
  ASSERT_TRUE(SnapIs(rec.Snapshot(12), 0, 10, Ids(0, 10)));
}

TEST(RefRecurrentCache, RestoreOfNullNeverCreatesState) {
  RefCache rec = RefCache::Recurrent();
  EXPECT_TRUE(rec.Restore(nullptr, 0));
  EXPECT_FALSE(rec.HasState());
  EXPECT_FALSE(rec.Snapshot(0).has_value());
}

TEST(RefRecurrentCache, MergeKeepsTheChildAndSplitKeepsNothingForTheParent) {
  RefCache rec = RefCache::Recurrent();
  WriteBatch(rec, 3);
  const RefSnap parent = rec.Snapshot(0);
  ASSERT_TRUE(parent.has_value());
  WriteBatch(rec, 3);
  const RefSnap child = rec.Snapshot(0);
  ASSERT_TRUE(child.has_value());
  ASSERT_TRUE(SnapIs(rec.Merge(parent, child), 0, 6, Ids(0, 6)));
  EXPECT_FALSE(rec.Merge(parent, std::nullopt).has_value());
  auto [left, right] = rec.Split(child, 4);
  EXPECT_FALSE(left.has_value());
  ASSERT_TRUE(SnapIs(right, 0, 6, Ids(0, 6)));
}

// ---- Capture schedule (§1.3, per-kind rules of §2.1-§2.3, shapes of §6.6) ----

TEST(RefCaptureSchedule, KvBaseMovesOnlyAtScheduledOffsets) {
  RefCache kv = RefCache::Kv();
  WriteBatch(kv, 2);
  ASSERT_TRUE(kv.PrepareSnapshots({2, 3, 5}).ok());
  WriteBatch(kv, 2);  // [2, 4)
  WriteBatch(kv, 2);  // [4, 6)
  const std::vector<RefSnap> got = kv.TakeSnapshots();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_FALSE(got[0].has_value());  // zero width: scheduled at the prepare offset
  ASSERT_TRUE(SnapIs(got[1], 2, 3, Ids(2, 3)));
  ASSERT_TRUE(SnapIs(got[2], 3, 5, Ids(3, 5)));  // the unscheduled boundary 4 did not move base
  ASSERT_TRUE(kv.Restore(&*got[1], 3));
  EXPECT_EQ(kv.Offset(), 3);
}

TEST(RefCaptureSchedule, KvBatchedWriteCapturesSingleTokenEdges) {
  RefCache kv = RefCache::Kv();
  WriteSingles(kv, 6);
  ASSERT_TRUE(kv.PrepareSnapshots({7, 8}).ok());
  WriteBatch(kv, 3);
  const std::vector<RefSnap> got = kv.TakeSnapshots();
  ASSERT_EQ(got.size(), 2u);
  ASSERT_TRUE(SnapIs(got[0], 6, 7, Ids(6, 7)));
  ASSERT_TRUE(SnapIs(got[1], 7, 8, Ids(7, 8)));
  const RefSnap merged = kv.Merge(got[0], got[1]);
  ASSERT_TRUE(SnapIs(merged, 6, 8, Ids(6, 8)));
  auto [parent, child] = kv.Split(merged, 7);
  ASSERT_TRUE(SnapIs(parent, 6, 7, Ids(6, 7)));
  ASSERT_TRUE(SnapIs(child, 7, 8, Ids(7, 8)));
}

TEST(RefCaptureSchedule, KvPerTokenScheduleGivesANullFirstEntryThenUnitEdges) {
  for (int64_t accepted = 0; accepted <= 4; ++accepted) {
    RefCache kv = RefCache::Kv();
    WriteSingles(kv, 6);
    ASSERT_TRUE(kv.PrepareSnapshots({6, 7, 8, 9}).ok());
    WriteBatch(kv, 4);
    EXPECT_EQ(kv.Offset(), 10);
    const std::vector<RefSnap> got = kv.TakeSnapshots();
    ASSERT_EQ(got.size(), 4u);
    EXPECT_FALSE(got[0].has_value());
    for (int64_t i = 1; i < 4; ++i) ASSERT_TRUE(SnapIs(got[i], 5 + i, 6 + i, Ids(5 + i, 6 + i)));
    ASSERT_TRUE(kv.Restore(nullptr, 6 + accepted));  // commit by live rewind
    EXPECT_EQ(kv.Offset(), 6 + accepted);
  }
}

TEST(RefCaptureSchedule, OffsetsNeverReachedStayNull) {
  RefCache kv = RefCache::Kv();
  ASSERT_TRUE(kv.PrepareSnapshots({2, 9}).ok());
  WriteBatch(kv, 4);
  const std::vector<RefSnap> got = kv.TakeSnapshots();
  ASSERT_EQ(got.size(), 2u);
  ASSERT_TRUE(SnapIs(got[0], 0, 2, Ids(0, 2)));
  EXPECT_FALSE(got[1].has_value());
}

// Decision: "slot still empty" is the Go nil check, so a zero-width (null) capture does not
// fill its slot; revisiting that offset after a rewind fires again and moves base back.
TEST(RefCaptureSchedule, ZeroWidthCaptureLeavesItsSlotOpenSoARevisitMovesBaseAgain) {
  RefCache kv = RefCache::Kv();
  WriteBatch(kv, 2);
  ASSERT_TRUE(kv.PrepareSnapshots({2, 4, 6}).ok());
  WriteSingles(kv, 1);  // reaches 2: null, base 2
  WriteBatch(kv, 2);    // reaches 4: [2, 4), base 4
  ASSERT_TRUE(kv.Restore(nullptr, 2));
  WriteBatch(kv, 5, /*branch=*/1);  // reaches 2 again (base 2), then 6
  const std::vector<RefSnap> got = kv.TakeSnapshots();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_FALSE(got[0].has_value());
  ASSERT_TRUE(SnapIs(got[1], 2, 4, Ids(2, 4)));
  ASSERT_TRUE(SnapIs(got[2], 2, 6, Ids(2, 6, 1)));
}

TEST(RefCaptureSchedule, RotatingCapturesTheStartBoundaryBeforeTheWrite) {
  RefCache rot = RefCache::Rotating(4);
  WriteSingles(rot, 10);
  ASSERT_TRUE(rot.PrepareSnapshots({10, 11, 12}).ok());
  WriteBatch(rot, 2);
  const std::vector<RefSnap> got = rot.TakeSnapshots();
  ASSERT_EQ(got.size(), 3u);
  ASSERT_TRUE(SnapIs(got[0], 0, 10, Ids(0, 10)));  // Snapshot(0) of the state before the write
  ASSERT_TRUE(SnapIs(got[1], 7, 11, Ids(0, 11)));  // window [o - min(o, W), o)
  ASSERT_TRUE(SnapIs(got[2], 8, 12, Ids(0, 12)));
}

TEST(RefCaptureSchedule, RotatingStartBoundaryAtOffsetZeroIsNull) {
  RefCache rot = RefCache::Rotating(4);
  ASSERT_TRUE(rot.PrepareSnapshots({0, 1}).ok());
  WriteBatch(rot, 2);
  std::vector<RefSnap> got = rot.TakeSnapshots();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_FALSE(got[0].has_value());  // no state yet
  ASSERT_TRUE(SnapIs(got[1], 0, 1, Ids(0, 1)));
  ASSERT_TRUE(rot.Restore(nullptr, 0));  // state kept, offset 0
  ASSERT_TRUE(rot.PrepareSnapshots({0}).ok());
  WriteBatch(rot, 2);
  got = rot.TakeSnapshots();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_FALSE(got[0].has_value());  // state exists but holds nothing
}

TEST(RefCaptureSchedule, RotatingSingleTokenWriteCapturesItsEnd) {
  for (auto [window, before] : {std::pair<int64_t, int64_t>{32, 5}, {4, 10}}) {
    RefCache rot = RefCache::Rotating(window);
    WriteSingles(rot, before);
    ASSERT_TRUE(rot.PrepareSnapshots({before + 1}).ok());
    WriteSingles(rot, 1);
    const std::vector<RefSnap> got = rot.TakeSnapshots();
    ASSERT_EQ(got.size(), 1u);
    const int64_t end = before + 1;
    ASSERT_TRUE(SnapIs(got[0], end - std::min(end, window), end, Ids(0, end)));
    RefCache fresh = RefCache::Rotating(window);
    ASSERT_TRUE(fresh.Restore(&*got[0], end));
    EXPECT_EQ(fresh.Offset(), end);
  }
}

TEST(RefCaptureSchedule, RotatingPerTokenCapturesRestoreEveryAcceptedPrefix) {
  for (auto [window, before] : {std::pair<int64_t, int64_t>{32, 4}, {8, 4}, {4, 10}}) {
    for (int64_t accepted = 0; accepted < 4; ++accepted) {
      RefCache rot = RefCache::Rotating(window);
      WriteSingles(rot, before);
      ASSERT_TRUE(rot.PrepareSnapshots({before, before + 1, before + 2, before + 3}).ok());
      WriteBatch(rot, 4);
      const std::vector<RefSnap> got = rot.TakeSnapshots();
      ASSERT_EQ(got.size(), 4u);
      ASSERT_TRUE(got[accepted].has_value());
      ASSERT_TRUE(rot.Restore(&*got[accepted], before + accepted));
      EXPECT_EQ(IdsOf(rot.log()), Ids(0, before + accepted));
    }
  }
}

TEST(RefCaptureSchedule, RotatingWindowCaptureSurvivesALaterChunk) {
  RefCache rot = RefCache::Rotating(6);
  ASSERT_TRUE(rot.PrepareSnapshots({4, 12}).ok());
  WriteBatch(rot, 8);
  WriteBatch(rot, 8);
  const std::vector<RefSnap> got = rot.TakeSnapshots();
  ASSERT_EQ(got.size(), 2u);
  ASSERT_TRUE(SnapIs(got[0], 0, 4, Ids(0, 4)));
  ASSERT_TRUE(SnapIs(got[1], 6, 12, Ids(0, 12)));
  ASSERT_TRUE(rot.Restore(&*got[0], 4));
  EXPECT_EQ(IdsOf(rot.log()), Ids(0, 4));
  RefCache fresh = RefCache::Rotating(6);
  ASSERT_TRUE(fresh.Restore(&*got[1], 12));
  EXPECT_EQ(fresh.Offset(), 12);
}

TEST(RefCaptureSchedule, RecurrentCapturesTheCurrentOffsetAtPrepare) {
  RefCache rec = RefCache::Recurrent();
  WriteBatch(rec, 5);
  ASSERT_TRUE(rec.PrepareSnapshots({5, 6, 7, 8}).ok());
  WriteBatch(rec, 4);
  EXPECT_EQ(rec.Offset(), 9);
  const std::vector<RefSnap> got = rec.TakeSnapshots();
  ASSERT_EQ(got.size(), 4u);
  for (int64_t k = 0; k < 4; ++k) ASSERT_TRUE(SnapIs(got[k], 0, 5 + k, Ids(0, 5 + k)));
  for (int64_t k : {3, 0, 2, 1}) {  // snapshots are self-contained: any order works
    ASSERT_TRUE(rec.Restore(&*got[k], 5 + k));
    EXPECT_EQ(rec.Offset(), 5 + k);
  }
}

TEST(RefCaptureSchedule, RecurrentPrepareCaptureIsNullWithoutState) {
  RefCache rec = RefCache::Recurrent();
  ASSERT_TRUE(rec.PrepareSnapshots({0, 2}).ok());
  WriteBatch(rec, 2);
  const std::vector<RefSnap> got = rec.TakeSnapshots();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_FALSE(got[0].has_value());
  ASSERT_TRUE(SnapIs(got[1], 0, 2, Ids(0, 2)));
}

TEST(RefCaptureSchedule, TakeDeactivatesAndAnInactiveTakeIsEmpty) {
  RefCache kv = RefCache::Kv();
  EXPECT_TRUE(kv.TakeSnapshots().empty());
  ASSERT_TRUE(kv.PrepareSnapshots({1}).ok());
  EXPECT_TRUE(kv.ScheduleActive());
  EXPECT_EQ(kv.TakeSnapshots().size(), 1u);
  EXPECT_FALSE(kv.ScheduleActive());
  EXPECT_TRUE(kv.TakeSnapshots().empty());
  WriteBatch(kv, 2);  // no schedule: nothing is captured
  EXPECT_TRUE(kv.TakeSnapshots().empty());
}

TEST(RefCaptureSchedule, AnEmptyScheduleStillCountsAsActive) {
  RefCache kv = RefCache::Kv();
  ASSERT_TRUE(kv.PrepareSnapshots({}).ok());
  EXPECT_TRUE(kv.ScheduleActive());
  EXPECT_EQ(kv.PrepareSnapshots({}).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(kv.TakeSnapshots().empty());
  EXPECT_FALSE(kv.ScheduleActive());
}

TEST(RefCaptureSchedule, PrepareWhileActiveIsAFailedPreconditionAndChangesNothing) {
  RefCache kv = RefCache::Kv();
  ASSERT_TRUE(kv.PrepareSnapshots({2}).ok());
  EXPECT_EQ(kv.PrepareSnapshots({1, 3}).code(), StatusCode::kFailedPrecondition);
  WriteBatch(kv, 3);
  const std::vector<RefSnap> got = kv.TakeSnapshots();
  ASSERT_EQ(got.size(), 1u);  // the first schedule is intact
  ASSERT_TRUE(SnapIs(got[0], 0, 2, Ids(0, 2)));
}

TEST(RefCaptureSchedule, PrepareBehindTheOffsetIsAnInvalidArgument) {
  for (RefCache cache : {RefCache::Kv(), RefCache::Rotating(4), RefCache::Recurrent()}) {
    WriteSingles(cache, 5);
    EXPECT_EQ(cache.PrepareSnapshots({3}).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(cache.PrepareSnapshots({5, 6}).code(), StatusCode::kOk);
  }
}

TEST(RefCaptureSchedule, PrepareWithUnsortedOrDuplicateOffsetsIsAnInvalidArgument) {
  RefCache kv = RefCache::Kv();
  EXPECT_EQ(kv.PrepareSnapshots({3, 2}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.PrepareSnapshots({2, 2}).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(kv.ScheduleActive());
  EXPECT_TRUE(kv.PrepareSnapshots({2, 3}).ok());
}

TEST(RefCaptureSchedule, FreeDiscardsTheScheduleAndItsCaptures) {
  RefCache rec = RefCache::Recurrent();
  ASSERT_TRUE(rec.PrepareSnapshots({1, 4}).ok());
  WriteBatch(rec, 2);
  rec.Free();
  EXPECT_FALSE(rec.ScheduleActive());
  EXPECT_TRUE(rec.TakeSnapshots().empty());
  ASSERT_TRUE(rec.PrepareSnapshots({0}).ok());  // a fresh schedule at offset 0
  EXPECT_EQ(rec.TakeSnapshots().size(), 1u);
}

// ---- What attention sees (§2.5, §5.2, §6.4, §6.5) ----

std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> out;
  for (int64_t k = begin; k < end; ++k) out.push_back(k);
  return out;
}

const RefMask kCausal{true, {}, {}};
const RefMask kZero{false, {}, {}};

TEST(RefAttention, FullKvHistoryIsEveryPositionUpToTheWrite) {
  EXPECT_EQ(ExpectedHistoryPositions(RefKind::kKv, 0, 5, 3), Range(0, 8));
  EXPECT_EQ(ExpectedHistoryPositions(RefKind::kKv, 0, 7, 1), Range(0, 8));
}

TEST(RefAttention, RotatingBatchedHistoryKeepsWMinusOneOlderTokens) {
  EXPECT_EQ(ExpectedHistoryPositions(RefKind::kRotating, 4, 0, 6), Range(0, 6));
  EXPECT_EQ(ExpectedHistoryPositions(RefKind::kRotating, 4, 2, 2), Range(0, 4));
  // §6.5 RunnerChunkedPrefill (ids = position + 1): [6..16] then [14..20].
  EXPECT_EQ(ExpectedHistoryPositions(RefKind::kRotating, 4, 8, 8), Range(5, 16));
  EXPECT_EQ(ExpectedHistoryPositions(RefKind::kRotating, 4, 16, 4), Range(13, 20));
}

TEST(RefAttention, RotatingDecodeHistoryIsTheNewestWindow) {
  EXPECT_EQ(ExpectedHistoryPositions(RefKind::kRotating, 4, 9, 1), Range(6, 10));
  EXPECT_EQ(ExpectedHistoryPositions(RefKind::kRotating, 4, 2, 1), Range(0, 3));
}

TEST(RefAttention, KvCausalQuerySeesItsPrefixOnly) {
  EXPECT_EQ(ExpectedVisible(RefKind::kKv, 0, 3, 4, 4, kCausal), Range(0, 5));
  EXPECT_EQ(ExpectedVisible(RefKind::kKv, 0, 7, 1, 7, kCausal), Range(0, 8));
}

TEST(RefAttention, KvZeroMaskSeesTheWholeBatch) {
  EXPECT_EQ(ExpectedVisible(RefKind::kKv, 0, 3, 4, 4, kZero), Range(0, 7));
}

TEST(RefAttention, KvRelaxationReopensItsRectangleOnly) {
  const RefMask relax{true, {RefRect{1, 4, 2, 5}}, {}};
  EXPECT_EQ(ExpectedVisible(RefKind::kKv, 0, 0, 6, 0, relax), Range(0, 1));
  EXPECT_EQ(ExpectedVisible(RefKind::kKv, 0, 0, 6, 1, relax), Range(0, 5));
  EXPECT_EQ(ExpectedVisible(RefKind::kKv, 0, 0, 6, 4, relax), Range(0, 5));
  EXPECT_EQ(ExpectedVisible(RefKind::kKv, 0, 0, 6, 5, relax), Range(0, 6));
  // Half-open on both axes: q_hi and k_hi are outside the rectangle.
  const RefMask ahead{true, {RefRect{1, 3, 2, 5}}, {}};
  EXPECT_EQ(ExpectedVisible(RefKind::kKv, 0, 0, 6, 2, ahead), Range(0, 5));
  EXPECT_EQ(ExpectedVisible(RefKind::kKv, 0, 0, 6, 3, ahead), Range(0, 4));
}

// §6.4 RotatingKVCachePrefillParity: L = 6 into W = 4; manual mask: causal blocks k > q,
// relax reopens, the window blocks k < q - W + 1.
TEST(RefAttention, RotatingPrefillMatchesTheManualMask) {
  const RefMask relax{true, {RefRect{1, 4, 2, 5}}, {}};
  const std::vector<std::vector<int64_t>> zero = {Range(0, 6), Range(0, 6), Range(0, 6),
                                                  Range(0, 6), Range(1, 6), Range(2, 6)};
  const std::vector<std::vector<int64_t>> causal = {Range(0, 1), Range(0, 2), Range(0, 3),
                                                    Range(0, 4), Range(1, 5), Range(2, 6)};
  const std::vector<std::vector<int64_t>> relaxed = {Range(0, 1), Range(0, 5), Range(0, 5),
                                                     Range(0, 5), Range(1, 5), Range(2, 6)};
  for (int64_t p = 0; p < 6; ++p) {
    EXPECT_EQ(ExpectedVisible(RefKind::kRotating, 4, 0, 6, p, kZero), zero[p]) << p;
    EXPECT_EQ(ExpectedVisible(RefKind::kRotating, 4, 0, 6, p, kCausal), causal[p]) << p;
    EXPECT_EQ(ExpectedVisible(RefKind::kRotating, 4, 0, 6, p, relax), relaxed[p]) << p;
  }
}

// The checks read a query's visible positions as ranges (ExpectedVisibleRangesInto, into a
// reused buffer); ExpectedVisible states the same rule position by position. Over seeded
// random forwards and masks (up to two rectangles and two blocks, so ranges split and
// blocks cut pieces of earlier cuts) the two must agree, whatever the buffer held before.
TEST(RefAttention, VisibleRangesAgreeWithThePositionByPositionRule) {
  Rng rng(20261127);
  std::vector<PositionRange> ranges{{100, 200}, {300, 301}};  // stale contents
  const auto rect = [&rng] {
    const auto q_lo = static_cast<int64_t>(rng.Below(12));
    const auto k_lo = static_cast<int64_t>(rng.Below(12));
    return RefRect{q_lo, q_lo + static_cast<int64_t>(rng.Below(6)), k_lo,
                   k_lo + static_cast<int64_t>(rng.Below(8))};
  };
  int64_t split = 0;  // cases where a block left two ranges, so the cut was exercised
  for (int trial = 0; trial < 4000; ++trial) {
    const RefKind kind = rng.Below(2) == 0 ? RefKind::kKv : RefKind::kRotating;
    const auto window = static_cast<int64_t>(1 + rng.Below(6));
    const auto o = static_cast<int64_t>(rng.Below(8));
    const auto query_len = static_cast<int64_t>(1 + rng.Below(6));
    RefMask mask{rng.Below(2) == 0, {}, {}};
    for (uint64_t n = rng.Below(3); n > 0; --n) mask.rects.push_back(rect());
    for (uint64_t n = rng.Below(3); n > 0; --n) mask.blocks.push_back(rect());
    for (int64_t p = o; p < o + query_len; ++p) {
      ExpectedVisibleRangesInto(kind, window, o, query_len, p, mask, ranges);
      std::vector<int64_t> positions;
      for (const PositionRange& r : ranges) {
        ASSERT_LT(r.first, r.end) << "trial " << trial;
        if (!positions.empty()) {
          ASSERT_LT(positions.back(), r.first) << "trial " << trial;
        }
        for (int64_t k = r.first; k < r.end; ++k) positions.push_back(k);
      }
      if (ranges.size() > 1 && !mask.blocks.empty()) ++split;
      ASSERT_EQ(positions, ExpectedVisible(kind, window, o, query_len, p, mask))
          << "trial " << trial << " query " << p;
    }
  }
  EXPECT_GT(split, 100);  // the generator reaches the case the cut exists for
}

TEST(RefAttention, RectangleNeverReopensOutsideTheWindow) {
  const RefMask relax{true, {RefRect{6, 8, 0, 8}}, {}};
  EXPECT_EQ(ExpectedVisible(RefKind::kRotating, 4, 0, 8, 6, relax), Range(3, 8));
}

TEST(RefAttention, RotatingPrefillAfterWrapSeesExactlyWKeysPerQuery) {
  EXPECT_EQ(ExpectedVisible(RefKind::kRotating, 4, 8, 3, 8, kCausal), Range(5, 9));
  EXPECT_EQ(ExpectedVisible(RefKind::kRotating, 4, 8, 3, 10, kCausal), Range(7, 11));
}

TEST(RefAttention, RotatingDecodeSeesTheWholeWindow) {
  EXPECT_EQ(ExpectedVisible(RefKind::kRotating, 4, 9, 1, 9, kCausal), Range(6, 10));
  EXPECT_EQ(ExpectedVisible(RefKind::kRotating, 4, 9, 1, 9, kZero), Range(6, 10));
}

// An additive array's -inf cells stay blocked whatever a rectangle reopens (spec §2.5:
// rectangles reset their cells to 0, then the array is added).
TEST(RefAttention, BlockedCellsStayBlockedUnderARelaxation) {
  const RefMask mask{true, {RefRect{1, 4, 2, 5}}, {RefRect{3, 6, 1, 3}}};
  EXPECT_EQ(ExpectedVisible(RefKind::kKv, 0, 0, 6, 2, mask), Range(0, 5));
  EXPECT_EQ(ExpectedVisible(RefKind::kKv, 0, 0, 6, 3, mask), (std::vector<int64_t>{0, 3, 4}));
  EXPECT_EQ(ExpectedVisible(RefKind::kKv, 0, 0, 6, 5, mask), (std::vector<int64_t>{0, 3, 4, 5}));
  // A decode query on a window: the block cuts the middle of what it sees.
  const RefMask decode{true, {}, {RefRect{9, 10, 7, 9}}};
  EXPECT_EQ(ExpectedVisible(RefKind::kRotating, 4, 9, 1, 9, decode), (std::vector<int64_t>{6, 9}));
}

// The interval form against the per-key rule, exhaustively over small shapes: both kinds,
// windows 1..4, offsets 0..9, forwards 1..5, every query, causal or not, with zero to two
// rectangles taken from a grid that overlaps, touches and leaves gaps, and with no block or
// one blocked rectangle that cuts a range's start, its middle, or whole queries.
TEST(RefAttention, VisibleRangesAreThePerKeyRuleInIntervals) {
  const std::vector<RefRect> grid = {{0, 20, 0, 2}, {2, 6, 3, 5},  {1, 4, 5, 9},
                                     {5, 9, 0, 20}, {3, 4, 8, 12}, {0, 20, 6, 7}};
  const std::vector<RefRect> blocks = {{0, 20, 1, 3}, {2, 5, 0, 20}, {4, 9, 6, 8}};
  std::vector<RefMask> masks;
  for (const bool causal : {true, false}) {
    masks.push_back(RefMask{causal, {}, {}});
    for (size_t a = 0; a < grid.size(); ++a) {
      masks.push_back(RefMask{causal, {grid[a]}, {}});
      for (size_t b = a + 1; b < grid.size(); ++b)
        masks.push_back(RefMask{causal, {grid[a], grid[b]}, {}});
    }
  }
  for (size_t i = 0, unblocked = masks.size(); i < unblocked; ++i) {
    for (const RefRect& b : blocks) masks.push_back(RefMask{masks[i].causal, masks[i].rects, {b}});
  }
  std::vector<PositionRange> ranges;
  int64_t compared = 0;
  for (const RefKind kind : {RefKind::kKv, RefKind::kRotating}) {
    for (int64_t w = 1; w <= 4; ++w) {
      for (int64_t o = 0; o < 10; ++o) {
        for (int64_t l = 1; l <= 5; ++l) {
          for (int64_t p = o; p < o + l; ++p) {
            for (const RefMask& m : masks) {
              ExpectedVisibleRangesInto(kind, w, o, l, p, m, ranges);
              std::vector<int64_t> expanded;
              for (size_t i = 0; i < ranges.size(); ++i) {
                ASSERT_LT(ranges[i].first, ranges[i].end);
                if (i > 0) {
                  ASSERT_GT(ranges[i].first, ranges[i - 1].end) << "adjacent or overlapping";
                }
                for (int64_t k = ranges[i].first; k < ranges[i].end; ++k) expanded.push_back(k);
              }
              ASSERT_EQ(expanded, ExpectedVisible(kind, w, o, l, p, m))
                  << "kind " << static_cast<int>(kind) << " W " << w << " o " << o << " L " << l
                  << " p " << p << " causal " << m.causal << " rects " << m.rects.size();
              ++compared;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 2 * 4 * 10 * 15 * 44 * 4);
}

}  // namespace
}  // namespace kvtwin::model
