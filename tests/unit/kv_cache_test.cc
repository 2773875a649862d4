// Goal: pin KvCache (spec §2.1, v1 eager snapshots) to the contract: capacity growth in
// 256-slot steps without losing data, live rewind, edge-local snapshots and "needs base"
// restores, Merge/Split boundary cases, the capture schedule (spec §1.3), and the
// conformance scenarios of spec §6.1 and §6.6 that apply to v1.
// Method: every K row written for position p holds the tag p + 1 in every element and the
// matching V row holds -(p + 1), so reading column values back tells exactly which
// position a slot or snapshot row holds (and a K/V mix-up shows). Everything is
// deterministic; there is no randomness.
#include "src/kv_cache.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "unit/tagged_rows.h"

namespace kvtwin {
namespace {

using namespace kvtwin::tagged;  // NOLINT: shared tagged-row helpers

History Write(KvCache& cache, const std::vector<float>& tags) {
  return cache.Update(Keys(tags), Values(tags));
}

// `count` single-token writes continuing from the cache's offset.
void WriteSingles(KvCache& cache, int64_t count) {
  for (int64_t i = 0; i < count; ++i) Write(cache, Positions(cache.Offset(), 1));
}

std::vector<float> LiveTags(const KvCache& cache) {
  const History h = cache.View();
  return Tags(*h.k, *h.v, 0, h.length);
}

const KvSnapshot& AsKv(const SnapshotPtr& snap) {
  EXPECT_NE(snap, nullptr);
  return static_cast<const KvSnapshot&>(*snap);
}

std::vector<float> SnapTags(const SnapshotPtr& snap) {
  const KvSnapshot& s = AsKv(snap);
  return Tags(s.k(), s.v(), 0, s.k().rows());
}

// --- spec §6.1 -----------------------------------------------------------------------

TEST(KvCache, SnapshotRestoreNeedsTheBaseBeforeTheSnapshot) {
  KvCache cache;
  WriteSingles(cache, 10);
  SnapshotPtr snap = cache.Snapshot(5);
  cache.Free();
  EXPECT_FALSE(cache.Restore(snap.get(), 10));  // offset 0 < snapshot start 5
  EXPECT_EQ(cache.Offset(), 0);
  EXPECT_FALSE(cache.HasBuffer());
}

TEST(KvCache, DataSurvivesSnapshotRestoreIntoAFreshCache) {
  KvCache cache;
  WriteSingles(cache, 10);
  SnapshotPtr snap = cache.Snapshot(0);
  KvCache fresh;
  ASSERT_TRUE(fresh.Restore(snap.get(), 10));
  EXPECT_EQ(fresh.Offset(), 10);
  EXPECT_EQ(fresh.View().length, 10);
  EXPECT_EQ(LiveTags(fresh), Positions(0, 10));
}

// K and V may be stored in different dtypes (Update takes each side's own): a snapshot keeps
// each side in its own, so a restore into a fresh cache gives back both sides bit for bit.
TEST(KvCache, SnapshotsKeepKAndVEachInItsOwnDtype) {
  KvCache cache;
  const std::vector<float> tags = Positions(0, 5);
  const Tensor k = tagged::Keys(tags, DType::kFloat32);
  const Tensor v = tagged::Values(tags, DType::kBFloat16);
  cache.Update(k, v);
  SnapshotPtr snap = cache.Snapshot(0);
  KvCache fresh;
  ASSERT_TRUE(fresh.Restore(snap.get(), 5));
  const History h = fresh.View();
  ASSERT_EQ(h.length, 5);
  EXPECT_EQ(h.k->dtype(), DType::kFloat32);
  EXPECT_EQ(h.v->dtype(), DType::kBFloat16);
  EXPECT_TRUE(h.k->Rows(0, 5).Equals(k));
  EXPECT_TRUE(h.v->Rows(0, 5).Equals(v));
}

TEST(KvCache, SplitPreservesData) {
  KvCache cache;
  WriteSingles(cache, 10);
  auto [parent, child] = cache.Split(cache.Snapshot(0), 5);
  KvCache fresh;
  ASSERT_TRUE(fresh.Restore(parent.get(), 5));
  EXPECT_EQ(fresh.Offset(), 5);
  EXPECT_EQ(fresh.View().length, 5);
  ASSERT_TRUE(fresh.Restore(child.get(), 10));
  EXPECT_EQ(fresh.Offset(), 10);
  EXPECT_EQ(LiveTags(fresh), Positions(0, 10));
}

TEST(KvCache, SplitMergeRoundTripPreservesData) {
  KvCache cache;
  WriteSingles(cache, 10);
  auto [parent, child] = cache.Split(cache.Snapshot(0), 6);
  SnapshotPtr merged = cache.Merge(std::move(parent), std::move(child));
  ASSERT_NE(merged, nullptr);
  EXPECT_EQ(merged->from(), 0);
  EXPECT_EQ(merged->to(), 10);
  KvCache fresh;
  ASSERT_TRUE(fresh.Restore(merged.get(), 10));
  EXPECT_EQ(fresh.Offset(), 10);
  EXPECT_EQ(LiveTags(fresh), Positions(0, 10));
}

// --- spec §6.6 -----------------------------------------------------------------------

TEST(KvCache, PerTokenSnapshotsAreSingleTokenEdgesAndCommitByLiveRewind) {
  for (int64_t accepted = 0; accepted <= 4; ++accepted) {
    SCOPED_TRACE(accepted);
    KvCache cache;
    WriteSingles(cache, 6);
    ASSERT_TRUE(cache.PrepareSnapshots({6, 7, 8, 9}).ok());
    Write(cache, Positions(6, 4));
    EXPECT_EQ(cache.Offset(), 10);
    std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
    ASSERT_EQ(entries.size(), 4u);
    EXPECT_EQ(entries[0], nullptr);  // zero-width: 6 was the offset at prepare time
    for (int64_t i = 1; i < 4; ++i) {
      const SnapshotPtr& e = entries[static_cast<size_t>(i)];
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->from(), 5 + i);
      EXPECT_EQ(e->to(), 6 + i);
      EXPECT_EQ(SnapTags(e), Positions(5 + i, 1));
    }
    ASSERT_TRUE(cache.Restore(nullptr, 6 + accepted));
    EXPECT_EQ(cache.Offset(), 6 + accepted);
    EXPECT_EQ(LiveTags(cache), Positions(0, 6 + accepted));
  }
}

TEST(KvCache, CapturedEdgesMergeAndSplitBackIntoTheSameEdges) {
  KvCache cache;
  WriteSingles(cache, 6);
  ASSERT_TRUE(cache.PrepareSnapshots({7, 8}).ok());
  Write(cache, Positions(6, 3));
  std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(SnapTags(entries[0]), Positions(6, 1));
  EXPECT_EQ(entries[0]->from(), 6);
  EXPECT_EQ(SnapTags(entries[1]), Positions(7, 1));
  EXPECT_EQ(entries[1]->from(), 7);
  SnapshotPtr merged = cache.Merge(std::move(entries[0]), std::move(entries[1]));
  EXPECT_EQ(merged->from(), 6);
  EXPECT_EQ(merged->to(), 8);
  EXPECT_EQ(SnapTags(merged), Positions(6, 2));
  auto [parent, child] = cache.Split(std::move(merged), 7);
  EXPECT_EQ(parent->from(), 6);
  EXPECT_EQ(parent->to(), 7);
  EXPECT_EQ(SnapTags(parent), Positions(6, 1));
  EXPECT_EQ(child->from(), 7);
  EXPECT_EQ(child->to(), 8);
  EXPECT_EQ(SnapTags(child), Positions(7, 1));
}

TEST(KvCache, PerTokenSnapshotPersistsAcrossWritesAndBaseMovesOnlyAtScheduledOffsets) {
  KvCache cache;
  WriteSingles(cache, 2);
  ASSERT_TRUE(cache.PrepareSnapshots({2, 3, 5}).ok());
  Write(cache, Positions(2, 2));
  Write(cache, Positions(4, 2));
  std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0], nullptr);
  EXPECT_EQ(entries[1]->from(), 2);
  EXPECT_EQ(entries[1]->to(), 3);
  EXPECT_EQ(entries[2]->from(), 3);  // not 4: the write boundary at 4 was not scheduled
  EXPECT_EQ(entries[2]->to(), 5);
  EXPECT_EQ(SnapTags(entries[2]), Positions(3, 2));
  ASSERT_TRUE(cache.Restore(entries[1].get(), 3));
  EXPECT_EQ(cache.Offset(), 3);
  EXPECT_EQ(LiveTags(cache), Positions(0, 3));
}

TEST(KvCache, PrepareSnapshotsBehindTheOffsetIsInvalidArgument) {
  KvCache cache;
  WriteSingles(cache, 5);
  const Status s = cache.PrepareSnapshots({3});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(cache.ScheduleActive());
}

// --- growth --------------------------------------------------------------------------

TEST(KvCache, CapacityGrowsInMultiplesOf256AndKeepsData) {
  KvCache cache;
  Write(cache, Positions(0, 1));
  EXPECT_EQ(cache.Capacity(), 256);
  Write(cache, Positions(1, 255));
  EXPECT_EQ(cache.Capacity(), 256);  // exactly full, no growth
  Write(cache, Positions(256, 1));
  EXPECT_EQ(cache.Capacity(), 512);  // prev 256 is a step multiple: Cap + 256
  Write(cache, Positions(257, 600));
  EXPECT_EQ(cache.Capacity(), 257 + 768);  // prev 257 unaligned: truncate, + ceil(600)
  EXPECT_EQ(LiveTags(cache), Positions(0, 857));
  EXPECT_EQ(cache.LiveBytes(), 1025 * (kKeyCols + kValueCols) * 4);
}

// ceil(L / 256) * 256 at the step's edges, for a first write and for a growth from an
// aligned offset (the simulated forwards are far shorter than a step).
TEST(KvCache, GrowthChunkIsTheForwardRoundedUpToTheStepAtItsEdges) {
  for (const int64_t n : {255, 256, 257, 511, 512, 513}) {
    const int64_t chunk = (n + 255) / 256 * 256;
    KvCache fresh;
    Write(fresh, Positions(0, n));
    EXPECT_EQ(fresh.Capacity(), chunk) << "first write of " << n;
    KvCache grown;
    Write(grown, Positions(0, 256));
    Write(grown, Positions(256, n));
    EXPECT_EQ(grown.Capacity(), 256 + chunk) << "write of " << n << " at 256";
    EXPECT_EQ(LiveTags(grown), Positions(0, 256 + n));
  }
}

TEST(KvCache, GrowthFromAnUnalignedOffsetTruncatesOnlyPadding) {
  KvCache cache;
  Write(cache, Positions(0, 10));
  Write(cache, Positions(10, 300));
  EXPECT_EQ(cache.Capacity(), 10 + 512);
  EXPECT_EQ(LiveTags(cache), Positions(0, 310));
  for (int64_t r = 310; r < cache.Capacity(); ++r) {
    ASSERT_EQ(cache.keys().At(r, 0), 0.0f) << r;
    ASSERT_EQ(cache.values().At(r, 0), 0.0f) << r;
  }
}

TEST(KvCache, GrowthFromAnAlignedOffsetAfterRewindAppendsAChunk) {
  KvCache cache;
  Write(cache, Positions(0, 300));
  EXPECT_EQ(cache.Capacity(), 512);
  ASSERT_TRUE(cache.Restore(nullptr, 256));
  Write(cache, Positions(256, 300));
  EXPECT_EQ(cache.Capacity(), 512 + 512);
  EXPECT_EQ(LiveTags(cache), Positions(0, 556));
}

// --- rewind and restore --------------------------------------------------------------

TEST(KvCache, RewindLeavesStaleRowsButStateLengthIsTheOffset) {
  KvCache cache;
  WriteSingles(cache, 10);
  ASSERT_TRUE(cache.Restore(nullptr, 4));
  EXPECT_EQ(cache.Offset(), 4);
  EXPECT_EQ(cache.View().length, 4);
  EXPECT_EQ(Tags(cache.keys(), cache.values(), 4, 6), Positions(4, 6));  // stale, untouched
  EXPECT_FALSE(cache.Restore(nullptr, 5));  // cannot rewind forward over stale rows
  EXPECT_EQ(cache.Offset(), 4);
  EXPECT_TRUE(cache.Restore(nullptr, 4));
  Write(cache, {40.0f});
  EXPECT_EQ(LiveTags(cache), (std::vector<float>{1, 2, 3, 4, 40}));
}

TEST(KvCache, RestoreRefusesANegativeTarget) {
  KvCache cache;
  WriteSingles(cache, 3);
  SnapshotPtr snap = cache.Snapshot(0);
  EXPECT_FALSE(cache.Restore(nullptr, -1));
  EXPECT_FALSE(cache.Restore(snap.get(), -1));
  EXPECT_EQ(cache.Offset(), 3);
}

TEST(KvCache, RestoreRefusesATargetBeyondTheSnapshotEnd) {
  KvCache cache;
  WriteSingles(cache, 8);
  SnapshotPtr snap = cache.Snapshot(4);
  EXPECT_FALSE(cache.Restore(snap.get(), 9));
  EXPECT_EQ(cache.Offset(), 8);
}

TEST(KvCache, RestoreRefillsFromTheSnapshotStartOverDivergedRows) {
  KvCache cache;
  WriteSingles(cache, 8);
  SnapshotPtr snap = cache.Snapshot(4);
  ASSERT_TRUE(cache.Restore(nullptr, 4));
  Write(cache, {50, 60, 70, 80, 90, 100});    // a different branch, longer than the snapshot
  ASSERT_TRUE(cache.Restore(snap.get(), 6));  // offset 10 >= from 4: base is present
  EXPECT_EQ(cache.Offset(), 6);
  EXPECT_EQ(LiveTags(cache), Positions(0, 6));
  // The refill wrote all of [4, 8) before clamping to the target.
  EXPECT_EQ(Tags(cache.keys(), cache.values(), 6, 2), Positions(6, 2));
}

// A restore refills whatever the cache wrote since the capture, however many writes that
// was: a count of writes kept to tell "untouched since the capture" (an own-snapshot fast
// path) must not wrap. Counts one below, at and past 2^8 and 2^16, each write one row over
// slot 4 after a rewind (another branch, as speculative rollbacks leave it).
TEST(KvCache, ARestoreAfterAPowerOfTwoOfWritesOnAnotherBranchStillRefills) {
  for (int64_t n : {255, 256, 257, 65535, 65536, 65537}) {
    KvCache cache;
    WriteSingles(cache, 8);
    SnapshotPtr snap = cache.Snapshot(4);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(cache.Restore(nullptr, 4));
      Write(cache, {static_cast<float>(1000 + i % 64)});
    }
    ASSERT_TRUE(cache.Restore(snap.get(), 8)) << n << " writes";
    EXPECT_EQ(LiveTags(cache), Positions(0, 8)) << n << " writes";
  }
}

// A restore is a rewind to the snapshot's start and an append of its rows (spec §2.1), also
// when the cache already holds the same leading rows (it re-prefilled the same tokens after
// a Free): the append then grows from offset 0, step-aligned, by a whole chunk (256 + 512),
// not from the live offset past the rows it kept (10 + 512).
TEST(KvCache, RestoreOntoTheSameLeadingRowsIsARewindAndAnAppend) {
  KvCache source;
  Write(source, Positions(0, 300));
  SnapshotPtr snap = source.Snapshot(0);
  KvCache twin;
  Write(twin, Positions(0, 10));
  ASSERT_TRUE(twin.Restore(nullptr, 0));
  Write(twin, Positions(0, 300));
  KvCache same;
  Write(same, Positions(0, 10));
  ASSERT_EQ(same.Capacity(), 256);
  ASSERT_TRUE(same.Restore(snap.get(), 300));
  EXPECT_EQ(same.Offset(), 300);
  EXPECT_EQ(same.Capacity(), twin.Capacity());
  EXPECT_EQ(same.Capacity(), 256 + 512);
  EXPECT_EQ(same.LiveBytes(), twin.LiveBytes());
  EXPECT_EQ(LiveTags(same), Positions(0, 300));
}

TEST(KvCache, RestoreToATargetBelowTheSnapshotStartActsAsARewind) {
  KvCache cache;
  WriteSingles(cache, 8);
  SnapshotPtr snap = cache.Snapshot(4);
  ASSERT_TRUE(cache.Restore(snap.get(), 2));
  EXPECT_EQ(cache.Offset(), 2);
  EXPECT_EQ(LiveTags(cache), Positions(0, 2));
}

TEST(KvCache, SnapshotsAreOwnedCopiesUnaffectedByLaterWrites) {
  KvCache cache;
  WriteSingles(cache, 10);
  SnapshotPtr snap = cache.Snapshot(5);
  ASSERT_TRUE(cache.Restore(nullptr, 5));
  Write(cache, {-1, -2, -3});
  EXPECT_EQ(snap->from(), 5);
  EXPECT_EQ(snap->to(), 10);
  EXPECT_EQ(SnapTags(snap), Positions(5, 5));
}

TEST(KvCache, SnapshotOfAnEmptyRangeOrWithoutBufferIsNull) {
  KvCache cache;
  EXPECT_EQ(cache.Snapshot(0), nullptr);
  WriteSingles(cache, 4);
  EXPECT_EQ(cache.Snapshot(4), nullptr);
  EXPECT_EQ(cache.Snapshot(6), nullptr);
  cache.Free();
  EXPECT_EQ(cache.Snapshot(0), nullptr);
}

TEST(KvCache, SnapshotSizeBytesCountsItsOwnedRows) {
  KvCache f32;
  WriteSingles(f32, 10);
  EXPECT_EQ(f32.Snapshot(3)->SizeBytes(), 7 * (kKeyCols + kValueCols) * 4);
  KvCache bf16;
  bf16.Update(Keys(Positions(0, 10), DType::kBFloat16), Values(Positions(0, 10), DType::kBFloat16));
  EXPECT_EQ(bf16.Snapshot(3)->SizeBytes(), 7 * (kKeyCols + kValueCols) * 2);
}

TEST(KvCache, Bf16RowsRoundTripThroughSnapshotAndRestoreBitExactly) {
  MatF k(5, kKeyCols);
  MatF v(5, kValueCols);
  for (Eigen::Index r = 0; r < 5; ++r) {
    for (Eigen::Index c = 0; c < kKeyCols; ++c) k(r, c) = 1.0f / static_cast<float>(3 + r + 7 * c);
    for (Eigen::Index c = 0; c < kValueCols; ++c) v(r, c) = -3.3f * static_cast<float>(r + c + 1);
  }
  const Tensor kb = Tensor::FromFloat(DType::kBFloat16, k);
  const Tensor vb = Tensor::FromFloat(DType::kBFloat16, v);
  KvCache cache;
  cache.Update(kb, vb);
  SnapshotPtr snap = cache.Snapshot(0);
  EXPECT_TRUE(AsKv(snap).k().Equals(kb));
  EXPECT_TRUE(AsKv(snap).v().Equals(vb));
  KvCache fresh;
  ASSERT_TRUE(fresh.Restore(snap.get(), 5));
  EXPECT_EQ(fresh.keys().dtype(), DType::kBFloat16);
  EXPECT_TRUE(fresh.keys().Rows(0, 5).Equals(kb));
  EXPECT_TRUE(fresh.values().Rows(0, 5).Equals(vb));
}

// A snapshot keeps its K and V rows in its own allocation (KvSnapshot::Make); whatever the
// two sides' dtypes and widths, each side reads back exactly its pieces in order, starts
// aligned for any element type, and neither overlaps the other nor the object.
TEST(KvSnapshot, MakeJoinsEachSidesPiecesApartAndAligned) {
  // K: bf16 rows 3 columns wide, an odd byte count per side, so a V placed right after K
  // would be misaligned for f32.
  MatF k(5, 3);
  MatF v(5, 4);
  for (Eigen::Index r = 0; r < 5; ++r) {
    for (Eigen::Index c = 0; c < 3; ++c) k(r, c) = static_cast<float>(10 * r + c);
    for (Eigen::Index c = 0; c < 4; ++c) v(r, c) = -static_cast<float>(10 * r + c) - 0.5f;
  }
  const Tensor kb = Tensor::FromFloat(DType::kBFloat16, k);
  const Tensor vf = Tensor::FromFloat(DType::kFloat32, v);
  const std::unique_ptr<KvSnapshot> s =
      KvSnapshot::Make(7, 12, {TensorView(kb).Rows(0, 2), TensorView(kb).Rows(2, 3)},
                       {TensorView(vf).Rows(0, 4), TensorView(vf).Rows(4, 1)});
  EXPECT_EQ(s->from(), 7);
  EXPECT_EQ(s->to(), 12);
  EXPECT_TRUE(s->k().Equals(kb));
  EXPECT_TRUE(s->v().Equals(vf));
  EXPECT_EQ(s->SizeBytes(), kb.Bytes() + vf.Bytes());
  const auto at = [](TensorView t) { return reinterpret_cast<uintptr_t>(t.data()); };
  EXPECT_EQ(at(s->k()) % alignof(std::max_align_t), 0u);
  EXPECT_EQ(at(s->v()) % alignof(std::max_align_t), 0u);
  EXPECT_GE(at(s->k()), reinterpret_cast<uintptr_t>(s.get() + 1));
  EXPECT_GE(at(s->v()), at(s->k()) + static_cast<uintptr_t>(kb.Bytes()));
  // Owned: the sources going away or changing leaves the snapshot as it was.
  Tensor source = Keys(Positions(0, 2));
  const std::unique_ptr<KvSnapshot> copy = KvSnapshot::Make(0, 2, {source}, {source});
  source.Set(1, 0, 99.0f);
  EXPECT_EQ(copy->k().At(1, 0), 2.0f);
}

// Widths are whole int64 counts: rows of 2^16 elements and more (many heads times a wide
// head) keep their width, bytes and rows through Make, Split and Merge.
TEST(KvSnapshot, RowsWiderThan16BitsKeepTheirWidth) {
  constexpr Eigen::Index kWide = (Eigen::Index{1} << 16) + 3;
  MatF k = MatF::Zero(3, kWide);
  MatF v = MatF::Zero(3, 2);
  for (Eigen::Index r = 0; r < 3; ++r) {
    k(r, 0) = static_cast<float>(r + 1);
    k(r, kWide - 1) = -static_cast<float>(r + 1);
    v(r, 1) = static_cast<float>(10 * (r + 1));
  }
  const Tensor kt = Tensor::FromFloat(DType::kFloat32, k);
  const Tensor vt = Tensor::FromFloat(DType::kBFloat16, v);
  const std::unique_ptr<KvSnapshot> s = KvSnapshot::Make(4, 7, {kt}, {vt});
  EXPECT_EQ(s->k().cols(), kWide);
  EXPECT_EQ(s->v().cols(), 2);
  EXPECT_TRUE(s->k().Equals(kt));
  EXPECT_TRUE(s->v().Equals(vt));
  EXPECT_EQ(s->SizeBytes(), kt.Bytes() + vt.Bytes());
  KvCache cache;
  auto [parent, child] = cache.Split(KvSnapshot::Make(4, 7, {kt}, {vt}), 5);
  ASSERT_NE(parent, nullptr);
  ASSERT_NE(child, nullptr);
  const auto& p = static_cast<const KvSnapshot&>(*parent);
  EXPECT_EQ(p.k().cols(), kWide);
  EXPECT_EQ(p.k().At(0, kWide - 1), -1.0f);
  const SnapshotPtr merged = cache.Merge(std::move(parent), std::move(child));
  ASSERT_NE(merged, nullptr);
  const auto& m = static_cast<const KvSnapshot&>(*merged);
  EXPECT_TRUE(m.k().Equals(kt));
  EXPECT_TRUE(m.v().Equals(vt));
}

TEST(KvSnapshotDeathTest, MakeChecksEachSidesRowsAndShape) {
  const Tensor k = Keys(Positions(0, 3));
  const Tensor v = Values(Positions(0, 3));
  EXPECT_DEATH(KvSnapshot::Make(0, 4, {k}, {v}), "rows must equal its range length");
  EXPECT_DEATH(KvSnapshot::Make(0, 3, {k}, {TensorView(v).Rows(0, 2)}),
               "rows must equal its range length");
  EXPECT_DEATH(KvSnapshot::Make(0, 6, {k, v}, {v, v}), "share a dtype and column count");
  EXPECT_DEATH(KvSnapshot::Make(3, 3, {k}, {v}), "non-empty");
}

TEST(KvCache, UpdateReturnsEveryPositionWithoutAnApplier) {
  KvCache cache;
  WriteSingles(cache, 3);
  const History h = Write(cache, Positions(3, 4));
  EXPECT_EQ(h.length, 7);
  EXPECT_FALSE(h.has_applier);
  EXPECT_EQ(Tags(*h.k, *h.v, 0, h.length), Positions(0, 7));
}

// --- Merge / Split boundaries --------------------------------------------------------

TEST(KvCache, SplitOfNullIsANullPair) {
  KvCache cache;
  auto [parent, child] = cache.Split(nullptr, 3);
  EXPECT_EQ(parent, nullptr);
  EXPECT_EQ(child, nullptr);
}

TEST(KvCache, SplitAtOrBeforeTheStartGivesEverythingToTheChild) {
  KvCache cache;
  WriteSingles(cache, 8);
  for (int64_t at : {2, 4}) {
    auto [parent, child] = cache.Split(cache.Snapshot(4), at);
    EXPECT_EQ(parent, nullptr);
    EXPECT_EQ(child->from(), 4);
    EXPECT_EQ(SnapTags(child), Positions(4, 4));
  }
}

TEST(KvCache, SplitAtOrAfterTheEndGivesEverythingToTheParent) {
  KvCache cache;
  WriteSingles(cache, 8);
  for (int64_t at : {8, 12}) {
    auto [parent, child] = cache.Split(cache.Snapshot(4), at);
    EXPECT_EQ(child, nullptr);
    EXPECT_EQ(parent->to(), 8);
    EXPECT_EQ(SnapTags(parent), Positions(4, 4));
  }
}

TEST(KvCache, MergeWithANullSideLosesTheWholeEdge) {
  KvCache cache;
  WriteSingles(cache, 8);
  EXPECT_EQ(cache.Merge(cache.Snapshot(4), nullptr), nullptr);
  EXPECT_EQ(cache.Merge(nullptr, cache.Snapshot(4)), nullptr);
  EXPECT_EQ(cache.Merge(nullptr, nullptr), nullptr);
}

TEST(KvCacheDeathTest, MergeOfNonAdjacentSnapshotsAborts) {
  KvCache cache;
  WriteSingles(cache, 8);
  auto [a, rest] = cache.Split(cache.Snapshot(0), 3);
  auto [gap, b] = cache.Split(std::move(rest), 5);
  EXPECT_DEATH((void)cache.Merge(std::move(a), std::move(b)), "non-adjacent");
}

TEST(KvCacheDeathTest, WriteWithADifferentDtypeOrWidthAborts) {
  KvCache cache;
  WriteSingles(cache, 2);
  EXPECT_DEATH(cache.Update(Keys({3}, DType::kBFloat16), Values({3})), "KV write dtype differs");
  EXPECT_DEATH(cache.Update(Keys({3}), Values({3}, DType::kBFloat16)), "KV write dtype differs");
  EXPECT_DEATH(cache.Update(Rows({3}, kKeyCols + 1, 1.0f, DType::kFloat32), Values({3})),
               "KV write column count differs");
  EXPECT_DEATH(cache.Update(Keys({3}), Rows({3}, kValueCols - 1, -1.0f, DType::kFloat32)),
               "KV write column count differs");
  EXPECT_DEATH(cache.Update(Keys({3, 4}), Values({3})), "KV write needs K and V");
}

TEST(KvCache, FirstWriteAfterFreeMaySetANewDtype) {
  KvCache cache;
  WriteSingles(cache, 2);
  cache.Free();
  cache.Update(Keys({1, 2}, DType::kBFloat16), Values({1, 2}, DType::kBFloat16));
  EXPECT_EQ(cache.keys().dtype(), DType::kBFloat16);
  EXPECT_EQ(LiveTags(cache), Positions(0, 2));
}

// --- capture schedule ----------------------------------------------------------------

TEST(KvCache, PrepareSnapshotsWhileAScheduleIsActiveIsFailedPrecondition) {
  KvCache cache;
  ASSERT_TRUE(cache.PrepareSnapshots({1}).ok());
  EXPECT_EQ(cache.PrepareSnapshots({2}).code(), StatusCode::kFailedPrecondition);
  std::vector<SnapshotPtr> taken = cache.TakeSnapshots();
  EXPECT_EQ(taken.size(), 1u);  // the first schedule is intact
}

TEST(KvCache, PrepareSnapshotsRejectsUnsortedOrDuplicateOffsets) {
  KvCache cache;
  EXPECT_EQ(cache.PrepareSnapshots({3, 2}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.PrepareSnapshots({2, 2}).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(cache.ScheduleActive());
}

TEST(KvCache, AnEmptyScheduleStaysActiveUntilTaken) {
  KvCache cache;
  ASSERT_TRUE(cache.PrepareSnapshots({}).ok());
  EXPECT_TRUE(cache.ScheduleActive());
  WriteSingles(cache, 3);
  EXPECT_EQ(cache.PrepareSnapshots({5}).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(cache.TakeSnapshots().empty());
  EXPECT_FALSE(cache.ScheduleActive());
  EXPECT_TRUE(cache.PrepareSnapshots({5}).ok());
}

TEST(KvCache, TakeSnapshotsWithoutAScheduleIsEmpty) {
  KvCache cache;
  WriteSingles(cache, 3);
  EXPECT_TRUE(cache.TakeSnapshots().empty());
}

TEST(KvCache, UnreachedScheduledOffsetsAreNull) {
  KvCache cache;
  ASSERT_TRUE(cache.PrepareSnapshots({2, 9}).ok());
  WriteSingles(cache, 4);
  std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(SnapTags(entries[0]), Positions(0, 2));  // base = offset 0 at prepare time
  EXPECT_EQ(entries[1], nullptr);
}

TEST(KvCache, FreeDropsBuffersOffsetAndTheSchedule) {
  KvCache cache;
  WriteSingles(cache, 3);
  ASSERT_TRUE(cache.PrepareSnapshots({3, 4}).ok());
  WriteSingles(cache, 1);
  cache.Free();
  EXPECT_FALSE(cache.ScheduleActive());
  EXPECT_TRUE(cache.TakeSnapshots().empty());
  EXPECT_EQ(cache.Offset(), 0);
  EXPECT_FALSE(cache.HasBuffer());
  EXPECT_EQ(cache.LiveBytes(), 0);
  EXPECT_EQ(cache.View().length, 0);
  EXPECT_TRUE(cache.PrepareSnapshots({0}).ok());
}

}  // namespace
}  // namespace kvtwin
