#include "sim/requests.h"

#include <fmt/format.h>

#include "src/core/rng.h"
#include "src/trie_export.h"

namespace kvtwin::sim {
namespace {

constexpr size_t kRecentRequests = 6;

Status OutOfRange(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  return InvalidArgument(fmt::format("{} must be in {}..{}, got {}", flag, lo, hi, value));
}

}  // namespace

Status ValidateRequestOptions(const RequestOptions& o) {
  if (o.layers < 1 || o.layers > 127) return OutOfRange("--layers", o.layers, 1, 127);
  if (o.conversations < 1 || o.conversations > 1000) {
    return OutOfRange("--conversations", o.conversations, 1, 1000);
  }
  if (o.requests < 1 || o.requests > 10'000'000) {
    return OutOfRange("--requests", o.requests, 1, 10'000'000);
  }
  if (o.budget_bytes < 0) {
    return InvalidArgument(
        fmt::format("--budget must be >= 0 (0 = unlimited), got {}", o.budget_bytes));
  }
  if (o.chunk < 1 || o.chunk > 4096) return OutOfRange("--chunk", o.chunk, 1, 4096);
  if (o.capture_interval < 0 || o.capture_interval > 1'000'000) {
    return OutOfRange("--interval", o.capture_interval, 0, 1'000'000);
  }
  if (o.pre_thinking < 0 || o.pre_thinking > 1'000'000) {
    return OutOfRange("--pre-thinking", o.pre_thinking, 0, 1'000'000);
  }
  if (o.window < 1) return InvalidArgument(fmt::format("--window must be >= 1, got {}", o.window));
  auto dtype = ParseDType(o.dtype);
  if (!dtype.ok()) return InvalidArgument("--dtype: " + dtype.status().message());
  auto stack = StackFromPreset(o.preset, o.layers, o.window, *dtype);
  if (!stack.ok()) return InvalidArgument("--preset: " + stack.status().message());
  return Status::Ok();
}

std::string RequestsReproduceCommand(const RequestOptions& o) {
  return fmt::format(
      "kvtwin requests --seeds {}..{} --preset {} --layers {} --window {} --dtype {} "
      "--conversations {} --requests {} --budget {} --chunk {} --interval {} "
      "--pre-thinking {}",
      o.seed, o.seed, o.preset, o.layers, o.window, o.dtype, o.conversations, o.requests,
      o.budget_bytes, o.chunk, o.capture_interval, o.pre_thinking);
}

RequestResult RunRequests(const RequestOptions& options) {
  const Status valid = ValidateRequestOptions(options);
  KV_CHECK(valid.ok(), valid.ToString());
  StackConfig config =
      StackFromPreset(options.preset, options.layers, options.window, *ParseDType(options.dtype))
          .value();
  RequestResult result;
  result.seed = options.seed;
  result.stack = config.Describe();
  result.reproduce = RequestsReproduceCommand(options);
  const RequestDriverOptions driver_options{options.budget_bytes, options.chunk,
                                            options.capture_interval, options.pre_thinking};
  RequestDriver driver(std::move(config), driver_options,
                       Rng::Derive(options.seed, "values").Next());
  Rng swarm = Rng::Derive(options.seed, "swarm");
  const WorkloadOptions mix = WorkloadOptions::Swarm(swarm, options.conversations);
  result.mix = mix.ToString();
  RequestWorkload workload(Rng::Derive(options.seed, "requests"), mix);
  for (int64_t i = 0; i < options.requests; ++i) {
    const RequestPlan plan = workload.Next();
    ++result.requests;
    result.divergence = driver.Run(plan);
    result.recent.push_back(plan.ToString() + " -> " + driver.last_outcome());
    if (result.recent.size() > kRecentRequests) result.recent.pop_front();
    if (result.divergence) break;
  }
  result.steps = driver.steps();
  result.digest = driver.digest();
  result.coverage = driver.coverage();
  // After a divergence the active path may name freed nodes (a faulty eviction): show the
  // trie alone then.
  const PrefixCache& pc = driver.manager();
  const std::span<TrieNode* const> path =
      result.divergence ? std::span<TrieNode* const>() : std::span(pc.active_path());
  result.trie_dump = DumpTrie(pc.trie(), path);
  result.trie_dot = TrieToDot(pc.trie(), path);
  return result;
}

}  // namespace kvtwin::sim
