// Shrink: delta debugging of a diverging trace (sim/trace.h) down to a small trace that
// still reports the same kind of divergence (DivergenceKind, sim/replay.h). Passes, run to
// a fixpoint: drop events (ddmin: halves, quarters, ... single events), shrink the setup
// (fewer layers, a smaller window, no periodic captures), then simplify each event —
// requests: no speculation (every step, then one at a time), no cancel, no user points,
// shorter prompts and outputs (a cancelled request's down to none), smaller token values; ops:
// shorter token lists, no padding or relaxed masks, fewer offsets, values pulled toward 0. A
// candidate counts only if it replays without an input error and diverges with the same kind,
// its coverage up to the divergence meeting every kept reach claim (ShrinkOptions). A trace
// that passes shrinks to what keeps passing and meeting the kept claims: a minimal trace that
// reaches a shape (a regression trace for a mechanism that a mutant, not a live bug, shows).
// Deterministic: no randomness, no clock. Single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "sim/replay.h"
#include "sim/trace.h"

namespace kvtwin::sim {

struct ShrinkOptions {
  int64_t max_replays = 20000;                       // stop early after this many replays
  std::function<void(const std::string&)> progress;  // one line per accepted step; optional
  // How a candidate is judged; empty = ReplayTrace. Tests substitute an oracle with a
  // known minimum to check the passes themselves.
  std::function<ReplayResult(const Trace&)> replay;
  // Claims every candidate's coverage up to its divergence must meet, so the minimum still
  // reaches the shape a regression trace is kept for (`kvtwin shrink --keep-reach`); the
  // counters only grow, so a fixed replay that runs on meets them too.
  std::vector<ReachClaim> keep_reaches;
};

struct ShrinkResult {
  Trace trace;        // the minimized trace
  ReplayResult last;  // its replay (diverging with `kind`)
  std::string kind;   // the divergence kind kept throughout
  int64_t replays = 0;
  int64_t original_events = 0;
};

// REQUIRES: ReplayTrace(trace) diverges, or passes with options.keep_reaches non-empty; either
// way meeting options.keep_reaches (the caller checked and reports otherwise).
ShrinkResult Shrink(const Trace& trace, const ShrinkOptions& options = {});

// A gtest that replays the trace at `path` (relative to the repository root) and expects
// `verdict` ("pass" once the bug is fixed).
std::string GtestSnippet(const std::string& path, const std::string& test_name);

}  // namespace kvtwin::sim
