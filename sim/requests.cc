#include "sim/requests.h"

#include <fmt/format.h>

#include "src/core/check.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

constexpr size_t kRecentRequests = 6;

Status OutOfRange(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  return InvalidArgument(fmt::format("{} must be in {}..{}, got {}", flag, lo, hi, value));
}

// Swarm testing at the request level: the seed picks the stack and the memory pressure, so
// some runs evict constantly and others never do. Returns every derived option.
std::string SwarmStack(RequestOptions& o) {
  Rng rng = Rng::Derive(o.seed, "swarm-stack");
  const auto& presets = RequestPresetNames();
  o.preset = presets[static_cast<size_t>(rng.Below(presets.size()))];
  // A holey stack's layer 0 is stateless: it needs a second layer.
  o.layers = static_cast<int32_t>(rng.Range(o.preset == "holey" ? 2 : 1, 5));
  // Wide windows too: a window that outlasts several nodes stays linear across their
  // boundaries, where rewinds and restores below a snapshot's end are still allowed.
  const int64_t windows[] = {1, 2, 3, 4, 8, 16, 32};
  o.window = windows[rng.Below(std::size(windows))];
  o.dtype = SwarmDTypes(o.seed, rng.Chance(1, 2) ? DType::kFloat32 : DType::kBFloat16);
  const int64_t budgets[] = {0, 0, 300, 1500, 6000, 30000};
  o.budget_bytes = budgets[rng.Below(6)];
  o.chunk = rng.Range(1, 9);
  const int64_t intervals[] = {0, 4, 8, 16};
  o.capture_interval = intervals[rng.Below(4)];
  o.pre_thinking = rng.Range(0, 5);
  o.dims = SwarmDims(o.seed);
  o.window = SwarmWindow(o.seed, o.dims, o.window);
  if (o.long_context) {
    // From a stream of its own, so every draw above is what the seed draws without it.
    Rng wide = Rng::Derive(o.seed, "swarm-long");
    const int64_t long_windows[] = {4, 255, 256, 257, 300, 512};
    o.window = long_windows[wide.Below(std::size(long_windows))];
    // 256 and 512: a prompt's first chunk fills whole KV growth steps (spec §2.1), where a
    // step count rounded up once too often shows in the capacity.
    const int64_t chunks[] = {1, 5, 9, 16, 64, 256, 512};
    o.chunk = chunks[wide.Below(std::size(chunks))];
    // Rotating layers of different windows in one stack: a node's end may lie inside one
    // layer's window and past another's.
    if (wide.Chance(1, 3)) {
      o.preset = kStaggeredPreset;
      o.layers = static_cast<int32_t>(wide.Range(2, 4));
    }
    // A capture every one to three tokens in one seed in four: a chunk of 16 or 64 then
    // crosses many scheduled offsets at once (up to 63 interior states of one forward), where
    // a cap on the splits of one forward shows.
    if (wide.Chance(1, 4)) o.capture_interval = wide.Range(1, 3);
  }
  if (o.huge_context) {
    // From a stream of its own, like the long draws. The default widths only: a snapshot of
    // 24,000 rows of a model's width, cloned per node, would take gigabytes.
    Rng huge = Rng::Derive(o.seed, "swarm-huge");
    o.dims = ModelDims{};
    const int64_t huge_windows[] = {4, 256, 2047, 4096, 4097};
    o.window = huge_windows[huge.Below(std::size(huge_windows))];
    const int64_t huge_chunks[] = {64, 512, 1536, 4096};
    o.chunk = huge_chunks[huge.Below(std::size(huge_chunks))];
    // No periodic capture in half the seeds: a prompt's uncached tail is then one edge.
    const int64_t huge_intervals[] = {0, 0, 0, 512, 1000, 4096};
    o.capture_interval = huge_intervals[huge.Below(std::size(huge_intervals))];
    o.pre_thinking = huge.Chance(1, 2) ? huge.Range(1, 5) : huge.Range(6, 3000);
    // Unlimited, or a few long nodes' worth (a token of the default widths is some hundreds
    // of bytes per layer).
    const int64_t huge_budgets[] = {0, 0, 2'000'000, 10'000'000, 40'000'000};
    o.budget_bytes = huge_budgets[huge.Below(std::size(huge_budgets))];
    if (huge.Chance(1, 3)) {
      o.preset = kStaggeredPreset;
      o.layers = static_cast<int32_t>(huge.Range(2, 4));
    }
  }
  return fmt::format(
      "preset {} layers {} window {} dtype {} {} budget {} chunk {} interval {} "
      "pre-thinking {}",
      o.preset, o.layers, o.window, o.dtype, o.dims.Describe(), o.budget_bytes, o.chunk,
      o.capture_interval, o.pre_thinking);
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
  if (o.long_context && o.huge_context) {
    return InvalidArgument("--long and --huge are exclusive (prompts to 700 or to 24,000 tokens)");
  }
  if (o.spike && o.huge_context) {
    return InvalidArgument(
        "--spike and --huge are exclusive (hundreds of 24,000-token prompts held at once)");
  }
  if (o.spike && o.requests < kSpikeEvery) {
    return InvalidArgument(
        fmt::format("--spike needs --requests >= {} (its first budget of 0 is request {}), got {}",
                    kSpikeEvery, kSpikeEvery, o.requests));
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
  auto dtype = ParseStackDTypes(o.dtype);
  if (!dtype.ok()) return InvalidArgument("--dtype: " + dtype.status().message());
  KV_RETURN_IF_ERROR(ValidateDimsFlags(o.dims));
  auto stack = StackFromPreset(o.preset, o.layers, o.window, *dtype, o.dims);
  if (!stack.ok()) return InvalidArgument("--preset: " + stack.status().message());
  return Status::Ok();
}

std::string RequestsReproduceCommand(const RequestOptions& o) {
  const std::string long_flag = std::string(o.long_context ? " --long" : "") +
                                (o.huge_context ? " --huge" : "") + (o.media ? " --media" : "") +
                                (o.spike ? " --spike" : "");
  if (o.swarm) {
    return fmt::format("kvtwin requests --swarm{} --seeds {}..{} --conversations {} --requests {}",
                       long_flag, o.seed, o.seed, o.conversations, o.requests);
  }
  return fmt::format(
      "kvtwin requests{} --seeds {}..{} --preset {} --layers {} --window {} --dtype {}{} "
      "--conversations {} --requests {} --budget {} --chunk {} --interval {} "
      "--pre-thinking {}",
      long_flag, o.seed, o.seed, o.preset, o.layers, o.window, o.dtype, DimsFlags(o.dims),
      o.conversations, o.requests, o.budget_bytes, o.chunk, o.capture_interval, o.pre_thinking);
}

// The header of a recorded run, member by member: a member added to TraceHeader keeps its
// default (no expected verdict).
TraceHeader RecordHeader(const RequestOptions& o, const std::string& source) {
  TraceHeader h;
  h.kind = TraceKind::kRequests;
  h.seed = o.seed;
  h.preset = o.preset;
  h.layers = o.layers;
  h.window = o.window;
  h.dtype = o.dtype;
  h.dims = o.dims;
  h.budget_bytes = o.budget_bytes;
  h.chunk = o.chunk;
  h.capture_interval = o.capture_interval;
  h.pre_thinking = o.pre_thinking;
  h.source = source;
  return h;
}

RequestOptions OptionsFromHeader(const TraceHeader& h) {
  RequestOptions o;
  o.preset = h.preset;
  o.layers = h.layers;
  o.window = h.window;
  o.dtype = h.dtype;
  o.dims = h.dims;
  o.budget_bytes = h.budget_bytes;
  o.chunk = h.chunk;
  o.capture_interval = h.capture_interval;
  o.pre_thinking = h.pre_thinking;
  o.seed = h.seed;
  return o;
}

namespace {

// The first `max_requests` requests of the seed (all of its requests with -1).
RequestResult RunRequestsOnce(const RequestOptions& given, Trace* record, bool audit_every_call,
                              int64_t max_requests) {
  RequestOptions options = given;
  std::string derived;
  if (options.swarm) derived = SwarmStack(options);
  if (options.spike && (options.swarm || options.budget_bytes == 0)) {
    options.budget_bytes = kSpikeBudgetBytes;
    if (options.swarm) derived += fmt::format(" (--spike: budget {})", kSpikeBudgetBytes);
  }
  const Status valid = ValidateRequestOptions(options);
  KV_CHECK(valid.ok(), valid.ToString());
  StackConfig config = StackFromPreset(options.preset, options.layers, options.window,
                                       *ParseStackDTypes(options.dtype), options.dims)
                           .value();
  RequestResult result;
  result.seed = options.seed;
  result.stack = config.Describe();
  result.reproduce = RequestsReproduceCommand(given);
  result.derived = derived;
  RequestDriverOptions driver_options;
  driver_options.budget_bytes = options.budget_bytes;
  driver_options.chunk = options.chunk;
  driver_options.capture_interval = options.capture_interval;
  driver_options.pre_thinking = options.pre_thinking;
  driver_options.audit_every_call = audit_every_call;
  driver_options.after_request = options.after_request;
  RequestDriver driver(std::move(config), driver_options,
                       Rng::Derive(options.seed, "values").Next());
  Rng swarm = Rng::Derive(options.seed, "swarm");
  WorkloadOptions mix = WorkloadOptions::Swarm(swarm, options.conversations);
  if (options.long_context) {
    mix.max_prompt_tokens = kLongPromptTokens;
    mix.turn_max = kLongTurnTokens;
  }
  if (options.huge_context) {
    mix.max_prompt_tokens = kHugePromptTokens;
    mix.turn_max = kHugeTurnTokens;
  }
  if (options.media) mix.media_pct = kMediaTurnPct;
  if (options.spike) {
    mix.pressure_pct = 0;
    mix.spike_every = kSpikeEvery;
  }
  result.mix = mix.ToString();
  RequestWorkload workload(Rng::Derive(options.seed, "requests"), mix);
  if (record != nullptr) {
    record->header = RecordHeader(options, result.reproduce);
    record->events.clear();
  }
  const int64_t requests = max_requests < 0 ? options.requests : max_requests;
  for (int64_t i = 0; i < requests; ++i) {
    const RequestPlan plan = workload.Next();
    if (record != nullptr) record->events.emplace_back(plan);
    ++result.requests;
    result.divergence = driver.Run(plan);
    result.recent.push_back(plan.ToString() + " -> " + driver.last_outcome());
    if (result.recent.size() > kRecentRequests) result.recent.pop_front();
    if (result.divergence) break;
  }
  if (!result.divergence) result.divergence = driver.FinalAudit();
  result.steps = driver.steps();
  result.digest = driver.digest();
  result.coverage = driver.coverage();
  RequestDriver::TrieDumps dumps = driver.DumpTries(result.divergence.has_value());
  result.trie_dump = std::move(dumps.text);
  result.trie_dot = std::move(dumps.dot);
  return result;
}

}  // namespace

RequestResult RunRequests(const RequestOptions& options, Trace* record) {
  RequestResult r = RunRequestsOnce(options, record, /*audit_every_call=*/false, -1);
  if (!r.divergence || r.divergence->unaudited_calls == 0) return r;
  // As sim/replay.cc's Localized: the same requests with every call audited fail no later.
  // The recorded trace stays the first run's; its replay localizes the same way.
  RequestResult first = RunRequestsOnce(options, nullptr, /*audit_every_call=*/true, r.requests);
  KV_CHECK(first.divergence.has_value(),
           "a run auditing every call passed the request at which the amortized one failed");
  first.divergence->note = LocalizedNote(r.divergence->request, r.divergence->unaudited_calls);
  return first;
}

}  // namespace kvtwin::sim
