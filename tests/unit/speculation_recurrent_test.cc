// Goal: pin the recurrent speculation wrapper (spec/README.md "Recurrent speculation (v1)")
// and the transaction around every wrapper (src/speculation.h): after Commit(n) of a D + 1
// token validation forward the live recurrent state is the state of "prefix, then the first
// n forward tokens"; the replay of the recorded scan rebuilds the forward's own states; a
// live capture schedule gets its captures at commit; isolated speculation never touches
// live state; Begin reports misuse as values and changes nothing; an uncommitted
// speculation rolls back; a mixed [KV, rotating, recurrent] stack commits consistently; and
// the programmer errors abort.
// Method: conv and scan inputs are deterministic functions of the absolute position
// (speculation_fixtures.h), so a twin RecurrentCache that runs RunRecurrentForward on
// exactly prefix + accepted tokens is the reference. Conv tails are data movement and are
// compared bit-exactly; the delta state is computed and compared within the stated relative
// tolerance kDeltaRelTol, except where the same float steps must give the same bits (replay
// of everything vs the forward's own end state). Deterministic; no randomness.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "src/kv_cache.h"
#include "src/recurrent_cache.h"
#include "src/rotating_cache.h"
#include "src/speculation.h"
#include "src/speculation_wrappers.h"
#include "unit/speculation_fixtures.h"
#include "unit/tagged_rows.h"

namespace kvtwin {
namespace {

using specfx::Attn;
using specfx::Begin;
using specfx::BeginIsolated;
using specfx::DeltaNear;
using specfx::ExpectSameRecurrent;
using specfx::Forward;
using specfx::kDrafts;
using specfx::Prefill;
using specfx::Rec;
using specfx::WriteTagged;

const specfx::Kernels& K() {
  static const specfx::Kernels k = specfx::MakeKernels();
  return k;
}

// The ordinary-forward reference: `prefix` tokens, then `accepted` more in one forward.
RecurrentCache Twin(int64_t prefix, int64_t accepted) {
  RecurrentCache twin(specfx::Dims());
  Prefill(twin, K(), prefix);
  if (accepted > 0) Forward(twin, K(), accepted);
  return twin;
}

RecurrentSpeculation& RecWrapper(Speculation& spec, size_t i) {
  return dynamic_cast<RecurrentSpeculation&>(spec.layer(i));
}

TEST(RecurrentSpeculation, CommitEqualsAnOrdinaryForwardOfTheAcceptedTokens) {
  for (const int64_t prefix : {int64_t{0}, int64_t{5}}) {  // 0: a fresh cache, no state yet
    for (const int64_t d : kDrafts) {
      for (int64_t a = 0; a <= d; ++a) {
        SCOPED_TRACE(testing::Message() << "prefix " << prefix << " D " << d << " a " << a);
        RecurrentCache live(specfx::Dims());
        Prefill(live, K(), prefix);
        Speculation spec = Begin({&live});
        Forward(Rec(spec, 0), K(), d + 1);
        EXPECT_EQ(Rec(spec, 0).Offset(), prefix + d + 1);
        EXPECT_EQ(live.Offset(), prefix);  // the forward runs on a copy
        EXPECT_EQ(live.HasState(), prefix > 0);
        spec.Commit(a + 1);
        ExpectSameRecurrent(live, Twin(prefix, a + 1));
        // The wrapper keeps its own end state (speculation_wrappers.h): a full commit hands
        // the live layer a copy, not the wrapper's buffers.
        if (a == d) {
          EXPECT_TRUE(RecWrapper(spec, 0).final_conv().Equals(live.conv()));
          EXPECT_TRUE(RecWrapper(spec, 0).final_delta() == live.delta());
        }
        if (HasFailure()) return;
      }
    }
  }
}

// The comparisons above can fail: a token more or less moves the state far beyond the
// tolerance, and the conv tail names its last rows.
TEST(RecurrentSpeculation, OneTokenMoreOrLessIsVisible) {
  for (int64_t n = 1; n <= 10; ++n) {
    const RecurrentCache shorter = Twin(5, n);
    const RecurrentCache longer = Twin(5, n + 1);
    EXPECT_GT(specfx::MaxAbsDiff(shorter.delta(), longer.delta()), 1e-3) << "n " << n;
    EXPECT_FALSE(shorter.conv().Equals(longer.conv())) << "n " << n;
  }
}

TEST(RecurrentSpeculation, CountsOutsideTheForwardCommitNothingOrEverything) {
  for (const int64_t d : kDrafts) {
    for (const int64_t n : {int64_t{-1}, int64_t{0}, d + 1, d + 7}) {
      for (const int64_t prefix : {int64_t{0}, int64_t{5}}) {
        SCOPED_TRACE(testing::Message() << "D " << d << " n " << n << " prefix " << prefix);
        RecurrentCache live(specfx::Dims());
        Prefill(live, K(), prefix);
        {
          Speculation spec = Begin({&live});
          Forward(Rec(spec, 0), K(), d + 1);
          spec.Commit(n);
        }
        // Never the bonus token: at most the D + 1 forwarded ones.
        EXPECT_EQ(live.Offset(), prefix + (n > 0 ? d + 1 : 0));
        ExpectSameRecurrent(live, Twin(prefix, n > 0 ? d + 1 : 0));
      }
    }
  }
}

// A speculation whose recurrent layer folded no real token (an all-padding forward, or no
// forward at all beside a layer that had one) commits nothing there, whatever the count:
// a fresh layer stays stateless (no zero state, no bytes) and a held one unchanged.
TEST(RecurrentSpeculation, NoRealTokenCommitsNothingWhateverTheCount) {
  for (const int64_t prefix : {int64_t{0}, int64_t{5}}) {
    for (const bool padding : {false, true}) {
      SCOPED_TRACE(testing::Message() << "prefix " << prefix << (padding ? " padding" : " none"));
      KvCache kv;
      RecurrentCache live(specfx::Dims());
      Prefill(live, K(), prefix);
      const int64_t bytes = live.LiveBytes();
      {
        Speculation spec = Begin({&kv, &live});
        WriteTagged(Attn(spec, 0), 0, 3);
        if (padding) Forward(Rec(spec, 1), K(), 0, 2);
        spec.Commit(3);
      }
      EXPECT_EQ(kv.Offset(), 3);
      EXPECT_EQ(live.Offset(), prefix);
      EXPECT_EQ(live.HasState(), prefix > 0);
      EXPECT_EQ(live.LiveBytes(), bytes);
      if (prefix > 0) ExpectSameRecurrent(live, Twin(prefix, 0));
    }
  }
}

// A live state holding a NaN (an input that overflowed upstream: the cache keeps what it
// is given) still speculates and commits like a clean one: nothing on the speculative path
// compares states by value, where NaN != NaN would read as a state changed under it.
TEST(RecurrentSpeculation, ALiveStateHoldingANanStillSpeculatesAndCommits) {
  RecurrentCache live(specfx::Dims());
  Prefill(live, K(), 5);
  MatF delta = live.delta();
  delta(0, 0) = std::numeric_limits<float>::quiet_NaN();
  Tensor conv = live.conv();
  (void)live.Get(conv.dtype());
  live.Put(1, {conv}, {delta});
  ASSERT_EQ(live.Offset(), 6);
  {
    Speculation spec = Begin({&live});
    Forward(Rec(spec, 0), K(), 3);
    Forward(Rec(spec, 0), K(), 1);
    spec.Commit(3);
  }
  EXPECT_EQ(live.Offset(), 9);
  EXPECT_TRUE(std::isnan(live.delta()(0, 0)));
  // Head 0's first value row is NaN through its m = S k-hat; a row of another head is not.
  EXPECT_TRUE(std::isfinite(live.delta()(live.delta().rows() - 1, 0)));
}

// Interior boundaries 1..T-1 of a forward of T tokens.
std::vector<int64_t> Interior(int64_t t) {
  std::vector<int64_t> s;
  for (int64_t i = 1; i < t; ++i) s.push_back(i);
  return s;
}

TEST(RecurrentSpeculation, ReplayRebuildsTheForwardsStates) {
  for (const int64_t d : kDrafts) {
    SCOPED_TRACE(testing::Message() << "D " << d);
    const int64_t t = d + 1;
    RecurrentCache live(specfx::Dims());
    Prefill(live, K(), 5);
    Speculation spec = Begin({&live});
    Forward(Rec(spec, 0), K(), t);
    const RecurrentSpeculation& w = RecWrapper(spec, 0);
    ASSERT_EQ(w.recorded(), t);

    // Same float steps on the same rows from the same state: the same bits.
    auto [convs, deltas] = w.Replay(t, {});
    ASSERT_EQ(convs.size(), 1u);
    EXPECT_TRUE(convs[0].Equals(w.final_conv()));
    EXPECT_TRUE(deltas[0] == w.final_delta())
        << "max diff " << specfx::MaxAbsDiff(deltas[0], w.final_delta());

    // With splits: the states a twin's capture schedule records at the same boundaries.
    for (const int64_t n : {t, (t + 1) / 2}) {
      const std::vector<int64_t> splits = Interior(n);
      RecurrentCache twin(specfx::Dims());
      Prefill(twin, K(), 5);
      std::vector<int64_t> offsets;
      for (const int64_t s : splits) offsets.push_back(5 + s);
      ASSERT_TRUE(twin.PrepareSnapshots(offsets).ok());
      Forward(twin, K(), n);
      std::vector<SnapshotPtr> captured = twin.TakeSnapshots();
      auto [split_convs, split_deltas] = w.Replay(n, splits);
      ASSERT_EQ(split_convs.size(), splits.size() + 1);
      ASSERT_EQ(captured.size(), splits.size());
      for (size_t i = 0; i < splits.size(); ++i) {
        ASSERT_NE(captured[i], nullptr);
        const auto& snap = static_cast<const RecurrentSnapshot&>(*captured[i]);
        EXPECT_TRUE(split_convs[i].Equals(snap.conv())) << "n " << n << " split " << splits[i];
        EXPECT_TRUE(DeltaNear(split_deltas[i], snap.delta())) << "n " << n << " split " << i;
      }
      EXPECT_TRUE(split_convs.back().Equals(twin.conv())) << "n " << n;
      EXPECT_TRUE(DeltaNear(split_deltas.back(), twin.delta())) << "n " << n;
    }
  }
}

// Padding rows are not tokens; a forward in two chunks is replayed across the chunk edge.
TEST(RecurrentSpeculation, RecordsOnlyRealRowsAcrossSeveralForwards) {
  RecurrentCache live(specfx::Dims());
  Prefill(live, K(), 5);
  Speculation spec = Begin({&live});
  Forward(Rec(spec, 0), K(), 3, /*pad=*/2);
  Forward(Rec(spec, 0), K(), 4);
  EXPECT_EQ(RecWrapper(spec, 0).recorded(), 7);
  EXPECT_EQ(Rec(spec, 0).Offset(), 12);
  spec.Commit(5);
  ExpectSameRecurrent(live, Twin(5, 5));
}

TEST(RecurrentSpeculation, LiveCaptureScheduleGetsItsCapturesAtCommit) {
  const int64_t t = 11;
  for (const int64_t n : {int64_t{4}, t}) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    // 5 is captured at prepare, 6 and 8 are interior to the commit, 9 its end; 13 is
    // reached only when everything is accepted.
    const std::vector<int64_t> offsets = {5, 6, 8, 9, 13};
    RecurrentCache live(specfx::Dims());
    Prefill(live, K(), 5);
    ASSERT_TRUE(live.PrepareSnapshots(offsets).ok());
    {
      Speculation spec = Begin({&live});
      Forward(Rec(spec, 0), K(), t);
      spec.Commit(n);
    }
    RecurrentCache twin(specfx::Dims());
    Prefill(twin, K(), 5);
    ASSERT_TRUE(twin.PrepareSnapshots(offsets).ok());
    Forward(twin, K(), n);
    ExpectSameRecurrent(live, twin);
    std::vector<SnapshotPtr> got = live.TakeSnapshots();
    std::vector<SnapshotPtr> want = twin.TakeSnapshots();
    ASSERT_EQ(got.size(), offsets.size());
    ASSERT_EQ(want.size(), offsets.size());
    for (size_t i = 0; i < offsets.size(); ++i) {
      SCOPED_TRACE(testing::Message() << "offset " << offsets[i]);
      const bool reached = offsets[i] <= 5 + n;
      ASSERT_EQ(got[i] != nullptr, reached);
      ASSERT_EQ(want[i] != nullptr, reached);
      if (!reached) continue;
      const auto& g = static_cast<const RecurrentSnapshot&>(*got[i]);
      const auto& e = static_cast<const RecurrentSnapshot&>(*want[i]);
      EXPECT_EQ(g.offset(), offsets[i]);
      EXPECT_TRUE(g.conv().Equals(e.conv()));
      EXPECT_TRUE(DeltaNear(g.delta(), e.delta()));
    }
  }
}

TEST(IsolatedSpeculation, RecurrentLeavesLiveUntouched) {
  RecurrentCache live(specfx::Dims());
  Prefill(live, K(), 5);
  const Tensor conv = live.conv();
  const MatF delta = live.delta();
  {
    Speculation spec = BeginIsolated({&live});
    Forward(Rec(spec, 0), K(), 4);
    EXPECT_EQ(Rec(spec, 0).Offset(), 9);
    // The forward itself is real: it ends where an ordinary one does.
    const RecurrentCache twin = Twin(5, 4);
    EXPECT_TRUE(RecWrapper(spec, 0).final_conv().Equals(twin.conv()));
    EXPECT_TRUE(DeltaNear(RecWrapper(spec, 0).final_delta(), twin.delta()));
  }
  EXPECT_EQ(live.Offset(), 5);
  EXPECT_TRUE(live.conv().Equals(conv));
  EXPECT_TRUE(live.delta() == delta);
}

TEST(IsolatedSpeculation, FreshRecurrentCacheStaysStateless) {
  RecurrentCache live(specfx::Dims());
  {
    Speculation spec = BeginIsolated({&live});
    Forward(Rec(spec, 0), K(), 4);
    EXPECT_FALSE(live.HasState());
  }
  EXPECT_FALSE(live.HasState());
  EXPECT_EQ(live.Offset(), 0);
  EXPECT_EQ(live.LiveBytes(), 0);
}

// LiveBytes is what the wrapper itself holds: nothing before the forward; then the initial
// state it replays from and the running state (each as large as the live state), and every
// folded token's scan inputs (a bf16 conv input row, a float qkv row and a float ba row).
// Padding rows are not folded, so they are not kept.
TEST(SpeculationWrappers, RecurrentLiveBytesCountTwoStatesAndTheFoldedInputs) {
  const RecurrentDims d = specfx::Dims();
  const int64_t per_token = d.conv_dim() * 2 + d.conv_dim() * 4 + 2 * d.num_v_heads * 4;
  for (const bool isolated : {false, true}) {
    SCOPED_TRACE(isolated ? "isolated" : "committing");
    RecurrentCache live(d);
    Prefill(live, K(), 5);
    const int64_t state = live.LiveBytes();
    ASSERT_GT(state, 0);
    Speculation spec = isolated ? BeginIsolated({&live}) : Begin({&live});
    EXPECT_EQ(spec.layer(0).LiveBytes(), 0);
    Forward(Rec(spec, 0), K(), 3, /*pad=*/2);
    EXPECT_EQ(spec.layer(0).LiveBytes(), 2 * state + 3 * per_token);
    Forward(Rec(spec, 0), K(), 1);
    EXPECT_EQ(spec.layer(0).LiveBytes(), 2 * state + 4 * per_token);
  }
}

TEST(SpeculationWrappers, RecurrentWrapperAnswersTheRestOfTheContract) {
  for (const bool isolated : {false, true}) {
    SCOPED_TRACE(isolated ? "isolated" : "committing");
    RecurrentCache live(specfx::Dims());
    Prefill(live, K(), 5);
    RecurrentCache donor = Twin(5, 0);
    Speculation spec = isolated ? BeginIsolated({&live}) : Begin({&live});
    Forward(Rec(spec, 0), K(), 4);
    EXPECT_TRUE(Rec(spec, 0).SnapshotSplits(4).empty());
    specfx::ExpectWrapperContract(
        spec.layer(0), CacheKind::kRecurrent, [&] { return donor.Snapshot(0); }, 9);
    if (isolated) continue;
    spec.Commit(2);  // Free above was a no-op
    ExpectSameRecurrent(live, Twin(5, 2));
  }
}

// ---- the transaction over a mixed stack ---------------------------------------------------

// [KV, rotating W = 4 (wrapped, cursor mid-ring), recurrent], all at offset 6.
struct Stack {
  KvCache kv;
  RotatingCache rot{4};
  RecurrentCache rec{specfx::Dims()};
  Stack() {
    WriteTagged(kv, 0, 5);
    WriteTagged(kv, 5, 1);
    for (int64_t p = 0; p < 6; ++p) WriteTagged(rot, p, 1);
    Prefill(rec, K(), 6);
  }
  std::vector<LayerCache*> layers() { return {&kv, &rot, &rec}; }
  void Forward(Speculation& spec, int64_t t) {
    WriteTagged(Attn(spec, 0), 6, t);
    WriteTagged(Attn(spec, 1), 6, t);
    specfx::Forward(Rec(spec, 2), K(), t);
  }
  // Ordinary writes of `n` more tokens on every layer.
  void Append(int64_t n) {
    if (n <= 0) return;
    WriteTagged(kv, 6, n);
    WriteTagged(rot, 6, n);
    specfx::Forward(rec, K(), n);
  }
};

void ExpectSameStack(const Stack& live, const Stack& twin) {
  const int64_t off = twin.kv.Offset();
  ASSERT_EQ(live.kv.Offset(), off);
  EXPECT_TRUE(live.kv.keys().Rows(0, off).Equals(twin.kv.keys().Rows(0, off)));
  EXPECT_EQ(live.rot.Offset(), twin.rot.Offset());
  EXPECT_EQ(live.rot.ring_idx(), twin.rot.ring_idx());
  EXPECT_TRUE(live.rot.keys().Equals(twin.rot.keys()));
  EXPECT_TRUE(live.rot.values().Equals(twin.rot.values()));
  ExpectSameRecurrent(live.rec, twin.rec);
}

TEST(SpeculationStack, MixedStackCommitsConsistently) {
  for (int64_t a = 0; a <= 3; ++a) {
    SCOPED_TRACE(testing::Message() << "a " << a);
    Stack live;
    ASSERT_TRUE(live.rot.ring_idx() > 0 && live.rot.ring_idx() < 4);
    Speculation spec = Begin(live.layers());
    ASSERT_EQ(spec.size(), 3u);
    live.Forward(spec, 4);
    spec.Commit(a + 1);
    Stack twin;
    twin.Append(a + 1);
    ExpectSameStack(live, twin);
  }
}

// Every kind clamps a count past the forward, the largest included, to the whole forward.
TEST(SpeculationStack, TheLargestCountCommitsTheWholeForwardOnEveryKind) {
  Stack live;
  Speculation spec = Begin(live.layers());
  live.Forward(spec, 4);
  spec.Commit(std::numeric_limits<int64_t>::max());
  Stack twin;
  twin.Append(4);
  ExpectSameStack(live, twin);
}

TEST(SpeculationStack, AnUncommittedSpeculationRollsBackWhenDestroyed) {
  Stack live;
  {
    Speculation spec = Begin(live.layers());
    live.Forward(spec, 4);
    EXPECT_EQ(live.kv.Offset(), 10);      // written through until the rollback
    Speculation moved = std::move(spec);  // one owner rolls back, once
    EXPECT_FALSE(moved.committed());
  }
  const Stack untouched;
  ExpectSameStack(live, untouched);
  // KV is back at 6: the next ordinary write lands over the rejected rows.
  WriteTagged(live.kv, 6, 1);
  EXPECT_EQ(tagged::Tags(live.kv.keys(), live.kv.values(), 0, 7), tagged::Positions(0, 7));
}

TEST(SpeculationBegin, ErrorsAreValuesAndChangeNothing) {
  Stack live;
  const Stack untouched;
  for (const bool isolated : {false, true}) {
    SCOPED_TRACE(isolated ? "isolated" : "committing");
    const auto begin = [isolated](std::vector<LayerCache*> layers) {
      return isolated ? BeginIsolatedSpeculation(layers) : BeginSpeculation(layers);
    };
    EXPECT_EQ(begin({&live.kv, nullptr}).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(begin({&live.kv, &live.rec, &live.kv}).status().code(), StatusCode::kInvalidArgument);
    {
      Speculation outer = Begin(live.layers());
      for (size_t i = 0; i < 3; ++i) {
        Result<Speculation> r = begin({&live.rot, &outer.layer(i)});
        EXPECT_EQ(r.status().code(), StatusCode::kUnsupported) << "wrapper " << i;
      }
      // The refused Begins did not disturb the open one.
      live.Forward(outer, 4);
      EXPECT_EQ(outer.layer(1).Offset(), 10);
    }  // rolled back
    ExpectSameStack(live, untouched);
  }
}

// ---- programmer errors --------------------------------------------------------------------

// Each scenario runs inside the death statement, so the parent never holds a speculation
// whose destructor would abort.
TEST(SpeculationDeathTest, CommitTwiceAborts) {
  EXPECT_DEATH(
      {
        Stack s;
        Speculation spec = Begin(s.layers());
        s.Forward(spec, 2);
        spec.Commit(1);
        spec.Commit(1);
      },
      "committed twice");
}

TEST(SpeculationDeathTest, CommitOnIsolatedAborts) {
  EXPECT_DEATH(
      {
        Stack s;
        Speculation spec = BeginIsolated(s.layers());
        s.Forward(spec, 2);
        spec.Commit(1);
      },
      "isolated speculation has no commit");
}

TEST(SpeculationDeathTest, LiveRecurrentUsedDirectlyDuringSpeculationAbortsTheCommit) {
  EXPECT_DEATH(
      {
        RecurrentCache live(specfx::Dims());
        Prefill(live, K(), 5);
        Speculation spec = Begin({&live});
        Forward(Rec(spec, 0), K(), 2);
        Forward(live, K(), 1);
        spec.Commit(1);
      },
      "used directly during a speculation");
}

// A committed recurrent wrapper refuses further forwards, as the attention wrappers refuse
// writes: Speculation's own committed flag only guards Commit, and a caller still holding
// the wrapper could otherwise run a forward whose state the commit never sees. Alone on its
// stack, so no other layer's check fires first.
TEST(SpeculationDeathTest, ForwardThroughACommittedRecurrentWrapperAborts) {
  for (const int64_t prefix : {int64_t{0}, int64_t{5}}) {
    EXPECT_DEATH(
        {
          RecurrentCache live(specfx::Dims());
          Prefill(live, K(), prefix);
          Speculation spec = Begin({&live});
          Forward(Rec(spec, 0), K(), 2);
          spec.Commit(1);
          Forward(Rec(spec, 0), K(), 1);
        },
        "forward through a committed speculation")
        << "prefix " << prefix;
  }
}

// The replay of a partial commit folds every recorded step with one set of gated-delta
// parameters, so a speculation whose forwards bring different ones must abort rather than
// replay the earlier steps with the later parameters.
TEST(SpeculationDeathTest, GatedDeltaParametersThatChangeBetweenForwardsAbort) {
  EXPECT_DEATH(
      {
        RecurrentCache live(specfx::Dims());
        Prefill(live, K(), 3);
        Speculation spec = Begin({&live});
        Forward(Rec(spec, 0), K(), 2);
        specfx::Kernels other = K();
        other.gdn.a_exp = VecF::Constant(specfx::Dims().num_v_heads, 0.5f);
        Forward(Rec(spec, 0), other, 1);
      },
      "parameters changed within one speculation");
}

}  // namespace
}  // namespace kvtwin
