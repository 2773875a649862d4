// Seeded lock-step runs: one seed -> one stack, one op sequence, one verdict. RunSeed is
// what `kvtwin run` and `kvtwin sweep` call per seed, what the determinism test calls
// twice, and what the reproduce command re-runs. In swarm mode the seed also chooses the
// preset, window, dtype and which op families are on (every derived option is reported).
// Single-threaded.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "sim/generator.h"
#include "sim/lockstep.h"
#include "sim/stack.h"
#include "sim/trace.h"

namespace kvtwin::sim {

struct RunOptions {
  std::string preset = "mixed";
  int32_t layers = 3;
  int64_t window = 4;
  std::string dtype = "f32";
  ModelDims dims;  // --kv-dims, --recurrent-dims
  int64_t steps = 2000;
  // The seed also chooses the stack, the op mix and, for half the seeds, the dims
  // (DrawModelDims); every derived option is reported.
  bool swarm = false;
};

struct RunResult {
  uint64_t seed = 0;
  std::string stack;    // StackConfig::Describe()
  std::string weights;  // OpWeights::ToString()
  int64_t steps = 0;
  uint64_t digest = 0;
  std::optional<Divergence> divergence;
  std::deque<std::string> recent_ops;  // the last few ops before the verdict
  std::string reproduce;               // one-line command that re-runs this seed
};

// Checks the options (InvalidArgument naming the field) without running anything.
Status ValidateRunOptions(const RunOptions& options);
// REQUIRES: ValidateRunOptions(options).ok(). With `record`, the run is also kept as an op
// trace (header with the derived stack, every op applied) that replays to the same digest.
RunResult RunSeed(const RunOptions& options, uint64_t seed, Trace* record = nullptr);
// The `kvtwin sweep` command line that reproduces RunSeed(options, seed).
std::string ReproduceCommand(const RunOptions& options, uint64_t seed);

}  // namespace kvtwin::sim
