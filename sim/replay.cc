#include "sim/replay.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <utility>

#include "sim/lockstep.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

constexpr size_t kRecentEvents = 6;

// Where events come from: a trace file, a Mooncake file or memory.
class Source {
 public:
  virtual ~Source() = default;
  virtual const TraceHeader& header() const = 0;
  virtual Result<std::optional<TraceEvent>> Next() = 0;
  // "FILE:LINE" of the last event (or "event N" in memory), for errors about its content.
  virtual std::string Where() const = 0;
  virtual int64_t line() const = 0;
};

template <typename Reader>
class FileSource final : public Source {
 public:
  explicit FileSource(std::unique_ptr<Reader> r) : r_(std::move(r)) {}
  const TraceHeader& header() const override { return r_->header(); }
  Result<std::optional<TraceEvent>> Next() override { return r_->Next(); }
  std::string Where() const override { return fmt::format("{}:{}", r_->path(), r_->line()); }
  int64_t line() const override { return r_->line(); }

 private:
  std::unique_ptr<Reader> r_;
};

class MemorySource final : public Source {
 public:
  explicit MemorySource(const Trace& t) : t_(t) {}
  const TraceHeader& header() const override { return t_.header; }
  Result<std::optional<TraceEvent>> Next() override {
    if (next_ >= t_.events.size()) return std::optional<TraceEvent>();
    return std::optional<TraceEvent>(t_.events[next_++]);
  }
  std::string Where() const override { return fmt::format("event {}", next_ - 1); }
  int64_t line() const override { return 0; }

 private:
  const Trace& t_;
  size_t next_ = 0;
};

std::string EventSummary(const TraceEvent& e) {
  if (const auto* op = std::get_if<Op>(&e)) return op->ToString();
  if (const auto* op = std::get_if<MsOp>(&e)) return op->ToString();
  return std::get<RequestPlan>(e).ToString();
}

class Replayer {
 public:
  Replayer(Source& source, const ReplayOptions& options, ReplayResult& result)
      : src_(source), o_(options), r_(result) {}

  void Run() {
    r_.header = src_.header();
    for (const ReachClaim& claim : o_.reaches) {
      if (Status s = CheckReachCounter(claim, r_.header.kind); !s.ok()) {
        r_.input_error = InvalidArgument(fmt::format("{}: --reach {}", HeaderWhere(), s.message()));
        return;
      }
    }
    RunKind();
    if (!r_.input_error && !r_.divergence && !r_.interrupted && o_.stop_after < 0) CheckReaches();
  }

 private:
  void RunKind() {
    if (r_.header.kind == TraceKind::kMultiSeq) {
      RunMultiSeq();
      return;
    }
    Result<StackConfig> config = TraceStack(r_.header);
    if (!config.ok()) {
      r_.input_error =
          InvalidArgument(fmt::format("{}: /model: {}", HeaderWhere(), config.status().message()));
      return;
    }
    if (r_.header.kind == TraceKind::kOps) {
      RunOps(std::move(*config));
    } else {
      RunRequests(std::move(*config));
    }
  }

  // The header's and the command's reach claims against the coverage of a replay that ran to
  // its end.
  void CheckReaches() {
    std::vector<std::string> short_of;
    auto check = [&](const ReachClaim& claim, const std::string& where, const char* who) {
      const int64_t got = r_.Counter(claim.counter);
      if (got >= claim.at_least) return;
      short_of.push_back(fmt::format("{}: {}: reached {} time(s), the {} claims at least {}",
                                     HeaderWhere(), where, got, who, claim.at_least));
    };
    for (const ReachClaim& c : r_.header.reaches) check(c, "/reaches/" + c.counter, "trace");
    for (const ReachClaim& c : o_.reaches) check(c, "--reach " + c.counter, "command");
    if (!short_of.empty()) r_.unreached = fmt::format("{}", fmt::join(short_of, "; "));
  }

  std::string HeaderWhere() const { return r_.path.empty() ? "header" : r_.path + ":1"; }

  // The next event, or nullopt at the end, on an input error or an interrupt.
  std::optional<TraceEvent> Next() {
    if (o_.interrupted != nullptr && o_.interrupted->load()) {
      r_.interrupted = true;
      return std::nullopt;
    }
    if (o_.stop_after >= 0 && r_.events > o_.stop_after) return std::nullopt;
    Result<std::optional<TraceEvent>> e = src_.Next();
    if (!e.ok()) {
      r_.input_error = e.status();
      return std::nullopt;
    }
    if (!*e) return std::nullopt;
    ++r_.events;
    r_.recent.push_back(EventSummary(**e));
    if (r_.recent.size() > kRecentEvents) r_.recent.pop_front();
    return std::move(*e);
  }

  void BeforeTeardown() const {
    if (o_.before_teardown) o_.before_teardown();
  }

  void Diverged(std::string report, const std::string& what) {
    r_.divergence = std::move(report);
    r_.divergence_kind = DivergenceKind(what);
    r_.failing_event = r_.events - 1;
    r_.failing_line = src_.line();
  }

  // Applies events of kind `Event` through an op-level driver (Valid, Apply, steps, digest)
  // until the end, an input error (an event of another kind, or one the driver would not
  // accept: `invalid` says what it names) or the first divergence.
  template <typename Event, typename Driver>
  void ApplyEvents(Driver& d, const char* invalid) {
    while (!r_.divergence) {
      std::optional<TraceEvent> e = Next();
      if (!e) break;
      const Event* op = std::get_if<Event>(&*e);
      if (op == nullptr || !d.Valid(*op)) {
        r_.input_error = InvalidArgument(
            fmt::format("{}: /: {} names {}", src_.Where(), EventSummary(*e), invalid));
        break;
      }
      if (auto div = d.Apply(*op)) {
        Diverged(div->ToString(), div->mismatch.what);
        break;
      }
      if (o_.on_event) o_.on_event(r_.events);
    }
    r_.steps = d.steps();
    r_.digest = d.digest();
  }

  void RunOps(StackConfig config) {
    LockstepDriver d(std::move(config), TraceValueSeed(r_.header));
    ApplyEvents<Op>(d, "a layer or snapshot slot that does not exist at this point");
    for (int32_t i = 0; i < d.num_layers(); ++i) {
      r_.state += fmt::format("layer {} {}: offset {}, {} pooled snapshot(s)\n", i,
                              CacheKindName(d.config().layers[static_cast<size_t>(i)].kind),
                              d.ref(i).Offset(), d.pool_size(i));
    }
    BeforeTeardown();
  }

  void RunMultiSeq() {
    const MultiSeqConfig& config = r_.header.multiseq;
    if (const Status valid = config.Validate(); !valid.ok()) {
      r_.input_error =
          InvalidArgument(fmt::format("{}: /multiseq: {}", HeaderWhere(), valid.message()));
      return;
    }
    MultiSeqDriver d(config, TraceValueSeed(r_.header));
    if (const std::optional<MsDivergence>& div = d.divergence()) {
      Diverged(div->ToString(), div->mismatch.what);  // a disagreement on the derived shape
    }
    ApplyEvents<MsOp>(d,
                      "a sequence, position, batch or edit inside a forward (those need conv "
                      "\"as-specified\") that a correct runner would not issue at this point");
    r_.ms_coverage = d.coverage();
    r_.state =
        fmt::format("multiseq {}\ncoverage: {}\n", config.Describe(), d.coverage().ToString());
    BeforeTeardown();
  }

  void RunRequests(StackConfig config) {
    const TraceHeader& h = r_.header;
    RequestDriverOptions options = TraceDriverOptions(h);
    options.audit_every_call = o_.audit_every_call;
    options.after_request = o_.after_request;
    RequestDriver d(std::move(config), options, TraceValueSeed(h));
    while (std::optional<TraceEvent> e = Next()) {
      RequestPlan* plan = std::get_if<RequestPlan>(&*e);
      if (plan == nullptr) {
        r_.input_error =
            InvalidArgument(fmt::format("{}: /: an op event in a requests trace", src_.Where()));
        break;
      }
      plan->index = r_.events - 1;
      std::optional<RequestDivergence> div = d.Run(*plan);
      r_.recent.back() += " -> " + d.last_outcome();
      const BeginReport& b = d.last_report();
      r_.prompt_tokens += b.total;
      r_.matched_tokens += b.matched;
      r_.cached_tokens += b.cached;
      if (div) {
        Diverged(div->ToString(), div->mismatch.what);
        r_.unaudited_calls = div->unaudited_calls;
        break;
      }
      if (o_.on_event) o_.on_event(r_.events);
    }
    if (!r_.divergence && !r_.input_error && !r_.interrupted) {
      if (std::optional<RequestDivergence> div = d.FinalAudit()) {
        Diverged(div->ToString(), div->mismatch.what);
        r_.unaudited_calls = div->unaudited_calls;
      }
    }
    r_.steps = d.steps();
    r_.digest = d.digest();
    r_.coverage = d.coverage();
    if (r_.divergence || o_.dump_trie) {
      RequestDriver::TrieDumps dumps = d.DumpTries(r_.divergence.has_value());
      r_.trie_dump = std::move(dumps.text);
      r_.trie_dot = std::move(dumps.dot);
    }
    const PrefixCache& pc = d.manager();
    r_.state = fmt::format("active path ends at offset {}; {} paged-out bytes\n",
                           r_.divergence ? -1 : pc.active_path().back()->end_offset(),
                           pc.trie().paged_out_bytes());
    BeforeTeardown();
  }

  Source& src_;
  const ReplayOptions& o_;
  ReplayResult& r_;
};

}  // namespace

const char* ReplayResult::verdict() const {
  if (input_error) return "input error";
  if (divergence) return "divergence";
  if (unreached) return "unreached";
  if (interrupted) return "interrupted";
  return "pass";
}

std::string ReplayResult::detail() const {
  if (input_error) return input_error->message();
  if (divergence) return *divergence;
  return unreached.value_or("");
}

std::string ReplayResult::CoverageCounters() const {
  if (header.kind == TraceKind::kMultiSeq) return ms_coverage.ToString();
  if (header.kind == TraceKind::kOps) return "";
  return coverage.Counters();
}

int64_t ReplayResult::Counter(const std::string& name) const {
  if (header.kind == TraceKind::kMultiSeq) {
    for (const auto& [field, member] : MsCoverage::Fields()) {
      if (name == field) return ms_coverage.*member;
    }
  } else if (header.kind == TraceKind::kRequests) {
    for (const auto& [field, member] : RequestCoverage::Fields()) {
      if (name == field) return coverage.*member;
    }
  }
  // The reader and the replay (CheckReachCounter) accept only counters of the header's kind; an
  // in-memory trace built with another name is a caller's bug.
  KV_CHECK(false, "no coverage counter '" + name + "' in a trace of this kind");
  return 0;
}

bool ReplayResult::Reaches(const std::vector<ReachClaim>& claims) const {
  return std::all_of(claims.begin(), claims.end(),
                     [&](const ReachClaim& c) { return Counter(c.counter) >= c.at_least; });
}

uint64_t TraceValueSeed(const TraceHeader& header) {
  // What RunMultiSeq gives its driver (sim/multi_seq_run.cc), so digests match.
  if (header.kind == TraceKind::kMultiSeq)
    return Rng::Derive(header.seed, "multiseq-values").Next();
  return Rng::Derive(header.seed, "values").Next();
}

RequestDriverOptions TraceDriverOptions(const TraceHeader& header) {
  RequestDriverOptions o;
  o.budget_bytes = header.budget_bytes;
  o.chunk = header.chunk;
  o.capture_interval = header.capture_interval;
  o.pre_thinking = header.pre_thinking;
  return o;
}

std::string DivergenceKind(const std::string& what) {
  // The first ": "-separated segment that is not a node's name ("node [5,9) keys ...",
  // "root"): node names change with every shrinking step, the check's name does not.
  std::string segment;
  for (size_t at = 0; at <= what.size();) {
    const size_t next = std::min(what.find(": ", at), what.size());
    segment = what.substr(at, next - at);
    if (!segment.starts_with("node [") && segment != "root") break;
    at = next + 2;
  }
  std::string kind;
  for (const char c : segment) {
    if (std::isdigit(static_cast<unsigned char>(c)) == 0) {
      kind += c;
    } else if (kind.empty() || kind.back() != '#') {
      kind += '#';
    }
  }
  return kind;
}

namespace {

ReplayResult ReplayFileOnce(const std::string& path, const ReplayOptions& options) {
  ReplayResult r;
  r.path = path;
  std::unique_ptr<Source> source;
  if (LooksLikeMooncake(path)) {
    auto reader = MooncakeReader::Open(path, options.mooncake, options.mooncake_setup);
    if (!reader.ok()) {
      r.input_error = reader.status();
      return r;
    }
    source = std::make_unique<FileSource<MooncakeReader>>(std::move(*reader));
  } else {
    auto reader = TraceReader::Open(path);
    if (!reader.ok()) {
      r.input_error = reader.status();
      return r;
    }
    source = std::make_unique<FileSource<TraceReader>>(std::move(*reader));
  }
  Replayer(*source, options, r).Run();
  return r;
}

ReplayResult ReplayTraceOnce(const Trace& trace, const ReplayOptions& options) {
  ReplayResult r;
  MemorySource source(trace);
  Replayer(source, options, r).Run();
  return r;
}

// A divergence the amortized audit found after calls it skipped may not be the first: an
// audit of a skipped call could have failed earlier. The replay is deterministic and the
// checks only read production state, so a replay with every call audited fails at or before
// the same event; its result replaces the first (an interrupted re-run keeps the first).
template <typename Replay>
ReplayResult Localized(ReplayResult r, const ReplayOptions& options, const Replay& replay) {
  if (!r.divergence || r.unaudited_calls == 0 || options.audit_every_call) return r;
  ReplayOptions again = options;
  again.audit_every_call = true;
  again.stop_after = r.failing_event;
  again.on_event = nullptr;  // the progress display has already counted these events
  ReplayResult first = replay(again);
  if (first.interrupted) return r;
  KV_CHECK(first.divergence.has_value() && first.failing_event <= r.failing_event,
           "a replay auditing every call passed the event at which the amortized one failed");
  *first.divergence += "\n  " + LocalizedNote(r.failing_event, r.unaudited_calls);
  return first;
}

}  // namespace

ReplayResult ReplayFile(const std::string& path, const ReplayOptions& options) {
  return Localized(ReplayFileOnce(path, options), options,
                   [&](const ReplayOptions& o) { return ReplayFileOnce(path, o); });
}

ReplayResult ReplayTrace(const Trace& trace, const ReplayOptions& options) {
  return Localized(ReplayTraceOnce(trace, options), options,
                   [&](const ReplayOptions& o) { return ReplayTraceOnce(trace, o); });
}

std::string ReplayCommand(const std::string& path, const ReplayOptions& options) {
  std::string reach;
  for (const ReachClaim& c : options.reaches) {
    reach += fmt::format(" --reach {}={}", c.counter, c.at_least);
  }
  if (!LooksLikeMooncake(path)) return "kvtwin replay " + path + reach;
  const TraceHeader& h = options.mooncake_setup;
  return fmt::format(
      "kvtwin replay {} --trace-block {} --block-scale {} --skip {} --limit {} --preset {} "
      "--layers {} --window {} --dtype {}{} --budget {} --chunk {} --interval {} "
      "--pre-thinking {}{}",
      path, options.mooncake.trace_block, options.mooncake.block_scale, options.mooncake.skip,
      options.mooncake.limit, h.preset, h.layers, h.window, h.dtype, DimsFlags(h.dims),
      h.budget_bytes, h.chunk, h.capture_interval, h.pre_thinking, reach);
}

}  // namespace kvtwin::sim
