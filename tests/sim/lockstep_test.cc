// Goal: the lock-step simulator is deterministic, passes on correct caches across every
// preset, and its checks fire on wrong state. Method: fixed seeds run twice must give equal
// digests; sweeps over presets must find no divergence; hand-corrupted production state
// and snapshots must be reported with decoded provenance.
#include "sim/lockstep.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>

#include "sim/checks.h"
#include "sim/forward.h"
#include "sim/run.h"
#include "sim/synthetic.h"
#include "src/kernels.h"
#include "src/kv_cache.h"
#include "src/recurrent_cache.h"
#include "src/rotating_cache.h"

namespace kvtwin::sim {
namespace {

RunOptions Options(const std::string& preset, const std::string& dtype, int64_t window = 4) {
  RunOptions o;
  o.preset = preset;
  o.layers = 4;
  o.window = window;
  o.dtype = dtype;
  o.steps = 600;
  return o;
}

TEST(Determinism, SameSeedGivesSameDigestTwice) {
  for (uint64_t seed : {1u, 7u, 42u}) {
    const RunResult a = RunSeed(Options("mixed", "bf16"), seed);
    const RunResult b = RunSeed(Options("mixed", "bf16"), seed);
    EXPECT_EQ(a.digest, b.digest) << "seed " << seed;
    EXPECT_EQ(a.steps, b.steps);
    EXPECT_FALSE(a.divergence.has_value()) << a.divergence->ToString();
  }
}

TEST(Determinism, DifferentSeedsGiveDifferentDigests) {
  EXPECT_NE(RunSeed(Options("mixed", "f32"), 1).digest, RunSeed(Options("mixed", "f32"), 2).digest);
}

TEST(Determinism, SwarmSeedChoosesTheSameStackTwice) {
  RunOptions o;
  o.swarm = true;
  o.steps = 300;
  const RunResult a = RunSeed(o, 99);
  const RunResult b = RunSeed(o, 99);
  EXPECT_EQ(a.stack, b.stack);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.digest, b.digest);
}

TEST(ModelDimsSweep, DrawnDimsPassOnCorrectCachesAndChangeTheRun) {
  // Widths other than the defaults reach every layer kind: each drawn set passes, and the
  // digest moves with them (the rows and states are built at those widths).
  Rng rng = Rng::Derive(3, "dims-test");
  for (int i = 0; i < 6; ++i) {
    RunOptions o = Options("mixed", i % 2 == 0 ? "f32" : "bf16", 3);
    o.steps = 400;
    const uint64_t default_digest = RunSeed(o, 11).digest;
    o.dims = DrawModelDims(rng);
    ASSERT_TRUE(ValidateRunOptions(o).ok()) << o.dims.Describe();
    const RunResult r = RunSeed(o, 11);
    ASSERT_FALSE(r.divergence.has_value()) << r.divergence->ToString() << "\n" << r.reproduce;
    EXPECT_NE(r.stack.find(o.dims.Describe()), std::string::npos) << r.stack;
    if (o.dims != ModelDims{}) {
      EXPECT_NE(r.digest, default_digest) << o.dims.Describe();
    }
  }
}

TEST(ModelDimsSweep, SwarmSeedsDrawDimsForSomeSeedsOnly) {
  RunOptions o;
  o.swarm = true;
  o.steps = 50;
  int drawn = 0;
  const std::string defaults = ModelDims{}.Describe();
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const RunResult r = RunSeed(o, seed);
    ASSERT_FALSE(r.divergence.has_value()) << r.divergence->ToString() << "\n" << r.reproduce;
    drawn += r.stack.find(defaults) == std::string::npos ? 1 : 0;
  }
  EXPECT_GT(drawn, 5);
  EXPECT_LT(drawn, 35);
}

TEST(ModelDims, FlagsParseValidateAndPrintBack) {
  ModelDims d;
  ASSERT_TRUE(ParseKvDims("1,8,7", &d).ok());
  ASSERT_TRUE(ParseRecurrentDims("2,3,6,4,1", &d).ok());
  EXPECT_EQ(d.kv_heads, 1);
  EXPECT_EQ(d.head_dim, 8);
  EXPECT_EQ(d.value_dim, 7);
  EXPECT_EQ(
      d.recurrent,
      (RecurrentDims{
          .conv_tail = 2, .num_k_heads = 3, .num_v_heads = 6, .head_k_dim = 4, .head_v_dim = 1}));
  EXPECT_TRUE(d.Validate().ok());
  EXPECT_EQ(DimsFlags(d), " --kv-dims 1,8,7 --recurrent-dims 2,3,6,4,1");
  EXPECT_EQ(DimsFlags(ModelDims{}), "");
  for (const char* bad : {"", "1,8", "1,8,7,6", "1,,7", "a,8,7", "1,8,7 ", " 1,8,7", "1;8;7",
                          "1,8,99999999999999999999"}) {
    ModelDims before;
    EXPECT_EQ(ParseKvDims(bad, &before).message(),
              fmt::format("--kv-dims must be HEADS,DK,DV, got '{}'", bad));
    EXPECT_EQ(before, ModelDims{}) << "a refused value changed nothing: " << bad;
  }
  EXPECT_FALSE(ParseRecurrentDims("1,2,3,4", &d).ok());
  ModelDims wide;
  ASSERT_TRUE(ParseKvDims("64,512,512", &wide).ok());
  EXPECT_TRUE(wide.Validate().ok());
  ASSERT_TRUE(ParseKvDims("65,512,512", &wide).ok());
  EXPECT_EQ(ValidateDimsFlags(wide).message(), "--kv-dims: kv heads must be in 1..64, got 65");
  // DV 0 is an MLA layer (K alone carries the tag); a V narrower than the tag is not.
  ASSERT_TRUE(ParseKvDims("2,4,0", &wide).ok());
  EXPECT_TRUE(ValidateDimsFlags(wide).ok());
  ASSERT_TRUE(ParseKvDims("2,4,3", &wide).ok());
  EXPECT_EQ(ValidateDimsFlags(wide).message(),
            "--kv-dims: kv heads x head_dim = 8 and kv heads x value_dim = 6 must be >= 7 so K and "
            "V rows carry their provenance (value_dim 0: an MLA layer)");
  ASSERT_TRUE(ParseKvDims("2,4,-1", &wide).ok());
  EXPECT_EQ(ValidateDimsFlags(wide).message(), "--kv-dims: kv value_dim must be in 0..512, got -1");
  ASSERT_TRUE(ParseKvDims("2,4,5", &wide).ok());
  ASSERT_TRUE(ParseRecurrentDims("3,2,5,2,3", &wide).ok());
  EXPECT_EQ(ValidateDimsFlags(wide).message(),
            "--recurrent-dims: recurrent num_v_heads (5) must be a multiple of num_k_heads (2)");
}

TEST(ModelDims, DrawnDimsAreValidAndCoverEveryWidthRange) {
  Rng rng = Rng::Derive(1, "dims-cover");
  std::set<int64_t> kv_heads, conv_tails, k_heads, groups;
  bool unequal_pairs = false;
  int mla = 0;
  for (int i = 0; i < 500; ++i) {
    const ModelDims d = DrawModelDims(rng);
    ASSERT_TRUE(d.Validate().ok()) << d.Describe();
    mla += d.value_dim == 0 ? 1 : 0;
    kv_heads.insert(d.kv_heads);
    conv_tails.insert(d.recurrent.conv_tail);
    k_heads.insert(d.recurrent.num_k_heads);
    groups.insert(d.recurrent.num_v_heads / d.recurrent.num_k_heads);
    // The pairs the default dims make equal come apart in some draws.
    unequal_pairs = unequal_pairs ||
                    (d.recurrent.num_k_heads != d.recurrent.head_k_dim &&
                     d.recurrent.conv_tail != d.recurrent.head_v_dim && d.head_dim != d.value_dim);
  }
  EXPECT_EQ(kv_heads, (std::set<int64_t>{1, 2, 3}));
  EXPECT_EQ(conv_tails, (std::set<int64_t>{0, 1, 2, 3, 4}));  // 0: a kernel of one tap
  EXPECT_EQ(k_heads, (std::set<int64_t>{1, 2, 3}));
  EXPECT_EQ(groups, (std::set<int64_t>{1, 2, 3, 4}));  // 3: a group not a power of two
  EXPECT_TRUE(unequal_pairs);
  EXPECT_GT(mla, 30);  // MLA layers (a zero-width V), one draw in eight
  EXPECT_LT(mla, 100);
}

class PresetSweep : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(PresetSweep, FindsNoDivergenceOnCorrectCaches) {
  const auto& [preset, dtype] = GetParam();
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    for (int64_t window : {1, 3, 8}) {
      const RunResult r = RunSeed(Options(preset, dtype, window), seed);
      ASSERT_FALSE(r.divergence.has_value()) << r.divergence->ToString() << "\n" << r.reproduce;
      EXPECT_EQ(r.steps, 600);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPresets, PresetSweep,
                         ::testing::Combine(::testing::Values("dense", "sliding", "recurrent",
                                                              "mixed"),
                                            ::testing::Values("f32", "bf16")));

TEST(RunOptions, ImpossibleConfigurationsAreInvalidArguments) {
  RunOptions o = Options("mixed", "f32");
  o.window = 0;
  EXPECT_EQ(ValidateRunOptions(o).code(), StatusCode::kInvalidArgument);
  o = Options("nonsense", "f32");
  EXPECT_EQ(ValidateRunOptions(o).code(), StatusCode::kInvalidArgument);
  o = Options("mixed", "f16");
  EXPECT_EQ(ValidateRunOptions(o).code(), StatusCode::kInvalidArgument);
  o = Options("mixed", "f32");
  o.steps = 0;
  EXPECT_EQ(ValidateRunOptions(o).code(), StatusCode::kInvalidArgument);
}

TEST(ReproduceCommand, NamesEveryOptionOfTheRun) {
  EXPECT_EQ(ReproduceCommand(Options("sliding", "bf16", 3), 17),
            "kvtwin sweep --seeds 17..17 --preset sliding --layers 4 --window 3 --dtype bf16 "
            "--steps 600");
  RunOptions o = Options("mixed", "f32");
  o.dims.kv_heads = 1;
  o.dims.head_dim = 7;
  EXPECT_EQ(ReproduceCommand(o, 2),
            "kvtwin sweep --seeds 2..2 --preset mixed --layers 4 --window 4 --dtype f32 "
            "--kv-dims 1,7,5 --steps 600");
}

// ---- the checks fire on wrong state ----

StackConfig OneLayer(CacheKind kind, int64_t window = 4) {
  StackConfig c;
  c.layers = {LayerSpec{kind, window}};
  return c;
}

model::TokenLog Tokens(const SyntheticForward& synth, std::vector<int32_t> ids, uint64_t h) {
  model::TokenLog log;
  for (int32_t id : ids) {
    h = NextHash(h, id);
    log.push_back({id, h});
  }
  (void)synth;
  return log;
}

TEST(LayerOracle, ReportsARowFromAnotherBranchWithItsProvenance) {
  SyntheticForward synth(5);
  StackConfig config = OneLayer(CacheKind::kFullKv);
  LayerOracle oracle(synth, config, 0);
  const model::TokenLog branch_a = Tokens(synth, {1, 2, 3}, 5);
  const model::TokenLog branch_b = Tokens(synth, {1, 4, 3}, 5);  // same token at position 2
  KvCache cache;
  Tensor k(DType::kFloat32, 3, config.k_cols()), v(DType::kFloat32, 3, config.v_cols());
  for (int64_t p = 0; p < 3; ++p) {
    oracle.FillRow(k, p, p, branch_b[static_cast<size_t>(p)], false);
    oracle.FillRow(v, p, p, branch_b[static_cast<size_t>(p)], true);
  }
  (void)cache.Update(k, v);
  model::RefCache ref = model::RefCache::Kv();
  ref.Write(branch_a);
  const Check c = oracle.CheckLive(cache, ref);
  ASSERT_TRUE(c.has_value());
  EXPECT_NE(c->what.find("slot 1"), std::string::npos) << c->what;
  EXPECT_NE(c->actual.find("pos 1"), std::string::npos) << c->actual;
}

// The oracle dispatches on the production object's kind, so a cache or snapshot of another
// kind than the layer's must be reported, not checked as what it claims to be.
TEST(LayerOracle, ReportsACacheOrSnapshotOfAnotherKindThanTheLayer) {
  SyntheticForward synth(5);
  const StackConfig recurrent = OneLayer(CacheKind::kRecurrent);
  RecurrentCache cache(recurrent.dims.recurrent);
  const model::TokenLog log = Tokens(synth, {1, 2, 3}, synth.seed());
  const ConvWeights conv = synth.ConvParams(0, recurrent.dims.recurrent);
  const GdnParams gdn = synth.GdnParamsFor(0, recurrent.dims.recurrent);
  (void)ForwardSynthetic(cache, recurrent, synth, 0, 0, log, &conv, &gdn);
  LayerOracle right(synth, recurrent, 0);
  const Check ok = right.CheckLiveContent(cache, log);
  EXPECT_FALSE(ok.has_value()) << ok->what;
  model::RefCache ref = model::RefCache::Recurrent();
  ref.Write(log);
  EXPECT_FALSE(right.CheckLive(cache, ref).has_value());
  const SnapshotPtr snap = cache.Snapshot(0);
  ASSERT_NE(snap, nullptr);
  const model::RefSnap ref_snap = ref.Snapshot(0);
  EXPECT_FALSE(right.CheckSnapshot(snap.get(), ref_snap).has_value());
  for (const CacheKind kind : {CacheKind::kFullKv, CacheKind::kRotating}) {
    LayerOracle wrong(synth, OneLayer(kind), 0);
    const Check content = wrong.CheckLiveContent(cache, log);
    ASSERT_TRUE(content.has_value());
    EXPECT_EQ(content->what, "live cache kind");
    const Check live = wrong.CheckLive(cache, ref);
    ASSERT_TRUE(live.has_value());
    EXPECT_EQ(live->what, "live cache kind");
    const Check snapshot = wrong.CheckSnapshot(snap.get(), ref_snap);
    ASSERT_TRUE(snapshot.has_value());
    EXPECT_EQ(snapshot->what, "snapshot kind");
  }
}

// Live rows are compared a whole run at a time; one wrong element anywhere in a long buffer
// (first, middle or last row, K or V) must still name its own slot.
// A KV snapshot far from position 0 on a fresh oracle: its slots 0..n-1 and positions
// from..to-1 come from one identity buffer, which the positions grow. A slot span taken
// before that growth dangles (it once read freed memory and reported a row out of range).
TEST(LayerOracle, ChecksAKvSnapshotFarFromTheStartOnAFreshOracle) {
  SyntheticForward synth(5);
  StackConfig config = OneLayer(CacheKind::kFullKv);
  constexpr int64_t kFrom = 300, kTo = 310;
  std::vector<int32_t> ids(kTo);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1 + static_cast<int32_t>(i % 5);
  const model::TokenLog log = Tokens(synth, ids, 5);
  const model::RefSnapshot ref{model::RefKind::kKv, kFrom, kTo,
                               model::TokenLog(log.begin() + kFrom, log.end())};
  for (const int64_t bad : {int64_t{-1}, int64_t{0}, int64_t{9}}) {
    LayerOracle oracle(synth, config, 0);
    Tensor k(DType::kFloat32, kTo, config.k_cols()), v(DType::kFloat32, kTo, config.v_cols());
    for (int64_t p = 0; p < kTo; ++p) {
      oracle.FillRow(k, p, p, log[static_cast<size_t>(p)], false);
      oracle.FillRow(v, p, p, log[static_cast<size_t>(p)], true);
    }
    if (bad >= 0) v.Set(kFrom + bad, 2, v.At(kFrom + bad, 2) + 1.0f);
    KvCache cache;
    (void)cache.Update(k, v);
    const SnapshotPtr snap = cache.Snapshot(kFrom);
    ASSERT_NE(snap, nullptr);
    const Check c = oracle.CheckSnapshot(snap.get(), ref);
    if (bad < 0) {
      EXPECT_FALSE(c.has_value()) << c->what;
      continue;
    }
    ASSERT_TRUE(c.has_value()) << bad;
    EXPECT_NE(
        c->what.find(fmt::format("kv snapshot slot {} (logical position {})", bad, kFrom + bad)),
        std::string::npos)
        << c->what;
  }
}

TEST(LayerOracle, NamesTheOneWrongRowOfALongBuffer) {
  SyntheticForward synth(5);
  StackConfig config = OneLayer(CacheKind::kFullKv);
  std::vector<int32_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1 + static_cast<int32_t>(i % 5);
  const model::TokenLog log = Tokens(synth, ids, 5);
  model::RefCache ref = model::RefCache::Kv();
  ref.Write(log);
  for (const int64_t bad : {int64_t{-1}, int64_t{0}, int64_t{23}, int64_t{39}}) {
    for (const bool in_value : {false, true}) {
      LayerOracle oracle(synth, config, 0);
      Tensor k(DType::kFloat32, 40, config.k_cols()), v(DType::kFloat32, 40, config.v_cols());
      for (int64_t p = 0; p < 40; ++p) {
        oracle.FillRow(k, p, p, log[static_cast<size_t>(p)], false);
        oracle.FillRow(v, p, p, log[static_cast<size_t>(p)], true);
      }
      if (bad >= 0) (in_value ? v : k).Set(bad, 5, (in_value ? v : k).At(bad, 5) + 1.0f);
      KvCache cache;
      (void)cache.Update(k, v);
      const Check c = oracle.CheckLive(cache, ref);
      if (bad < 0) {
        EXPECT_FALSE(c.has_value()) << c->what;
        continue;
      }
      ASSERT_TRUE(c.has_value()) << bad;
      EXPECT_NE(c->what.find(fmt::format("slot {} ", bad)), std::string::npos) << c->what;
      EXPECT_EQ(c->expected.back(), in_value ? 'V' : 'K') << c->expected;
      EXPECT_NE(c->actual.find(fmt::format("pos {} ", bad)), std::string::npos) << c->actual;
    }
  }
}

TEST(LayerOracle, ReportsAnOffsetMismatch) {
  SyntheticForward synth(5);
  LayerOracle oracle(synth, OneLayer(CacheKind::kRotating), 0);
  RotatingCache cache(4);
  model::RefCache ref = model::RefCache::Rotating(4);
  ref.Write(Tokens(synth, {1}, 5));
  const Check c = oracle.CheckLive(cache, ref);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->what, "offset");
}

TEST(LayerOracle, AcceptsTheKernelStateAndRejectsItPerturbedBeyondTolerance) {
  SyntheticForward synth(5);
  StackConfig config = OneLayer(CacheKind::kRecurrent);
  const RecurrentDims& d = config.dims.recurrent;
  LayerOracle oracle(synth, config, 0);
  const model::TokenLog tokens = Tokens(synth, {1}, 5);
  model::RefCache ref = model::RefCache::Recurrent();
  ref.Write(tokens);
  MatF conv = MatF::Zero(d.conv_tail, d.conv_dim());
  synth.FillConvInput(conv, d.conv_tail - 1, DType::kFloat32, 0, 0, tokens[0].h, d.conv_dim());
  GdnInputs in{MatF(1, d.conv_dim()), MatF(1, 2 * d.num_v_heads)};
  synth.FillGdnInput(in.qkv, in.ba, 0, DType::kFloat32, 0, 0, tokens[0].h, d);
  const MatF zero = MatF::Zero(d.delta_rows(), d.head_k_dim);
  const MatF state = GatedDelta(zero, in, 1, synth.GdnParamsFor(0, d), {}).states[0];
  for (float bump : {0.0f, 1e-3f}) {
    RecurrentCache cache(d);
    (void)cache.Get(DType::kFloat32);
    MatF delta = state;
    delta(1, d.head_k_dim - 1) += bump;
    cache.Put(1, {Tensor::FromFloat(DType::kFloat32, conv)}, {delta});
    const Check c = oracle.CheckLive(cache, ref);
    if (bump == 0.0f) {
      EXPECT_FALSE(c.has_value()) << c->what << ": " << c->expected << " vs " << c->actual;
    } else {
      ASSERT_TRUE(c.has_value());
      EXPECT_NE(c->what.find("delta"), std::string::npos) << c->what;
    }
  }
}

TEST(LayerOracle, ReportsASnapshotThatShouldBeNull) {
  SyntheticForward synth(5);
  LayerOracle oracle(synth, OneLayer(CacheKind::kRecurrent), 0);
  RecurrentDims dims;
  RecurrentSnapshot snap(0, Tensor(DType::kFloat32, dims.conv_tail, dims.conv_dim()),
                         MatF::Zero(dims.delta_rows(), dims.head_k_dim));
  const Check c = oracle.CheckSnapshot(&snap, std::nullopt);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->what, "snapshot presence");
}

// Spec §7: a window snapshot is a clone of State(), so a linear one holds exactly its `to`
// rows (grow padding excluded), and SizeBytes() counts what the snapshot must hold: the
// trie's byte counter and the eviction budget are sums of it.
TEST(LayerOracle, ReportsSnapshotSizesThatAreNotTheSpecs) {
  SyntheticForward synth(5);
  const StackConfig window_config = OneLayer(CacheKind::kRotating);
  LayerOracle rotating(synth, window_config, 0);
  const model::TokenLog log = Tokens(synth, {1, 2}, 5);
  const model::RefSnap ref =
      model::RefSnapshot{model::RefKind::kRotating, 0, 2, model::TokenLog(log)};
  for (const int64_t rows : {int64_t{2}, int64_t{4}}) {  // 4: two rows of grow padding
    Tensor k(DType::kFloat32, rows, window_config.k_cols()),
        v(DType::kFloat32, rows, window_config.v_cols());
    for (int64_t p = 0; p < 2; ++p) {
      rotating.FillRow(k, p, p, log[static_cast<size_t>(p)], false);
      rotating.FillRow(v, p, p, log[static_cast<size_t>(p)], true);
    }
    const RotatingSnapshot snap(0, 2, 2, std::move(k), std::move(v));
    const Check c = rotating.CheckSnapshot(&snap, ref);
    if (rows == 2) {
      EXPECT_FALSE(c.has_value()) << c->what;
    } else {
      ASSERT_TRUE(c.has_value());
      EXPECT_EQ(c->what, "window snapshot rows (a clone of State())");
      EXPECT_EQ(c->expected, "2");
    }
  }
  // A KV snapshot whose V rows are as wide as K's (a cache that sized V with Dk): 2 rows of
  // f32 K (8 columns) and V (10 columns) are 144 bytes, not 128.
  {
    const StackConfig kv_config = OneLayer(CacheKind::kFullKv);
    ASSERT_NE(kv_config.k_cols(), kv_config.v_cols());
    LayerOracle kv(synth, kv_config, 0);
    Tensor k(DType::kFloat32, 2, kv_config.k_cols()), v(DType::kFloat32, 2, kv_config.k_cols());
    for (int64_t p = 0; p < 2; ++p) {
      kv.FillRow(k, p, p, log[static_cast<size_t>(p)], false);
      kv.FillRow(v, p, p, log[static_cast<size_t>(p)], true);
    }
    const std::unique_ptr<KvSnapshot> snap =
        KvSnapshot::Make(0, 2, {TensorView(k)}, {TensorView(v)});
    const Check c =
        kv.CheckSnapshot(snap.get(), model::RefSnapshot{model::RefKind::kKv, 0, 2, log});
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->what, "snapshot SizeBytes (spec §7)");
    EXPECT_EQ(c->expected, "144");
    EXPECT_EQ(c->actual, "128");
  }
  // A recurrent snapshot whose conv tail is not in the activation dtype: 3 x 20 bf16 + 12 x 2
  // float32 is 216 bytes, where an f32 stack needs 336.
  const StackConfig config = OneLayer(CacheKind::kRecurrent);
  const RecurrentDims& d = config.dims.recurrent;
  LayerOracle recurrent(synth, config, 0);
  const RecurrentSnapshot snap(0, Tensor(DType::kBFloat16, d.conv_tail, d.conv_dim()),
                               MatF::Zero(d.delta_rows(), d.head_k_dim));
  const Check c = recurrent.CheckSnapshot(
      &snap, model::RefSnapshot{model::RefKind::kRecurrent, 0, 0, model::TokenLog{}});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->what, "snapshot SizeBytes (spec §7)");
  EXPECT_EQ(c->expected, "336");
  EXPECT_EQ(c->actual, "216");
}

TEST(RotatingWindowSlots, ReadsEachStorageRegime) {
  EXPECT_EQ(*RotatingWindowSlots(3, 3, 4, 4), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(*RotatingWindowSlots(6, 2, 4, 4), (std::vector<int64_t>{2, 3, 0, 1}));
  EXPECT_EQ(*RotatingWindowSlots(10, 6, 6, 4), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_FALSE(RotatingWindowSlots(3, 2, 4, 4).ok());   // linear but cursor != offset
  EXPECT_FALSE(RotatingWindowSlots(10, 3, 6, 4).ok());  // oversize but cursor != rows
}

TEST(Synthetic, RowsDecodeToTheirProvenance) {
  SyntheticForward synth(3);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const Tensor row = synth.KvRow(dtype, 8, 5, 70000, 0xabcdef12ULL, true);
    const Provenance p = DecodeRow(row, 0);
    ASSERT_TRUE(p.valid);
    EXPECT_EQ(p.position, 70000);
    EXPECT_EQ(p.hash24, 0xcdef12u);
    EXPECT_EQ(p.layer, 5);
    EXPECT_TRUE(p.is_value);
  }
}

TEST(Synthetic, ValuesDependOnTheWholePrefix) {
  // Same token at the same position after different prefixes: different hash, different K.
  const uint64_t a = NextHash(NextHash(0, 1), 9);
  const uint64_t b = NextHash(NextHash(0, 2), 9);
  EXPECT_NE(a, b);
  SyntheticForward synth(3);
  EXPECT_FALSE(synth.KvRow(DType::kFloat32, 8, 0, 1, a, false)
                   .Equals(synth.KvRow(DType::kFloat32, 8, 0, 1, b, false)));
}

}  // namespace
}  // namespace kvtwin::sim
