// Goal: the request driver's amortized whole-trie audit skips calls only on a large trie,
// still ends every run audited, and reports a divergence it found after skipped calls with
// their number, so callers can localize it; auditing every call finds the same divergence
// at the first call after it arose. Method: a workload over many conversations grows the
// trie past the always-audited size; a node with a key no request uses is grafted onto the
// production trie (the test's stand-in for a production bug: nothing but the comparison
// with the reference manager's trie can see it) at the same request in an amortized and an
// every-call driver, and after the last request for FinalAudit. Both drivers must reach the
// same digest on the unmodified workload. Through ReplayTrace, the graft is planted by the
// after_request seam, so the localizing re-run plants it again; RunRequests (a seeded run)
// localizes through the same seam.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/replay.h"
#include "sim/request_driver.h"
#include "sim/requests.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

constexpr uint64_t kSeed = 7;
constexpr int64_t kRequests = 240;

std::unique_ptr<RequestDriver> MakeDriver(bool audit_every_call) {
  const RequestOptions o;        // the default stack
  RequestDriverOptions options;  // unlimited budget, the default cadence
  options.audit_every_call = audit_every_call;
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
void GraftForeignNode(const PrefixCache& manager) {
  // The manager exposes its trie read-only; the test plays a faulty manager here.
  auto& trie = const_cast<PrefixTrie&>(manager.trie());
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
    if (plan.index == graft_after) GraftForeignNode(driver.manager());
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

// The callers' half: a replay that fails after skipped audits replays again with every call
// audited and reports that run's first failure, with the amortized one's place.
TEST(AmortizedAudit, AReplayLocalizesALateFailureToTheFirstAuditedOne) {
  RequestOptions options;
  options.seed = kSeed;
  options.conversations = 40;
  options.requests = kRequests;
  Trace trace;
  ASSERT_FALSE(RunRequests(options, &trace).divergence.has_value());
  const ReplayResult clean = ReplayTrace(trace);
  ASSERT_TRUE(clean.passed());
  ASSERT_LT(clean.coverage.audited_calls, clean.coverage.calls) << "the trie stayed small";

  const int64_t graft_after = kRequests - 40;
  ReplayOptions faulty;
  faulty.after_request = [&](PrefixCache& pc, int64_t request) {
    if (request == graft_after) GraftForeignNode(pc);
  };
  const ReplayResult localized = ReplayTrace(trace, faulty);
  ASSERT_TRUE(localized.divergence.has_value());
  EXPECT_EQ(localized.failing_event, graft_after + 1) << *localized.divergence;
  EXPECT_EQ(localized.unaudited_calls, 0);
  EXPECT_NE(localized.divergence->find("(localized: the amortized audit first failed at request #"),
            std::string::npos)
      << *localized.divergence;
  EXPECT_EQ(localized.divergence_kind, "trie after Begin at an unlimited budget, line #")
      << localized.divergence_kind;

  // Asked to audit every call, the replay finds it there at once, with no note.
  faulty.audit_every_call = true;
  const ReplayResult direct = ReplayTrace(trace, faulty);
  ASSERT_TRUE(direct.divergence.has_value());
  EXPECT_EQ(direct.failing_event, graft_after + 1);
  EXPECT_EQ(direct.divergence->find("localized"), std::string::npos) << *direct.divergence;
}

// The same for a seeded run (`kvtwin requests`): RunRequests re-runs with every call
// audited and reports that run's first failure, with the amortized one's place.
TEST(AmortizedAudit, ASeededRunLocalizesALateFailureToTheFirstAuditedOne) {
  RequestOptions options;
  options.seed = kSeed;
  options.conversations = 40;
  options.requests = kRequests;
  const RequestResult clean = RunRequests(options);
  ASSERT_FALSE(clean.divergence.has_value());
  ASSERT_LT(clean.coverage.audited_calls, clean.coverage.calls) << "the trie stayed small";

  const int64_t graft_after = kRequests - 40;
  options.after_request = [&](PrefixCache& pc, int64_t request) {
    if (request == graft_after) GraftForeignNode(pc);
  };
  const RequestResult localized = RunRequests(options);
  ASSERT_TRUE(localized.divergence.has_value());
  const RequestDivergence& d = *localized.divergence;
  EXPECT_EQ(d.request, graft_after + 1) << d.ToString();
  EXPECT_EQ(d.unaudited_calls, 0);
  EXPECT_NE(d.note.find("(localized: the amortized audit first failed at request #"),
            std::string::npos)
      << d.ToString();
  EXPECT_NE(d.ToString().find(d.note), std::string::npos) << "the report leaves out the note";
  EXPECT_EQ(localized.requests, graft_after + 2) << "the re-run stops at its first failure";
}

}  // namespace
}  // namespace kvtwin::sim
