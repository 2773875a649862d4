// Goal: pin RotatingCache (spec §2.2, v1 eager snapshots) to the contract: the ring
// (single-token writes), the linearize-trim-append of batched writes, window snapshots
// with the ring cursor, the restore rules of spec §1.2 (live rewind only before the ring
// wraps, clamps only for snapshots that fit the window), and the conformance scenarios of
// spec §6.1, §6.5 and §6.6 that apply to v1.
// Method: K rows carry a tag in every element (token id = position + 1 unless a scenario
// says otherwise) and V rows carry minus that tag. Physical buffer contents are read in
// slot order where the scenario states a buffer; the live window is read back through an
// independent regime reader (spec §4.1: R1 linear, R2 ring, R3 oversize) and compared
// with the trailing min(offset, W) positions. Deterministic; no randomness.
#include "src/rotating_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "unit/tagged_rows.h"

namespace kvtwin {
namespace {

using namespace kvtwin::tagged;  // NOLINT: shared tagged-row helpers

// The last min(offset, W) positions: what the live window must hold, oldest first.
std::vector<float> ExpectedWindow(int64_t offset, int64_t window) {
  const int64_t live = std::min(offset, window);
  return Positions(offset - live, live);
}

History Write(RotatingCache& cache, const std::vector<float>& tags, DType dtype = DType::kFloat32) {
  return cache.Update(Rows(tags, kKeyCols, 1.0f, dtype), Rows(tags, kValueCols, -1.0f, dtype));
}

// `count` single-token writes continuing from the cache's offset (tags = position + 1).
void WriteSingles(RotatingCache& cache, int64_t count) {
  for (int64_t i = 0; i < count; ++i) Write(cache, Positions(cache.Offset(), 1));
}

// One batched write of `count` tokens continuing from the cache's offset.
History WriteBatch(RotatingCache& cache, int64_t count) {
  return Write(cache, Positions(cache.Offset(), count));
}

// State() in slot order: slots [0, min(offset, Dim)).
std::vector<float> StateTags(const RotatingCache& cache) {
  if (!cache.HasBuffer()) return {};
  return Tags(cache.keys(), cache.values(), 0, std::min(cache.Offset(), cache.buffer_rows()));
}

// The live window, oldest first, read by regime (spec §4.1), checking the regime's
// invariants on the way.
std::vector<float> WindowTags(const RotatingCache& cache) {
  const int64_t offset = cache.Offset();
  const int64_t w = cache.window();
  const int64_t dim = cache.HasBuffer() ? cache.buffer_rows() : 0;
  const int64_t idx = cache.ring_idx();
  if (offset <= w) {  // R1 (or R3 that still starts at position 0): slot i = position i
    EXPECT_EQ(idx, offset);
    EXPECT_GE(dim, offset);
    return Tags(cache.keys(), cache.values(), 0, offset);
  }
  if (dim > w) {  // R3: logical order, the window is the trailing W slots
    EXPECT_EQ(idx, dim);
    return Tags(cache.keys(), cache.values(), dim - w, w);
  }
  EXPECT_EQ(dim, w);  // R2: logical j in slot (idx + j) mod W
  EXPECT_TRUE(idx >= 0 && idx <= w);
  std::vector<float> tags;
  for (int64_t j = 0; j < w; ++j) {
    tags.push_back(TagAt(cache.keys(), cache.values(), (idx + j) % w));
  }
  return tags;
}

std::vector<float> WindowOfSnapshot(const SnapshotPtr& snap, int64_t window) {
  RotatingCache fresh(window);
  EXPECT_TRUE(fresh.Restore(snap.get(), snap->to()));
  return WindowTags(fresh);
}

const RotatingSnapshot& AsRotating(const SnapshotPtr& snap) {
  EXPECT_NE(snap, nullptr);
  return static_cast<const RotatingSnapshot&>(*snap);
}

// --- spec §6.1 -----------------------------------------------------------------------

// Every tail length in every regime: R1 (offset <= W), R2 (wrapped, the cursor anywhere in
// the ring) and R3 (oversize after a batch). The speculation wrappers ask for the whole
// window only, so shorter tails of a wrapped ring are held here.
TEST(RotatingCache, LogicalTailIsTheNewestTokensOldestFirstInEveryRegime) {
  const int64_t w = 4;
  for (const int64_t offset : {2, 4, 5, 6, 7, 8, 11}) {
    for (const bool batch : {false, true}) {
      RotatingCache cache(w);
      if (batch) {
        WriteBatch(cache, offset);  // oversize (R3) once offset > W
      } else {
        WriteSingles(cache, offset);  // wrapped (R2) once offset > W
      }
      for (int64_t count = 0; count <= std::min(offset, w); ++count) {
        const auto [k, v] = cache.LogicalTail(count);
        const std::vector<float> got = count == 0 ? std::vector<float>{} : Tags(k, v, 0, count);
        EXPECT_EQ(got, Positions(offset - count, count))
            << "offset " << offset << (batch ? " batch" : " singles") << " count " << count;
      }
    }
  }
}

TEST(RotatingCache, LiveRewindOutsideTheWindowIsRefused) {
  RotatingCache cache(4);
  WriteSingles(cache, 10);
  EXPECT_FALSE(cache.Restore(nullptr, 3));
  EXPECT_EQ(cache.Offset(), 10);
  EXPECT_EQ(WindowTags(cache), ExpectedWindow(10, 4));
}

TEST(RotatingCache, SnapshotPreservesTheWindowAcrossLaterWrites) {
  RotatingCache cache(4);
  WriteSingles(cache, 10);
  SnapshotPtr snap = cache.Snapshot(0);
  WriteSingles(cache, 5);
  ASSERT_TRUE(cache.Restore(snap.get(), 10));
  EXPECT_EQ(cache.Offset(), 10);
  EXPECT_EQ(cache.View().length, 4);
  EXPECT_EQ(WindowTags(cache), ExpectedWindow(10, 4));
}

TEST(RotatingCache, RestoreFromSnapshotRestoresTheCursorForTheNextWrite) {
  RotatingCache cache(4);
  WriteSingles(cache, 6);  // wrapped: idx mid-ring
  SnapshotPtr snap = cache.Snapshot(0);
  WriteSingles(cache, 3);
  ASSERT_TRUE(cache.Restore(snap.get(), 6));
  EXPECT_EQ(cache.ring_idx(), 2);
  WriteSingles(cache, 1);
  EXPECT_EQ(cache.Offset(), 7);
  EXPECT_EQ(cache.View().length, 4);
  EXPECT_EQ(WindowTags(cache), ExpectedWindow(7, 4));
}

// --- spec §6.5 (K values = token ids; buffer read in slot order) ---------------------

TEST(RotatingCache, ConcatMidRotationPreservesContext) {
  RotatingCache cache(4);
  Write(cache, {1, 2, 3});
  for (float t = 4; t <= 9; ++t) Write(cache, {t});
  EXPECT_EQ(cache.ring_idx(), 1);  // ring, cursor mid-buffer
  Write(cache, {10, 11});
  EXPECT_EQ(StateTags(cache), (std::vector<float>{7, 8, 9, 10, 11}));
  EXPECT_EQ(cache.Offset(), 11);
}

TEST(RotatingCache, ConcatAlignedInvariant) {
  RotatingCache cache(4);
  Write(cache, Positions(0, 6));
  Write(cache, {7, 8, 9});
  EXPECT_EQ(StateTags(cache), (std::vector<float>{4, 5, 6, 7, 8, 9}));
  Write(cache, {10});
  std::vector<float> state = StateTags(cache);
  ASSERT_EQ(state.size(), 4u);
  std::sort(state.begin(), state.end());
  EXPECT_EQ(state, (std::vector<float>{7, 8, 9, 10}));
}

TEST(RotatingCache, ConcatAfterDecodeGrowsBufferWithoutPullingInPadding) {
  RotatingCache cache(512);
  Write(cache, {1, 2, 3});
  Write(cache, {4});
  EXPECT_EQ(cache.buffer_rows(), 3 + 256);  // grow padding
  Write(cache, {5, 6, 7});
  EXPECT_EQ(cache.buffer_rows(), 7);
  EXPECT_EQ(StateTags(cache), Positions(0, 7));
}

TEST(RotatingCache, ConcatAfterLiveRewind) {
  RotatingCache cache(8);
  Write(cache, {1, 2});
  for (float t = 3; t <= 8; ++t) Write(cache, {t});
  EXPECT_EQ(cache.Offset(), 8);
  ASSERT_TRUE(cache.Restore(nullptr, 2));
  EXPECT_EQ(cache.Offset(), 2);
  Write(cache, {9, 10, 11});
  EXPECT_EQ(StateTags(cache), (std::vector<float>{1, 2, 9, 10, 11}));
  EXPECT_EQ(cache.buffer_rows(), 5);
  EXPECT_EQ(cache.Offset(), 5);
}

TEST(RotatingCache, ConcatGrowingBuffer) {
  RotatingCache cache(4);
  Write(cache, {1, 2});
  Write(cache, {3, 4});
  EXPECT_EQ(StateTags(cache), (std::vector<float>{1, 2, 3, 4}));
}

TEST(RotatingCache, RunnerChunkedPrefill) {
  RotatingCache cache(4);
  Write(cache, Positions(0, 8));
  Write(cache, Positions(8, 8));
  EXPECT_EQ(StateTags(cache), Positions(5, 11));  // tokens 6..16
  Write(cache, Positions(16, 4));
  EXPECT_EQ(StateTags(cache), Positions(13, 7));  // tokens 14..20
  Write(cache, {21});
  std::vector<float> state = StateTags(cache);
  ASSERT_EQ(state.size(), 4u);
  std::sort(state.begin(), state.end());
  EXPECT_EQ(state, (std::vector<float>{18, 19, 20, 21}));
}

TEST(RotatingCache, MultiTurnChatSimulation) {
  RotatingCache cache(4);
  Write(cache, {1, 2});
  for (float t = 3; t <= 7; ++t) Write(cache, {t});
  EXPECT_EQ(cache.Offset(), 7);
  Write(cache, {8, 9, 10});
  EXPECT_EQ(StateTags(cache), Positions(4, 6));  // tokens 5..10
  for (float t = 11; t <= 14; ++t) Write(cache, {t});
  EXPECT_EQ(cache.Offset(), 14);
  EXPECT_EQ(WindowTags(cache), Positions(10, 4));
  Write(cache, {15, 16});
  EXPECT_EQ(StateTags(cache), Positions(11, 5));  // tokens 12..16
}

TEST(RotatingCache, OffsetIsTheMonotoneTokenCount) {
  RotatingCache cache(4);
  WriteBatch(cache, 3);
  EXPECT_EQ(cache.Offset(), 3);
  for (int64_t expected = 4; expected <= 8; ++expected) {
    WriteSingles(cache, 1);
    EXPECT_EQ(cache.Offset(), expected);
  }
  WriteBatch(cache, 2);
  EXPECT_EQ(cache.Offset(), 10);
  WriteBatch(cache, 7);  // L > W
  EXPECT_EQ(cache.Offset(), 17);
  EXPECT_EQ(WindowTags(cache), ExpectedWindow(17, 4));
}

// --- spec §6.6 (tags = position + 1) -------------------------------------------------

struct Regime {
  int64_t window;
  int64_t before;
};
constexpr Regime kRegimes[] = {{32, 4}, {8, 4}, {4, 10}};

// `before` single writes, a schedule at before..before+3, one batched write of 4.
std::vector<SnapshotPtr> PerTokenCaptures(RotatingCache& cache, int64_t before) {
  WriteSingles(cache, before);
  EXPECT_TRUE(cache.PrepareSnapshots({before, before + 1, before + 2, before + 3}).ok());
  WriteBatch(cache, 4);
  return cache.TakeSnapshots();
}

TEST(RotatingCache, PerTokenSnapshotRestoreGivesTheWindowAtEachAcceptedLength) {
  for (const Regime& r : kRegimes) {
    for (int64_t accepted = 0; accepted < 4; ++accepted) {
      SCOPED_TRACE(testing::Message()
                   << "W=" << r.window << " before=" << r.before << " accepted=" << accepted);
      RotatingCache cache(r.window);
      std::vector<SnapshotPtr> entries = PerTokenCaptures(cache, r.before);
      ASSERT_EQ(entries.size(), 4u);
      const int64_t target = r.before + accepted;
      const SnapshotPtr& e = entries[static_cast<size_t>(accepted)];
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->to(), target);
      ASSERT_TRUE(cache.Restore(e.get(), target));
      EXPECT_EQ(cache.Offset(), target);
      EXPECT_EQ(WindowTags(cache), ExpectedWindow(target, r.window));
      // The restored cursor must place the next single-token write correctly...
      WriteSingles(cache, 1);
      EXPECT_EQ(WindowTags(cache), ExpectedWindow(target + 1, r.window));
      // ...and a batched write must linearize and trim the restored window correctly.
      ASSERT_TRUE(cache.Restore(e.get(), target));
      const History h = WriteBatch(cache, 3);
      const int64_t keys = std::min(target, r.window - 1) + 3;
      EXPECT_EQ(h.length, keys);
      EXPECT_EQ(Tags(*h.k, *h.v, 0, h.length), Positions(target + 3 - keys, keys));
    }
  }
}

TEST(RotatingCache, BatchedWriteCapturesAreWindowSlicesWithALogicalCursor) {
  for (const Regime& r : kRegimes) {
    SCOPED_TRACE(r.window);
    RotatingCache cache(r.window);
    std::vector<SnapshotPtr> entries = PerTokenCaptures(cache, r.before);
    for (int64_t i = 1; i < 4; ++i) {
      const int64_t o = r.before + i;
      const int64_t live = std::min(o, r.window);
      const RotatingSnapshot& s = AsRotating(entries[static_cast<size_t>(i)]);
      EXPECT_EQ(s.from(), o - live);
      EXPECT_EQ(s.to(), o);
      EXPECT_EQ(s.idx(), live);
      EXPECT_EQ(Tags(s.k(), s.v(), 0, s.k().rows()), ExpectedWindow(o, r.window));
      EXPECT_EQ(s.SizeBytes(), live * (kKeyCols + kValueCols) * 4);
    }
  }
}

TEST(RotatingCache, SnapshotScheduledAfterASingleTokenWriteRestoresTheWindow) {
  for (const Regime& r : {Regime{32, 5}, Regime{4, 10}}) {
    SCOPED_TRACE(r.window);
    RotatingCache cache(r.window);
    WriteSingles(cache, r.before);
    ASSERT_TRUE(cache.PrepareSnapshots({r.before + 1}).ok());
    WriteSingles(cache, 1);
    std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
    ASSERT_EQ(entries.size(), 1u);
    ASSERT_NE(entries[0], nullptr);
    const int64_t o = r.before + 1;
    EXPECT_EQ(entries[0]->from(), o - std::min(o, r.window));
    EXPECT_EQ(entries[0]->to(), o);
    WriteSingles(cache, 3);
    ASSERT_TRUE(cache.Restore(entries[0].get(), o));
    EXPECT_EQ(WindowTags(cache), ExpectedWindow(o, r.window));
    EXPECT_EQ(WindowOfSnapshot(entries[0], r.window), ExpectedWindow(o, r.window));
  }
}

TEST(RotatingCache, SnapshotSurvivesALaterChunk) {
  RotatingCache cache(6);
  ASSERT_TRUE(cache.PrepareSnapshots({4, 12}).ok());
  WriteBatch(cache, 8);
  WriteBatch(cache, 8);
  std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
  ASSERT_EQ(entries.size(), 2u);
  ASSERT_TRUE(cache.Restore(entries[0].get(), 4));
  EXPECT_EQ(WindowTags(cache), Positions(0, 4));
  RotatingCache fresh(6);
  ASSERT_TRUE(fresh.Restore(entries[1].get(), 12));
  EXPECT_EQ(WindowTags(fresh), Positions(6, 6));
}

TEST(RotatingCache, StartBoundaryCaptureIsACloneOfTheWindowBeforeTheWrite) {
  RotatingCache cache(4);
  WriteSingles(cache, 6);
  ASSERT_TRUE(cache.PrepareSnapshots({6}).ok());
  WriteBatch(cache, 3);
  std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
  const RotatingSnapshot& s = AsRotating(entries[0]);
  EXPECT_EQ(s.to(), 6);
  EXPECT_EQ(s.idx(), 2);  // ring order and cursor kept as they were
  EXPECT_EQ(Tags(s.k(), s.v(), 0, 4), (std::vector<float>{5, 6, 3, 4}));
  EXPECT_EQ(WindowOfSnapshot(entries[0], 4), ExpectedWindow(6, 4));

  RotatingCache empty(4);
  ASSERT_TRUE(empty.PrepareSnapshots({0, 2}).ok());
  WriteBatch(empty, 2);
  entries = empty.TakeSnapshots();
  EXPECT_EQ(entries[0], nullptr);  // nothing to clone yet
  EXPECT_EQ(WindowOfSnapshot(entries[1], 4), Positions(0, 2));
}

// --- restore rules -------------------------------------------------------------------

TEST(RotatingCache, LiveRewindIsAllowedUntilTheRingWraps) {
  RotatingCache cache(4);
  WriteSingles(cache, 4);  // offset == W: full but not wrapped
  ASSERT_TRUE(cache.Restore(nullptr, 2));
  EXPECT_EQ(cache.Offset(), 2);
  EXPECT_EQ(cache.ring_idx(), 2);
  Write(cache, {30});
  EXPECT_EQ(WindowTags(cache), (std::vector<float>{1, 2, 30}));
  Write(cache, {40, 50});  // offset 5 > W
  const std::vector<float> before = WindowTags(cache);
  EXPECT_FALSE(cache.Restore(nullptr, 4));
  EXPECT_EQ(cache.Offset(), 5);
  EXPECT_EQ(WindowTags(cache), before);
}

TEST(RotatingCache, LiveRestoreToTheCurrentOffsetSucceedsEvenAfterWrap) {
  RotatingCache cache(4);
  WriteSingles(cache, 10);
  EXPECT_TRUE(cache.Restore(nullptr, 10));
  EXPECT_FALSE(cache.Restore(nullptr, 11));
  EXPECT_FALSE(cache.Restore(nullptr, 9));
  EXPECT_FALSE(cache.Restore(nullptr, -1));
  EXPECT_EQ(cache.Offset(), 10);
  RotatingCache empty(4);
  EXPECT_TRUE(empty.Restore(nullptr, 0));
  EXPECT_FALSE(empty.Restore(nullptr, 1));
}

// A restore installs the snapshot's window whatever the cache wrote since the capture: a
// count of writes kept to tell "untouched since the capture" must not wrap. Counts one
// below, at and past 2^8 and 2^16, each write one row over position 4 after a live rewind
// (the ring has not wrapped, so the rewind is allowed).
TEST(RotatingCache, ARestoreAfterAPowerOfTwoOfWritesOnAnotherBranchStillInstallsIt) {
  for (int64_t n : {255, 256, 257, 65535, 65536, 65537}) {
    RotatingCache cache(16);
    WriteSingles(cache, 8);
    SnapshotPtr snap = cache.Snapshot(4);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(cache.Restore(nullptr, 4));
      Write(cache, {static_cast<float>(1000 + i % 64)});
    }
    ASSERT_TRUE(cache.Restore(snap.get(), 8)) << n << " writes";
    EXPECT_EQ(WindowTags(cache), ExpectedWindow(8, 16)) << n << " writes";
  }
}

TEST(RotatingCache, RestoreClampIsRefusedForASnapshotBeyondTheWindow) {
  RotatingCache cache(4);
  WriteSingles(cache, 6);
  SnapshotPtr snap = cache.Snapshot(0);
  WriteSingles(cache, 1);
  EXPECT_FALSE(cache.Restore(snap.get(), 5));
  EXPECT_FALSE(cache.Restore(snap.get(), 7));  // beyond snap.to
  EXPECT_EQ(cache.Offset(), 7);
  EXPECT_EQ(WindowTags(cache), ExpectedWindow(7, 4));
}

TEST(RotatingCache, RestoreClampWithinTheWindowRewindsAndKeepsWritingCorrectly) {
  RotatingCache cache(8);
  WriteSingles(cache, 6);
  SnapshotPtr snap = cache.Snapshot(0);
  WriteSingles(cache, 5);  // wraps
  ASSERT_TRUE(cache.Restore(snap.get(), 3));
  EXPECT_EQ(cache.Offset(), 3);
  EXPECT_EQ(cache.ring_idx(), 3);
  EXPECT_EQ(WindowTags(cache), Positions(0, 3));
  Write(cache, {70});
  EXPECT_EQ(WindowTags(cache), (std::vector<float>{1, 2, 3, 70}));
  ASSERT_TRUE(cache.Restore(snap.get(), 3));
  const History h = Write(cache, {80, 90});
  EXPECT_EQ(Tags(*h.k, *h.v, 0, h.length), (std::vector<float>{1, 2, 3, 80, 90}));
}

TEST(RotatingCache, RestoreIgnoresTheCurrentOffsetAndInstallsTheRingCursor) {
  RotatingCache source(4);
  WriteSingles(source, 6);
  SnapshotPtr snap = source.Snapshot(0);
  RotatingCache far_ahead(4);
  WriteSingles(far_ahead, 20);
  RotatingCache fresh(4);
  for (RotatingCache* cache : {&far_ahead, &fresh}) {
    ASSERT_TRUE(cache->Restore(snap.get(), 6));
    EXPECT_EQ(cache->Offset(), 6);
    EXPECT_EQ(cache->ring_idx(), 2);
    EXPECT_EQ(WindowTags(*cache), ExpectedWindow(6, 4));
    const History h = Write(*cache, Positions(6, 1));
    EXPECT_EQ(h.applier.ring_idx, 3);
    EXPECT_EQ(WindowTags(*cache), ExpectedWindow(7, 4));
  }
}

// --- write mechanics -----------------------------------------------------------------

TEST(RotatingCache, BatchedWriteKeepsExactlyWMinusOneOlderTokens) {
  for (int64_t w : {1, 3, 4, 8}) {
    for (int64_t o = 0; o <= 12; ++o) {
      for (int64_t n : {2, 3, 9}) {
        for (bool prefix_batched : {false, true}) {
          SCOPED_TRACE(testing::Message() << "W=" << w << " o=" << o << " L=" << n
                                          << " batched prefix=" << prefix_batched);
          RotatingCache cache(w);
          if (prefix_batched && o > 1) {
            WriteBatch(cache, o);
          } else {
            WriteSingles(cache, o);
          }
          const History h = WriteBatch(cache, n);
          const int64_t keys = std::min(o, w - 1) + n;
          ASSERT_EQ(h.length, keys);
          EXPECT_EQ(Tags(*h.k, *h.v, 0, keys), Positions(o + n - keys, keys));
          EXPECT_EQ(h.applier.key_len, keys);
          EXPECT_EQ(h.applier.query_len, n);
          EXPECT_EQ(h.applier.window, w);
          EXPECT_EQ(h.applier.ring_idx, keys);
        }
      }
    }
  }
}

TEST(RotatingCache, SingleTokenWriteNeverLeavesTheBufferLargerThanTheWindow) {
  for (int64_t w : {1, 2, 4, 7}) {
    for (int64_t n : {2, 5, 11}) {
      SCOPED_TRACE(testing::Message() << "W=" << w << " L=" << n);
      RotatingCache cache(w);
      WriteSingles(cache, 3);
      WriteBatch(cache, n);
      for (int64_t i = 0; i < w + 2; ++i) {
        const History h = Write(cache, Positions(cache.Offset(), 1));
        EXPECT_LE(cache.buffer_rows(), w);
        EXPECT_EQ(h.length, std::min(cache.Offset(), w));
        EXPECT_EQ(WindowTags(cache), ExpectedWindow(cache.Offset(), w));
      }
    }
  }
}

TEST(RotatingCache, SingleTokenHistoryIsTheRingWithItsCursor) {
  RotatingCache cache(4);
  WriteSingles(cache, 6);
  const History h = Write(cache, Positions(6, 1));
  EXPECT_EQ(h.length, 4);
  ASSERT_TRUE(h.has_applier);
  EXPECT_EQ(h.applier.key_len, 4);
  EXPECT_EQ(h.applier.query_len, 1);
  EXPECT_EQ(h.applier.window, 4);
  EXPECT_EQ(h.applier.ring_idx, 3);
  // Physical ring order: slot s holds logical (s - ring_idx) mod 4 of positions 3..6.
  EXPECT_EQ(Tags(*h.k, *h.v, 0, 4), (std::vector<float>{5, 6, 7, 4}));
}

TEST(RotatingCache, FirstSingleTokenWritesGrowTowardTheWindowOnly) {
  RotatingCache cache(300);
  WriteSingles(cache, 1);
  EXPECT_EQ(cache.buffer_rows(), 256);
  WriteSingles(cache, 256);
  EXPECT_EQ(cache.buffer_rows(), 300);  // second grow is capped at W - offset = 44
  EXPECT_EQ(WindowTags(cache), ExpectedWindow(257, 300));
}

TEST(RotatingCache, ViewOfAnOversizeBufferIsTheTrailingWindowInRingLayout) {
  RotatingCache cache(4);
  WriteBatch(cache, 7);
  EXPECT_EQ(cache.buffer_rows(), 7);
  const History h = cache.View();
  EXPECT_EQ(h.length, 4);
  EXPECT_EQ(h.applier.key_len, 4);
  EXPECT_EQ(h.applier.query_len, 1);
  EXPECT_EQ(h.applier.ring_idx, 0);
  EXPECT_EQ(Tags(*h.k, *h.v, 0, 4), Positions(3, 4));
  EXPECT_EQ(cache.buffer_rows(), 7);  // View does not change the cache
}

TEST(RotatingCache, ViewOfARingOrRewoundBufferIsTheStateWithTheCursor) {
  RotatingCache cache(4);
  WriteSingles(cache, 6);
  History h = cache.View();
  EXPECT_EQ(h.k, &cache.keys());
  EXPECT_EQ(h.length, 4);
  EXPECT_EQ(h.applier.ring_idx, 2);
  RotatingCache linear(8);
  WriteSingles(linear, 6);
  ASSERT_TRUE(linear.Restore(nullptr, 2));
  h = linear.View();
  EXPECT_EQ(h.length, 2);
  EXPECT_EQ(h.applier.ring_idx, 2);
  EXPECT_EQ(Tags(*h.k, *h.v, 0, 2), Positions(0, 2));
}

// --- snapshots, Merge / Split, Free ---------------------------------------------------

TEST(RotatingCache, SnapshotIsNullWithoutBufferOrAtTheOffset) {
  RotatingCache cache(4);
  EXPECT_EQ(cache.Snapshot(0), nullptr);
  WriteSingles(cache, 3);
  EXPECT_EQ(cache.Snapshot(3), nullptr);
  EXPECT_NE(cache.Snapshot(2), nullptr);
}

TEST(RotatingCache, SnapshotIsAnOwnedCloneOfTheStateWithItsSize) {
  RotatingCache ring(4);
  WriteSingles(ring, 6);
  SnapshotPtr snap = ring.Snapshot(5);
  EXPECT_EQ(snap->from(), 5);  // informational
  EXPECT_EQ(snap->to(), 6);
  EXPECT_EQ(snap->SizeBytes(), 4 * (kKeyCols + kValueCols) * 4);
  WriteSingles(ring, 2);  // overwrites ring slots; the clone is unaffected
  EXPECT_EQ(Tags(AsRotating(snap).k(), AsRotating(snap).v(), 0, 4),
            (std::vector<float>{5, 6, 3, 4}));
  RotatingCache oversize(4);
  WriteBatch(oversize, 9);
  EXPECT_EQ(oversize.Snapshot(0)->SizeBytes(), 9 * (kKeyCols + kValueCols) * 4);
  RotatingCache rewound(8);
  WriteSingles(rewound, 6);
  ASSERT_TRUE(rewound.Restore(nullptr, 2));
  EXPECT_EQ(AsRotating(rewound.Snapshot(0)).k().rows(), 2);  // State(), not the padding
}

TEST(RotatingCache, MergeReturnsTheChildAndSplitKeepsTheWholeSnapshot) {
  RotatingCache cache(4);
  WriteSingles(cache, 5);
  SnapshotPtr parent = cache.Snapshot(0);
  WriteSingles(cache, 1);
  SnapshotPtr child = cache.Snapshot(0);
  const CacheSnapshot* child_raw = child.get();
  SnapshotPtr merged = cache.Merge(std::move(parent), std::move(child));
  EXPECT_EQ(merged.get(), child_raw);
  EXPECT_EQ(cache.Merge(cache.Snapshot(0), nullptr), nullptr);  // the window is lost
  auto [p, c] = cache.Split(std::move(merged), 5);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(c.get(), child_raw);
  auto [np, nc] = cache.Split(nullptr, 5);
  EXPECT_EQ(np, nullptr);
  EXPECT_EQ(nc, nullptr);
}

TEST(RotatingCache, FreeDropsBufferCursorAndSchedule) {
  RotatingCache cache(4);
  WriteSingles(cache, 6);
  ASSERT_TRUE(cache.PrepareSnapshots({6, 7}).ok());
  WriteSingles(cache, 1);
  cache.Free();
  EXPECT_FALSE(cache.HasBuffer());
  EXPECT_EQ(cache.Offset(), 0);
  EXPECT_EQ(cache.ring_idx(), 0);
  EXPECT_EQ(cache.LiveBytes(), 0);
  EXPECT_FALSE(cache.ScheduleActive());
  EXPECT_TRUE(cache.TakeSnapshots().empty());
  EXPECT_EQ(cache.View().length, 0);
  Write(cache, {1}, DType::kBFloat16);  // a new first write may pick a new dtype
  EXPECT_EQ(cache.keys().dtype(), DType::kBFloat16);
  EXPECT_EQ(WindowTags(cache), Positions(0, 1));
}

TEST(RotatingCache, PrepareSnapshotsReportsMisuseAsStatus) {
  RotatingCache cache(4);
  WriteSingles(cache, 5);
  EXPECT_EQ(cache.PrepareSnapshots({3}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.PrepareSnapshots({7, 6}).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(cache.ScheduleActive());
  ASSERT_TRUE(cache.PrepareSnapshots({}).ok());
  EXPECT_EQ(cache.PrepareSnapshots({6}).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(cache.TakeSnapshots().empty());
  EXPECT_TRUE(cache.TakeSnapshots().empty());  // no schedule
}

TEST(RotatingCache, Bf16WindowRoundTripsThroughSnapshotBitExactly) {
  MatF k(6, kKeyCols);
  MatF v(6, kValueCols);
  for (Eigen::Index r = 0; r < 6; ++r) {
    for (Eigen::Index c = 0; c < kKeyCols; ++c) k(r, c) = 1.0f / static_cast<float>(3 + r + 7 * c);
    for (Eigen::Index c = 0; c < kValueCols; ++c) v(r, c) = -3.3f * static_cast<float>(r + c + 1);
  }
  const Tensor kb = Tensor::FromFloat(DType::kBFloat16, k);
  const Tensor vb = Tensor::FromFloat(DType::kBFloat16, v);
  RotatingCache cache(4);
  for (int64_t r = 0; r < 6; ++r) cache.Update(kb.Rows(r, 1), vb.Rows(r, 1));
  SnapshotPtr snap = cache.Snapshot(0);
  RotatingCache fresh(4);
  ASSERT_TRUE(fresh.Restore(snap.get(), 6));
  EXPECT_TRUE(fresh.keys().Equals(cache.keys()));
  EXPECT_TRUE(fresh.values().Equals(cache.values()));
  // Ring slot (idx + j) mod 4 holds row 2 + j of the input, bit for bit.
  for (int64_t j = 0; j < 4; ++j) {
    const int64_t slot = (fresh.ring_idx() + j) % 4;
    EXPECT_TRUE(fresh.keys().Rows(slot, 1).Equals(kb.Rows(2 + j, 1)));
    EXPECT_TRUE(fresh.values().Rows(slot, 1).Equals(vb.Rows(2 + j, 1)));
  }
}

// K and V keep their own dtypes (spec §2.1, §2.2: those of the first written keys and
// values), however the first write comes: a single token into a fresh or freed layer (the
// growth path allocates the buffers), or a batch (the buffers adopt the tensors).
TEST(RotatingCache, KAndVKeepTheirOwnDtypesFromAnyFirstWrite) {
  const DType bf = DType::kBFloat16, f32 = DType::kFloat32;
  for (const auto& [k_dtype, v_dtype] : {std::pair{bf, f32}, std::pair{f32, bf}}) {
    for (const int64_t first : {int64_t{1}, int64_t{3}}) {
      for (const bool freed : {false, true}) {
        RotatingCache cache(4);
        if (freed) {
          cache.Update(Rows(Positions(0, 2), kKeyCols, 1.0f, f32),
                       Rows(Positions(0, 2), kValueCols, -1.0f, f32));
          cache.Free();
        }
        const std::string at = "first " + std::to_string(first) + (freed ? " after Free" : "");
        for (int64_t pos = 0; pos < 6; pos += first) {
          const std::vector<float> tags = Positions(pos, first);
          cache.Update(Rows(tags, kKeyCols, 1.0f, k_dtype), Rows(tags, kValueCols, -1.0f, v_dtype));
        }
        ASSERT_TRUE(cache.HasBuffer()) << at;
        EXPECT_EQ(cache.keys().dtype(), k_dtype) << at;
        EXPECT_EQ(cache.values().dtype(), v_dtype) << at;
        EXPECT_EQ(WindowTags(cache), ExpectedWindow(cache.Offset(), 4)) << at;
      }
    }
  }
}

// Every write is held to the first write's dtype and widths, K and V each, and to equal
// row counts, whether it is a single token or a batch and whether the ring has wrapped.
// By the rotating cache's own messages: the tensor copies below would abort on some of
// these too, later and for another reason.
TEST(RotatingCacheDeathTest, WriteOfAnotherShapeOrDtypeAborts) {
  const DType bf = DType::kBFloat16, f32 = DType::kFloat32;
  for (const int64_t before : {int64_t{2}, int64_t{6}}) {  // window 4: unwrapped, wrapped
    for (const int64_t n : {int64_t{1}, int64_t{2}}) {
      const std::vector<float> tags = Positions(before, n);
      const auto write = [&](int64_t k_cols, DType k_dtype, int64_t v_cols, DType v_dtype,
                             int64_t v_rows) {
        RotatingCache cache(4);
        WriteSingles(cache, before);
        cache.Update(Rows(tags, k_cols, 1.0f, k_dtype),
                     Rows(Positions(before, v_rows), v_cols, -1.0f, v_dtype));
      };
      const std::string at = "before " + std::to_string(before) + " n " + std::to_string(n);
      EXPECT_DEATH(write(kKeyCols, bf, kValueCols, f32, n), "rotating write dtype differs") << at;
      EXPECT_DEATH(write(kKeyCols, f32, kValueCols, bf, n), "rotating write dtype differs") << at;
      EXPECT_DEATH(write(kKeyCols + 1, f32, kValueCols, f32, n), "rotating write column count")
          << at;
      EXPECT_DEATH(write(kKeyCols, f32, kValueCols - 1, f32, n), "rotating write column count")
          << at;
      EXPECT_DEATH(write(kKeyCols, f32, kValueCols, f32, n + 1), "rotating write needs K and V")
          << at;
    }
  }
}

}  // namespace
}  // namespace kvtwin
