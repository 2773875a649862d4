// Goal: pin the attention wrappers of src/speculation.h (spec §2.7) to their contract: after
// Commit(n) of a D + 1 token validation forward, a full KV or rotating live cache is exactly
// the cache that got the ordinary writes "prefix, then the first n forward tokens"; the
// history a wrapper hands the forward is the one an ordinary batched write would give
// (spec §5.2); counts <= 0 commit nothing and counts past the forward never reach the bonus
// token; isolated speculation never touches live state; wrappers answer the rest of the
// cache contract as §2.7 says.
// Method: rows are position-tagged (tagged_rows.h), so every row read back names its
// position. Each live cache is compared with a twin built by ordinary writes of the same
// tagged tokens (bit-exact rows, and for rotating caches the whole physical ring: offset,
// cursor, buffer), and with positions derived from the spec alone (windows, visible sets).
// Sweeps: D in {1, 3, 10} x every accept count; windows W in {2, 4, 32} (smaller than D + 1
// too) x prefixes that leave the ring unwrapped, wrapped with the cursor mid-buffer, and
// oversize right after a batched write. Deterministic; no randomness.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "src/attention_mask.h"
#include "src/kv_cache.h"
#include "src/rotating_cache.h"
#include "src/speculation.h"
#include "unit/speculation_fixtures.h"
#include "unit/tagged_rows.h"

namespace kvtwin {
namespace {

using specfx::Attn;
using specfx::Begin;
using specfx::BeginIsolated;
using specfx::HistoryPositions;
using specfx::kDrafts;
using specfx::WriteTagged;

std::vector<int64_t> Range(int64_t first, int64_t count) {
  std::vector<int64_t> out;
  for (int64_t p = first; p < first + count; ++p) out.push_back(p);
  return out;
}

// Per query, the positions it attends: VisibleRows translated through the row tags.
std::vector<std::vector<int64_t>> VisiblePositions(const History& h, const AttentionMask& mask,
                                                   int64_t offset, int64_t query_len) {
  const std::vector<int64_t> positions = HistoryPositions(h);
  Result<std::vector<std::vector<int64_t>>> rows = VisibleRows(h, mask, offset, query_len);
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  std::vector<std::vector<int64_t>> out;
  if (!rows.ok()) return out;
  for (const std::vector<int64_t>& q : *rows) {
    out.emplace_back();
    for (const int64_t r : q) out.back().push_back(positions[static_cast<size_t>(r)]);
  }
  return out;
}

// Spec §5.2: query p attends max(0, p - W + 1)..p (W <= 0: no window, 0..p).
std::vector<std::vector<int64_t>> ModelVisible(int64_t offset, int64_t query_len, int64_t w) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t p = offset; p < offset + query_len; ++p) {
    const int64_t oldest = w > 0 ? std::max<int64_t>(0, p - w + 1) : 0;
    out.push_back(Range(oldest, p - oldest + 1));
  }
  return out;
}

// ---- full KV ------------------------------------------------------------------------

// Positions [0, prefix) in two ordinary writes (a batch, then a decode token).
void FillKv(KvCache& cache, int64_t prefix) {
  if (prefix > 1) WriteTagged(cache, 0, prefix - 1);
  if (prefix > 0) WriteTagged(cache, prefix - 1, 1);
}

void ExpectSameKv(const KvCache& live, const KvCache& twin) {
  const int64_t off = twin.Offset();
  ASSERT_EQ(live.Offset(), off);
  if (off == 0) return;
  EXPECT_TRUE(live.keys().Rows(0, off).Equals(twin.keys().Rows(0, off)));
  EXPECT_TRUE(live.values().Rows(0, off).Equals(twin.values().Rows(0, off)));
  EXPECT_EQ(tagged::Tags(live.keys(), live.values(), 0, off), tagged::Positions(0, off));
}

// 250 + 11 crosses the 256-slot grow step inside the forward.
const std::vector<int64_t> kKvPrefixes = {0, 7, 250};

TEST(KvSpeculation, CommitEqualsOrdinaryWritesOfTheAcceptedTokens) {
  for (const int64_t prefix : kKvPrefixes) {
    for (const int64_t d : kDrafts) {
      for (int64_t a = 0; a <= d; ++a) {
        SCOPED_TRACE(testing::Message() << "prefix " << prefix << " D " << d << " a " << a);
        KvCache live;
        FillKv(live, prefix);
        Speculation spec = Begin({&live});
        WriteTagged(Attn(spec, 0), prefix, d + 1);
        EXPECT_EQ(Attn(spec, 0).Offset(), prefix + d + 1);
        EXPECT_EQ(live.Offset(), prefix + d + 1);  // full KV writes through
        spec.Commit(a + 1);

        KvCache twin;
        FillKv(twin, prefix);
        WriteTagged(twin, prefix, a + 1);
        ExpectSameKv(live, twin);
        // The cursor really moved: the next ordinary token lands right after the commit.
        WriteTagged(live, live.Offset(), 1);
        WriteTagged(twin, twin.Offset(), 1);
        ExpectSameKv(live, twin);
        if (HasFailure()) return;
      }
    }
  }
}

TEST(KvSpeculation, ForwardSeesWhatABatchedForwardSees) {
  for (const int64_t prefix : kKvPrefixes) {
    for (const int64_t d : kDrafts) {
      SCOPED_TRACE(testing::Message() << "prefix " << prefix << " D " << d);
      const int64_t t = d + 1;
      KvCache live;
      FillKv(live, prefix);
      Speculation spec = Begin({&live});
      const History h = WriteTagged(Attn(spec, 0), prefix, t);
      KvCache twin;
      FillKv(twin, prefix);
      const History th = WriteTagged(twin, prefix, t);
      EXPECT_EQ(HistoryPositions(h), Range(0, prefix + t));
      EXPECT_EQ(HistoryPositions(h), HistoryPositions(th));
      EXPECT_FALSE(h.has_applier);
      const AttentionMask causal = AttentionMask::Causal();
      EXPECT_EQ(VisiblePositions(h, causal, prefix, t), ModelVisible(prefix, t, 0));
      EXPECT_EQ(VisiblePositions(h, causal, prefix, t), VisiblePositions(th, causal, prefix, t));
    }
  }
}

// ---- rotating -------------------------------------------------------------------------

enum class Regime { kPartial, kFull, kRing, kOversize };

struct RotPrefix {
  Regime regime;
  std::vector<int64_t> writes;  // sizes of the ordinary prefix writes, in order
};

// Unwrapped (offset < W and == W), wrapped with the ring cursor mid-buffer (a batch of 2,
// then single tokens up to offset 2W + 1), wrapped and oversize right after a batched write.
std::vector<RotPrefix> RotPrefixes(int64_t w) {
  std::vector<int64_t> ring(static_cast<size_t>(2 * w), 1);
  ring[0] = 2;
  return {{Regime::kPartial, {std::max<int64_t>(1, w / 2)}},
          {Regime::kFull, {w - 1, 1}},
          {Regime::kRing, ring},
          {Regime::kOversize, {w + 1, 3}}};
}

const std::vector<int64_t> kWindows = {2, 4, 32};

void FillRot(RotatingCache& cache, const RotPrefix& prefix) {
  for (const int64_t n : prefix.writes) WriteTagged(cache, cache.Offset(), n);
}

// The prefix really produced the storage regime the case is named after.
void ExpectRegime(const RotatingCache& c, Regime regime) {
  const int64_t w = c.window();
  switch (regime) {
    case Regime::kPartial:
      EXPECT_LT(c.Offset(), w);
      break;
    case Regime::kFull:
      EXPECT_EQ(c.Offset(), w);
      break;
    case Regime::kRing:
      EXPECT_GT(c.Offset(), w);
      EXPECT_EQ(c.buffer_rows(), w);
      EXPECT_TRUE(c.ring_idx() > 0 && c.ring_idx() < w) << "cursor " << c.ring_idx();
      break;
    case Regime::kOversize:
      EXPECT_GT(c.Offset(), w);
      EXPECT_GT(c.buffer_rows(), w);
      break;
  }
}

std::vector<int64_t> WindowPositions(const RotatingCache& c) {
  auto [k, v] = c.LogicalTail(std::min(c.Offset(), c.window()));
  std::vector<int64_t> out;
  for (const float tag : tagged::Tags(k, v, 0, k.rows()))
    out.push_back(static_cast<int64_t>(tag) - 1);
  return out;
}

// Same logical window as the spec says, and the same physical ring as the twin.
void ExpectSameRotating(const RotatingCache& live, const RotatingCache& twin) {
  const int64_t off = twin.Offset();
  ASSERT_EQ(live.Offset(), off);
  const int64_t n = std::min(off, live.window());
  EXPECT_EQ(WindowPositions(live), Range(off - n, n));
  EXPECT_EQ(live.ring_idx(), twin.ring_idx());
  EXPECT_EQ(live.HasBuffer(), twin.HasBuffer());
  EXPECT_EQ(live.buffer_rows(), twin.buffer_rows());
  EXPECT_TRUE(live.keys().Equals(twin.keys()));
  EXPECT_TRUE(live.values().Equals(twin.values()));
}

TEST(RotatingSpeculation, CommitEqualsOrdinaryWritesOfTheAcceptedTokens) {
  for (const int64_t w : kWindows) {
    for (const RotPrefix& prefix : RotPrefixes(w)) {
      for (const int64_t d : kDrafts) {
        for (int64_t a = 0; a <= d; ++a) {
          SCOPED_TRACE(testing::Message()
                       << "W " << w << " regime " << static_cast<int>(prefix.regime) << " D " << d
                       << " a " << a);
          RotatingCache live(w);
          FillRot(live, prefix);
          ExpectRegime(live, prefix.regime);
          const RotatingCache before = [&] {
            RotatingCache c(w);
            FillRot(c, prefix);
            return c;
          }();
          const int64_t start = live.Offset();
          Speculation spec = Begin({&live});
          WriteTagged(Attn(spec, 0), start, d + 1);
          EXPECT_EQ(Attn(spec, 0).Offset(), start + d + 1);
          ExpectSameRotating(live, before);  // the forward never touches the live ring
          spec.Commit(a + 1);

          // One ordinary write of exactly the accepted tokens (n == 1: the ring path).
          RotatingCache twin(w);
          FillRot(twin, prefix);
          WriteTagged(twin, start, a + 1);
          ExpectSameRotating(live, twin);
          WriteTagged(live, live.Offset(), 1);
          WriteTagged(twin, twin.Offset(), 1);
          ExpectSameRotating(live, twin);
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST(RotatingSpeculation, ForwardSeesWhatABatchedForwardSees) {
  for (const int64_t w : kWindows) {
    for (const RotPrefix& prefix : RotPrefixes(w)) {
      for (const int64_t d : kDrafts) {
        SCOPED_TRACE(testing::Message()
                     << "W " << w << " regime " << static_cast<int>(prefix.regime) << " D " << d);
        const int64_t t = d + 1;
        RotatingCache live(w);
        FillRot(live, prefix);
        const int64_t start = live.Offset();
        for (const bool isolated : {false, true}) {
          Speculation spec = isolated ? BeginIsolated({&live}) : Begin({&live});
          const History h = WriteTagged(Attn(spec, 0), start, t);
          RotatingCache twin(w);
          FillRot(twin, prefix);
          const History th = WriteTagged(twin, start, t);
          // Spec §5.2: the newest min(live, W - 1) older tokens, then the forward's.
          const int64_t keys = std::min(start, w - 1) + t;
          EXPECT_EQ(HistoryPositions(h), Range(start + t - keys, keys));
          EXPECT_EQ(HistoryPositions(h), HistoryPositions(th));
          ASSERT_TRUE(h.has_applier);
          EXPECT_EQ(h.applier.key_len, keys);
          EXPECT_EQ(h.applier.query_len, t);
          EXPECT_EQ(h.applier.window, w);
          const AttentionMask causal = AttentionMask::Causal();
          EXPECT_EQ(VisiblePositions(h, causal, start, t), ModelVisible(start, t, w));
          EXPECT_EQ(VisiblePositions(h, causal, start, t), VisiblePositions(th, causal, start, t));
          const AttentionMask zero = AttentionMask::Zero();
          EXPECT_EQ(VisiblePositions(h, zero, start, t), VisiblePositions(th, zero, start, t));
          // Read-only View afterwards (invalidates h): the newest W tokens, as the twin's.
          EXPECT_EQ(HistoryPositions(Attn(spec, 0).View()), HistoryPositions(twin.View()));
        }
        if (HasFailure()) return;
      }
    }
  }
}

// ---- commit counts outside [1, D + 1] -----------------------------------------------

// The count is clamped per wrapper, to that wrapper's own forward, never to the shortest
// forward of the speculation: a layer forwarded fewer tokens (or none, as a model that skips
// layers on a draft would) keeps what it wrote, and the others keep the count.
TEST(SpeculationCommit, EachLayerClampsTheCountToItsOwnForward) {
  for (const int64_t short_len : {int64_t{0}, int64_t{2}}) {
    KvCache a;
    KvCache b;
    FillKv(a, 7);
    FillKv(b, 7);
    {
      Speculation spec = Begin({&a, &b});
      WriteTagged(Attn(spec, 0), 7, 4);
      if (short_len > 0) WriteTagged(Attn(spec, 1), 7, short_len);
      spec.Commit(3);
    }
    EXPECT_EQ(a.Offset(), 7 + 3) << "short forward " << short_len;
    EXPECT_EQ(b.Offset(), 7 + short_len) << "short forward " << short_len;
  }
}

TEST(SpeculationCommit, NonPositiveCountsCommitNothing) {
  for (const int64_t d : kDrafts) {
    for (const int64_t n : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
      SCOPED_TRACE(testing::Message() << "D " << d << " n " << n);
      KvCache kv;
      FillKv(kv, 7);
      RotatingCache rot(4);
      FillRot(rot, RotPrefixes(4)[2]);  // wrapped, cursor mid-ring
      {
        Speculation spec = Begin({&kv, &rot});
        WriteTagged(Attn(spec, 0), 7, d + 1);
        WriteTagged(Attn(spec, 1), rot.Offset(), d + 1);
        spec.Commit(n);
      }
      KvCache kv_twin;
      FillKv(kv_twin, 7);
      RotatingCache rot_twin(4);
      FillRot(rot_twin, RotPrefixes(4)[2]);
      ExpectSameKv(kv, kv_twin);
      ExpectSameRotating(rot, rot_twin);
      WriteTagged(kv, kv.Offset(), 1);  // lands at 7, over the rejected row
      WriteTagged(kv_twin, 7, 1);
      ExpectSameKv(kv, kv_twin);
    }
  }
}

// A speculation is movable (Result<Speculation> returns it; callers keep it in a
// container): a moved one carries its state, open or committed, and the husk owns nothing.
// So a committed speculation moved afterwards keeps its commit, and an open one moved
// rolls back once, when its new owner goes.
TEST(SpeculationCommit, AMovedSpeculationKeepsItsStateAndTheHuskOwnsNothing) {
  KvCache committed;
  RotatingCache open(4);
  FillKv(committed, 7);
  FillRot(open, RotPrefixes(4)[2]);
  const int64_t open_before = open.Offset();
  {
    Speculation spec = Begin({&committed});
    WriteTagged(Attn(spec, 0), 7, 3);
    spec.Commit(2);
    std::vector<Speculation> kept;
    kept.push_back(std::move(spec));
    EXPECT_TRUE(kept.back().committed());
    Speculation rolled = Begin({&open});
    WriteTagged(Attn(rolled, 0), open_before, 2);
    kept.push_back(std::move(rolled));
    EXPECT_FALSE(kept.back().committed());
  }  // kept, then the husks, go: one rollback (of `open`), no second commit
  EXPECT_EQ(committed.Offset(), 7 + 2);
  RotatingCache twin(4);
  FillRot(twin, RotPrefixes(4)[2]);
  ExpectSameRotating(open, twin);
}

TEST(SpeculationCommit, TheBonusTokenIsNeverCommitted) {
  for (const int64_t d : kDrafts) {
    // Any count past the forward is clamped, up to the largest (no overflow on the way).
    for (const int64_t n : {d + 1, d + 7, std::numeric_limits<int64_t>::max()}) {
      SCOPED_TRACE(testing::Message() << "D " << d << " n " << n);
      KvCache kv;
      FillKv(kv, 7);
      RotatingCache rot(4);
      FillRot(rot, RotPrefixes(4)[3]);  // wrapped, oversize
      const int64_t rot_start = rot.Offset();
      {
        Speculation spec = Begin({&kv, &rot});
        WriteTagged(Attn(spec, 0), 7, d + 1);
        WriteTagged(Attn(spec, 1), rot_start, d + 1);
        spec.Commit(n);
      }
      EXPECT_EQ(kv.Offset(), 7 + d + 1);
      EXPECT_EQ(rot.Offset(), rot_start + d + 1);
      KvCache kv_twin;
      FillKv(kv_twin, 7);
      WriteTagged(kv_twin, 7, d + 1);
      RotatingCache rot_twin(4);
      FillRot(rot_twin, RotPrefixes(4)[3]);
      WriteTagged(rot_twin, rot_start, d + 1);
      ExpectSameKv(kv, kv_twin);
      ExpectSameRotating(rot, rot_twin);
    }
  }
}

// ---- isolated speculation -------------------------------------------------------------

TEST(IsolatedSpeculation, KvSeesLiveThenForwardAndLeavesLiveUntouched) {
  for (const int64_t prefix : {int64_t{0}, int64_t{7}}) {
    SCOPED_TRACE(testing::Message() << "prefix " << prefix);
    KvCache live;
    FillKv(live, prefix);
    const bool had_buffer = live.HasBuffer();
    const int64_t capacity = live.Capacity();
    const Tensor keys = live.keys();
    const Tensor values = live.values();
    {
      Speculation spec = BeginIsolated({&live});
      EXPECT_TRUE(spec.isolated());
      EXPECT_EQ(HistoryPositions(WriteTagged(Attn(spec, 0), prefix, 4)), Range(0, prefix + 4));
      // A second write accumulates: [live ; both writes].
      const History h = WriteTagged(Attn(spec, 0), prefix + 4, 1);
      EXPECT_EQ(HistoryPositions(h), Range(0, prefix + 5));
      EXPECT_EQ(Attn(spec, 0).Offset(), prefix + 5);
      EXPECT_EQ(live.Offset(), prefix);
    }
    EXPECT_EQ(live.Offset(), prefix);
    EXPECT_EQ(live.HasBuffer(), had_buffer);
    EXPECT_EQ(live.Capacity(), capacity);
    EXPECT_TRUE(live.keys().Equals(keys));
    EXPECT_TRUE(live.values().Equals(values));
  }
}

TEST(IsolatedSpeculation, RotatingLeavesLiveUntouched) {
  for (const int64_t w : kWindows) {
    for (const RotPrefix& prefix : RotPrefixes(w)) {
      SCOPED_TRACE(testing::Message()
                   << "W " << w << " regime " << static_cast<int>(prefix.regime));
      RotatingCache live(w);
      FillRot(live, prefix);
      RotatingCache twin(w);
      FillRot(twin, prefix);
      {
        Speculation spec = BeginIsolated({&live});
        WriteTagged(Attn(spec, 0), live.Offset(), 11);
        WriteTagged(Attn(spec, 0), live.Offset() + 11, 1);
        EXPECT_EQ(Attn(spec, 0).Offset(), twin.Offset() + 12);
        ExpectSameRotating(live, twin);
      }
      ExpectSameRotating(live, twin);
    }
  }
}

// ---- spec §2.7 contract answers -------------------------------------------------------

TEST(SpeculationWrappers, AttentionWrappersAnswerTheRestOfTheContract) {
  for (const bool isolated : {false, true}) {
    SCOPED_TRACE(isolated ? "isolated" : "committing");
    KvCache kv, kv_donor, kv_twin;
    for (KvCache* c : {&kv, &kv_donor, &kv_twin}) FillKv(*c, 7);
    RotatingCache rot(4), rot_donor(4), rot_twin(4);
    for (RotatingCache* c : {&rot, &rot_donor, &rot_twin}) FillRot(*c, RotPrefixes(4)[2]);
    const int64_t rot_start = rot.Offset();
    Speculation spec = isolated ? BeginIsolated({&kv, &rot}) : Begin({&kv, &rot});
    WriteTagged(Attn(spec, 0), 7, 4);
    WriteTagged(Attn(spec, 1), rot_start, 4);
    specfx::ExpectWrapperContract(
        spec.layer(0), CacheKind::kFullKv, [&] { return kv_donor.Snapshot(0); }, 11);
    specfx::ExpectWrapperContract(
        spec.layer(1), CacheKind::kRotating, [&] { return rot_donor.Snapshot(0); }, rot_start + 4);
    if (isolated) continue;
    // Nothing above (Free included) changed what the commit keeps.
    spec.Commit(2);
    WriteTagged(kv_twin, 7, 2);
    WriteTagged(rot_twin, rot_start, 2);
    ExpectSameKv(kv, kv_twin);
    ExpectSameRotating(rot, rot_twin);
  }
}

// spec §2.7's refusals: a null layer or one listed twice is InvalidArgument, naming the
// layer, and a speculation wrapper (not a live cache) is Unsupported; a refused begin wraps
// nothing, so no live cache moves. Layers listed more than once anywhere in the list count,
// not only neighbours.
TEST(SpeculationBegin, RefusesANullARepeatedOrAWrappedLayer) {
  for (const bool isolated : {false, true}) {
    SCOPED_TRACE(isolated ? "isolated" : "committing");
    const auto begin = [isolated](std::vector<LayerCache*> layers) {
      return isolated ? BeginIsolatedSpeculation(layers) : BeginSpeculation(layers);
    };
    KvCache kv, kv2;
    RotatingCache rot(4);
    FillKv(kv, 5);
    FillKv(kv2, 3);
    FillRot(rot, RotPrefixes(4)[1]);
    const auto refused = [&](std::vector<LayerCache*> layers, StatusCode code,
                             const std::string& says) {
      const Result<Speculation> s = begin(std::move(layers));
      ASSERT_FALSE(s.ok());
      EXPECT_EQ(s.status().code(), code);
      EXPECT_NE(s.status().message().find(says), std::string::npos) << s.status().ToString();
    };
    refused({&kv, nullptr}, StatusCode::kInvalidArgument, "layer 1 is null");
    refused({&kv, &rot, &kv}, StatusCode::kInvalidArgument, "layer 2 is listed twice");
    refused({&kv, &rot, &kv2, &rot}, StatusCode::kInvalidArgument, "layer 3 is listed twice");
    refused({&rot, &rot}, StatusCode::kInvalidArgument, "layer 1 is listed twice");
    Speculation outer = Begin({&kv2});
    refused({&kv, &outer.layer(0)}, StatusCode::kUnsupported, "layer 1");
    EXPECT_EQ(kv.Offset(), 5);
    EXPECT_EQ(rot.Offset(), 4);
    EXPECT_TRUE(begin({&kv, &kv2, &rot}).ok()) << "three distinct live caches";
  }
}

// LiveBytes is what the wrapper itself holds (spec §2.7 leaves the rows of a write-through
// wrapper in the live cache): an accumulating wrapper keeps its copy of the live history
// (a full KV layer: every row; a rotating one: the whole window, since View shows all W
// before the forward), the drafts, and the
// history it last returned (base ; drafts, cut to the window), each as K and V.
TEST(SpeculationWrappers, LiveBytesCountWhatTheWrapperHolds) {
  const std::vector<float> one = tagged::Positions(0, 1);
  const int64_t row = tagged::Keys(one).Bytes() + tagged::Values(one).Bytes();
  {
    KvCache live;
    FillKv(live, 7);
    Speculation spec = Begin({&live});
    WriteTagged(Attn(spec, 0), 7, 4);
    EXPECT_EQ(spec.layer(0).LiveBytes(), 0) << "committing KV writes through";
  }
  {
    KvCache live;
    FillKv(live, 7);
    Speculation spec = BeginIsolated({&live});
    EXPECT_EQ(spec.layer(0).LiveBytes(), 7 * row) << "isolated KV before the forward";
    WriteTagged(Attn(spec, 0), 7, 4);
    EXPECT_EQ(spec.layer(0).LiveBytes(), (7 + 4 + 11) * row) << "isolated KV";
  }
  for (const bool isolated : {false, true}) {
    RotatingCache live(4);
    FillRot(live, RotPrefixes(4)[2]);  // wrapped, cursor mid-ring
    Speculation spec = isolated ? BeginIsolated({&live}) : Begin({&live});
    WriteTagged(Attn(spec, 0), live.Offset(), 4);
    // The window's 4 rows, the 4 drafts, and the forward's history: its newest W - 1 = 3
    // older rows and the 4 drafts.
    EXPECT_EQ(spec.layer(0).LiveBytes(), (4 + 4 + 7) * row)
        << (isolated ? "isolated" : "committing") << " rotating";
  }
  // A committing KV wrapper holds nothing even when its forward makes the live cache grow
  // (past a 256-row step, or from no buffer at all): that capacity is the live cache's.
  for (const int64_t before : {int64_t{0}, int64_t{250}}) {
    KvCache live;
    if (before > 0) FillKv(live, before);
    Speculation spec = Begin({&live});
    WriteTagged(Attn(spec, 0), before, 10);
    EXPECT_EQ(spec.layer(0).LiveBytes(), 0) << "KV growing from " << before << " rows";
  }
  // Right after one batched write past the window the live buffer still holds every row
  // (untrimmed); the wrapper's copy is the window's newest W all the same.
  for (const bool isolated : {false, true}) {
    RotatingCache live(4);
    const std::vector<float> six = tagged::Positions(0, 6);
    live.Update(tagged::Keys(six), tagged::Values(six));
    ASSERT_GT(live.buffer_rows(), live.window()) << "the case needs an untrimmed buffer";
    Speculation spec = isolated ? BeginIsolated({&live}) : Begin({&live});
    EXPECT_EQ(spec.layer(0).LiveBytes(), 4 * row)
        << (isolated ? "isolated" : "committing") << " rotating over an untrimmed buffer";
  }
}

// K and V may be stored in two dtypes (KvCache.SnapshotsKeepKAndVEachInItsOwnDtype): a
// wrapper prices each side at its own width, bf16 K and f32 V here.
TEST(SpeculationWrappers, LiveBytesPriceKAndVEachAtItsOwnDtype) {
  const auto write = [](AttentionCache& c, int64_t first, int64_t count) {
    const std::vector<float> tags = tagged::Positions(first, count);
    return c.Update(tagged::Keys(tags, DType::kBFloat16), tagged::Values(tags, DType::kFloat32));
  };
  const std::vector<float> one = tagged::Positions(0, 1);
  const int64_t row =
      tagged::Keys(one, DType::kBFloat16).Bytes() + tagged::Values(one, DType::kFloat32).Bytes();
  ASSERT_EQ(row, 3 * 2 + 2 * 4);
  {
    KvCache live;
    write(live, 0, 7);
    Speculation spec = BeginIsolated({&live});
    EXPECT_EQ(spec.layer(0).LiveBytes(), 7 * row) << "isolated KV before the forward";
    write(Attn(spec, 0), 7, 4);
    EXPECT_EQ(spec.layer(0).LiveBytes(), (7 + 4 + 11) * row) << "isolated KV";
  }
  for (const bool isolated : {false, true}) {
    RotatingCache live(4);
    write(live, 0, 6);
    write(live, 6, 1);
    Speculation spec = isolated ? BeginIsolated({&live}) : Begin({&live});
    write(Attn(spec, 0), 7, 4);
    EXPECT_EQ(spec.layer(0).LiveBytes(), (4 + 4 + 7) * row)
        << (isolated ? "isolated" : "committing") << " rotating";
  }
}

// A zero-width V (spec §2.5's MLA variant: attention takes its values from K) is a V like
// any other to the wrappers that gather histories: every row of the history names a V row
// of zero columns in V's dtype, after a forward and in View.
TEST(SpeculationWrappers, AZeroWidthVIsGatheredIntoEveryHistory) {
  const auto write = [](AttentionCache& c, int64_t first, int64_t count) {
    const std::vector<float> tags = tagged::Positions(first, count);
    return c.Update(tagged::Keys(tags, DType::kBFloat16), Tensor(DType::kBFloat16, count, 0));
  };
  const auto expect_zero_width = [](const History& h, const std::string& where) {
    ASSERT_NE(h.v, nullptr) << where;
    EXPECT_GE(h.v->rows(), h.length) << where;
    EXPECT_EQ(h.v->cols(), 0) << where;
    EXPECT_EQ(h.v->dtype(), DType::kBFloat16) << where;
    EXPECT_GE(h.k->rows(), h.length) << where;
  };
  for (const bool rotating : {false, true}) {
    for (const bool isolated : {false, true}) {
      const std::string where =
          std::string(rotating ? "rotating" : "KV") + (isolated ? ", isolated" : ", committing");
      KvCache kv;
      RotatingCache rot(4);
      AttentionCache& live = rotating ? static_cast<AttentionCache&>(rot) : kv;
      write(live, 0, 6);
      write(live, 6, 1);
      Speculation spec = isolated ? BeginIsolated({&live}) : Begin({&live});
      expect_zero_width(Attn(spec, 0).View(), where + ", View before the forward");
      expect_zero_width(write(Attn(spec, 0), 7, 3), where + ", forward");
      expect_zero_width(Attn(spec, 0).View(), where + ", View after the forward");
    }
  }
}

// Before the forward, View (a draft reading the target cache through the wrapper) shows
// the live history: the whole window (in ring order on the live side, logical on the
// wrapper's, so compared as sets) or all KV rows. This once aborted: appending the empty
// accumulated rows to the live ones.
TEST(SpeculationWrappers, ViewBeforeTheForwardShowsTheLiveHistory) {
  for (const bool rotating : {false, true}) {
    for (const bool isolated : {false, true}) {
      KvCache kv;
      FillKv(kv, 7);
      RotatingCache rot(4);
      FillRot(rot, RotPrefixes(4)[2]);  // wrapped, cursor mid-ring
      AttentionCache& live = rotating ? static_cast<AttentionCache&>(rot) : kv;
      std::vector<int64_t> want = HistoryPositions(live.View());
      std::sort(want.begin(), want.end());
      Speculation spec = isolated ? BeginIsolated({&live}) : Begin({&live});
      EXPECT_EQ(HistoryPositions(Attn(spec, 0).View()), want)
          << (rotating ? "rotating" : "KV") << (isolated ? ", isolated" : ", committing");
    }
  }
}

// ---- programmer errors ----------------------------------------------------------------

// A live KV cache of 3 tokens, or a wrapped rotating one with its cursor mid-ring, a
// speculation (committing, or isolated) begun over it and `written` tokens written through
// the wrapper; then `misuse`. The whole scenario runs inside the death statement: a
// parent-side open speculation over a misused live cache would abort in its destructor.
template <typename Misuse>
void SpeculateThen(bool rotating, Misuse misuse, int64_t written = 2, bool isolated = false) {
  KvCache kv;
  RotatingCache rot(4);
  if (rotating) {
    FillRot(rot, RotPrefixes(4)[2]);
  } else {
    FillKv(kv, 3);
  }
  AttentionCache& live = rotating ? static_cast<AttentionCache&>(rot) : kv;
  Speculation spec = isolated ? BeginIsolated({&live}) : Begin({&live});
  if (written > 0) WriteTagged(Attn(spec, 0), live.Offset(), written);
  misuse(live, spec);
}

TEST(SpeculationDeathTest, LiveCacheUsedDirectlyDuringSpeculationAbortsTheCommit) {
  for (const bool rotating : {false, true}) {
    EXPECT_DEATH(SpeculateThen(rotating,
                               [](AttentionCache& live, Speculation& spec) {
                                 WriteTagged(live, live.Offset(), 1);
                                 spec.Commit(1);
                               }),
                 "used directly during a speculation")
        << (rotating ? "rotating" : "KV");
  }
}

// A committed wrapper refuses further writes: the speculation's own committed flag only
// guards Commit, and a caller still holding the wrapper could otherwise append to the live
// cache behind the commit.
TEST(SpeculationDeathTest, WriteThroughACommittedWrapperAborts) {
  for (const bool rotating : {false, true}) {
    EXPECT_DEATH(SpeculateThen(rotating,
                               [](AttentionCache& live, Speculation& spec) {
                                 spec.Commit(1);
                                 WriteTagged(Attn(spec, 0), live.Offset(), 1);
                               }),
                 "write through a committed speculation")
        << (rotating ? "rotating" : "KV");
  }
}

// The first write through an accumulating wrapper (rotating, or any isolated one) has no
// accumulated rows yet, so its shape is held to the live base's: K of another width, or
// of another dtype, aborts there, not only from the second write on.
TEST(SpeculationDeathTest, AFirstSpeculativeWriteOfAnotherShapeAborts) {
  const std::vector<float> tags = {50.0f};
  const auto wrong_shapes = {
      std::pair{tagged::Rows(tags, tagged::kKeyCols + 1, 1.0f, DType::kFloat32),
                tagged::Rows(tags, tagged::kValueCols + 1, -1.0f, DType::kFloat32)},
      std::pair{tagged::Keys(tags, DType::kBFloat16), tagged::Values(tags, DType::kBFloat16)}};
  for (const auto& shape : wrong_shapes) {
    const Tensor& k = shape.first;
    const Tensor& v = shape.second;
    for (const bool rotating : {false, true}) {
      EXPECT_DEATH(
          SpeculateThen(
              rotating,
              [&](AttentionCache&, Speculation& spec) { (void)Attn(spec, 0).Update(k, v); },
              /*written=*/0, /*isolated=*/!rotating),
          "does not match")
          << (rotating ? "rotating" : "isolated KV") << " " << k.ShapeString();
    }
  }
}

}  // namespace
}  // namespace kvtwin
