// Goal: the benchmark's production-only mode (ProductionRunner) makes exactly the PrefixCache
// calls the differential RequestDriver makes, so its speed is the speed of the replay minus
// the checks and nothing else. Method: the same request plans go through both, Mooncake
// plans (a prefix tree of block ids at three block scales) and generated conversation
// streams (every preset and dtype: extensions, divergences, cancels, user points, callers
// that schedule nothing, speculative decode), all at an unlimited budget (under a budget
// the driver's clock differs on purpose). After every request the runner's trie dump
// (structure, ranges, ticks, user flags, snapshot kinds and bytes, active path) and Begin
// report equal the driver's, and every snapshot in the runner's trie holds the rows of its
// key path (CheckTrieSoundness): equal dumps alone would miss rows of the wrong tokens.
#include "sim/production_runner.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "sim/mooncake.h"
#include "sim/replay.h"
#include "sim/request_driver.h"
#include "sim/trie_checks.h"
#include "src/core/check.h"
#include "src/core/rng.h"
#include "src/trie_export.h"

namespace kvtwin::sim {
namespace {

std::string Dump(const PrefixCache& pc) { return DumpTrie(pc.trie(), pc.active_path()); }

// Runs both sides over `plans`; stops at the first request where they disagree.
void ExpectSameCalls(const StackConfig& config, const std::vector<RequestPlan>& plans,
                     uint64_t value_seed) {
  const RequestDriverOptions options;  // unlimited budget, the replay's default cadence
  RequestDriver driver(config, options, value_seed);
  ProductionRunner runner(config, options, value_seed);
  SyntheticForward synth(value_seed);
  std::vector<std::unique_ptr<LayerOracle>> oracles;
  std::vector<LayerOracle*> oracle_ptrs;
  for (size_t i = 0; i < config.layers.size(); ++i) {
    oracles.push_back(std::make_unique<LayerOracle>(synth, config, static_cast<int32_t>(i)));
    oracle_ptrs.push_back(oracles.back().get());
  }
  SoundnessMemo memo;
  for (const RequestPlan& plan : plans) {
    SCOPED_TRACE(config.Describe() + ", request " + plan.ToString());
    const std::optional<RequestDivergence> div = driver.Run(plan);
    ASSERT_FALSE(div.has_value()) << div->ToString();
    const Status ran = runner.Run(plan);
    ASSERT_TRUE(ran.ok()) << ran.ToString();
    const BeginReport& want = driver.last_report();
    const BeginReport& got = runner.last_report();
    ASSERT_EQ(std::tie(got.total, got.matched, got.cached, got.left, got.free_all),
              std::tie(want.total, want.matched, want.cached, want.left, want.free_all));
    ASSERT_EQ(Dump(runner.manager()), Dump(driver.manager()));
    const Check sound = CheckTrieSoundness(runner.manager().trie(), oracle_ptrs, value_seed, &memo);
    ASSERT_FALSE(sound.has_value()) << sound->what;
  }
}

StackConfig Stack(const std::string& preset, DType dtype) {
  TraceHeader h;
  h.preset = preset;
  h.dtype = dtype == DType::kFloat32 ? "f32" : "bf16";
  Result<StackConfig> config = TraceStack(h);
  KV_CHECK(config.ok(), config.status().ToString());
  return *config;
}

// Mooncake requests whose ids form a prefix tree (an id always has the same parent): each
// request continues a random earlier request's first blocks with fresh ids.
std::vector<MooncakeRequest> MooncakeRequests(uint64_t seed, int count) {
  Rng rng = Rng::Derive(seed, "mooncake-plans");
  std::vector<MooncakeRequest> out;
  int64_t next_id = 0;
  for (int i = 0; i < count; ++i) {
    MooncakeRequest r;
    r.timestamp = i;
    if (!out.empty() && rng.Below(4) != 0) {
      const MooncakeRequest& base = out[rng.Below(out.size())];
      const uint64_t keep = 1 + rng.Below(base.hash_ids.size());
      r.hash_ids.assign(base.hash_ids.begin(), base.hash_ids.begin() + keep);
    }
    const uint64_t fresh = rng.Below(4) + (r.hash_ids.empty() ? 1 : 0);
    for (uint64_t k = 0; k < fresh; ++k) r.hash_ids.push_back(next_id++);
    const auto blocks = static_cast<int64_t>(r.hash_ids.size());
    // A full last block half of the time (a repeat then matches the whole prompt).
    const int64_t short_by = rng.Below(2) == 0 ? 0 : static_cast<int64_t>(rng.Below(511));
    r.input_length = blocks * kMooncakeBlockTokens - short_by;
    r.output_length = static_cast<int64_t>(rng.Below(1200));
    out.push_back(std::move(r));
  }
  return out;
}

TEST(ProductionRunner, MakesTheDriversCallsOnMooncakePlans) {
  const std::vector<MooncakeRequest> requests = MooncakeRequests(7, 60);
  for (const int64_t scale : {1, 3, 16}) {
    std::vector<RequestPlan> plans;
    for (size_t i = 0; i < requests.size(); ++i) {
      plans.push_back(MooncakePlan(requests[i], static_cast<int64_t>(i), scale));
    }
    ExpectSameCalls(Stack("dense", DType::kFloat32), plans, 11);
    if (HasFatalFailure()) return;
  }
}

class GeneratedPlans : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(GeneratedPlans, MakeTheSameCallsAsTheDriver) {
  const auto& [preset, dtype] = GetParam();
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    Rng mix_rng = Rng::Derive(seed, "swarm");
    // Seed 1: the default mix; seed 2: a swarm mix (some mechanisms hammered, others off).
    const WorkloadOptions mix =
        seed == 1 ? WorkloadOptions{} : WorkloadOptions::Swarm(mix_rng, /*conversations=*/6);
    RequestWorkload workload(Rng::Derive(seed, "requests"), mix);
    std::vector<RequestPlan> plans;
    for (int i = 0; i < 40; ++i) plans.push_back(workload.Next());
    ExpectSameCalls(Stack(preset, dtype), plans, seed * 1000 + 3);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryPreset, GeneratedPlans,
                         ::testing::Combine(::testing::Values("dense", "sliding", "recurrent",
                                                              "mixed", "rotating"),
                                            ::testing::Values(DType::kFloat32, DType::kBFloat16)),
                         [](const auto& param_info) {
                           return std::get<0>(param_info.param) +
                                  (std::get<1>(param_info.param) == DType::kFloat32 ? "_f32"
                                                                                    : "_bf16");
                         });

}  // namespace
}  // namespace kvtwin::sim
