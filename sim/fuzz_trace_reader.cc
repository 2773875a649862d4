// The kTraceReader fuzz family: arbitrary text through the trace reader. Properties, each
// derived from the format's contract (sim/trace.h) rather than from known inputs:
// * a rejected text gets one line naming the input ("fuzz-input:LINE: ...");
// * an accepted text's canonical form (HeaderToJson / EventToJson lines) reads back, and
//   writing that again gives the same bytes (the writer and reader agree; canonical form is
//   a fixpoint);
// * a small accepted trace replays to a verdict (pass, divergence or input error) without
//   tripping a check: an event the drivers cannot take must be an input error, and a
//   divergence on hand-written events is a production/reference disagreement worth a report.
#include <string>

#include "sim/fuzz_families.h"
#include "sim/replay.h"

namespace kvtwin::sim {
namespace {

constexpr const char* kName = "fuzz-input";
// Replay only traces this small, so a hostile prompt length cannot make one input slow.
constexpr size_t kMaxReplayTokens = 2048;
constexpr size_t kMaxReplayEvents = 32;

std::string Canonical(const Trace& trace) {
  std::string text = HeaderToJson(trace.header) + "\n";
  for (const TraceEvent& e : trace.events) text += EventToJson(e) + "\n";
  return text;
}

size_t Tokens(const TraceEvent& e) {
  if (const auto* plan = std::get_if<RequestPlan>(&e)) {
    size_t n = plan->inputs.size() + plan->outputs.size();
    for (const SpeculativeStep& s : plan->speculation) n += s.rejected.size();
    return n;
  }
  if (const auto* op = std::get_if<Op>(&e)) return op->tokens.size() + op->offsets.size();
  return std::get<MsOp>(e).batch.size();
}

bool SmallEnough(const Trace& trace) {
  if (trace.events.size() > kMaxReplayEvents) return false;
  size_t tokens = 0;
  for (const TraceEvent& e : trace.events) tokens += Tokens(e);
  return tokens <= kMaxReplayTokens;
}

std::optional<std::string> CheckRejection(const Status& status) {
  const std::string& m = status.message();
  if (m.find('\n') != std::string::npos || m.rfind(std::string(kName) + ":", 0) != 0)
    return "reader error is not one line naming the input: " + m;
  return std::nullopt;
}

std::optional<std::string> CheckRoundTrip(const Trace& trace) {
  const std::string once = Canonical(trace);
  Result<Trace> again = ParseTrace("canonical", once);
  if (!again.ok())
    return "the canonical form of an accepted trace is rejected: " + again.status().message() +
           "\n" + once;
  const std::string twice = Canonical(*again);
  if (twice != once) return "write/read/write changes the trace:\n" + once + "---\n" + twice;
  return std::nullopt;
}

}  // namespace

FuzzRun RunTraceReaderFuzz(const uint8_t* data, size_t size) {
  FuzzRun run;
  Result<Trace> trace = ParseTrace(kName, std::string(reinterpret_cast<const char*>(data), size));
  if (!trace.ok()) {
    run.divergence = CheckRejection(trace.status());
    if (run.divergence) run.divergence_kind = "reader error format";
    return run;
  }
  run.trace = *trace;
  run.events = static_cast<int64_t>(trace->events.size());
  run.divergence = CheckRoundTrip(*trace);
  if (run.divergence) {
    run.divergence_kind = "reader round trip";
    return run;
  }
  if (!SmallEnough(*trace)) return run;
  const ReplayResult replay = ReplayTrace(*trace);
  run.digest = replay.digest;
  if (replay.divergence) {
    run.divergence = *replay.divergence;
    run.divergence_kind = replay.divergence_kind;
  }
  return run;
}

}  // namespace kvtwin::sim
