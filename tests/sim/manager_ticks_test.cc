// Goal: the comparison with the reference manager sees every LRU refresh, not only the order
// of the ages it leaves. A refresh skipped on a node that already held the newest age keeps
// every rank (mutant 63: Close refreshing the frontier only when it advanced the path), yet
// under a coarse wall clock it changes which ages tie, and ties decide evictions. Both
// managers advance their logical clocks at the same spec "now" events, so the ages must be
// equal, not just equally ordered. Method: after one request, a production age moves one
// tick back into an unused tick (order, ties and later stamps unchanged); the very next
// audited call must report the trie (under a budget, the pass that call begins already
// does). The unmodified run passes.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "sim/request_driver.h"
#include "sim/requests.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

constexpr uint64_t kSeed = 11;
constexpr int64_t kRequests = 24;
constexpr int64_t kPlantAfter = 9;

// The newest age that has an unused tick right below it moves there, on every node holding
// it: the order, the ties and the clock's next stamp all stay as they were (the trace mutant
// 63 leaves). Returns whether some age could move; the test plays a manager that stamped it.
bool MoveAnAgeOneTickBack(const PrefixCache& manager) {
  auto& trie = const_cast<PrefixTrie&>(manager.trie());
  std::set<uint64_t> ages;
  trie.Walk([&](TrieNode* n) { ages.insert(static_cast<uint64_t>(n->last_used())); });
  for (auto it = ages.rbegin(); it != ages.rend(); ++it) {
    const uint64_t age = *it;
    if (age < 2 || ages.count(age - 1) > 0) continue;
    trie.Walk([&](TrieNode* n) {
      if (static_cast<uint64_t>(n->last_used()) == age) n->set_last_used(Tick{age - 1});
    });
    return true;
  }
  return false;
}

// `budget_bytes`: 0 = unlimited.
std::optional<RequestDivergence> RunPlanted(int64_t plant_after, int64_t budget_bytes = 0) {
  const RequestOptions o;  // the default stack
  RequestDriverOptions options;
  options.audit_every_call = true;
  options.budget_bytes = budget_bytes;
  RequestDriver driver(StackFromPreset("dense", o.layers, o.window, DType::kFloat32).value(),
                       options, Rng::Derive(kSeed, "values").Next());
  WorkloadOptions mix;
  mix.conversations = 4;
  RequestWorkload workload(Rng::Derive(kSeed, "requests"), mix);
  for (int64_t i = 0; i < kRequests; ++i) {
    const RequestPlan plan = workload.Next();
    if (std::optional<RequestDivergence> d = driver.Run(plan)) return d;
    if (plan.index == plant_after && !MoveAnAgeOneTickBack(driver.manager())) {
      ADD_FAILURE() << "no age with a free tick below it after request " << plant_after;
    }
  }
  return driver.FinalAudit();
}

TEST(ManagerTicks, UnmodifiedRunPasses) { EXPECT_FALSE(RunPlanted(-1).has_value()); }

TEST(ManagerTicks, RankPreservingAgeChangeIsReportedAtTheNextCall) {
  const std::optional<RequestDivergence> d = RunPlanted(kPlantAfter);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->request, kPlantAfter + 1) << d->ToString();
  EXPECT_NE(d->mismatch.what.find("trie after"), std::string::npos) << d->ToString();
}

// Under a budget small enough that the next Begin's switch runs a pass, the moved age is
// reported when that pass begins, before the call's trie comparison: the ages decide the
// victims, so the reference compares them at every pass, not only at audits.
TEST(ManagerTicks, UnderABudgetTheMovedAgeIsReportedWhenThePassBegins) {
  EXPECT_FALSE(RunPlanted(-1, 1500).has_value());
  const std::optional<RequestDivergence> d = RunPlanted(kPlantAfter, 1500);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->request, kPlantAfter + 1) << d->ToString();
  EXPECT_EQ(d->mismatch.what.rfind("Begin: trie when the eviction pass of policy point #1 begins, "
                                   "node #",
                                   0),
            0u)
      << d->ToString();
  EXPECT_NE(d->mismatch.expected.find(", age "), std::string::npos) << d->ToString();
}

}  // namespace
}  // namespace kvtwin::sim
