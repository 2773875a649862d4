// OpGenerator reaches the restores that only a directed draw makes common, on every layer
// kind, with the default weights the sweeps of `kvtwin run` use:
//   * a held snapshot restored where the layer already stands, taken on another branch
//     (a cache that skips the install when the offsets agree keeps the wrong state);
//   * a held snapshot restored onto an offset an active schedule names, before any write
//     reached it (a cache that captures on landing there hands the restored state back).
// Method: fixed seeds (6 x 1,000 ops, W = 8); the driver checks every step, and both counts
// must be non-zero (3 and 14-33 per preset when written), so the test fails when the
// generator stops drawing a case instead of passing without it. The schedule is followed
// from the ops themselves (the reference keeps its offsets private).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "sim/generator.h"
#include "sim/lockstep.h"
#include "sim/stack.h"

namespace kvtwin::sim {
namespace {

struct Reach {
  int64_t restore_at_live_offset_other_branch = 0;
  int64_t restore_onto_scheduled_offset_ahead = 0;
};

class GeneratorReach : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GeneratorReach, DrawsTheDirectedRestoresOnEveryKind) {
  const auto& [preset, dtype] = GetParam();
  Reach r;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    StackConfig config = StackFromPreset(preset, 3, 8, *ParseDType(dtype)).value();
    LockstepDriver driver(config, seed);
    OpGenerator gen(Rng::Derive(seed, "generator-reach"), OpWeights{});
    std::vector<std::vector<int64_t>> scheduled(static_cast<size_t>(driver.num_layers()));
    for (int i = 0; i < 1000; ++i) {
      const Op op = gen.Next(driver);
      const bool was_active = op.layer >= 0 && driver.ref(op.layer).ScheduleActive();
      if (op.kind == OpKind::kRestore && op.slot >= 0) {
        const model::RefCache& ref = driver.ref(op.layer);
        const model::RefSnapshot& snap = *driver.pool_ref(op.layer, op.slot);
        const bool whole_state = snap.kind != model::RefKind::kKv;
        if (op.value == ref.Offset() && snap.to == ref.Offset() && whole_state &&
            !std::ranges::equal(snap.tokens.span(), ref.log())) {
          ++r.restore_at_live_offset_other_branch;
        }
        const auto& s = scheduled[static_cast<size_t>(op.layer)];
        if (was_active && op.value > ref.Offset() &&
            std::find(s.begin(), s.end(), op.value) != s.end()) {
          ++r.restore_onto_scheduled_offset_ahead;
        }
      }
      auto d = driver.Apply(op);
      ASSERT_FALSE(d.has_value()) << d->ToString() << "\n(seed " << seed << ")";
      for (int32_t l = 0; l < driver.num_layers(); ++l) {
        if (!driver.ref(l).ScheduleActive()) scheduled[static_cast<size_t>(l)].clear();
      }
      if (op.kind == OpKind::kPrepare && !was_active && driver.ref(op.layer).ScheduleActive()) {
        scheduled[static_cast<size_t>(op.layer)] = op.offsets;
      }
    }
  }
  // A KV snapshot is a range, not a whole state: the case is the window and recurrent kinds'.
  if (preset != "dense") {
    EXPECT_GT(r.restore_at_live_offset_other_branch, 0);
  }
  EXPECT_GT(r.restore_onto_scheduled_offset_ahead, 0);
}

// Writes of padding alone come only on stacks of recurrent layers, and there they give
// state at offset 0, which a snapshot then takes (a layer that reads offset 0 as "no state"
// hands back null).
TEST(GeneratorReachPadding, PadsAloneOnlyOnRecurrentStacksAndSnapshotsTheStateAtZero) {
  for (const std::string preset : {"recurrent", "mixed"}) {
    int64_t padding_alone = 0, snapshots_of_state_at_zero = 0;
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      StackConfig config = StackFromPreset(preset, 3, 8, DType::kFloat32).value();
      LockstepDriver driver(config, seed);
      OpGenerator gen(Rng::Derive(seed, "generator-reach"), OpWeights{});
      for (int i = 0; i < 1000; ++i) {
        const Op op = gen.Next(driver);
        if (op.kind == OpKind::kWrite && op.tokens.empty()) {
          ++padding_alone;
          EXPECT_GT(op.pad, 0);
        }
        if (op.kind == OpKind::kSnapshot && driver.ref(op.layer).HasState() &&
            driver.ref(op.layer).Offset() == 0) {
          ++snapshots_of_state_at_zero;
        }
        auto d = driver.Apply(op);
        ASSERT_FALSE(d.has_value()) << d->ToString() << "\n(" << preset << " seed " << seed << ")";
      }
    }
    SCOPED_TRACE(preset);
    if (preset == "recurrent") {
      EXPECT_GT(padding_alone, 0);
      EXPECT_GT(snapshots_of_state_at_zero, 0);
    } else {
      EXPECT_EQ(padding_alone, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPresets, GeneratorReach,
                         ::testing::Combine(::testing::Values("dense", "sliding", "recurrent",
                                                              "mixed"),
                                            ::testing::Values("f32", "bf16")));

}  // namespace
}  // namespace kvtwin::sim
