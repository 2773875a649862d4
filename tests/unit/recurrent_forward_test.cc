// Goal: RunRecurrentForward with a RecurrentForwardScratch is the same forward as without
// one. The scratch's state buffers rotate through Put (the layer swaps its old state into
// them), and one scratch serves every layer of a stack, so a buffer the kernels write may
// have held another layer's state or an older state of the same layer.
// Method: two caches share one scratch, their twins run without it; the same forwards
// (prefills of several lengths, padded and segmented ones, decode steps, forwards across
// scheduled captures) go through both, and after every forward the live states and every
// captured snapshot must be equal bit for bit: the same float steps on the same rows.
// Deterministic inputs (speculation_fixtures.h); no randomness.
#include "src/recurrent_forward.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "src/recurrent_cache.h"
#include "unit/speculation_fixtures.h"

namespace kvtwin {
namespace {

struct Step {
  int64_t count, pad;
  bool segmented;
  std::vector<int64_t> captures;  // offsets to schedule before the forward (absolute)
};

void ExpectSameCache(const RecurrentCache& got, const RecurrentCache& want) {
  EXPECT_EQ(got.Offset(), want.Offset());
  EXPECT_TRUE(got.conv().Equals(want.conv()));
  EXPECT_TRUE(got.delta().cwiseEqual(want.delta()).all());
}

void ExpectSameSnapshots(std::vector<SnapshotPtr> got, std::vector<SnapshotPtr> want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("snapshot " + std::to_string(i));
    ASSERT_EQ(got[i] == nullptr, want[i] == nullptr);
    if (got[i] == nullptr) continue;
    const auto& g = static_cast<const RecurrentSnapshot&>(*got[i]);
    const auto& w = static_cast<const RecurrentSnapshot&>(*want[i]);
    EXPECT_EQ(g.offset(), w.offset());
    EXPECT_TRUE(g.conv().Equals(w.conv()));
    EXPECT_TRUE(g.delta().cwiseEqual(w.delta()).all());
  }
}

TEST(RunRecurrentForward, ASharedScratchGivesTheStatesAndCapturesOfFreshBuffers) {
  const specfx::Kernels k = specfx::MakeKernels();
  // Shapes change, repeat, pad and segment; captures land inside and at the end of forwards.
  const std::vector<Step> steps = {
      {5, 0, false, {}}, {1, 0, false, {}},       {1, 0, false, {}}, {4, 2, false, {8, 10}},
      {1, 0, false, {}}, {6, 0, true, {13, 15}},  {1, 1, false, {}}, {1, 0, false, {20}},
      {3, 0, false, {}}, {7, 3, false, {25, 28}}, {1, 0, true, {}},  {1, 0, false, {}}};
  RecurrentCache a(specfx::Dims()), b(specfx::Dims());            // share one scratch
  RecurrentCache twin_a(specfx::Dims()), twin_b(specfx::Dims());  // fresh buffers
  RecurrentForwardScratch scratch;
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    const Step& s = steps[i];
    if (!s.captures.empty()) {
      for (RecurrentCache* c : {&a, &b, &twin_a, &twin_b}) {
        ASSERT_TRUE(c->PrepareSnapshots(s.captures).ok());
      }
    }
    // Layer b sees later positions than layer a, so the two never hold equal states.
    RecurrentForwardInputs in_a = specfx::TokenInputs(a.Offset(), s.count, s.pad);
    RecurrentForwardInputs in_b = specfx::TokenInputs(b.Offset() + 100, s.count, s.pad);
    in_a.segmented = in_b.segmented = s.segmented;
    RunRecurrentForward(a, in_a, k.conv, k.gdn, &scratch);
    RunRecurrentForward(twin_a, in_a, k.conv, k.gdn);
    RunRecurrentForward(b, in_b, k.conv, k.gdn, &scratch);
    RunRecurrentForward(twin_b, in_b, k.conv, k.gdn);
    ExpectSameCache(a, twin_a);
    ExpectSameCache(b, twin_b);
    EXPECT_FALSE(a.delta().cwiseEqual(b.delta()).all());
    if (!s.captures.empty()) {
      ExpectSameSnapshots(a.TakeSnapshots(), twin_a.TakeSnapshots());
      ExpectSameSnapshots(b.TakeSnapshots(), twin_b.TakeSnapshots());
    }
  }
}

// A forward of no rows at all still reads the layer (spec §2.3: Get creates the zero state
// of a layer that has none) and puts it back at an unchanged offset: the layer then holds
// a zero state, as after any forward, and a scheduled offset ahead stays pending.
TEST(RunRecurrentForward, AForwardOfNoRowsStillCreatesTheState) {
  const specfx::Kernels k = specfx::MakeKernels();
  RecurrentCache layer(specfx::Dims());
  ASSERT_FALSE(layer.HasState());
  ASSERT_TRUE(layer.PrepareSnapshots({2}).ok());
  RecurrentForwardScratch scratch;
  RunRecurrentForward(layer, specfx::TokenInputs(0, 0), k.conv, k.gdn, &scratch);
  EXPECT_TRUE(layer.HasState());
  EXPECT_EQ(layer.Offset(), 0);
  EXPECT_GT(layer.LiveBytes(), 0);
  EXPECT_EQ(layer.conv().dtype(), DType::kBFloat16);
  EXPECT_TRUE(layer.conv().ToFloat().isZero(0.0f));
  EXPECT_TRUE(layer.delta().isZero(0.0f));
  EXPECT_EQ(scratch.conv.out.rows(), 0);
  // The same layer then folds two tokens and takes the capture at 2.
  RunRecurrentForward(layer, specfx::TokenInputs(0, 2), k.conv, k.gdn, &scratch);
  const std::vector<SnapshotPtr> taken = layer.TakeSnapshots();
  ASSERT_EQ(taken.size(), 1u);
  ASSERT_NE(taken[0], nullptr);
  EXPECT_EQ(static_cast<const RecurrentSnapshot&>(*taken[0]).offset(), 2);
}

}  // namespace
}  // namespace kvtwin
