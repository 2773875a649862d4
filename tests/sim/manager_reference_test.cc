// Goal: the reference manager pairs its eviction-policy points with production's one by
// one (sim/manager_reference.h): a point production reaches and the reference does not,
// the reverse, and a pass that begins on one side of the budget only are each reported,
// named by the call. The request sweeps exercise the pairing on passes that evict (and
// the mutants in tests/mutants/ show it failing there); this pins the bookkeeping itself.
// Method: one production manager over the dense stack, its hooks forwarded as the request
// driver forwards them, and the same Begin on the reference; then one side makes an extra
// point, or the two budgets differ.
#include "sim/manager_reference.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/stack.h"
#include "src/prefix_cache.h"

namespace kvtwin::sim {
namespace {

class Paired : public ::testing::Test {
 protected:
  Paired()
      : caches_(BuildCaches(StackFromPreset("dense", 2, 4, DType::kFloat32).value())),
        pc_(Pointers()),
        ref_(std::vector<std::optional<model::RefCache>>{model::RefCache::Kv(),
                                                         model::RefCache::Kv()}) {
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

// The trie holds no snapshot, so production's counter is 0: over a budget of -1 only.
TEST_F(Paired, APassOnOneSideOfTheBudgetOnlyIsReported) {
  ref_.set_budget(-1);
  const Check missing = BeginBoth();
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(missing->what,
            "Begin: eviction pass at policy point #1 (paged-out bytes 0, budget -1)");
  EXPECT_EQ(missing->expected, "a pass");
  EXPECT_EQ(missing->actual, "none");
  ref_.set_budget(0);
  pc_.set_max_paged_out_bytes(-1);
  ref_.StartCall();
  pc_.EnforceEvictionPolicy();
  ref_.manager().EnforceEvictionPolicy();
  const Check extra = ref_.FinishCall("EnforceEvictionPolicy");
  ASSERT_TRUE(extra.has_value());
  EXPECT_EQ(extra->expected, "none");
  EXPECT_EQ(extra->actual, "a pass");
}

}  // namespace
}  // namespace kvtwin::sim
