// Goal: every minimized bug trace in traces/regress/ (and every bundled workload in
// traces/workloads/) replays with its expected verdict: the header's "expect" ("pass"
// once the bug is fixed, or "divergence: <kind>" for a trace that documents a divergence
// on purpose); a trace without an expectation must pass, and a pass short of the header's
// "reaches" claims is verdict "unreached". Every requests or multiseq trace in
// traces/regress/ claims a reach: its driver chooses the calls, so a change to the driver
// can move the trace off the shape it pins while it still passes.
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
  EXPECT_EQ(got, want) << r.detail() << "\nreproduce: kvtwin replay " << GetParam();
  const bool driven = r.header.kind != TraceKind::kOps;
  if (driven && GetParam().starts_with("traces/regress/")) {
    EXPECT_FALSE(r.header.reaches.empty())
        << GetParam() << ": a regression trace of kind requests or multiseq names in its "
        << "header's \"reaches\" the coverage it is kept for; its coverage: "
        << (r.header.kind == TraceKind::kMultiSeq ? r.ms_coverage.ToString()
                                                  : r.coverage.ToString());
  }
}

std::string CaseName(const testing::TestParamInfo<std::string>& info) {
  std::string name = std::filesystem::path(info.param).parent_path().filename().string() + "_" +
                     std::filesystem::path(info.param).stem().string();
  std::replace_if(
      name.begin(), name.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); },
      '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Traces, RegressTrace, testing::ValuesIn(TraceFiles()), CaseName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(RegressTrace);

}  // namespace
}  // namespace kvtwin::sim
