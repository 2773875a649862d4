#include "sim/run.h"

#include <fmt/format.h>

#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

constexpr size_t kRecentOps = 6;

// Swarm testing: the seed switches whole op families and stack shapes on or off, so some
// runs hammer one mechanism without the others diluting it.
void Swarm(uint64_t seed, Rng& rng, RunOptions& options, OpWeights& weights) {
  const auto& presets = PresetNames();
  options.preset = presets[static_cast<size_t>(rng.Below(presets.size()))];
  options.layers = static_cast<int32_t>(rng.Range(1, 5));
  const int64_t windows[] = {1, 2, 3, 4, 5, 8, 16};
  options.window = windows[rng.Below(7)];
  options.dtype = SwarmDTypes(seed, rng.Chance(1, 2) ? DType::kFloat32 : DType::kBFloat16);
  uint32_t* families[] = {&weights.snapshot,     &weights.restore,  &weights.merge, &weights.split,
                          &weights.free,         &weights.prepare,  &weights.take,  &weights.close,
                          &weights.capture_spec, &weights.speculate};
  for (uint32_t* w : families) {
    if (rng.Chance(1, 4)) *w = 0;
  }
  options.dims = SwarmDims(seed);
  options.window = SwarmWindow(seed, options.dims, options.window);
}

}  // namespace

Status ValidateRunOptions(const RunOptions& options) {
  if (options.steps < 1)
    return InvalidArgument(fmt::format("--steps must be >= 1, got {}", options.steps));
  if (options.layers < 1 || options.layers > 127) {
    return InvalidArgument(fmt::format("--layers must be in 1..127, got {}", options.layers));
  }
  auto dtype = ParseStackDTypes(options.dtype);
  if (!dtype.ok()) return dtype.status();
  KV_RETURN_IF_ERROR(ValidateDimsFlags(options.dims));
  auto stack =
      StackFromPreset(options.preset, options.layers, options.window, *dtype, options.dims);
  return stack.ok() ? RequireStateful(*stack) : stack.status();
}

std::string ReproduceCommand(const RunOptions& options, uint64_t seed) {
  if (options.swarm) {
    return fmt::format("kvtwin sweep --swarm --seeds {}..{} --steps {}", seed, seed, options.steps);
  }
  return fmt::format(
      "kvtwin sweep --seeds {}..{} --preset {} --layers {} --window {} --dtype {}{} "
      "--steps {}",
      seed, seed, options.preset, options.layers, options.window, options.dtype,
      DimsFlags(options.dims), options.steps);
}

RunResult RunSeed(const RunOptions& given, uint64_t seed, Trace* record) {
  RunOptions options = given;
  OpWeights weights;
  if (options.swarm) {
    Rng swarm_rng = Rng::Derive(seed, "swarm");
    Swarm(seed, swarm_rng, options, weights);
  }
  const Status valid = ValidateRunOptions(options);
  KV_CHECK(valid.ok(), valid.ToString());
  StackConfig config = StackFromPreset(options.preset, options.layers, options.window,
                                       *ParseStackDTypes(options.dtype), options.dims)
                           .value();
  RunResult result;
  result.seed = seed;
  result.stack = config.Describe();
  result.weights = weights.ToString();
  result.reproduce = ReproduceCommand(given, seed);
  if (record != nullptr) {
    record->header = TraceHeader{};
    record->header.kind = TraceKind::kOps;
    record->header.seed = seed;
    record->header.preset = options.preset;
    record->header.layers = options.layers;
    record->header.window = options.window;
    record->header.dtype = options.dtype;
    record->header.dims = options.dims;
    record->header.source = result.reproduce;
    record->events.clear();
  }
  LockstepDriver driver(std::move(config), Rng::Derive(seed, "values").Next());
  OpGenerator generator(Rng::Derive(seed, "ops"), weights);
  for (int64_t i = 0; i < options.steps; ++i) {
    const Op op = generator.Next(driver);
    if (record != nullptr) record->events.emplace_back(op);
    result.recent_ops.push_back(op.ToString());
    if (result.recent_ops.size() > kRecentOps) result.recent_ops.pop_front();
    if (auto d = driver.Apply(op)) {
      result.divergence = d;
      break;
    }
  }
  result.steps = driver.steps();
  result.digest = driver.digest();
  return result;
}

}  // namespace kvtwin::sim
