// Goal: the request driver's amortized whole-trie audit skips calls only on a large trie,
// still ends every run audited, and reports a divergence it found after skipped calls with
// their number, so callers can localize it; auditing every call finds the same divergence
// at the first call after it arose. Method: a workload over many conversations grows the
// trie past the always-audited size; a node with a key no request uses is grafted onto the
// production trie (the test's stand-in for a production bug: nothing but the comparison
// with the reference manager's trie can see it) at the same request in an amortized and an
// every-call driver, and after the last request for FinalAudit. Both drivers must reach the
// same digest on the unmodified workload.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/request_driver.h"
#include "sim/requests.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

constexpr uint64_t kSeed = 7;
constexpr int64_t kRequests = 240;

std::unique_ptr<RequestDriver> MakeDriver(bool audit_every_call) {
  const RequestOptions o;
  const RequestDriverOptions options{o.budget_bytes, o.chunk, o.capture_interval, o.pre_thinking,
                                     audit_every_call};
  return std::make_unique<RequestDriver>(
      StackFromPreset("dense", o.layers, o.window, DType::kFloat32).value(), options,
      Rng::Derive(kSeed, "values").Next());
}

std::vector<RequestPlan> Plans() {
  WorkloadOptions mix;
  mix.conversations = 40;
  mix.vocab = 40;
  RequestWorkload workload(Rng::Derive(kSeed, "requests"), mix);
  std::vector<RequestPlan> plans;
  for (int64_t i = 0; i < kRequests; ++i) plans.push_back(workload.Next());
  return plans;
}

// A leaf under the root whose key no request of the workload uses (tokens are 1..vocab):
// structurally sound and never matched, so only the reference trie tells it apart.
void GraftForeignNode(const RequestDriver& driver) {
  // The driver exposes its manager read-only; the test plays a faulty manager here.
  auto& trie = const_cast<PrefixTrie&>(driver.manager().trie());
  const std::vector<TrieKey> keys{TrieKey{1'000'000}};
  trie.AppendChild(trie.root(), keys, 1);
}

struct Outcome {
  std::optional<RequestDivergence> divergence;
  RequestCoverage coverage;
  int64_t nodes = 0;
  uint64_t digest = 0;
};

// Runs the plans, grafting after request `graft_after` (-1: never), then FinalAudit.
Outcome RunPlans(bool audit_every_call, int64_t graft_after) {
  const std::unique_ptr<RequestDriver> owned = MakeDriver(audit_every_call);
  RequestDriver& driver = *owned;
  Outcome out;
  for (const RequestPlan& plan : Plans()) {
    out.divergence = driver.Run(plan);
    if (out.divergence) break;
    if (plan.index == graft_after) GraftForeignNode(driver);
  }
  if (!out.divergence) out.divergence = driver.FinalAudit();
  out.coverage = driver.coverage();
  out.nodes = driver.manager().trie().num_nodes();
  out.digest = driver.digest();
  return out;
}

TEST(AmortizedAudit, ALargeTrieSkipsAuditsYetTheRunPassesAndEndsAudited) {
  const Outcome amortized = RunPlans(/*audit_every_call=*/false, -1);
  ASSERT_FALSE(amortized.divergence.has_value()) << amortized.divergence->ToString();
  // The trie outgrew the always-audited size, so the schedule skipped calls.
  EXPECT_GT(amortized.nodes, 300);
  EXPECT_LT(amortized.coverage.audited_calls, amortized.coverage.calls);
  EXPECT_GT(amortized.coverage.audited_calls, 0);
  const Outcome every = RunPlans(/*audit_every_call=*/true, -1);
  ASSERT_FALSE(every.divergence.has_value()) << every.divergence->ToString();
  EXPECT_EQ(every.coverage.audited_calls, every.coverage.calls);
  EXPECT_EQ(every.coverage.calls, amortized.coverage.calls);
  // The digest does not depend on which calls were audited.
  EXPECT_EQ(every.digest, amortized.digest);
}

TEST(AmortizedAudit, AGraftIsFoundLateWithItsGapAndAtOnceWhenEveryCallIsAudited) {
  // Late in the run, where the trie is large and most calls go unaudited.
  const int64_t graft_after = kRequests - 40;
  const Outcome every = RunPlans(/*audit_every_call=*/true, graft_after);
  ASSERT_TRUE(every.divergence.has_value());
  EXPECT_EQ(every.divergence->request, graft_after + 1);
  EXPECT_EQ(every.divergence->phase, "after Begin") << every.divergence->ToString();
  EXPECT_EQ(every.divergence->unaudited_calls, 0);
  EXPECT_NE(every.divergence->mismatch.what.find("unlimited budget"), std::string::npos)
      << every.divergence->ToString();

  const Outcome amortized = RunPlans(/*audit_every_call=*/false, graft_after);
  ASSERT_TRUE(amortized.divergence.has_value());
  EXPECT_GT(amortized.divergence->request, graft_after + 1);
  EXPECT_GT(amortized.divergence->unaudited_calls, 0);
  EXPECT_NE(amortized.divergence->mismatch.what.find("unlimited budget"), std::string::npos)
      << amortized.divergence->ToString();
}

TEST(AmortizedAudit, FinalAuditFindsAGraftAfterTheLastUnauditedCall) {
  const Outcome amortized = RunPlans(/*audit_every_call=*/false, kRequests - 1);
  ASSERT_TRUE(amortized.divergence.has_value());
  EXPECT_EQ(amortized.divergence->phase, "final audit (its last call was unaudited)");
  EXPECT_EQ(amortized.divergence->request, kRequests - 1);
  EXPECT_GT(amortized.divergence->unaudited_calls, 0);
  EXPECT_NE(amortized.divergence->mismatch.what.find("the last session call"), std::string::npos)
      << amortized.divergence->ToString();
}

}  // namespace
}  // namespace kvtwin::sim
