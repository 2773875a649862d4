#include "sim/multi_seq_run.h"

#include <fmt/format.h>

#include <iterator>
#include <optional>

#include "sim/multi_seq_generator.h"
#include "src/core/check.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

constexpr size_t kRecentOps = 8;

// Where a seed's sequences start, and the chunk that goes with it.
struct FarStart {
  int64_t base = 0;
  std::optional<int64_t> chunk;  // replaces the drawn chunk
};

// One run in eight starts its sequences far up: around 2^24, where neighbouring positions
// stop being distinct floats, or near int32's last position, where position arithmetic
// meets int32's edge; half of those also put a chunk boundary in reach (at 2^24, or at
// int32's last or second-to-last position). From a stream of its own, so every other
// draw of every seed is what it was.
FarStart FarStartForSeed(uint64_t seed) {
  Rng far = Rng::Derive(seed, "multiseq-far-positions");
  FarStart out;
  if (!far.Chance(1, 8)) return out;
  constexpr int64_t k24 = int64_t{1} << 24;
  const int64_t bases[] = {k24 - 6, k24 + 3, kMaxBatchPosition - 60, kMaxBatchPosition - 12};
  out.base = bases[far.Below(std::size(bases))];
  if (far.Chance(1, 2)) {
    const bool high = out.base > k24 + 3;
    const int64_t chunks[] = {high ? kMaxBatchPosition : k24,
                              high ? kMaxBatchPosition - 1 : k24 / 2};
    out.chunk = chunks[far.Below(std::size(chunks))];
  }
  return out;
}

}  // namespace

MultiSeqConfig MultiSeqConfigForSeed(const MultiSeqRunOptions& options, uint64_t seed) {
  if (options.huge) {
    // Neither the far starts nor the hundreds of sequences: a prompt of 512 near int32's last
    // position has no room, and 300 sequences of thousands of cells pass the cell bound.
    Rng rng = Rng::Derive(seed, "multiseq-huge-config");
    MultiSeqConfig config = DrawHugeMultiSeqConfig(rng);
    config.conv = options.conv;
    return config;
  }
  Rng rng = Rng::Derive(seed, "multiseq-config");
  MultiSeqConfig config = DrawMultiSeqConfig(rng);
  config.conv = options.conv;
  if (const std::optional<int64_t> chunk = FarStartForSeed(seed).chunk) config.chunk = *chunk;
  // One run in sixteen has more than kSeqBitsPerWord sequences (the most one word of
  // sequence bits holds), some past 2^8 (a byte's range: llama.cpp's old sequence limit),
  // where a layout that fits the cache's bound allows it. From a stream of its own, so every
  // other draw is what it was.
  Rng many = Rng::Derive(seed, "multiseq-many-seqs");
  if (many.Chance(1, 16)) {
    const int32_t counts[] = {kSeqBitsPerWord + 1, 96, 2 * kSeqBitsPerWord + 1, 257, 300};
    MultiSeqConfig wide = config;
    wide.max_seqs = counts[many.Below(std::size(counts))];
    if (wide.Validate().ok()) config = wide;
  }
  return config;
}

std::string MultiSeqReproduceCommand(const MultiSeqRunOptions& options, uint64_t seed) {
  return fmt::format("kvtwin multiseq --seeds {}..{} --steps {}{}{}", seed, seed, options.steps,
                     options.conv == ConvExpectation::kIdeal ? " --conv ideal" : "",
                     options.huge ? " --huge" : "");
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
  MultiSeqGenerator generator(Rng::Derive(seed, "multiseq-ops"),
                              options.huge ? 0 : FarStartForSeed(seed).base, options.huge);
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
