// The trace commands: `replay`, `gen`, `import`, `shrink` and `explain`.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "sim/cli.h"
#include "sim/shrink.h"

namespace kvtwin::cli {
namespace {

sim::CaseReport FileCase(const std::string& path, const sim::ReplayResult& r,
                         const sim::ReplayOptions& options) {
  sim::CaseReport c;
  c.name = path;
  c.verdict = r.verdict();
  if (r.input_error) c.kind = r.input_error->message();
  if (r.divergence) {
    c.kind = r.divergence_kind;
    c.detail = *r.divergence;
  }
  if (r.unreached) {
    c.kind = "unreached";
    c.detail = *r.unreached;
  }
  c.reproduce = sim::ReplayCommand(path, options);
  c.events = r.events;
  c.steps = r.steps;
  c.digest = r.digest;
  c.prompt_tokens = r.prompt_tokens;
  c.matched_tokens = r.matched_tokens;
  c.cached_tokens = r.cached_tokens;
  return c;
}

std::string Percent(int64_t part, int64_t whole) {
  return whole > 0 ? fmt::format("{:.2f}%",
                                 100.0 * static_cast<double>(part) / static_cast<double>(whole))
                   : "n/a";
}

void PrintFailure(const std::string& path, const sim::ReplayResult& r,
                  const sim::ReplayOptions& options) {
  fmt::print("FAIL {}: event {}{}\n{}\n  last events:\n", path, r.failing_event,
             r.failing_line > 0 ? fmt::format(" (line {})", r.failing_line) : "", *r.divergence);
  for (const std::string& e : r.recent) fmt::print("    {}\n", e);
  if (!r.trie_dump.empty()) fmt::print("  trie:\n{}", r.trie_dump);
  fmt::print("reproduce: {}\n", sim::ReplayCommand(path, options));
}

// The replay setup of a Mooncake file must be a valid request run.
Status ValidateSetup(const sim::TraceHeader& h, const sim::MooncakeOptions& m) {
  if (m.trace_block < 1 || m.trace_block > sim::kMaxTraceBlockTokens) {
    return InvalidArgument(fmt::format("--trace-block must be in 1..{}, got {}",
                                       sim::kMaxTraceBlockTokens, m.trace_block));
  }
  if (m.block_scale < 1 || m.block_scale > m.trace_block) {
    return InvalidArgument(fmt::format("--block-scale must be in 1..{} (--trace-block), got {}",
                                       m.trace_block, m.block_scale));
  }
  if (m.limit < 0) return InvalidArgument(fmt::format("--limit must be >= 0, got {}", m.limit));
  if (m.skip < 0) return InvalidArgument(fmt::format("--skip must be >= 0, got {}", m.skip));
  return sim::ValidateRequestOptions(sim::OptionsFromHeader(h));
}

}  // namespace

int Replay(const ReplayFlags& flags) {
  if (Status s = ValidateSetup(flags.options.mooncake_setup, flags.options.mooncake); !s.ok()) {
    return Usage(s.message());
  }
  sim::ReplayOptions base = flags.options;
  for (const std::string& text : flags.reach) {
    Result<sim::ReachClaim> c = sim::ParseReachClaim(text);
    if (!c.ok()) return Usage("--reach " + c.status().message());
    base.reaches.push_back(std::move(*c));
  }
  std::vector<sim::CaseReport> cases;
  int code = 0;
  for (const std::string& path : flags.files) {
    sim::ReplayOptions options = base;
    options.interrupted = &Interrupted();
    Progress progress("replay " + path + ": events");
    options.on_event = [&progress](int64_t n) { progress.Update(n); };
    ArmAbortReproduce(sim::ReplayCommand(path, options));
    const sim::ReplayResult r = sim::ReplayFile(path, options);
    if (r.input_error) return Usage(r.input_error->message());
    cases.push_back(FileCase(path, r, options));
    if (r.divergence) {
      PrintFailure(path, r, options);
      code = 1;
      continue;
    }
    if (r.unreached) {
      // The replay passed but no longer reaches what the trace is kept for.
      fmt::print("FAIL {}: unreached\n{}\n  coverage: {}\nreproduce: {}\n", path, *r.unreached,
                 r.CoverageCounters(), sim::ReplayCommand(path, options));
      code = 1;
      continue;
    }
    std::string line = fmt::format("{}: {}, {} events, {} steps, digest {:016x}", path, r.verdict(),
                                   r.events, r.steps, r.digest);
    if (r.prompt_tokens > 0) {
      line +=
          fmt::format("; prefix reuse: matched {} ({}), cached {} ({}) of {} prompt tokens",
                      r.matched_tokens, Percent(r.matched_tokens, r.prompt_tokens), r.cached_tokens,
                      Percent(r.cached_tokens, r.prompt_tokens), r.prompt_tokens);
    }
    if (!flags.quiet) fmt::print("{}\n", line);
    if (flags.coverage && !r.CoverageCounters().empty()) {
      fmt::print("{}: coverage: {}\n", path, r.CoverageCounters());
    }
    std::fflush(stdout);
    if (r.interrupted) {
      code = 130;
      break;
    }
  }
  if (!flags.reports.Write("replay", cases)) return 2;
  if (code == 130) {
    fmt::print("INTERRUPTED: {} file(s) replayed, no divergence so far\n", cases.size());
  } else if (code == 0) {
    fmt::print("PASS: {} file(s), digest {:016x}\n", cases.size(), sim::RunDigest(cases));
  }
  return code;
}

int Gen(const GenFlags& flags) {
  sim::Trace trace;
  if (flags.kind == "requests") {
    sim::RequestOptions o = flags.requests;
    o.seed = flags.seed;
    if (Status s = sim::ValidateRequestOptions(o); !s.ok()) return Usage(s.message());
    ArmAbortReproduce(sim::RequestsReproduceCommand(o));
    const sim::RequestResult r = sim::RunRequests(o, &trace);
    fmt::print("kvtwin gen: {} requests, {}\n  mix: {}\n", trace.events.size(), r.stack, r.mix);
    if (!r.derived.empty()) fmt::print("  derived: {}\n", r.derived);
    if (r.divergence) fmt::print("the generating run diverged:\n{}\n", r.divergence->ToString());
  } else if (flags.kind == "ops") {
    if (Status s = sim::ValidateRunOptions(flags.ops); !s.ok()) return Usage(s.message());
    ArmAbortReproduce(sim::ReproduceCommand(flags.ops, flags.seed));
    const sim::RunResult r = sim::RunSeed(flags.ops, flags.seed, &trace);
    fmt::print("kvtwin gen: {} ops, {}\n  ops: {}\n", trace.events.size(), r.stack, r.weights);
    if (r.divergence) fmt::print("the generating run diverged:\n{}\n", r.divergence->ToString());
  } else if (flags.kind == "multiseq") {
    if (flags.multiseq.steps < 1) return Usage("--steps must be >= 1");
    ArmAbortReproduce(sim::MultiSeqReproduceCommand(flags.multiseq, flags.seed));
    const sim::MultiSeqRunResult r = sim::RunMultiSeq(flags.multiseq, flags.seed, &trace);
    fmt::print("kvtwin gen: {} multiseq ops, {}\n", trace.events.size(), r.config);
    if (r.divergence) fmt::print("the generating run diverged:\n{}\n", r.divergence->ToString());
  } else {
    return Usage("--kind: expected requests, ops or multiseq, got '" + flags.kind + "'");
  }
  if (Status s = sim::WriteTrace(flags.out, trace); !s.ok()) return Usage(s.message());
  fmt::print("wrote {}\n", flags.out);
  return 0;
}

int Import(const ImportFlags& flags) {
  if (Status s = ValidateSetup(flags.setup, flags.mooncake); !s.ok()) return Usage(s.message());
  Result<int64_t> n = sim::ImportMooncake(flags.in, flags.out, flags.mooncake, flags.setup);
  if (!n.ok()) return Usage(n.status().message());
  fmt::print("imported {} requests from {} at block scale {} into {}\n", *n, flags.in,
             flags.mooncake.block_scale, flags.out);
  return 0;
}

// The --keep-reach claims, by counter name (a counter named twice keeps its larger count).
Result<std::vector<sim::ReachClaim>> KeepReaches(const ShrinkFlags& flags, sim::TraceKind kind) {
  std::vector<sim::ReachClaim> claims;
  for (const std::string& text : flags.keep_reach) {
    Result<sim::ReachClaim> c = sim::ParseReachClaim(text);
    if (!c.ok()) return InvalidArgument("--keep-reach " + c.status().message());
    if (Status s = sim::CheckReachCounter(*c, kind); !s.ok()) {
      return InvalidArgument("--keep-reach " + s.message());
    }
    claims.push_back(std::move(*c));
  }
  // By name, the larger count first; then one per name. (Plain std:: algorithms: clang 14's
  // ranges over libstdc++ 12 refuse std::ranges::unique's subrange.)
  std::sort(claims.begin(), claims.end(), [](const auto& a, const auto& b) {
    return std::tie(a.counter, b.at_least) < std::tie(b.counter, a.at_least);
  });
  claims.erase(std::unique(claims.begin(), claims.end(),
                           [](const auto& a, const auto& b) { return a.counter == b.counter; }),
               claims.end());
  return claims;
}

int Shrink(const ShrinkFlags& flags) {
  Result<sim::Trace> trace = sim::ReadTrace(flags.in);
  if (!trace.ok()) return Usage(trace.status().message());
  Result<std::vector<sim::ReachClaim>> keep = KeepReaches(flags, trace->header.kind);
  if (!keep.ok()) return Usage(keep.status().message());
  if (!keep->empty() && trace->header.expect.starts_with(sim::kExpectDivergencePrefix)) {
    return Usage(flags.in + ": --keep-reach writes reach claims, which a trace expecting a " +
                 "divergence cannot carry; take its \"expect\" out first");
  }
  // The input's own reach claims were about the input: neither a bound on the candidates nor
  // the output's. The output claims what it was shrunk to keep, which a fixed replay, running
  // on past the divergence, meets too.
  trace->header.reaches.clear();
  const sim::ReplayResult first = sim::ReplayTrace(*trace);
  if (first.input_error) return Usage(flags.in + ": " + first.input_error->message());
  if (!first.divergence && (keep->empty() || !first.passed())) {
    return Usage(flags.in + ": the trace does not diverge (verdict " + first.verdict() +
                 "); nothing to shrink (--keep-reach shrinks a passing trace to what it reaches)");
  }
  for (const sim::ReachClaim& c : *keep) {
    if (first.Counter(c.counter) >= c.at_least) continue;
    return Usage(fmt::format(
        "{}: {} the trace reaches {} {} time(s), below --keep-reach {}={}", flags.in,
        first.divergence ? fmt::format("up to its divergence (event {})", first.failing_event)
                         : std::string("replayed whole"),
        c.counter, first.Counter(c.counter), c.counter, c.at_least));
  }
  if (first.divergence) {
    fmt::print("kvtwin shrink: {} events, divergence kind '{}'\n", trace->events.size(),
               first.divergence_kind);
  } else {
    fmt::print("kvtwin shrink: {} events, passing, keeping its reach\n", trace->events.size());
  }
  std::fflush(stdout);
  sim::ShrinkOptions options;
  options.max_replays = flags.max_replays;
  options.keep_reaches = *keep;
  Progress progress("shrink: accepted steps");
  int64_t accepted = 0;
  options.progress = [&](const std::string&) { progress.Update(++accepted); };
  sim::ShrinkResult r = sim::Shrink(*trace, options);
  r.trace.header.source = "kvtwin shrink " + flags.in;
  r.trace.header.reaches = *keep;
  if (Status s = sim::WriteTrace(flags.out, r.trace); !s.ok()) return Usage(s.message());
  if (r.last.divergence) {
    fmt::print("shrunk {} -> {} events in {} replays, kind kept: '{}'\n{}\nwrote {}\n",
               r.original_events, r.trace.events.size(), r.replays, r.kind, *r.last.divergence,
               flags.out);
  } else {
    fmt::print("shrunk {} -> {} events in {} replays, passing and reaching {}\nwrote {}\n",
               r.original_events, r.trace.events.size(), r.replays, r.last.CoverageCounters(),
               flags.out);
  }
  fmt::print("reproduce: kvtwin replay {}\ngtest:\n{}", flags.out,
             sim::GtestSnippet(flags.out, flags.name));
  return 0;
}

int Explain(const ExplainFlags& flags) {
  if (flags.at < 0) return Usage(fmt::format("--at must be >= 0, got {}", flags.at));
  if (Status s = ValidateSetup(flags.options.mooncake_setup, flags.options.mooncake); !s.ok()) {
    return Usage(s.message());
  }
  sim::ReplayOptions options = flags.options;
  options.stop_after = flags.at;
  options.dump_trie = true;
  const sim::ReplayResult r = sim::ReplayFile(flags.file, options);
  if (r.input_error) return Usage(r.input_error->message());
  if (r.events <= flags.at && !r.divergence) {
    return Usage(fmt::format("--at {}: {} has only {} events", flags.at, flags.file, r.events));
  }
  fmt::print("{} after event {} ({}):\n  {}\n", flags.file, r.events - 1,
             r.divergence ? "diverged here" : "state after it", r.recent.back());
  fmt::print("{}", r.state);
  if (r.divergence) fmt::print("{}\n", *r.divergence);
  if (!r.trie_dump.empty()) fmt::print("trie:\n{}", r.trie_dump);
  if (!flags.dot.empty() && !WriteWhole(flags.dot, r.trie_dot)) {
    return Usage("--dot: cannot write '" + flags.dot + "'");
  }
  return 0;
}

}  // namespace kvtwin::cli
