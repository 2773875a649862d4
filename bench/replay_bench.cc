// Goal: the end-to-end cost of replaying a Mooncake trace, in one of three modes measured the
// same way: (a) `lru`, the block-level LRU a user would otherwise write (bench/block_lru.h);
// (b) `production`, the production caches alone (sim/production_runner.h: the replay's
// PrefixCache calls with no checks); (c) `differential`, the full lock-step replay
// (ReplayFile, exactly `kvtwin replay FILE --block-scale S --preset P`), whose verdict must
// be pass. Method: one configuration per process, so the peak RSS (getrusage) is that
// mode's. Wall (steady clock) and CPU time cover reading, parsing and planning the trace,
// which every mode does alike (the time that input takes alone is reported beside it), and
// stop before the mode's state is freed (the differential replay through
// ReplayOptions::before_teardown). `--repeat N` runs the configuration N times from
// scratch and reports the median run. Writes one JSON object (bench_report merges them).
// Exit codes: 0; 1 a divergence in differential mode; 2 bad flags or input (one line on
// stderr).
#include <fmt/format.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/block_lru.h"
#include "sim/mooncake.h"
#include "sim/production_runner.h"
#include "sim/replay.h"
#include "src/core/check.h"

namespace kvtwin::bench {
namespace {

using Json = nlohmann::ordered_json;

struct Flags {
  std::string mode, trace, json, preset = "dense";
  int64_t scale = 1, limit = 0, repeat = 1;
};

// What a mode replayed; every mode fills the same counts for the same window.
struct Work {
  int64_t requests = 0, block_accesses = 0, prompt_tokens = 0, output_tokens = 0;
  int64_t reused_tokens = 0;  // prompt tokens not recomputed (a hit / cached by Begin)
  double wall_seconds = 0, cpu_seconds = 0;
  Json extra = Json::object();
};

double Seconds(const timeval& t) {
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return Seconds(u.ru_utime) + Seconds(u.ru_stime);
}

// Wall and CPU time of one run, stopped before its state is torn down: freeing a large trie
// or block map is not replaying (block accesses per second are the targets' unit). Until
// the twenty-second session the differential replay's time included freeing its driver,
// whose trie, reference trie and model are the largest of the three modes.
class Stopwatch {
 public:
  void Stop(Work& w) const {
    const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - wall0_;
    w.wall_seconds = wall.count();
    w.cpu_seconds = CpuSeconds() - cpu0_;
  }

 private:
  std::chrono::steady_clock::time_point wall0_ = std::chrono::steady_clock::now();
  double cpu0_ = CpuSeconds();
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "replay_bench: %s\n", message.c_str());
  return 2;
}

// The requests [0, limit) of a Mooncake file with their plans, read the way MooncakeReader
// reads them (one request per line, blank lines skipped, timestamps never decrease); the
// LRU baseline needs the block ids the reader's events no longer carry.
class MooncakeWindow {
 public:
  MooncakeWindow(const std::string& path, int64_t limit, int64_t scale)
      : path_(path), in_(path), limit_(limit), scale_(scale) {}

  // False at the end of the window; an error names FILE:LINE.
  Result<bool> Next(sim::MooncakeRequest& request, sim::RequestPlan& plan) {
    if (!in_) return IoError(fmt::format("{}: cannot read", path_));
    if (limit_ > 0 && index_ >= limit_) return false;
    std::string text;
    while (std::getline(in_, text)) {
      ++line_;
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto r = sim::ParseMooncakeLine(text, path_, line_, last_timestamp_);
      if (!r.ok()) return r.status();
      request = std::move(r).value();
      last_timestamp_ = request.timestamp;
      plan = sim::MooncakePlan(request, index_++, scale_);
      return true;
    }
    if (in_.bad()) return IoError(fmt::format("{}:{}: read error", path_, line_ + 1));
    return false;
  }

 private:
  std::string path_;
  std::ifstream in_;
  int64_t limit_, scale_;
  int64_t line_ = 0, index_ = 0;
  sim::TraceTime last_timestamp_ = -1;
};

// Adds one request's counts.
void Count(Work& w, const sim::MooncakeRequest& r, const sim::RequestPlan& plan) {
  ++w.requests;
  w.block_accesses += static_cast<int64_t>(r.hash_ids.size());
  w.prompt_tokens += static_cast<int64_t>(plan.inputs.size());
  w.output_tokens += static_cast<int64_t>(plan.outputs.size());
}

Result<Work> RunLru(const Flags& f, const sim::TraceHeader& setup) {
  Result<sim::StackConfig> config = sim::TraceStack(setup);
  if (!config.ok()) return config.status();
  const Stopwatch watch;
  BlockLru lru(*config, sim::TraceValueSeed(setup), setup.budget_bytes);
  MooncakeWindow window(f.trace, f.limit, f.scale);
  sim::MooncakeRequest r;
  sim::RequestPlan plan;
  std::vector<int64_t> lens;
  while (true) {
    Result<bool> more = window.Next(r, plan);
    if (!more.ok()) return more.status();
    if (!*more) break;
    lens.clear();
    for (size_t i = 0; i < r.hash_ids.size(); ++i) {
      lens.push_back(sim::ScaledBlockLength(r, i, f.scale));
    }
    lru.Run(r.hash_ids, lens, plan);
  }
  const BlockLruStats& s = lru.stats();
  Work w{s.requests, s.block_accesses, s.prompt_tokens, s.output_tokens, s.hit_tokens};
  watch.Stop(w);
  w.extra["block_hits"] = s.block_hits;
  w.extra["evicted_blocks"] = s.evicted_blocks;
  w.extra["cached_bytes"] = lru.cached_bytes();
  w.extra["checksum"] = lru.checksum();
  return w;
}

// The window's counts (the replay's events no longer carry the block ids), and the time
// reading, parsing and planning it takes alone: the share of every mode that is input.
Result<Work> CountWindow(const Flags& f) {
  const Stopwatch watch;
  MooncakeWindow window(f.trace, f.limit, f.scale);
  sim::MooncakeRequest r;
  sim::RequestPlan plan;
  Work w;
  while (true) {
    Result<bool> more = window.Next(r, plan);
    if (!more.ok()) return more.status();
    if (!*more) break;
    Count(w, r, plan);
  }
  watch.Stop(w);
  return w;
}

// CountWindow `repeat` times, its median wall time kept: the input's share, measured like
// the mode (a single cold pass would also pay the first-touch page faults).
Result<Work> InputAlone(const Flags& f) {
  std::vector<double> walls;
  Result<Work> window = CountWindow(f);
  for (int64_t i = 0; window.ok() && i < f.repeat; ++i) {
    if (i > 0) window = CountWindow(f);
    if (window.ok()) walls.push_back(window->wall_seconds);
  }
  if (!window.ok()) return window.status();
  std::sort(walls.begin(), walls.end());
  window->wall_seconds = walls[walls.size() / 2];
  return window;
}

Result<Work> RunProduction(const Flags& f, const sim::MooncakeOptions& m,
                           const sim::TraceHeader& setup, const Work& window) {
  const Stopwatch watch;
  auto reader = sim::MooncakeReader::Open(f.trace, m, setup);
  if (!reader.ok()) return reader.status();
  const sim::TraceHeader& h = (*reader)->header();
  Result<sim::StackConfig> config = sim::TraceStack(h);
  if (!config.ok()) return config.status();
  sim::ProductionRunner runner(*config, sim::TraceDriverOptions(h), sim::TraceValueSeed(h));
  Work w;
  while (true) {
    auto event = (*reader)->Next();
    if (!event.ok()) return event.status();
    if (!event->has_value()) break;
    const auto& plan = std::get<sim::RequestPlan>(**event);
    if (Status s = runner.Run(plan); !s.ok()) {
      return Status(s.code(), fmt::format("request {}: the production run failed: {}", w.requests,
                                          s.message()));
    }
    ++w.requests;
    w.prompt_tokens += static_cast<int64_t>(plan.inputs.size());
    w.output_tokens += static_cast<int64_t>(plan.outputs.size());
    w.reused_tokens += runner.last_report().cached;
  }
  watch.Stop(w);
  w.block_accesses = window.block_accesses;
  w.extra["checksum"] = runner.checksum();
  w.extra["trie_nodes"] = runner.manager().trie().num_nodes();
  w.extra["paged_out_bytes"] = runner.manager().trie().paged_out_bytes();
  return w;
}

Result<Work> RunDifferential(const Flags& f, const sim::MooncakeOptions& m,
                             const sim::TraceHeader& setup, const Work& window) {
  sim::ReplayOptions options;
  options.mooncake = m;
  options.mooncake_setup = setup;
  Work w = window;
  const Stopwatch watch;
  options.before_teardown = [&] { watch.Stop(w); };
  const sim::ReplayResult r = sim::ReplayFile(f.trace, options);
  if (r.input_error) return *r.input_error;
  w.reused_tokens = r.cached_tokens;
  w.extra["verdict"] = r.verdict();
  w.extra["events"] = r.events;
  w.extra["steps"] = r.steps;
  w.extra["digest"] = fmt::format("{:016x}", r.digest);
  if (r.divergence) {
    std::fprintf(stderr, "%s\nreproduce: %s\n", r.divergence->c_str(),
                 sim::ReplayCommand(f.trace, options).c_str());
  } else {
    KV_CHECK(r.events == window.requests && r.prompt_tokens == window.prompt_tokens,
             "the replay and the window disagree on the requests");
  }
  return w;
}

int64_t PeakRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports kilobytes
}

double PerSecond(int64_t n, double seconds) {
  return seconds > 0 ? static_cast<double>(n) / seconds : 0.0;
}

bool WriteJson(const std::string& path, const Json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

Result<Work> RunOnce(const Flags& f, const sim::TraceHeader& setup, const Work& window) {
  const sim::MooncakeOptions m{.block_scale = f.scale, .skip = 0, .limit = f.limit};
  if (f.mode == "lru") return RunLru(f, setup);
  if (f.mode == "production") return RunProduction(f, m, setup, window);
  return RunDifferential(f, m, setup, window);
}

// Runs the configuration `repeat` times from scratch; the run with the median wall time
// is reported (short runs vary by a few percent between repetitions).
Result<Work> RunMedian(const Flags& f, const sim::TraceHeader& setup, const Work& window) {
  std::vector<Work> runs;
  Json walls = Json::array();
  for (int64_t i = 0; i < f.repeat; ++i) {
    Result<Work> w = RunOnce(f, setup, window);
    if (!w.ok()) return w.status();
    walls.push_back(w->wall_seconds);
    runs.push_back(std::move(*w));
    if (runs.back().extra.value("verdict", "pass") != "pass") break;  // report the failure
  }
  std::sort(runs.begin(), runs.end(),
            [](const Work& a, const Work& b) { return a.wall_seconds < b.wall_seconds; });
  Work median = std::move(runs[runs.size() / 2]);
  median.extra["runs_wall_seconds"] = walls;
  return median;
}

Json ToJson(const Flags& f, const Work& w, const Work& window) {
  const int64_t tokens = w.prompt_tokens + w.output_tokens;
  Json j;
  j["mode"] = f.mode;
  j["scale"] = f.scale;
  j["limit"] = f.limit;
  j["preset"] = f.preset;
  j["trace"] = f.trace;
  j["requests"] = w.requests;
  j["block_accesses"] = w.block_accesses;
  j["prompt_tokens"] = w.prompt_tokens;
  j["output_tokens"] = w.output_tokens;
  j["reused_tokens"] = w.reused_tokens;
  j["wall_seconds"] = w.wall_seconds;
  j["cpu_seconds"] = w.cpu_seconds;
  j["requests_per_second"] = PerSecond(w.requests, w.wall_seconds);
  j["block_accesses_per_second"] = PerSecond(w.block_accesses, w.wall_seconds);
  j["tokens_per_second"] = PerSecond(tokens, w.wall_seconds);
  j["peak_rss_bytes"] = PeakRssBytes();
  j["parse_seconds"] = window.wall_seconds;
  j.update(w.extra);
  return j;
}

int Main(const Flags& f) {
  sim::TraceHeader setup;  // the replay CLI's defaults, with the preset asked for
  setup.preset = f.preset;
  setup.chunk = sim::MooncakeChunk(f.scale);
  setup.capture_interval = sim::MooncakeInterval(f.scale);
  if (Result<sim::StackConfig> c = sim::TraceStack(setup); !c.ok()) {
    return Fail("--preset: " + c.status().message());
  }
  Result<Work> window = InputAlone(f);
  if (!window.ok()) return Fail(window.status().message());
  Result<Work> work = RunMedian(f, setup, *window);
  if (!work.ok()) return Fail(work.status().message());
  const Work& w = *work;
  KV_CHECK(w.requests == window->requests && w.block_accesses == window->block_accesses &&
               w.prompt_tokens == window->prompt_tokens,
           "the run and the window disagree on the requests");
  if (!WriteJson(f.json, ToJson(f, w, *window))) {
    return Fail("--json: cannot write '" + f.json + "'");
  }
  fmt::print(
      "{} scale {}: {} requests, {} block accesses, {} tokens in {:.3f} s wall ({:.3f} s "
      "CPU; input alone {:.3f} s)\n",
      f.mode, f.scale, w.requests, w.block_accesses, w.prompt_tokens + w.output_tokens,
      w.wall_seconds, w.cpu_seconds, window->wall_seconds);
  const bool diverged = w.extra.value("verdict", "pass") != "pass";
  return diverged ? 1 : 0;
}

}  // namespace
}  // namespace kvtwin::bench

int main(int argc, char** argv) {
  kvtwin::bench::Flags f;
  CLI::App app{"replay_bench: one end-to-end Mooncake replay configuration, as JSON"};
  app.add_option("--mode", f.mode, "lru | production | differential")
      ->required()
      ->check(CLI::IsMember({"lru", "production", "differential"}));
  app.add_option("--scale", f.scale, "tokens per 512-token block (1..512)")
      ->required()
      ->check(CLI::Range(int64_t{1}, kvtwin::sim::kMooncakeBlockTokens));
  app.add_option("--limit", f.limit, "the first N requests only (0 = all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000000}));
  app.add_option("--repeat", f.repeat, "runs from scratch; the median is reported")
      ->check(CLI::Range(int64_t{1}, int64_t{100}));
  app.add_option("--preset", f.preset, "stack preset (dense, sliding, recurrent, mixed, rotating)");
  app.add_option("--trace", f.trace, "Mooncake JSONL")->required()->check(CLI::ExistingFile);
  app.add_option("--json", f.json, "where to write the result")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return kvtwin::bench::Fail(e.what());
  }
  return kvtwin::bench::Main(f);
}
