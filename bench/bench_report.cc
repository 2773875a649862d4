// bench_report: merges what one `make bench` measured into bench/results/latest.json and
// prints it as a table. Inputs: the replay parts (one JSON object per replay_bench process;
// several processes of one configuration, interleaved with the other modes, reduce to the
// fastest one), the Google Benchmark JSON of cache_bench, and the scaling JSON when that file
// exists (its format belongs to scaling_bench; it is copied, not interpreted). Computed
// here, per window (block scale and request limit): (b)/(a) = production over the LRU
// baseline and (c)/(b) = differential over production, both in block accesses per second
// (equal to the requests/s and tokens/s ratios, since both modes replayed the same window);
// and the targets at block scale 1 over the whole trace. The output is written to
// a temporary file and renamed. A missing or malformed input (parts are checked field by
// field before use) is one line on stderr and exit 2; the micro and scaling files are
// optional (a run that skipped them).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "src/core/status.h"

namespace {

using Json = nlohmann::ordered_json;

const char* const kModes[] = {"lru", "production", "differential"};
const char* const kModeLabels[] = {"(a) lru", "(b) production", "(c) differential"};
// "Seconds, not minutes": the differential replay of the whole trace at block scale 1.
constexpr double kDifferentialWallSecondsMax = 60.0;
constexpr double kDifferentialOverProductionMin = 0.25;
constexpr double kProductionOverLruMin = 1.0;

using kvtwin::InvalidArgument;
using kvtwin::IoError;
using kvtwin::Result;
using kvtwin::Status;

Result<Json> ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return IoError(path + ": cannot read");
  Json j = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(path + ": not valid JSON");
  return j;
}

// The trace window a part replayed: its block scale and request limit. Windows sort by
// scale, then the whole trace (limit 0) before longer limits before shorter ones.
struct Window {
  int64_t scale = 0, limit = 0;
  int64_t Requests() const { return limit == 0 ? INT64_MAX : limit; }
  bool operator<(const Window& o) const {
    return scale != o.scale ? scale < o.scale : Requests() > o.Requests();
  }
  std::string Limit() const { return limit == 0 ? "all" : std::to_string(limit); }
};

// mode -> part, per window: ratios compare modes over the same window only.
using Parts = std::map<Window, std::map<std::string, Json>>;

// The fields the report reads, each checked for its type.
Status CheckPart(const Json& j, const std::string& path) {
  const auto mode = j.value("mode", std::string());
  if (std::find(std::begin(kModes), std::end(kModes), mode) == std::end(kModes)) {
    return InvalidArgument(path + ": /mode: expected lru, production or differential");
  }
  for (const char* key :
       {"scale", "limit", "requests", "block_accesses", "prompt_tokens", "output_tokens",
        "reused_tokens", "wall_seconds", "cpu_seconds", "parse_seconds", "requests_per_second",
        "block_accesses_per_second", "tokens_per_second", "peak_rss_bytes"}) {
    if (!j.contains(key) || !j[key].is_number()) {
      return InvalidArgument(fmt::format("{}: /{}: expected a number", path, key));
    }
  }
  return Status::Ok();
}

// The fastest of several processes that ran the same configuration (by wall time; each
// reports its median run), with every process's wall time added. This VM's slow phases last
// seconds, span whole processes and only ever add time, so the fastest process is the
// least disturbed; the median of three still landed in a slow phase whenever two did.
Json FastestPart(std::vector<Json> runs) {
  std::sort(runs.begin(), runs.end(), [](const Json& a, const Json& b) {
    return a["wall_seconds"].get<double>() < b["wall_seconds"].get<double>();
  });
  Json walls = Json::array();
  for (const Json& r : runs) walls.push_back(r["wall_seconds"]);
  Json fastest = std::move(runs.front());
  fastest["processes"] = walls.size();
  fastest["process_wall_seconds"] = walls;
  return fastest;
}

Result<Parts> ReadParts(const std::vector<std::string>& paths) {
  std::map<Window, std::map<std::string, std::vector<Json>>> all;
  for (const std::string& path : paths) {
    Result<Json> j = ReadJson(path);
    if (!j.ok()) return j.status();
    KV_RETURN_IF_ERROR(CheckPart(*j, path));
    const Window w{(*j)["scale"].get<int64_t>(), (*j)["limit"].get<int64_t>()};
    all[w][(*j)["mode"].get<std::string>()].push_back(std::move(*j));
  }
  Parts parts;
  for (auto& [window, modes] : all) {
    for (auto& [mode, runs] : modes) parts[window][mode] = FastestPart(std::move(runs));
  }
  return parts;
}

std::optional<double> Ratio(const std::map<std::string, Json>& modes, const char* num,
                            const char* den) {
  if (!modes.contains(num) || !modes.contains(den)) return std::nullopt;
  const double d = modes.at(den)["block_accesses_per_second"].get<double>();
  if (d <= 0) return std::nullopt;
  return modes.at(num)["block_accesses_per_second"].get<double>() / d;
}

Json Ratios(const Parts& parts) {
  Json out = Json::array();
  for (const auto& [window, modes] : parts) {
    Json r;
    r["scale"] = window.scale;
    r["limit"] = window.limit;
    const auto ba = Ratio(modes, "production", "lru");
    const auto cb = Ratio(modes, "differential", "production");
    r["production_over_lru"] = ba ? Json(*ba) : Json();
    r["differential_over_production"] = cb ? Json(*cb) : Json();
    out.push_back(r);
  }
  return out;
}

Json Targets(const Parts& parts, const Json& ratios) {
  Json t = Json::array();
  auto add = [&](std::string what, std::optional<double> value, bool met) {
    t.push_back({{"target", std::move(what)},
                 {"value", value ? Json(*value) : Json()},
                 {"met", value.has_value() && met}});
  };
  // At scale 1 over the whole trace.
  std::optional<double> wall, cb, ba;
  const Window full{1, 0};
  if (parts.contains(full) && parts.at(full).contains("differential")) {
    wall = parts.at(full).at("differential")["wall_seconds"].get<double>();
  }
  for (const Json& r : ratios) {
    if (r["scale"] != 1 || r["limit"] != 0) continue;
    if (!r["differential_over_production"].is_null())
      cb = r["differential_over_production"].get<double>();
    if (!r["production_over_lru"].is_null()) ba = r["production_over_lru"].get<double>();
  }
  add(fmt::format("(c) replays the full trace at scale 1 in < {:.0f} s wall",
                  kDifferentialWallSecondsMax),
      wall, wall && *wall < kDifferentialWallSecondsMax);
  add(fmt::format("(c)/(b) at scale 1 >= {:.2f}", kDifferentialOverProductionMin), cb,
      cb && *cb >= kDifferentialOverProductionMin);
  add(fmt::format("(b)/(a) at scale 1 >= {:.1f} (block accesses/s)", kProductionOverLruMin), ba,
      ba && *ba >= kProductionOverLruMin);
  return t;
}

std::string Rate(double per_second) {
  if (per_second >= 1e6) return fmt::format("{:.2f}M", per_second / 1e6);
  if (per_second >= 1e3) return fmt::format("{:.1f}k", per_second / 1e3);
  return fmt::format("{:.1f}", per_second);
}

std::string Optional(const Json& v, const char* format_spec) {
  return v.is_null() ? "-" : fmt::format(fmt::runtime(format_spec), v.get<double>());
}

// One row: the fastest process of a mode over a window; `runs` is processes x runs in each.
void PrintRow(const Window& window, const char* label, const Json& p) {
  const auto tokens = p["prompt_tokens"].get<int64_t>() + p["output_tokens"].get<int64_t>();
  const auto prompt = p["prompt_tokens"].get<double>();
  const std::string runs =
      fmt::format("{}x{}", p.value("processes", 1),
                  p.contains("runs_wall_seconds") ? p["runs_wall_seconds"].size() : 1);
  fmt::print(
      "{:>5} {:<17} {:>8} {:>6} {:>5} {:>10} {:>10} {:>8.3f} {:>8.3f} {:>7.3f} {:>9} {:>9} "
      "{:>9} {:>9.1f} {:>5.1f}% {}\n",
      window.scale, label, p["requests"].get<int64_t>(), window.Limit(), runs,
      p["block_accesses"].get<int64_t>(), tokens, p["wall_seconds"].get<double>(),
      p["cpu_seconds"].get<double>(), p["parse_seconds"].get<double>(),
      Rate(p["requests_per_second"].get<double>()),
      Rate(p["block_accesses_per_second"].get<double>()),
      Rate(p["tokens_per_second"].get<double>()),
      p["peak_rss_bytes"].get<double>() / (1024.0 * 1024.0),
      prompt > 0 ? 100.0 * p["reused_tokens"].get<double>() / prompt : 0.0,
      p.value("verdict", std::string("-")));
}

void PrintReplay(const Parts& parts, const Json& ratios) {
  if (parts.empty()) return;
  fmt::print(
      "Mooncake replay ({} preset; limit = the first N requests, all = {} requests; "
      "runs = processes x runs each, the fastest process's median run shown; input s = "
      "reading and parsing alone)\n",
      parts.begin()->second.begin()->second["preset"].get<std::string>(),
      parts.contains({1, 0}) ? parts.at({1, 0}).begin()->second["requests"].dump() : "?");
  fmt::print(
      "{:>5} {:<17} {:>8} {:>6} {:>5} {:>10} {:>10} {:>8} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} "
      "{:>6} {}\n",
      "scale", "mode", "requests", "limit", "runs", "blocks", "tokens", "wall s", "cpu s",
      "input s", "req/s", "blocks/s", "tokens/s", "peak MiB", "reuse", "verdict");
  for (const auto& [window, modes] : parts) {
    for (size_t m = 0; m < std::size(kModes); ++m) {
      if (modes.contains(kModes[m])) PrintRow(window, kModeLabels[m], modes.at(kModes[m]));
    }
  }
  fmt::print("\nratios over the same window (block accesses/s)\n{:>5} {:>6} {:>9} {:>9}\n", "scale",
             "limit", "(b)/(a)", "(c)/(b)");
  for (const Json& r : ratios) {
    const Window w{r["scale"].get<int64_t>(), r["limit"].get<int64_t>()};
    fmt::print("{:>5} {:>6} {:>9} {:>9}\n", w.scale, w.Limit(),
               Optional(r["production_over_lru"], "{:.3f}"),
               Optional(r["differential_over_production"], "{:.3f}"));
  }
}

void PrintTargets(const Json& targets) {
  fmt::print("\ntargets (benchmarks, not tests)\n");
  for (const Json& t : targets) {
    fmt::print("  {:<55} {:>9}  {}\n", t["target"].get<std::string>(),
               Optional(t["value"], "{:.3f}"),
               t["value"].is_null()   ? "not measured"
               : t["met"].get<bool>() ? "met"
                                      : "MISSED");
  }
}

void PrintMicro(const Json& micro) {
  if (micro.is_null() || !micro.contains("benchmarks")) return;
  fmt::print("\nmicro benchmarks (cache_bench)\n");
  for (const Json& b : micro["benchmarks"]) {
    const std::string items = b.contains("items_per_second")
                                  ? Rate(b["items_per_second"].get<double>()) + " items/s"
                                  : "";
    fmt::print("  {:<44} {:>12.1f} {:<3} {}\n", b.value("name", std::string("?")),
               b.value("cpu_time", 0.0), b.value("time_unit", std::string()), items);
  }
}

Status WriteAtomically(const std::string& path, const Json& j) {
  const std::filesystem::path out(path);
  std::error_code ec;
  if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path(), ec);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << j.dump(2) << "\n";
    if (!f) return IoError("--out: cannot write '" + tmp + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return IoError("--out: cannot rename '" + tmp + "' to '" + path + "'");
  }
  return Status::Ok();
}

struct Flags {
  std::vector<std::string> replay;
  std::string micro, scaling, out;
};

Status Run(const Flags& f) {
  Result<Parts> read = ReadParts(f.replay);
  if (!read.ok()) return read.status();
  const Parts& parts = *read;
  Json j;
  j["format"] = "kvtwin-bench";
  j["version"] = 1;
  Json replay = Json::array();
  for (const auto& [window, modes] : parts) {
    for (const char* mode : kModes) {
      if (modes.contains(mode)) replay.push_back(modes.at(mode));
    }
  }
  j["replay"] = replay;
  j["ratios"] = Ratios(parts);
  j["targets"] = Targets(parts, j["ratios"]);
  for (const auto& [key, path] : {std::pair{"micro", f.micro}, std::pair{"scaling", f.scaling}}) {
    j[key] = Json();
    if (path.empty() || !std::filesystem::exists(path)) continue;  // not run this time
    Result<Json> other = ReadJson(path);
    if (!other.ok()) return other.status();
    j[key] = std::move(*other);
  }
  KV_RETURN_IF_ERROR(WriteAtomically(f.out, j));
  PrintReplay(parts, j["ratios"]);
  PrintTargets(j["targets"]);
  PrintMicro(j["micro"]);
  fmt::print("\nscaling: {}\nwrote {}\n",
             j["scaling"].is_null() ? "none" : "merged from " + f.scaling, f.out);
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"bench_report: merge replay_bench, cache_bench and scaling JSON; print a table"};
  app.add_option("--replay", f.replay, "replay_bench JSON parts")->required();
  app.add_option("--micro", f.micro, "cache_bench --benchmark_out JSON");
  app.add_option("--scaling", f.scaling, "scaling_bench JSON (skipped when absent)");
  app.add_option("--out", f.out, "merged JSON to write")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "bench_report: %s\n", e.what());
    return 2;
  }
  const Status s = Run(f);
  if (s.ok()) return 0;
  std::fprintf(stderr, "bench_report: %s\n", s.message().c_str());
  return 2;
}
