// Goal: pin RecurrentCache (spec §2.3, v1 owned snapshots) to its contract: lazy state
// creation, Put advancing by the real length, exact-offset restores from anywhere, the
// capture schedule driven through SnapshotSplits, byte accounting, and the aborts on
// programmer errors.
// Method: states are filled with one recognisable value per boundary (the ollama tests' own
// trick, §6.3 and §6.6), so each captured or restored state names the boundary it came from;
// where the kernels matter (padding, segmented capture) the real CausalConv1D / GatedDelta
// run on small deterministic inputs and are compared with unpadded or unsplit runs.
#include "src/recurrent_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "src/kernels.h"

namespace kvtwin {
namespace {

RecurrentDims Dims() { return RecurrentDims{}; }  // tail 3, Hk 1, Hv 2, Dk 4, Dv 4

Tensor ConvFilled(DType dtype, float value) {
  const RecurrentDims d = Dims();
  return Tensor::FromFloat(dtype, MatF::Constant(d.conv_tail, d.conv_dim(), value));
}

MatF DeltaFilled(float value) {
  const RecurrentDims d = Dims();
  return MatF::Constant(d.delta_rows(), d.head_k_dim, value);
}

// Puts `real_len` tokens whose boundary states (every interior split, then the end) are
// all filled with `value`, the way a forward would hand them over.
void PutFilled(RecurrentCache& cache, int64_t real_len, float value) {
  // Keeps the dtype of an existing state; a fresh cache gets float32 activations.
  const DType dtype = cache.HasState() ? cache.conv().dtype() : DType::kFloat32;
  cache.Get(dtype);
  const size_t n = cache.SnapshotSplits(real_len).size() + 1;
  cache.Put(real_len, std::vector<Tensor>(n, ConvFilled(dtype, value)),
            std::vector<MatF>(n, DeltaFilled(value)));
}

// The value a filled state holds, or NaN if the state is not uniform.
float FilledValue(const MatF& m) {
  const float v = m(0, 0);
  return (m.array() == v).all() ? v : std::nanf("");
}

float ConvValue(const Tensor& t) { return FilledValue(t.ToFloat()); }

const RecurrentSnapshot& AsRec(const SnapshotPtr& s) {
  return static_cast<const RecurrentSnapshot&>(*s);
}

// A cache at `offset` whose state is filled with `value` (float32 activations).
RecurrentCache CacheAt(int64_t offset, float value) {
  RecurrentCache cache(Dims());
  cache.Get(DType::kFloat32);
  PutFilled(cache, offset, value);
  return cache;
}

// ---- §6.3 recurrent_test.go ---------------------------------------------------------

TEST(RecurrentCache, RestoreExactOffset) {
  RecurrentCache cache = CacheAt(10, 1.0f);
  SnapshotPtr snap = cache.Snapshot(0);
  ASSERT_NE(snap, nullptr);
  EXPECT_EQ(snap->to(), 10);
  PutFilled(cache, 5, 2.0f);
  ASSERT_EQ(cache.Offset(), 15);

  EXPECT_FALSE(cache.Restore(snap.get(), 5));
  EXPECT_FALSE(cache.Restore(snap.get(), 15));
  // A refused restore leaves the cache as it was.
  EXPECT_EQ(cache.Offset(), 15);
  EXPECT_EQ(FilledValue(cache.delta()), 2.0f);

  EXPECT_TRUE(cache.Restore(snap.get(), 10));
  EXPECT_EQ(cache.Offset(), 10);
  EXPECT_EQ(FilledValue(cache.delta()), 1.0f);
  EXPECT_EQ(ConvValue(cache.conv()), 1.0f);
}

TEST(RecurrentCache, GetLazyInit) {
  RecurrentCache cache(Dims());
  EXPECT_FALSE(cache.HasState());
  EXPECT_EQ(cache.LiveBytes(), 0);
  EXPECT_EQ(cache.Snapshot(0), nullptr);

  RecurrentCache::StateView view = cache.Get(DType::kBFloat16);
  EXPECT_TRUE(cache.HasState());
  EXPECT_EQ(cache.Offset(), 0);
  EXPECT_EQ(view.conv->dtype(), DType::kBFloat16);
  EXPECT_EQ(view.conv->rows(), 3);
  EXPECT_EQ(view.conv->cols(), 16);
  EXPECT_EQ(ConvValue(*view.conv), 0.0f);
  // MatF is float32 by type; the shape is [(Hv*Dv) x Dk] and starts at zero.
  EXPECT_EQ(view.delta->rows(), 8);
  EXPECT_EQ(view.delta->cols(), 4);
  EXPECT_EQ(FilledValue(*view.delta), 0.0f);
  // A second Get with the same dtype returns the same state and still does not advance.
  EXPECT_EQ(cache.Get(DType::kBFloat16).conv, view.conv);
  EXPECT_EQ(cache.Offset(), 0);
}

// Deterministic, varied values in roughly [-1, 1] for kernel inputs.
float Wave(int64_t i, int64_t j, float phase) {
  return std::sin(0.7f * static_cast<float>(i) + 1.3f * static_cast<float>(j) + phase);
}

struct Kernels {
  ConvWeights conv;
  GdnParams gdn;
};

Kernels MakeKernels() {
  const RecurrentDims d = Dims();
  Kernels k;
  k.conv.w = MatF(d.conv_dim(), d.conv_tail + 1);
  for (int64_t c = 0; c < k.conv.w.rows(); ++c) {
    for (int64_t j = 0; j < k.conv.w.cols(); ++j) k.conv.w(c, j) = 0.5f * Wave(c, j, 0.1f);
  }
  k.conv.bias = VecF::Constant(d.conv_dim(), 0.05f);
  k.conv.silu = true;
  k.gdn.dims = d;
  k.gdn.dt_bias = VecF::Constant(d.num_v_heads, 0.2f);
  k.gdn.a_exp = VecF::Constant(d.num_v_heads, 0.8f);
  return k;
}

// Token inputs: rows [0, real) are the deterministic stream, rows [real, rows) are `pad`.
MatF TokenRows(int64_t rows, int64_t real, int64_t cols, float phase, float pad) {
  MatF m = MatF::Constant(rows, cols, pad);
  for (int64_t t = 0; t < real; ++t) {
    for (int64_t c = 0; c < cols; ++c) m(t, c) = Wave(t, c, phase);
  }
  return m;
}

// One forward through the kernels from the cache's live state (bf16 activations), with
// the cache's own splits, then Put. `rows` >= `real`: extra rows are padding valued `pad`.
void ForwardAndPut(RecurrentCache& cache, const Kernels& k, int64_t rows, int64_t real, float pad) {
  const RecurrentDims d = Dims();
  const RecurrentCache::StateView live = cache.Get(DType::kBFloat16);
  const std::vector<int64_t> splits = cache.SnapshotSplits(real);
  const Tensor x =
      Tensor::FromFloat(DType::kBFloat16, TokenRows(rows, real, d.conv_dim(), 0.0f, pad));
  ConvResult conv = CausalConv1D(*live.conv, x, real, k.conv, splits);
  GdnInputs in;
  // The GDN consumes the activated conv output in the activation dtype; padded rows are
  // overwritten with `pad` so the kernel itself must ignore them.
  in.qkv = Tensor::FromFloat(DType::kBFloat16, conv.out).ToFloat();
  in.qkv.bottomRows(rows - real).setConstant(pad);
  in.ba = TokenRows(rows, real, 2 * d.num_v_heads, 2.0f, pad);
  GdnResult gdn = GatedDelta(*live.delta, in, real, k.gdn, splits);
  cache.Put(real, std::move(conv.states), std::move(gdn.states));
}

TEST(RecurrentCache, PaddedRoundTrip) {
  const Kernels k = MakeKernels();
  RecurrentCache padded(Dims());
  ForwardAndPut(padded, k, /*rows=*/4, /*real=*/2, /*pad=*/99.0f);
  RecurrentCache unpadded(Dims());
  ForwardAndPut(unpadded, k, /*rows=*/2, /*real=*/2, /*pad=*/0.0f);

  EXPECT_EQ(padded.Offset(), 2);  // the real length, not 4
  EXPECT_TRUE(padded.conv().Equals(unpadded.conv()));
  EXPECT_GT(padded.delta().cwiseAbs().maxCoeff(), 1e-3f);  // the comparison means something
  EXPECT_LE((padded.delta() - unpadded.delta()).cwiseAbs().maxCoeff(), 1e-3f);
}

TEST(RecurrentCache, PutAdvances) {
  RecurrentCache cache(Dims());
  cache.Get(DType::kFloat32);
  PutFilled(cache, 2, 3.0f);
  EXPECT_EQ(cache.Offset(), 2);
  EXPECT_EQ(FilledValue(cache.delta()), 3.0f);
  EXPECT_EQ(ConvValue(cache.conv()), 3.0f);
}

// ---- §6.6 snapshot_capture_test.go ----------------------------------------------------

TEST(RecurrentSnapshot, SplitsAndSegmentedCapture) {
  RecurrentCache cache = CacheAt(5, 0.0f);
  ASSERT_TRUE(cache.PrepareSnapshots({5, 6, 7, 8}).ok());
  const std::vector<int64_t> splits = cache.SnapshotSplits(4);
  ASSERT_EQ(splits, (std::vector<int64_t>{1, 2, 3}));

  std::vector<Tensor> convs;
  std::vector<MatF> deltas;
  for (int v = 1; v <= 4; ++v) {
    convs.push_back(ConvFilled(DType::kFloat32, static_cast<float>(v)));
    deltas.push_back(DeltaFilled(static_cast<float>(v)));
  }
  cache.Put(4, std::move(convs), std::move(deltas));
  EXPECT_EQ(cache.Offset(), 9);
  EXPECT_EQ(FilledValue(cache.delta()), 4.0f);

  std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
  ASSERT_EQ(entries.size(), 4u);
  for (const SnapshotPtr& e : entries) ASSERT_NE(e, nullptr);
  // Snapshots are self-contained: restore them out of order, each to its own offset.
  for (int64_t k : {2, 0, 3, 1}) {
    ASSERT_TRUE(cache.Restore(entries[k].get(), 5 + k)) << "entry " << k;
    EXPECT_EQ(cache.Offset(), 5 + k);
    EXPECT_EQ(FilledValue(cache.delta()), static_cast<float>(k)) << "entry " << k;
    EXPECT_EQ(ConvValue(cache.conv()), static_cast<float>(k)) << "entry " << k;
  }
}

// The kernels' split states captured through the schedule equal the end state of an
// unsplit forward over the same prefix: segmenting must not change the state (§2.4).
TEST(RecurrentSnapshot, KernelSplitCapturesEqualPrefixForwards) {
  const Kernels k = MakeKernels();
  RecurrentCache cache(Dims());
  cache.Get(DType::kBFloat16);
  ASSERT_TRUE(cache.PrepareSnapshots({0, 2, 3, 5}).ok());
  ASSERT_EQ(cache.SnapshotSplits(5), (std::vector<int64_t>{2, 3}));
  ForwardAndPut(cache, k, /*rows=*/5, /*real=*/5, /*pad=*/0.0f);
  std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
  ASSERT_EQ(entries.size(), 4u);

  for (size_t i = 0; i < entries.size(); ++i) {
    ASSERT_NE(entries[i], nullptr);
    const RecurrentSnapshot& s = AsRec(entries[i]);
    RecurrentCache prefix(Dims());
    prefix.Get(DType::kBFloat16);
    if (s.offset() > 0) ForwardAndPut(prefix, k, s.offset(), s.offset(), 0.0f);
    EXPECT_TRUE(s.conv().Equals(prefix.conv())) << "offset " << s.offset();
    EXPECT_LE((s.delta() - prefix.delta()).cwiseAbs().maxCoeff(), 1e-4f) << "offset " << s.offset();
  }
}

// ---- restore -----------------------------------------------------------------------

TEST(RecurrentCache, RestoreIntoFreedCacheInstallsTheSnapshot) {
  RecurrentCache cache(Dims());
  cache.Get(DType::kBFloat16);
  PutFilled(cache, 7, 5.0f);
  SnapshotPtr snap = cache.Snapshot(3);
  cache.Free();
  ASSERT_FALSE(cache.HasState());

  EXPECT_FALSE(cache.Restore(snap.get(), 0));
  EXPECT_FALSE(cache.HasState());
  ASSERT_TRUE(cache.Restore(snap.get(), 7));
  EXPECT_TRUE(cache.HasState());
  EXPECT_EQ(cache.Offset(), 7);
  EXPECT_EQ(cache.conv().dtype(), DType::kBFloat16);
  EXPECT_EQ(ConvValue(cache.conv()), 5.0f);
  EXPECT_EQ(FilledValue(cache.delta()), 5.0f);
  // The restored dtype is the one Get must now be called with.
  EXPECT_EQ(cache.Get(DType::kBFloat16).conv->dtype(), DType::kBFloat16);
}

// Spec §2.3 installs copies of the snapshot over live state, so the conv dtype and values
// are the snapshot's even when the live state holds the other activation dtype (a layer freed
// and read again in another dtype, then restored from a capture of before): a restore that
// converted into the live dtype would round an f32 tail to bf16 (1.1 is not a bf16 value).
TEST(RecurrentCache, RestoreOverLiveStateOfTheOtherDtypeInstallsTheSnapshotsConv) {
  for (const DType snap_dtype : {DType::kFloat32, DType::kBFloat16}) {
    const DType live_dtype = snap_dtype == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
    RecurrentCache cache(Dims());
    cache.Get(snap_dtype);
    PutFilled(cache, 4, 1.1f);
    SnapshotPtr snap = cache.Snapshot(0);
    const float captured = ConvValue(AsRec(snap).conv());
    cache.Free();
    cache.Get(live_dtype);
    PutFilled(cache, 2, 2.0f);
    ASSERT_EQ(cache.conv().dtype(), live_dtype);
    ASSERT_TRUE(cache.Restore(snap.get(), 4));
    EXPECT_EQ(cache.Offset(), 4);
    ASSERT_EQ(cache.conv().dtype(), snap_dtype) << DTypeName(snap_dtype);
    EXPECT_EQ(ConvValue(cache.conv()), captured) << DTypeName(snap_dtype);
    EXPECT_EQ(FilledValue(cache.delta()), 1.1f);
    EXPECT_EQ(cache.Get(snap_dtype).conv->dtype(), snap_dtype);
  }
}

TEST(RecurrentCache, RestoreForwardToALaterSnapshot) {
  RecurrentCache cache = CacheAt(3, 1.0f);
  SnapshotPtr early = cache.Snapshot(0);
  PutFilled(cache, 4, 2.0f);
  SnapshotPtr late = cache.Snapshot(0);

  ASSERT_TRUE(cache.Restore(early.get(), 3));
  ASSERT_EQ(cache.Offset(), 3);
  ASSERT_TRUE(cache.Restore(late.get(), 7));
  EXPECT_EQ(cache.Offset(), 7);
  EXPECT_EQ(FilledValue(cache.delta()), 2.0f);
}

TEST(RecurrentCache, RestoreWithoutSnapshotSucceedsOnlyAtTheCurrentOffset) {
  RecurrentCache fresh(Dims());
  EXPECT_TRUE(fresh.Restore(nullptr, 0));
  EXPECT_FALSE(fresh.Restore(nullptr, 1));

  RecurrentCache cache = CacheAt(6, 1.0f);
  EXPECT_TRUE(cache.Restore(nullptr, 6));
  EXPECT_FALSE(cache.Restore(nullptr, 5));
  EXPECT_FALSE(cache.Restore(nullptr, 7));
  EXPECT_EQ(cache.Offset(), 6);
  EXPECT_EQ(FilledValue(cache.delta()), 1.0f);
}

TEST(RecurrentCache, RestoredStateIsACopyOfTheSnapshot) {
  RecurrentCache cache = CacheAt(4, 1.0f);
  SnapshotPtr snap = cache.Snapshot(0);
  ASSERT_TRUE(cache.Restore(snap.get(), 4));
  PutFilled(cache, 1, 9.0f);
  // Writing after the restore must not reach into the snapshot.
  EXPECT_EQ(FilledValue(AsRec(snap).delta()), 1.0f);
  EXPECT_EQ(ConvValue(AsRec(snap).conv()), 1.0f);
  EXPECT_EQ(AsRec(snap).offset(), 4);
}

// ---- capture schedule --------------------------------------------------------------

TEST(RecurrentCache, PrepareSnapshotsErrorsChangeNothing) {
  RecurrentCache cache = CacheAt(5, 1.0f);
  EXPECT_EQ(cache.PrepareSnapshots({4, 6}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.PrepareSnapshots({7, 6}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.PrepareSnapshots({6, 6}).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(cache.ScheduleActive());
  EXPECT_TRUE(cache.SnapshotSplits(4).empty());

  ASSERT_TRUE(cache.PrepareSnapshots({5, 7}).ok());
  EXPECT_EQ(cache.PrepareSnapshots({8}).code(), StatusCode::kFailedPrecondition);
  // The first schedule survives the refused one, including its immediate capture at 5.
  EXPECT_TRUE(cache.ScheduleActive());
  EXPECT_EQ(cache.SnapshotSplits(4), (std::vector<int64_t>{2}));
  EXPECT_EQ(cache.Offset(), 5);
  std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
  ASSERT_EQ(entries.size(), 2u);
  ASSERT_NE(entries[0], nullptr);
  EXPECT_EQ(AsRec(entries[0]).offset(), 5);
  EXPECT_EQ(entries[1], nullptr);  // 7 was never reached
}

TEST(RecurrentCache, EmptyScheduleStaysActiveUntilTaken) {
  RecurrentCache cache = CacheAt(2, 1.0f);
  ASSERT_TRUE(cache.PrepareSnapshots({}).ok());
  EXPECT_TRUE(cache.ScheduleActive());
  EXPECT_EQ(cache.PrepareSnapshots({3}).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(cache.TakeSnapshots().empty());
  EXPECT_FALSE(cache.ScheduleActive());
}

TEST(RecurrentCache, PrepareBeforeFirstGetCapturesNull) {
  RecurrentCache cache(Dims());
  ASSERT_TRUE(cache.PrepareSnapshots({0, 2}).ok());
  PutFilled(cache, 3, 1.0f);  // Get happens inside; split at 2 is interior
  std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0], nullptr);  // no state existed at prepare time
  ASSERT_NE(entries[1], nullptr);
  EXPECT_EQ(AsRec(entries[1]).offset(), 2);
}

TEST(RecurrentCache, SchedulePersistsAcrossPutsUntilTaken) {
  RecurrentCache cache = CacheAt(2, 0.0f);
  ASSERT_TRUE(cache.PrepareSnapshots({2, 3, 6, 9}).ok());
  EXPECT_EQ(cache.SnapshotSplits(2), (std::vector<int64_t>{1}));
  PutFilled(cache, 2, 1.0f);  // [2,4): 3 is interior
  PutFilled(cache, 2, 2.0f);  // [4,6): 6 is the end, captured from the live state
  PutFilled(cache, 1, 3.0f);  // [6,7): nothing scheduled
  EXPECT_TRUE(cache.ScheduleActive());

  std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
  EXPECT_FALSE(cache.ScheduleActive());
  ASSERT_EQ(entries.size(), 4u);
  const std::vector<std::pair<int64_t, float>> expected = {{2, 0.0f}, {3, 1.0f}, {6, 2.0f}};
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NE(entries[i], nullptr) << "entry " << i;
    EXPECT_EQ(AsRec(entries[i]).offset(), expected[i].first);
    EXPECT_EQ(FilledValue(AsRec(entries[i]).delta()), expected[i].second);
  }
  EXPECT_EQ(entries[3], nullptr);  // 9 never reached
  EXPECT_TRUE(cache.TakeSnapshots().empty());
}

// From a cache at 3: a state at 5 held aside, back at 3, `offsets` (starting with 5)
// scheduled, then that state restored, so the cache stands on a scheduled offset that no
// write has reached since the schedule began.
void RestoreOntoScheduled(RecurrentCache& cache, const std::vector<int64_t>& offsets) {
  SnapshotPtr early = cache.Snapshot(0);
  PutFilled(cache, 2, 2.0f);
  SnapshotPtr late = cache.Snapshot(0);  // offset 5
  ASSERT_TRUE(cache.Restore(early.get(), 3));
  ASSERT_TRUE(cache.PrepareSnapshots(offsets).ok());
  ASSERT_TRUE(cache.Restore(late.get(), 5));
}

// The schedule captures at Prepare and at the boundaries a Put reaches (spec §2.3), never at
// a restore: restoring onto a scheduled offset the writes have not reached leaves its slot
// empty, and the first write from there does not fill it either (a Put captures the
// boundaries it reaches, not the one it starts from).
TEST(RecurrentCache, ARestoreOntoAScheduledOffsetCapturesNothing) {
  RecurrentCache cache = CacheAt(3, 1.0f);
  ASSERT_NO_FATAL_FAILURE(RestoreOntoScheduled(cache, {5, 8}));
  PutFilled(cache, 1, 3.0f);  // [5,6)
  std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0], nullptr) << "captured at a restore";
  EXPECT_EQ(entries[1], nullptr);  // 8 never reached
}

// Put commits and then captures the boundary it ends on (spec §2.3), and a forward of
// padding alone ends where it started (the offset advances by the real length only). So
// after a restore onto a scheduled offset, such a forward fills that slot, with the state
// it committed.
TEST(RecurrentCache, AnAllPaddingPutCapturesTheOffsetItEndsOn) {
  RecurrentCache cache = CacheAt(3, 1.0f);
  ASSERT_NO_FATAL_FAILURE(RestoreOntoScheduled(cache, {5}));
  PutFilled(cache, 0, 4.0f);
  EXPECT_EQ(cache.Offset(), 5);
  EXPECT_EQ(FilledValue(cache.delta()), 4.0f);
  std::vector<SnapshotPtr> entries = cache.TakeSnapshots();
  ASSERT_EQ(entries.size(), 1u);
  ASSERT_NE(entries[0], nullptr) << "the end boundary of a padding-only forward not captured";
  EXPECT_EQ(entries[0]->to(), 5);
  const auto& captured = static_cast<const RecurrentSnapshot&>(*entries[0]);
  EXPECT_EQ(FilledValue(captured.delta()), 4.0f);
}

TEST(RecurrentCache, SnapshotSplitsExcludeTheEndpoints) {
  RecurrentCache cache = CacheAt(4, 0.0f);
  EXPECT_TRUE(cache.SnapshotSplits(8).empty());  // nothing scheduled
  ASSERT_TRUE(cache.PrepareSnapshots({4, 5, 8, 9}).ok());
  EXPECT_EQ(cache.SnapshotSplits(4), (std::vector<int64_t>{1}));  // 4 and 8 are endpoints
  EXPECT_EQ(cache.SnapshotSplits(5), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(cache.SnapshotSplits(6), (std::vector<int64_t>{1, 4, 5}));
  EXPECT_TRUE(cache.SnapshotSplits(1).empty());
  EXPECT_TRUE(cache.SnapshotSplits(0).empty());
}

TEST(RecurrentCache, FreeDropsStateAndSchedule) {
  RecurrentCache cache = CacheAt(3, 1.0f);
  ASSERT_TRUE(cache.PrepareSnapshots({3, 5}).ok());
  cache.Free();
  EXPECT_FALSE(cache.HasState());
  EXPECT_EQ(cache.Offset(), 0);
  EXPECT_EQ(cache.LiveBytes(), 0);
  EXPECT_FALSE(cache.ScheduleActive());
  EXPECT_TRUE(cache.TakeSnapshots().empty());
  EXPECT_EQ(cache.Snapshot(0), nullptr);
  EXPECT_TRUE(cache.PrepareSnapshots({0}).ok());  // a new schedule is allowed
  // A freed cache starts over: a new first Get may pick another dtype.
  EXPECT_EQ(cache.Get(DType::kBFloat16).conv->dtype(), DType::kBFloat16);
}

// ---- dtypes and bytes ----------------------------------------------------------------

TEST(RecurrentCache, DeltaStaysFloat32WhileConvIsBf16) {
  RecurrentCache cache(Dims());
  cache.Get(DType::kBFloat16);
  // 1 + 2^-20 is not representable in bf16; the delta must keep it exactly.
  const float fine = 1.0f + std::ldexp(1.0f, -20);
  MatF conv_values = TokenRows(3, 3, Dims().conv_dim(), 0.3f, 0.0f);
  const Tensor conv = Tensor::FromFloat(DType::kBFloat16, conv_values);
  cache.Put(1, {conv}, {DeltaFilled(fine)});
  SnapshotPtr snap = cache.Snapshot(0);
  PutFilled(cache, 1, 0.0f);
  ASSERT_TRUE(cache.Restore(snap.get(), 1));

  EXPECT_EQ(FilledValue(cache.delta()), fine);
  EXPECT_EQ(cache.conv().dtype(), DType::kBFloat16);
  EXPECT_TRUE(cache.conv().Equals(conv));  // bit-exact round trip through the snapshot
}

TEST(RecurrentCache, SizeBytesCountsConvInItsDtypeAndDeltaAsFloat32) {
  // conv 3 x 16, delta 8 x 4 floats = 128 bytes.
  RecurrentCache bf16(Dims());
  bf16.Get(DType::kBFloat16);
  EXPECT_EQ(bf16.LiveBytes(), 3 * 16 * 2 + 128);
  EXPECT_EQ(bf16.Snapshot(0)->SizeBytes(), 3 * 16 * 2 + 128);

  RecurrentCache f32 = CacheAt(2, 1.0f);
  EXPECT_EQ(f32.LiveBytes(), 3 * 16 * 4 + 128);
  EXPECT_EQ(f32.Snapshot(0)->SizeBytes(), 3 * 16 * 4 + 128);
}

// ---- merge / split -------------------------------------------------------------------

TEST(RecurrentCache, MergeReturnsTheChildAndSplitReturnsNullParent) {
  RecurrentCache cache = CacheAt(2, 1.0f);
  SnapshotPtr parent = cache.Snapshot(0);
  PutFilled(cache, 2, 2.0f);
  SnapshotPtr child = cache.Snapshot(2);
  const CacheSnapshot* child_raw = child.get();

  SnapshotPtr merged = cache.Merge(std::move(parent), std::move(child));
  EXPECT_EQ(merged.get(), child_raw);
  EXPECT_EQ(cache.Merge(cache.Snapshot(0), nullptr), nullptr);

  auto [left, right] = cache.Split(std::move(merged), 3);
  EXPECT_EQ(left, nullptr);
  EXPECT_EQ(right.get(), child_raw);
  EXPECT_EQ(right->to(), 4);
}

// ---- programmer errors ----------------------------------------------------------------

TEST(RecurrentCacheDeathTest, GetWithAnotherDtypeAborts) {
  RecurrentCache cache(Dims());
  cache.Get(DType::kBFloat16);
  EXPECT_DEATH(cache.Get(DType::kFloat32), "conv state is bf16");
}

TEST(RecurrentCacheDeathTest, PutWithTheWrongNumberOfStatesAborts) {
  RecurrentCache cache = CacheAt(1, 0.0f);
  ASSERT_TRUE(cache.PrepareSnapshots({3}).ok());  // one interior split for 4 tokens
  EXPECT_DEATH(cache.Put(4, {ConvFilled(DType::kFloat32, 1.0f)}, {DeltaFilled(1.0f)}),
               "1 states for 1 snapshot splits");
  EXPECT_DEATH(cache.Put(1, {}, {}), "non-empty");
}

// Each dimension of a state is checked on its own (the guard-family operator mutants found
// a conv state of the wrong width accepted, no test having tried one).
TEST(RecurrentCacheDeathTest, PutOfAStateWithAnotherShapeAborts) {
  const RecurrentDims d = Dims();
  RecurrentCache cache = CacheAt(1, 0.0f);
  const auto conv = [](int64_t rows, int64_t cols) {
    return Tensor::FromFloat(DType::kFloat32, MatF::Constant(rows, cols, 1.0f));
  };
  EXPECT_DEATH(cache.Put(1, {conv(d.conv_tail, d.conv_dim() + 1)}, {DeltaFilled(1.0f)}),
               "does not match");
  EXPECT_DEATH(cache.Put(1, {conv(d.conv_tail + 1, d.conv_dim())}, {DeltaFilled(1.0f)}),
               "does not match");
  EXPECT_DEATH(cache.Put(1, {ConvFilled(DType::kBFloat16, 1.0f)}, {DeltaFilled(1.0f)}),
               "does not match");
  EXPECT_DEATH(cache.Put(1, {ConvFilled(DType::kFloat32, 1.0f)},
                         {MatF::Constant(d.delta_rows() + 1, d.head_k_dim, 1.0f)}),
               "does not match");
  EXPECT_DEATH(cache.Put(1, {ConvFilled(DType::kFloat32, 1.0f)},
                         {MatF::Constant(d.delta_rows(), d.head_k_dim + 1, 1.0f)}),
               "does not match");
}

}  // namespace
}  // namespace kvtwin
