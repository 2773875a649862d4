// The production-scale stage of `kvtwin run`: windows of the recorded Mooncake trace
// (../shared/traces-external) replayed at its recorded block size, 512 tokens a hash id, so
// prompts run to tens of thousands of tokens. Every other stage keeps histories below about
// 700 tokens, where a path the caches take only for long buffers or long trie edges (a split
// that moves an edge of thousands of keys, a KV buffer grown many times over, a window of
// 4,096 inside one node) never runs.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "sim/cli.h"

namespace kvtwin::cli {
namespace {

// One replay of a window of the recorded trace. Requests 3925-3974 share about half of their
// 1.2 M prompt tokens with each other (the first fifty share 4 %), so prompts leave long
// cached paths at block boundaries deep inside them.
struct ProductionSetup {
  const char* what;
  int64_t skip, limit;
  const char* preset;
  int64_t window;
  const char* dtype;
  int64_t budget_bytes, chunk, capture_interval;
  // What the window is replayed for, claimed as `kvtwin replay --reach` claims (about half of
  // what it reaches), so the main job fails when the window stops reaching it.
  std::vector<sim::ReachClaim> reaches;
};

const ProductionSetup kProductionSetups[] = {
    // No periodic captures: a prompt's whole uncached tail becomes one trie edge of up to
    // tens of thousands of keys, which later prompts split at a block boundary anywhere in it.
    {"mixed, no periodic captures",
     3925,
     50,
     "mixed",
     4,
     "f32",
     0,
     512,
     0,
     {{"cache_hits", 6}, {"splits", 6}}},
    // Windows of 4,096 in nodes of 4,096 tokens (a capture every 4,096), V rows apart from K,
    // and a budget that evicts about two thirds of what the unlimited run reuses.
    {"sliding W=4096 bf16/f32, budget 60 MB",
     3925,
     50,
     "sliding",
     4096,
     "bf16/f32",
     60'000'000,
     1536,
     4096,
     {{"cache_hits", 4}, {"eviction_passes", 19}, {"evictions", 149}}},
};

}  // namespace

bool RunProductionTrace(const std::string& where, uint64_t& files, uint64_t& events) {
  // Shown in reproduce commands: without the build's "repo/../shared" detour.
  const std::string path = std::filesystem::path(where).lexically_normal().string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    fmt::print("  production trace: skipped, no recorded trace at {}\n", path);
    return true;
  }
  for (const ProductionSetup& s : kProductionSetups) {
    sim::ReplayOptions options;
    options.interrupted = &Interrupted();
    options.mooncake.skip = s.skip;
    options.mooncake.limit = s.limit;
    sim::TraceHeader& h = options.mooncake_setup;
    h.preset = s.preset;
    h.window = s.window;
    h.dtype = s.dtype;
    h.budget_bytes = s.budget_bytes;
    h.chunk = s.chunk;
    h.capture_interval = s.capture_interval;
    options.reaches = s.reaches;
    const std::string command = sim::ReplayCommand(path, options);
    ArmAbortReproduce(command);
    const sim::ReplayResult r = sim::ReplayFile(path, options);
    ++files;
    events += static_cast<uint64_t>(r.events);
    if (!r.passed()) {
      fmt::print("FAIL {} ({}): {}\n{}\nreproduce: {}\n", path, s.what, r.verdict(), r.detail(),
                 command);
      return false;
    }
    fmt::print("  production trace, requests {}-{} at 512 tokens a block, {}: pass\n", s.skip,
               s.skip + s.limit - 1, s.what);
    std::fflush(stdout);
  }
  return true;
}

}  // namespace kvtwin::cli
