// Goal: speculation transactions (kSpeculate) pass the lock-step checks on every preset,
// dtype and window, and the generator really produces the hard cases: windows smaller
// than the forward, rings that have wrapped, every acceptance count including the ones the
// commit must clamp, isolated speculations, transactions dropped without a commit (mid-stack
// and after the whole forward), and capture schedules active across a commit.
// Method: speculation-heavy op mixes from OpGenerator, fixed seeds; the driver checks every
// step; counters over the generated ops must all be non-zero, so the test fails if the
// generator stops reaching a case rather than passing vacuously.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "sim/generator.h"
#include "sim/lockstep.h"
#include "sim/stack.h"

namespace kvtwin::sim {
namespace {

struct Coverage {
  int64_t speculations = 0, isolated = 0, full_accept = 0, none_accepted = 0, clamped = 0,
          window_smaller_than_forward = 0, wrapped_ring = 0, schedule_active = 0,
          abandoned_mid_stack = 0, abandoned_after_forward = 0;
};

void Note(const LockstepDriver& d, const Op& op, Coverage& c) {
  if (op.kind != OpKind::kSpeculate) return;
  ++c.speculations;
  const auto drafts = static_cast<int64_t>(op.tokens.size()) - 1;
  if (op.isolated) {
    ++c.isolated;
  } else if (op.abandon_after >= 0) {
    c.abandoned_mid_stack += op.abandon_after > 0 && op.abandon_after < d.num_layers();
    c.abandoned_after_forward += op.abandon_after == d.num_layers();
  } else if (op.value < 0 || op.value > drafts) {
    ++c.clamped;
  } else {
    c.full_accept += op.value == drafts;
    c.none_accepted += op.value == 0;
  }
  for (int32_t l = 0; l < d.num_layers(); ++l) {
    const model::RefCache& ref = d.ref(l);
    c.schedule_active += ref.ScheduleActive();
    if (ref.kind() != model::RefKind::kRotating) continue;
    c.window_smaller_than_forward += ref.window() < drafts + 1;
    c.wrapped_ring += ref.Offset() > ref.window();
  }
}

class SpeculationSweep : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(SpeculationSweep, FindsNoDivergenceAndReachesTheHardCases) {
  const auto& [preset, dtype] = GetParam();
  OpWeights w;
  w.write = 10;
  w.speculate = 25;
  w.capture_spec = 3;
  w.merge = w.split = w.free = w.close = 1;
  Coverage c;
  for (int64_t window : {1, 2, 4, 32}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      StackConfig config = StackFromPreset(preset, 4, window, *ParseDType(dtype)).value();
      LockstepDriver driver(config, seed);
      OpGenerator gen(Rng::Derive(seed, "speculation-sweep"), w);
      for (int i = 0; i < 400; ++i) {
        const Op op = gen.Next(driver);
        Note(driver, op, c);
        auto d = driver.Apply(op);
        ASSERT_FALSE(d.has_value())
            << d->ToString() << "\n(seed " << seed << ", W " << window << ")";
      }
    }
  }
  EXPECT_GT(c.speculations, 0);
  EXPECT_GT(c.isolated, 0);
  EXPECT_GT(c.full_accept, 0);
  EXPECT_GT(c.none_accepted, 0);
  EXPECT_GT(c.clamped, 0);
  EXPECT_GT(c.abandoned_mid_stack, 0);
  EXPECT_GT(c.abandoned_after_forward, 0);
  EXPECT_GT(c.schedule_active, 0);
  if (preset != "dense" && preset != "recurrent") {
    EXPECT_GT(c.window_smaller_than_forward, 0);
    EXPECT_GT(c.wrapped_ring, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(AllPresets, SpeculationSweep,
                         ::testing::Combine(::testing::Values("dense", "sliding", "recurrent",
                                                              "mixed"),
                                            ::testing::Values("f32", "bf16")));

}  // namespace
}  // namespace kvtwin::sim
