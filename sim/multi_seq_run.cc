#include "sim/multi_seq_run.h"

#include <fmt/format.h>

#include "sim/multi_seq_generator.h"
#include "src/core/check.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

constexpr size_t kRecentOps = 8;

}  // namespace

MultiSeqConfig MultiSeqConfigForSeed(const MultiSeqRunOptions& options, uint64_t seed) {
  Rng rng = Rng::Derive(seed, "multiseq-config");
  MultiSeqConfig config = DrawMultiSeqConfig(rng);
  config.conv = options.conv;
  return config;
}

std::string MultiSeqReproduceCommand(const MultiSeqRunOptions& options, uint64_t seed) {
  return fmt::format("kvtwin multiseq --seeds {}..{} --steps {}{}", seed, seed, options.steps,
                     options.conv == ConvExpectation::kIdeal ? " --conv ideal" : "");
}

MultiSeqRunResult RunMultiSeq(const MultiSeqRunOptions& options, uint64_t seed, Trace* record) {
  KV_CHECK(options.steps >= 1, "a multi-sequence run needs at least one step");
  const MultiSeqConfig config = MultiSeqConfigForSeed(options, seed);
  MultiSeqRunResult result;
  result.seed = seed;
  result.config = config.Describe();
  result.reproduce = MultiSeqReproduceCommand(options, seed);
  if (record != nullptr) {
    record->header = TraceHeader{};
    record->header.kind = TraceKind::kMultiSeq;
    record->header.seed = seed;
    record->header.multiseq = config;
    record->header.source = result.reproduce;
    record->events.clear();
  }
  MultiSeqDriver driver(config, Rng::Derive(seed, "multiseq-values").Next());
  result.divergence = driver.divergence();  // a disagreement on the derived shape
  MultiSeqGenerator generator(Rng::Derive(seed, "multiseq-ops"));
  for (int64_t i = 0; i < options.steps && !result.divergence; ++i) {
    const MsOp op = generator.Next(driver);
    result.recent_ops.push_back(op.ToString());
    if (result.recent_ops.size() > kRecentOps) result.recent_ops.pop_front();
    if (record != nullptr) record->events.emplace_back(op);
    result.divergence = driver.Apply(op);
  }
  result.steps = driver.steps();
  result.digest = driver.digest();
  result.coverage = driver.coverage();
  return result;
}

}  // namespace kvtwin::sim
