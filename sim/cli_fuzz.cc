// `kvtwin replay --fuzz-input FILE --target NAME`: a libFuzzer input (a crash artifact, a
// corpus entry) decoded exactly as the clang-built target decodes it (RunFuzzInput is the
// one decoder), written as a kvtwin trace and replayed, so the report, the reproduce line
// and `kvtwin shrink` all work on it. The trace_reader target's input already is trace
// text: it is checked against the reader's properties and reported, nothing is written.
#include <fmt/format.h>

#include "sim/cli.h"
#include "sim/fuzz_input.h"

namespace kvtwin::cli {

std::string FuzzTargetList() {
  std::string list;
  for (sim::FuzzTarget t : sim::AllFuzzTargets())
    list += (list.empty() ? "" : ", ") + std::string(sim::FuzzTargetName(t));
  return list;
}

namespace {

int ReportReaderInput(const std::string& path, const std::string& text, const sim::FuzzRun& run) {
  if (run.divergence) {
    fmt::print("FAIL {} (target trace_reader): {}\n{}\n", path, run.divergence_kind,
               *run.divergence);
    return 1;
  }
  const Result<sim::Trace> parsed = sim::ParseTrace("fuzz-input", text);
  fmt::print("{}: pass (target trace_reader): {}\n", path,
             parsed.ok() ? fmt::format("accepted, {} events, round trip and replay hold",
                                       parsed->events.size())
                         : "rejected: " + parsed.status().message());
  return 0;
}

}  // namespace

int ReplayFuzzInput(const ReplayFlags& flags) {
  const std::optional<sim::FuzzTarget> target = sim::ParseFuzzTarget(flags.fuzz_target);
  if (!target) {
    return Usage(
        fmt::format("--target: expected one of {}, got '{}'", FuzzTargetList(), flags.fuzz_target));
  }
  if (!flags.files.empty()) return Usage("replay: --fuzz-input takes no trace files");
  std::string error;
  const std::optional<std::string> read = ReadWhole(flags.fuzz_input, error);
  if (!read) return Usage(error);
  const std::string& bytes = *read;
  const sim::FuzzRun run =
      sim::RunFuzzInput(*target, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (*target == sim::FuzzTarget::kTraceReader)
    return ReportReaderInput(flags.fuzz_input, bytes, run);

  sim::Trace trace = run.trace;
  trace.header.source =
      fmt::format("kvtwin replay --fuzz-input {} --target {}", flags.fuzz_input, flags.fuzz_target);
  const std::string out = flags.save.empty() ? flags.fuzz_input + ".jsonl" : flags.save;
  if (Status s = sim::WriteTrace(out, trace); !s.ok()) return Usage(s.message());
  fmt::print("{} (target {}): {} events -> {}\n", flags.fuzz_input, flags.fuzz_target,
             trace.events.size(), out);
  ReplayFlags replay = flags;
  replay.fuzz_input.clear();
  replay.files = {out};
  return Replay(replay);
}

}  // namespace kvtwin::cli
