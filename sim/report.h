// Machine-readable run reports for CI systems: a JSON summary (--json) and JUnit XML
// (--junit), one case per replayed file or seed. Both are pure functions of the cases, so
// equal runs give byte-equal reports (no timestamps: kvtwin has no wall clock outside
// bench/). Value types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvtwin::sim {

struct CaseReport {
  std::string name;     // the file, or "seed N"
  std::string verdict;  // "pass", "divergence", "unreached", "input error" or "interrupted"
  std::string kind;     // divergence kind (DivergenceKind), "unreached" or the input error
  std::string detail;   // the human report of a failure
  std::string reproduce;
  int64_t events = 0, steps = 0;
  uint64_t digest = 0;
  // Requests only (0 otherwise): Σ prompt tokens and Σ matched / cached over Begin reports.
  int64_t prompt_tokens = 0, matched_tokens = 0, cached_tokens = 0;
};

// {"command": ..., "verdict": "pass" | "fail", "digest": "<16 hex>", "cases": [...]}, keys
// sorted, one line. The run digest folds the case digests in order.
std::string SummaryJson(const std::string& command, const std::vector<CaseReport>& cases);
// <testsuites><testsuite name=... tests failures errors><testcase ...> with <failure> for
// a divergence and <error> for an input error or an interrupt.
std::string JunitXml(const std::string& suite, const std::vector<CaseReport>& cases);
// The order-sensitive fold of the case digests.
uint64_t RunDigest(const std::vector<CaseReport>& cases);

}  // namespace kvtwin::sim
