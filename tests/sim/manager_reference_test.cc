// Goal: the reference manager pairs its eviction-policy points with production's one by
// one (sim/manager_reference.h): a point production reaches and the reference does not,
// the reverse, and a pass that begins on one side of the budget only are each reported,
// named by the call. The request sweeps exercise the pairing on passes that evict (and
// the mutants in tests/mutants/ show it failing there); this pins the bookkeeping itself.
// Method: one production manager over the dense stack, its hooks forwarded as the request
// driver forwards them, and the same Begin on the reference; then one side makes an extra
// point, or the two budgets differ. And end to end: an eviction production makes behind
// the driver's back under a budget (a test seam) is reported at the next request.
#include "sim/manager_reference.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/request_driver.h"
#include "sim/requests.h"
#include "sim/stack.h"
#include "src/core/rng.h"
#include "src/prefix_cache.h"

namespace kvtwin::sim {
namespace {

class Paired : public ::testing::Test {
 protected:
  Paired()
      : caches_(BuildCaches(StackFromPreset("dense", 2, 4, DType::kFloat32).value())),
        pc_(Pointers()),
        // No snapshot is ever taken here, so the unit sizes are never charged.
        ref_(std::vector<std::optional<model::RefCache>>{model::RefCache::Kv(),
                                                         model::RefCache::Kv()},
             {1, 1}) {
    pc_.set_policy_hook([this] { ref_.OnProductionPoint(pc_); });
    pc_.set_eviction_hook([this](bool ended) {
      if (!ended) ref_.OnProductionPass(pc_);
    });
  }

  std::vector<LayerCache*> Pointers() const {
    std::vector<LayerCache*> out;
    for (const auto& c : caches_) out.push_back(c.get());
    return out;
  }

  // Begin {1, 2, 3} on both sides, as the driver orders it; the pairing's verdict.
  Check BeginBoth() {
    ref_.Begin(model::TokenLog{{1, 1}, {2, 2}, {3, 3}});
    ref_.StartCall();
    EXPECT_TRUE(pc_.Begin(std::vector<int32_t>{1, 2, 3}).ok());
    return ref_.AfterBegin();
  }

  std::vector<std::unique_ptr<LayerCache>> caches_;
  PrefixCache pc_;
  ManagerReference ref_;
};

TEST_F(Paired, EqualPointsPass) {
  EXPECT_EQ(BeginBoth(), std::nullopt);
  ref_.StartCall();
  pc_.EnforceEvictionPolicy();
  ref_.manager().EnforceEvictionPolicy();
  EXPECT_EQ(ref_.FinishCall("EnforceEvictionPolicy"), std::nullopt);
}

// A point-count mismatch named by `call`.
void ExpectPointCount(const Check& c, const std::string& call, const char* expected,
                      const char* actual) {
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->what.rfind(call + ": eviction-policy points", 0), 0u) << c->what;
  EXPECT_EQ(c->expected, expected);
  EXPECT_EQ(c->actual, actual);
}

TEST_F(Paired, AnExtraProductionPointIsReported) {
  ASSERT_EQ(BeginBoth(), std::nullopt);
  ref_.StartCall();
  pc_.EnforceEvictionPolicy();
  ExpectPointCount(ref_.FinishCall("SchedulePrefillSnapshots"), "SchedulePrefillSnapshots", "0",
                   "1");
}

TEST_F(Paired, AMissingProductionPointIsReported) {
  ASSERT_EQ(BeginBoth(), std::nullopt);
  ref_.StartCall();
  ref_.manager().EnforceEvictionPolicy();
  ExpectPointCount(ref_.FinishCall("Close"), "Close", "at least 1", "0");
}

// The trie holds no snapshot, so both counters are 0: a reference budget of -1 passes alone.
TEST_F(Paired, APassOnOneSideOfTheBudgetOnlyIsReported) {
  ref_.set_budget(-1);
  const Check missing = BeginBoth();
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(missing->what,
            "Begin: eviction pass at policy point #1 (paged-out bytes 0, budget -1 B)");
  EXPECT_EQ(missing->expected, "a pass");
  EXPECT_EQ(missing->actual, "none");
  // The reverse (a pass on production's side only) cannot be staged at equal counters here:
  // production's budget is never negative (PrefixCache refuses one), so at a counter of 0 it
  // never passes, and with bytes on one side only the counters differ first. The request
  // sweeps reach it (mutant 98, a pass begun within the budget, dies there).
  EXPECT_DEATH(pc_.set_max_paged_out_bytes(-1), "negative byte budget");
}

// A request run at a budget of 6000 bytes. From request `plant_from` on (-1: never) a seam
// evicts everything off the active path, once, after the first request that leaves
// something to evict, as a manager with a spurious eviction would. The pass is a correct
// pass at its own budget, so only the reference manager can object. `planted_at`: that
// request's index.
std::optional<RequestDivergence> RunWithSpuriousEviction(int64_t plant_from, int64_t& planted_at) {
  constexpr uint64_t kSeed = 5;
  const RequestOptions o;
  RequestDriverOptions options;
  options.budget_bytes = 6000;
  planted_at = -1;
  options.after_request = [&](PrefixCache& pc, int64_t index) {
    if (plant_from < 0 || index < plant_from || planted_at >= 0) return;
    const int64_t nodes = pc.trie().num_nodes();
    const int64_t budget = pc.options().max_paged_out_bytes;
    pc.set_max_paged_out_bytes(0);
    pc.EnforceEvictionPolicy();
    pc.set_max_paged_out_bytes(budget);
    if (pc.trie().num_nodes() < nodes) planted_at = index;
  };
  RequestDriver driver(StackFromPreset("dense", o.layers, o.window, DType::kFloat32).value(),
                       options, Rng::Derive(kSeed, "values").Next());
  WorkloadOptions mix;
  mix.conversations = 4;
  RequestWorkload workload(Rng::Derive(kSeed, "requests"), mix);
  for (int64_t i = 0; i < 40; ++i) {
    if (std::optional<RequestDivergence> d = driver.Run(workload.Next())) return d;
  }
  return driver.FinalAudit();
}

TEST(ManagerReferenceUnderABudget, UnmodifiedRunPasses) {
  int64_t planted_at = 0;
  EXPECT_EQ(RunWithSpuriousEviction(-1, planted_at), std::nullopt);
}

TEST(ManagerReferenceUnderABudget, ASpuriousEvictionIsReportedAtTheNextRequest) {
  int64_t planted_at = 0;
  const std::optional<RequestDivergence> d = RunWithSpuriousEviction(8, planted_at);
  ASSERT_GE(planted_at, 8) << "the seam never found a node to evict";
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->request, planted_at + 1) << d->ToString();
  EXPECT_EQ(d->phase, "after Begin") << d->ToString();
  // The reference's own sizes sum to more than production's counter at Begin's point,
  // before any pass; with production's sizes it was the trie comparison after Begin.
  EXPECT_EQ(d->mismatch.what.rfind("Begin: paged-out bytes at policy point #1", 0), 0u)
      << d->ToString();
  EXPECT_GT(std::stoll(d->mismatch.expected), std::stoll(d->mismatch.actual)) << d->ToString();
  // The counter names no slot: the report adds where the tries differ after the call.
  EXPECT_NE(d->mismatch.what.find("; at the call's end, trie after Begin under a budget of 6000 B"),
            std::string::npos)
      << d->ToString();
}

}  // namespace
}  // namespace kvtwin::sim
