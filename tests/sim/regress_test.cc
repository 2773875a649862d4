// Goal: every minimized bug trace in traces/regress/ (and every bundled workload in
// traces/workloads/) replays with its expected verdict: the header's "expect" ("pass"
// once the bug is fixed, or "divergence: <kind>" for a trace that documents a divergence
// on purpose); a trace without an expectation must pass.
// Method: one parameterized case per file, listed when the binary starts (ctest runs from
// the repository root).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "sim/replay.h"

namespace kvtwin::sim {
namespace {

std::vector<std::string> TraceFiles() {
  std::vector<std::string> files;
  for (const char* dir : {"traces/regress", "traces/workloads"}) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".jsonl") files.push_back(e.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

class RegressTrace : public testing::TestWithParam<std::string> {};

TEST_P(RegressTrace, ReplaysWithItsExpectedVerdict) {
  const ReplayResult r = ReplayFile(GetParam(), {});
  ASSERT_FALSE(r.input_error) << r.input_error->ToString();
  const std::string want = r.header.expect.empty() ? "pass" : r.header.expect;
  const std::string got =
      r.divergence ? "divergence: " + r.divergence_kind : std::string(r.verdict());
  EXPECT_EQ(got, want) << r.divergence.value_or("") << "\nreproduce: kvtwin replay " << GetParam();
}

std::string CaseName(const testing::TestParamInfo<std::string>& info) {
  std::string name = std::filesystem::path(info.param).parent_path().filename().string() + "_" +
                     std::filesystem::path(info.param).stem().string();
  std::replace_if(
      name.begin(), name.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); },
      '_');
  return name;
}

// A regression trace pins a shape the seeded streams reach rarely; a change to the request
// path can move the shape away while the trace still passes (catalogue mutant 128's trace
// stopped copying a rotating snapshot, and the mutant drifted to the tests stage unseen).
// So a trace kept for a reach has it asserted from the driver's coverage.
TEST(RegressReach, AttachBesideKeptWholeStatesCopiesARotatingAndARecurrentSnapshot) {
  const ReplayResult r =
      ReplayFile("traces/regress/attach-beside-kept-whole-states-copies-them.jsonl", {});
  ASSERT_FALSE(r.input_error) << r.input_error->ToString();
  ASSERT_FALSE(r.divergence) << *r.divergence;
  // The mixed preset's one rotating and one recurrent layer, both kept beside a KV capture.
  EXPECT_GE(r.coverage.whole_state_copies, 2) << r.coverage.ToString();
}

INSTANTIATE_TEST_SUITE_P(Traces, RegressTrace, testing::ValuesIn(TraceFiles()), CaseName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(RegressTrace);

}  // namespace
}  // namespace kvtwin::sim
