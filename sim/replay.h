// Replay: runs a trace (sim/trace.h) or a Mooncake JSONL file (sim/mooncake.h) against the
// production caches and the reference in lock step — op traces through the LockstepDriver,
// request traces through the RequestDriver — and returns the verdict: pass, the first
// divergence (explained, with the event that caused it), or an input error (a malformed
// file, or an event naming state that does not exist, such as a snapshot slot), which
// the CLI turns into exit 2. Files are streamed event by event; the in-memory form is
// what the shrinker and the gtest snippets use. Single-threaded.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include "sim/mooncake.h"
#include "sim/request_driver.h"
#include "sim/trace.h"

namespace kvtwin::sim {

struct ReplayOptions {
  // Mooncake input only: the block scale, a request limit and the replay setup (the
  // header's model, budget, chunk and capture cadence; `kind` and `source` are set here).
  MooncakeOptions mooncake;
  TraceHeader mooncake_setup;
  // Called after every event with the number of events replayed (progress display).
  std::function<void(int64_t)> on_event;
  // Set from a signal handler: the replay stops after the current event and reports a
  // partial verdict.
  const std::atomic<bool>* interrupted = nullptr;
  // Replay only events [0, stop_after] (explain --at); -1 = all.
  int64_t stop_after = -1;
  // Requests: run the whole-trie checks on every session call (RequestDriverOptions). Off,
  // a divergence found after calls the amortized audit skipped is localized by a second
  // replay with it on, up to the failing event, whose result is returned.
  bool audit_every_call = false;
  // Requests: dump the final trie of a run that passed too (explain); a divergence always
  // dumps it. Off, a passing replay skips rendering a trie it would not show.
  bool dump_trie = false;
  // Claims a replay that passes must meet beside its header's "reaches" (`kvtwin replay
  // --reach`): a counter the trace's kind lacks is an input error.
  std::vector<ReachClaim> reaches;
  // Requests: RequestDriverOptions::after_request (a test seam; the re-run keeps it).
  std::function<void(PrefixCache&, int64_t)> after_request;
  // Called when a replay's verdict is complete, before its driver's state is freed: a
  // benchmark stops its clock here, so freeing a large trie is not counted as replaying.
  // A localizing re-run calls it again.
  std::function<void()> before_teardown;
};

struct ReplayResult {
  std::string path;  // "" for an in-memory trace
  TraceHeader header;
  int64_t events = 0;  // events replayed (the failing one included)
  int64_t steps = 0;   // driver steps
  uint64_t digest = 0;
  bool interrupted = false;
  // Exactly one of these is set unless the trace passed (or was interrupted).
  std::optional<Status> input_error;      // InvalidArgument "FILE:LINE: /pointer: reason"
  std::optional<std::string> divergence;  // the human report (multi-line)
  // The header's "reaches" claims a replay that ran to the end without a divergence fell
  // short of, one line: "FILE:1: /reaches/COUNTER: reached N times, the trace claims at
  // least M" (several joined by "; ").
  std::optional<std::string> unreached;
  std::string divergence_kind;  // DivergenceKind of the mismatch (shrinking keeps it)
  int64_t failing_event = -1;   // 0-based event index of the divergence
  int64_t failing_line = 0;     // its line in the file (0 for in-memory traces)
  // Requests: session calls the amortized audit skipped before the divergence was found
  // (RequestDivergence::unaudited_calls); after a localizing re-run, that run's (0).
  int64_t unaudited_calls = 0;
  std::deque<std::string> recent;  // the last few events before the verdict
  // Requests only: Σ over Begin reports (prefix reuse), and the driver's coverage.
  int64_t prompt_tokens = 0, matched_tokens = 0, cached_tokens = 0;
  RequestCoverage coverage;
  // Multiseq only: the driver's coverage.
  MsCoverage ms_coverage;
  // Requests only, filled when the run ends: the trie (DumpTrie / TrieToDot; after a
  // divergence or with ReplayOptions::dump_trie) and, for
  // explain, the live cache offsets; ops only: per-layer offsets and kinds.
  std::string trie_dump, trie_dot, state;

  bool passed() const { return !input_error && !divergence && !unreached && !interrupted; }
  // "pass", "divergence", "unreached", "input error" or "interrupted".
  const char* verdict() const;
  // What went wrong, for a failure line: the input error's message, the divergence report or
  // the unreached claims; "" otherwise.
  std::string detail() const;
  // The driver's coverage as "name=value ..." by the counter names a header's "reaches"
  // claims (requests and multiseq traces); "" for an ops trace, which has none.
  std::string CoverageCounters() const;
  // The driver's coverage counter `name` (a name ReachCounterNames(header.kind) lists; REQUIRES
  // one), as far as the replay got: after a divergence, up to the failing event.
  int64_t Counter(const std::string& name) const;
  // Whether every claim holds of the coverage as far as the replay got.
  bool Reaches(const std::vector<ReachClaim>& claims) const;
};

// The stable kind of a mismatch, kept while shrinking: the first ": "-separated segment of
// its `what` that does not name a node, with every run of digits replaced by '#'
// ("layer # history", "layer # rotating snapshot range", "Restore outcome").
std::string DivergenceKind(const std::string& what);

// The value seed the replay gives the trace's driver (derived from header.seed by kind), for
// code that drives a recorded run itself and must reach the replay's digest.
uint64_t TraceValueSeed(const TraceHeader& header);

// The request-driver options the replay builds from a trace header (its stack:
// TraceStack, sim/trace.h), for code that runs the same requests another way (the
// benchmark's production-only mode must drive exactly the stack and cadence the
// differential replay checks).
RequestDriverOptions TraceDriverOptions(const TraceHeader& header);

// Replays `path`: a kvtwin trace, or Mooncake JSONL (detected by LooksLikeMooncake).
ReplayResult ReplayFile(const std::string& path, const ReplayOptions& options);
// Replays an in-memory trace (events checked the same way; input errors name event N).
ReplayResult ReplayTrace(const Trace& trace, const ReplayOptions& options = {});

// The one-line command that replays `path` with `options`.
std::string ReplayCommand(const std::string& path, const ReplayOptions& options);

}  // namespace kvtwin::sim
