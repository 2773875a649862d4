#include "sim/report.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

namespace kvtwin::sim {
namespace {

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        // XML 1.0 has no escape for other control characters: show them as '?'.
        out += (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') ? '?' : c;
    }
  }
  return out;
}

bool Passed(const CaseReport& c) { return c.verdict == "pass"; }

}  // namespace

uint64_t RunDigest(const std::vector<CaseReport>& cases) {
  uint64_t d = 0;
  for (const CaseReport& c : cases) d = XXH3_64bits_withSeed(&c.digest, sizeof(c.digest), d);
  return d;
}

std::string SummaryJson(const std::string& command, const std::vector<CaseReport>& cases) {
  nlohmann::json j;
  j["command"] = command;
  bool pass = true;
  j["cases"] = nlohmann::json::array();
  for (const CaseReport& c : cases) {
    pass = pass && Passed(c);
    nlohmann::json e{{"name", c.name},
                     {"verdict", c.verdict},
                     {"events", c.events},
                     {"steps", c.steps},
                     {"digest", fmt::format("{:016x}", c.digest)}};
    if (!c.kind.empty()) e["kind"] = c.kind;
    if (!c.detail.empty()) e["detail"] = c.detail;
    if (!c.reproduce.empty()) e["reproduce"] = c.reproduce;
    if (c.prompt_tokens > 0) {
      e["prompt_tokens"] = c.prompt_tokens;
      e["matched_tokens"] = c.matched_tokens;
      e["cached_tokens"] = c.cached_tokens;
    }
    j["cases"].push_back(std::move(e));
  }
  j["verdict"] = pass ? "pass" : "fail";
  j["digest"] = fmt::format("{:016x}", RunDigest(cases));
  // Reports echo file names and error text: never abort on odd bytes.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string JunitXml(const std::string& suite, const std::vector<CaseReport>& cases) {
  int64_t failures = 0, errors = 0;
  std::string body;
  for (const CaseReport& c : cases) {
    body += fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"0\"", XmlEscape(suite),
                        XmlEscape(c.name));
    if (Passed(c)) {
      body += "/>\n";
      continue;
    }
    // A divergence or a reach lost is the code under test failing; anything else is the run's.
    const bool failure = c.verdict == "divergence" || c.verdict == "unreached";
    failures += failure;
    errors += !failure;
    const std::string text = c.detail + (c.reproduce.empty() ? "" : "\nreproduce: " + c.reproduce);
    body += fmt::format(">\n      <{0} message=\"{1}\" type=\"{2}\">{3}</{0}>\n    </testcase>\n",
                        failure ? "failure" : "error", XmlEscape(c.kind), XmlEscape(c.verdict),
                        XmlEscape(text));
  }
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n  <testsuite name=\"{}\" "
      "tests=\"{}\" failures=\"{}\" errors=\"{}\">\n{}  </testsuite>\n</testsuites>\n",
      XmlEscape(suite), cases.size(), failures, errors, body);
}

}  // namespace kvtwin::sim
