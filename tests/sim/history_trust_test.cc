// Goal: the amortized history check of long contexts is transparent on a sound run and
// exact about what it skips. A forward's history rows before its write were verified when
// written and at every later full check; past RequestDriver's kHistoryAlwaysRows a forward
// re-reads them only on credit, while every live check at a session call reads every row.
// Method: (1) LayerOracle::CheckHistory with trusted rows: a wrong row inside the trusted
// prefix is the caller's to have verified, a wrong row after it is reported at its own
// index, and a rotating history ignores the trust; the rotating applier is held to the spec
// field by field. (2) Long-context requests through the RequestDriver, amortized and with
// every call audited: both pass with the same digest, and only the amortized run trusts rows
// (so the schedule engages where it should).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/checks.h"
#include "sim/forward.h"
#include "sim/request_driver.h"
#include "sim/stack.h"
#include "sim/trie_checks.h"
#include "src/kv_cache.h"
#include "src/rotating_cache.h"
#include "tests/sim/one_layer.h"

namespace kvtwin::sim {
namespace {

model::TokenLog Tokens(int64_t n, uint64_t seed) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(1 + (i * 7 + 3) % 11));
  return WithHashes(t, seed);
}

void Corrupt(const Tensor& keys, int64_t row) {
  auto& k = const_cast<Tensor&>(keys);  // the bug under test: a row overwritten in place
  k.Set(row, 0, k.At(row, 0) + 1.0f);
}

TEST(HistoryTrust, TrustedRowsAreSkippedAndLaterRowsReportedAtTheirIndex) {
  OneLayer l("dense");
  const model::TokenLog log = Tokens(12, l.synth.seed());
  const History h = l.WriteAll(log);
  ASSERT_FALSE(l.oracle->CheckHistory(h, log, 0, 12, Op{}).has_value());
  const auto& kv = static_cast<const KvCache&>(*l.cache);
  Corrupt(kv.keys(), 3);
  const Check all = l.oracle->CheckHistory(h, log, 0, 12, Op{}, 0);
  ASSERT_TRUE(all.has_value());
  EXPECT_NE(all->what.find("history row 3 of 12"), std::string::npos) << all->what;
  // Row 3 lies in a trusted prefix of 5: the caller vouches for it.
  EXPECT_FALSE(l.oracle->CheckHistory(h, log, 0, 12, Op{}, 5).has_value());
  Corrupt(kv.keys(), 7);
  const Check later = l.oracle->CheckHistory(h, log, 0, 12, Op{}, 5);
  ASSERT_TRUE(later.has_value());
  EXPECT_NE(later->what.find("history row 7 of 12"), std::string::npos) << later->what;
  // A trust past the history is clamped to it, not an out-of-range read.
  EXPECT_FALSE(l.oracle->CheckHistory(h, log, 0, 12, Op{}, 99).has_value());
}

TEST(HistoryTrust, ARotatingHistoryIsAlwaysReadWhole) {
  OneLayer l("sliding");
  ASSERT_EQ(l.cache->kind(), CacheKind::kRotating);
  const model::TokenLog log = Tokens(3, l.synth.seed());  // inside the window: rows = positions
  const History h = l.WriteAll(log);
  ASSERT_FALSE(l.oracle->CheckHistory(h, log, 0, 3, Op{}).has_value());
  Corrupt(*h.k, 0);
  const Check c = l.oracle->CheckHistory(h, log, 0, 3, Op{}, 3);
  ASSERT_TRUE(c.has_value());
  EXPECT_NE(c->what.find("history row 0"), std::string::npos) << c->what;
}

// The rotating applier is held to the spec field by field (§2.2, §2.5), also where attention
// would never read the field: each wrong field is reported by name, before anything that
// resolves the applier could abort on it. No other kind may carry one.
TEST(HistoryTrust, TheApplierIsHeldToTheSpecFieldByField) {
  OneLayer l("sliding");
  const model::TokenLog log = Tokens(3, l.synth.seed());
  const History h = l.WriteAll(log);  // a prefill: {K 3, L 3, W 4}
  ASSERT_FALSE(l.oracle->CheckHistory(h, log, 0, 3, Op{}).has_value());
  const auto wrong = [&](const History& bad, const char* field) {
    const Check c = l.oracle->CheckHistory(bad, log, 0, 3, Op{});
    ASSERT_TRUE(c.has_value()) << field;
    EXPECT_EQ(c->what, std::string("rotating history applier ") + field);
  };
  History bad = h;
  bad.applier.key_len += 1;
  wrong(bad, "K");
  bad = h;
  bad.applier.query_len = 1;
  wrong(bad, "L");
  bad = h;
  bad.applier.window += 1;
  wrong(bad, "W");
  // A live batched write leaves the cursor at the end of its logical buffer (K); a
  // speculation wrapper's batched history fixes none (spec §2.7).
  bad = h;
  bad.applier.ring_idx = 0;
  wrong(bad, "ringIdx of a batched write");
  EXPECT_FALSE(
      l.oracle->CheckHistory(bad, log, 0, 3, Op{}, 0, HistorySource::kSpeculation).has_value());
  // A decode that fills the window leaves the cursor at K (idx += 1 after the write), never
  // at 0, though 0 names the same rotation of the K rows.
  const model::TokenLog full = Tokens(4, l.synth.seed());  // log and one more token
  const History decode =
      ForwardSynthetic(*l.cache, l.config, l.synth, 0, 3, std::span(full).subspan(3));
  ASSERT_EQ(decode.applier.ring_idx, 4);
  ASSERT_FALSE(l.oracle->CheckHistory(decode, full, 3, 1, Op{}).has_value());
  bad = decode;
  bad.applier.ring_idx = 0;
  const Check zero = l.oracle->CheckHistory(bad, full, 3, 1, Op{});
  ASSERT_TRUE(zero.has_value());
  EXPECT_EQ(zero->what, "rotating history applier ringIdx");
  EXPECT_EQ(zero->expected, "in [1, 4]");
  // A View's cursor may be 0 (an oversize window's is), so the same history passes as one.
  EXPECT_FALSE(l.oracle->CheckView(bad, full).has_value());
  // A View is a ring layout; its cursor names one of the K rows or K itself.
  const History view = static_cast<const AttentionCache&>(*l.cache).View();
  ASSERT_FALSE(l.oracle->CheckView(view, full).has_value());
  bad = view;
  bad.applier.ring_idx = view.length + 1;
  const Check ring = l.oracle->CheckView(bad, full);
  ASSERT_TRUE(ring.has_value());
  EXPECT_EQ(ring->what, "View(): rotating history applier ringIdx");

  OneLayer dense("dense");
  const History kv = dense.WriteAll(log);
  ASSERT_FALSE(dense.oracle->CheckHistory(kv, log, 0, 3, Op{}).has_value());
  bad = kv;
  bad.has_applier = true;
  bad.applier = {3, 3, 4, 0};
  const Check c = dense.oracle->CheckHistory(bad, log, 0, 3, Op{});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->what, "history applier of a non-rotating cache");
}

// A long conversation: a prompt past kHistoryAlwaysRows, a continuation of it, and a
// second conversation sharing most of the first prompt.
std::vector<RequestPlan> LongPlans() {
  std::vector<RequestPlan> plans(3);
  for (int32_t t = 0; t < 1600; ++t) plans[0].inputs.push_back(1 + (t * 5 + 1) % 13);
  plans[0].outputs = {3, 4, 5, 6};
  plans[1].index = 1;
  plans[1].kind = RequestKind::kExtend;
  plans[1].inputs = plans[0].inputs;
  plans[1].inputs.insert(plans[1].inputs.end(), plans[0].outputs.begin(), plans[0].outputs.end());
  for (int32_t t = 0; t < 300; ++t) plans[1].inputs.push_back(2 + t % 9);
  plans[1].outputs = {7, 8, 9};
  plans[2].index = 2;
  plans[2].conversation = 1;
  plans[2].inputs.assign(plans[0].inputs.begin(), plans[0].inputs.begin() + 1200);
  for (int32_t t = 0; t < 200; ++t) plans[2].inputs.push_back(20 + t % 5);
  plans[2].outputs = {1, 2};
  return plans;
}

struct Outcome {
  std::optional<RequestDivergence> divergence;
  uint64_t digest = 0;
  RequestCoverage coverage;
};

Outcome RunLong(bool audit_every_call) {
  RequestDriverOptions options;
  options.audit_every_call = audit_every_call;
  RequestDriver driver(StackFromPreset("mixed", 4, 8, DType::kFloat32).value(), options, 9);
  Outcome out;
  for (const RequestPlan& plan : LongPlans()) {
    out.divergence = driver.Run(plan);
    if (out.divergence) break;
  }
  out.digest = driver.digest();
  out.coverage = driver.coverage();
  return out;
}

TEST(HistoryTrust, LongContextsPassWithTheDigestOfEveryRowChecked) {
  const Outcome amortized = RunLong(false);
  const Outcome every = RunLong(true);
  ASSERT_FALSE(amortized.divergence.has_value()) << amortized.divergence->ToString();
  ASSERT_FALSE(every.divergence.has_value()) << every.divergence->ToString();
  EXPECT_EQ(amortized.digest, every.digest);
  EXPECT_EQ(amortized.coverage.forwards, every.coverage.forwards);
  EXPECT_GT(amortized.coverage.trusting_forwards, 0);
  EXPECT_LT(amortized.coverage.trusting_forwards, amortized.coverage.forwards);
  EXPECT_EQ(every.coverage.trusting_forwards, 0);
}

}  // namespace
}  // namespace kvtwin::sim
