// Seeded multi-sequence lock-step runs: one seed -> one cache shape (DrawMultiSeqConfig),
// one workload (MultiSeqGenerator), one verdict from the MultiSeqDriver. RunMultiSeq is what
// a `kvtwin multiseq` sweep calls per seed, what the determinism test calls twice and what
// the reproduce command re-runs, and what `kvtwin gen --kind multiseq` records. Single-threaded.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "sim/multi_seq_driver.h"
#include "sim/trace.h"

namespace kvtwin::sim {

struct MultiSeqRunOptions {
  int64_t steps = 400;
  ConvExpectation conv = ConvExpectation::kAsSpecified;
  // Production-sized shapes and prompts (DrawHugeMultiSeqConfig), sequences from position 0.
  bool huge = false;
};

struct MultiSeqRunResult {
  uint64_t seed = 0;
  std::string config;  // MultiSeqConfig::Describe()
  int64_t steps = 0;
  uint64_t digest = 0;
  std::optional<MsDivergence> divergence;
  std::deque<std::string> recent_ops;  // the last few ops before the verdict
  MsCoverage coverage;
  std::string reproduce;  // one-line command that re-runs this seed
};

// The cache shape a seed runs with (what RunMultiSeq uses).
MultiSeqConfig MultiSeqConfigForSeed(const MultiSeqRunOptions& options, uint64_t seed);
// REQUIRES: options.steps >= 1. With `record`, its header becomes the run's (kind multiseq:
// the derived config, the seed, the reproduce command as source) and its events every op
// applied, the diverging one included, so replaying it gives the same digest.
MultiSeqRunResult RunMultiSeq(const MultiSeqRunOptions& options, uint64_t seed,
                              Trace* record = nullptr);
// "kvtwin multiseq --seeds N..N --steps S [--conv ideal] [--huge]".
std::string MultiSeqReproduceCommand(const MultiSeqRunOptions& options, uint64_t seed);

}  // namespace kvtwin::sim
