// Goal: how the production cache manager scales (issue 8, deliverable 3): per-request cost
// against the number of cached conversations (target: flat within ±25 % from 1k to 100k)
// and against the context length, and the memory it holds against the raw tensor bytes of
// what it caches (target: at most 1.5x).
// Method: the series of scaling_series.h replay chat requests through sim::ProductionRunner
// (the production call sequence, no checks) and time them with steady_clock. The results
// go to one JSON file (every point, the stacks, the targets and whether they were met) and
// to one whitespace-separated .dat file per series in --plots, which bench/plots/*.gp turn
// into SVG plots (run gnuplot from the directory holding the .dat files).
//
//   scaling_bench --json bench/results/scaling.json --plots bench/results [--quick]
//
// Exit codes: 0 done (a missed target is reported, not a failure: these are benchmarks),
// 2 usage or output error.
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/scaling_series.h"

namespace {

using kvtwin::bench::ContextSeries;
using kvtwin::bench::ConversationSeries;
using kvtwin::bench::MemorySeries;
using kvtwin::bench::Timing;
using nlohmann::json;

constexpr double kFlatTolerance = 0.25;  // per-request cost within ±25 % of the 1k point
constexpr double kMaxMemoryRatio = 1.5;
// glibc's largest M_MMAP_THRESHOLD on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
constexpr int kMaxMmapThreshold = 32 * 1024 * 1024;

double Real(int64_t v) { return static_cast<double>(v); }
double Mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

json TimingJson(const Timing& t) {
  return {{"mean_ns", t.mean_ns},
          {"median_ns", t.median_ns},
          {"p90_ns", t.p90_ns},
          {"requests", t.requests}};
}

// Largest relative deviation of the medians from the first point's.
double MaxDeviation(const ConversationSeries& s) {
  double worst = 0;
  const double base = s.points.front().measured.median_ns;
  for (const auto& p : s.points) worst = std::max(worst, std::abs(p.measured.median_ns / base - 1));
  return worst;
}

json ConversationJson(const ConversationSeries& s) {
  json points = json::array();
  for (const auto& p : s.points) {
    points.push_back({{"conversations", p.conversations},
                      {"measured_cpu", TimingJson(p.measured)},
                      {"measured_wall", TimingJson(p.measured_wall)},
                      {"populate_mean_cpu_ns", p.populate_mean_ns},
                      {"trie_nodes", p.trie_nodes},
                      {"branch_children", p.branch_children},
                      {"repeat_cpu_medians_ns", p.repeat_medians_ns},
                      {"measured_minor_faults", p.measured_faults}});
  }
  const double dev = MaxDeviation(s);
  return {{"stack", s.stack},
          {"notes", s.notes},
          {"points", points},
          {"max_median_deviation", dev},
          {"target", "flat ±25 % (median CPU ns/request against the first point)"},
          {"target_met", dev <= kFlatTolerance}};
}

json ContextJson(const ContextSeries& s) {
  json points = json::array();
  for (const auto& p : s.points) {
    points.push_back({{"context_tokens", p.context_tokens},
                      {"measured_cpu", TimingJson(p.measured)},
                      {"measured_wall", TimingJson(p.measured_wall)},
                      {"harness_cpu", TimingJson(p.harness)},
                      {"manager_estimate_median_ns", p.measured.median_ns - p.harness.median_ns},
                      {"repeat_cpu_medians_ns", p.repeat_medians_ns},
                      {"measured_minor_faults", p.measured_faults},
                      {"ns_per_context_token", p.measured.median_ns / Real(p.context_tokens)},
                      {"ns_per_new_token", p.measured.median_ns / p.new_tokens_per_request}});
  }
  return {{"stack", s.stack}, {"notes", s.notes}, {"points", points}};
}

json MemoryJson(const MemorySeries& s) {
  json points = json::array();
  double worst = 0;
  for (const auto& p : s.points) {
    worst = std::max(worst, std::max(p.held_ratio(), p.rss_ratio()));
    points.push_back({{"cached_tokens", p.cached_tokens},
                      {"conversations", p.conversations},
                      {"snapshot_bytes", p.snapshot_bytes},
                      {"live_bytes", p.live_bytes},
                      {"raw_bytes", p.raw_bytes},
                      {"recurrent_states", p.recurrent_states},
                      {"trie_nodes", p.trie_nodes},
                      {"rss_delta_bytes", p.rss_delta_bytes},
                      {"held_ratio", p.held_ratio()},
                      {"rss_ratio", p.rss_ratio()}});
  }
  return {{"stack", s.stack},
          {"notes", s.notes},
          {"points", points},
          {"max_ratio", worst},
          {"target", "held and RSS bytes at most 1.5x the raw tensor bytes"},
          {"target_met", worst <= kMaxMemoryRatio}};
}

// Writes `text` to `path` through a temporary file and a rename, so a plot never reads a
// half-written file; false (with a message) when it cannot.
bool WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    out.flush();
    if (!out.good()) {
      std::fprintf(stderr, "scaling_bench: cannot write %s\n", tmp.c_str());
      return false;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (!ec) return true;
  std::fprintf(stderr, "scaling_bench: cannot rename %s: %s\n", tmp.c_str(), ec.message().c_str());
  return false;
}

std::string ConversationDat(const ConversationSeries& s) {
  std::string out =
      "# conversations median_cpu_us mean_cpu_us p90_cpu_us populate_mean_cpu_us "
      "median_wall_us\n";
  for (const auto& p : s.points) {
    out += std::to_string(p.conversations) + " " + std::to_string(p.measured.median_ns / 1e3) +
           " " + std::to_string(p.measured.mean_ns / 1e3) + " " +
           std::to_string(p.measured.p90_ns / 1e3) + " " +
           std::to_string(p.populate_mean_ns / 1e3) + " " +
           std::to_string(p.measured_wall.median_ns / 1e3) + "\n";
  }
  return out;
}

std::string ContextDat(const ContextSeries& s) {
  std::string out =
      "# context_tokens median_cpu_us mean_cpu_us cpu_ns_per_context_token median_wall_us "
      "harness_median_cpu_us minus_harness_us\n";
  for (const auto& p : s.points) {
    out += std::to_string(p.context_tokens) + " " + std::to_string(p.measured.median_ns / 1e3) +
           " " + std::to_string(p.measured.mean_ns / 1e3) + " " +
           std::to_string(p.measured.median_ns / Real(p.context_tokens)) + " " +
           std::to_string(p.measured_wall.median_ns / 1e3) + " " +
           std::to_string(p.harness.median_ns / 1e3) + " " +
           std::to_string((p.measured.median_ns - p.harness.median_ns) / 1e3) + "\n";
  }
  return out;
}

std::string MemoryDat(const MemorySeries& s) {
  std::string out = "# cached_tokens raw_MiB held_MiB rss_delta_MiB held_ratio rss_ratio\n";
  for (const auto& p : s.points) {
    out += std::to_string(p.cached_tokens) + " " + std::to_string(Mib(p.raw_bytes)) + " " +
           std::to_string(Mib(p.snapshot_bytes + p.live_bytes)) + " " +
           std::to_string(Mib(p.rss_delta_bytes)) + " " + std::to_string(p.held_ratio()) + " " +
           std::to_string(p.rss_ratio()) + "\n";
  }
  return out;
}

void PrintSummary(const ConversationSeries& c, const ContextSeries& x, const MemorySeries& m) {
  std::printf(
      "conversations  cpu_median_us  cpu_mean_us  wall_median_us  populate_cpu_us  "
      "branch_children\n");
  for (const auto& p : c.points) {
    std::printf("%13lld  %13.1f  %11.1f  %14.1f  %15.1f  %15lld\n",
                static_cast<long long>(p.conversations), p.measured.median_ns / 1e3,
                p.measured.mean_ns / 1e3, p.measured_wall.median_ns / 1e3, p.populate_mean_ns / 1e3,
                static_cast<long long>(p.branch_children));
  }
  std::printf(
      "context  cpu_median_us  cpu_mean_us  wall_median_us  cpu_ns/context_token  harness_us\n");
  for (const auto& p : x.points) {
    std::printf("%7lld  %13.1f  %11.1f  %14.1f  %20.2f  %10.1f\n",
                static_cast<long long>(p.context_tokens), p.measured.median_ns / 1e3,
                p.measured.mean_ns / 1e3, p.measured_wall.median_ns / 1e3,
                p.measured.median_ns / Real(p.context_tokens), p.harness.median_ns / 1e3);
  }
  std::printf("tokens  raw_MiB  held_MiB  rss_MiB  held_ratio  rss_ratio\n");
  for (const auto& p : m.points) {
    std::printf("%6lld  %7.1f  %8.1f  %7.1f  %10.3f  %9.3f\n",
                static_cast<long long>(p.cached_tokens), Mib(p.raw_bytes),
                Mib(p.snapshot_bytes + p.live_bytes), Mib(p.rss_delta_bytes), p.held_ratio(),
                p.rss_ratio());
  }
}

struct Results {
  MemorySeries memory;
  ConversationSeries conversations;
  ContextSeries context;
  double seconds = 0;
};

// Writes the JSON and the .dat file of every series that ran; prints the summary. False
// when a file cannot be written.
bool WriteResults(const Results& r, const kvtwin::bench::ScalingOptions& options,
                  const std::string& json_path, const std::filesystem::path& dir) {
  json out = {{"quick", options.quick}, {"seed", options.seed}, {"seconds", r.seconds}};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  bool ok = true;
  std::string verdict;
  if (!r.memory.points.empty()) {
    out["memory"] = MemoryJson(r.memory);
    ok = WriteFile(dir / "memory.dat", MemoryDat(r.memory)) && ok;
    verdict += out["memory"]["target_met"].get<bool>() ? "; memory met" : "; memory NOT met";
  }
  if (!r.conversations.points.empty()) {
    out["conversations"] = ConversationJson(r.conversations);
    ok = WriteFile(dir / "conversations.dat", ConversationDat(r.conversations)) && ok;
    verdict += out["conversations"]["target_met"].get<bool>() ? "; conversations flat met"
                                                              : "; conversations flat NOT met";
  }
  if (!r.context.points.empty()) {
    out["context"] = ContextJson(r.context);
    ok = WriteFile(dir / "context.dat", ContextDat(r.context)) && ok;
  }
  ok = WriteFile(json_path, out.dump(2) + "\n") && ok;
  PrintSummary(r.conversations, r.context, r.memory);
  std::printf("scaling_bench: %.1f s%s\n", r.seconds, verdict.c_str());
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("kvtwin scaling benchmarks: conversations, context length, memory");
  std::string json_path, plots_dir;
  kvtwin::bench::ScalingOptions options;
  std::vector<std::string> series = {"memory", "conversations", "context"};
  app.add_option("--json", json_path, "write every point here")->required();
  app.add_option("--plots", plots_dir, "directory for the .dat files of the plots")->required();
  app.add_flag("--quick", options.quick, "smaller sweeps (conversations to 10k, context to 16k)");
  app.add_option("--seed", options.seed, "seed of every request");
  app.add_option("--series", series, "the series to run (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember({"memory", "conversations", "context"}));
  app.add_option("--max-conversations", options.max_conversations,
                 "largest N of the conversation series (0: the sweep's own)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto wanted = [&](const char* name) {
    return std::find(series.begin(), series.end(), name) != series.end();
  };
  const auto start = std::chrono::steady_clock::now();
  Results r;
  // Memory first: its RSS baseline is cleanest in a process that has freed nothing yet.
  if (wanted("memory")) r.memory = kvtwin::bench::RunMemorySeries(options);
  // The time series measure the manager's CPU cost, not the kernel's first touch of heap
  // pages, which depends on what the process freed before, not on N or the context: keep
  // freed memory mapped (no trim at the top, no per-allocation mmap) so a point reuses the
  // pages a larger one touched. The memory series above runs with the defaults.
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  mallopt(M_MMAP_THRESHOLD, kMaxMmapThreshold);
  if (wanted("conversations")) r.conversations = kvtwin::bench::RunConversationSeries(options);
  if (wanted("context")) r.context = kvtwin::bench::RunContextSeries(options);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return WriteResults(r, options, json_path, plots_dir) ? 0 : 2;
}
