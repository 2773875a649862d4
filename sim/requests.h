// Seeded request-level runs of the prefix-cache manager: one seed -> one stack, one request
// stream (sim/request_workload.h), one verdict from the checks of sim/request_driver.h.
// RunRequests is what `kvtwin requests` calls per seed, what the determinism test calls
// twice and what the reproduce command re-runs. Single-threaded.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include "sim/request_driver.h"
#include "sim/trace.h"

namespace kvtwin::sim {

inline constexpr int64_t kLongPromptTokens = 700;
inline constexpr int64_t kLongTurnTokens = 128;
// RequestOptions::huge_context: a production prompt's length, whole documents per turn.
inline constexpr int64_t kHugePromptTokens = 24'000;
inline constexpr int64_t kHugeTurnTokens = 6'000;
// With RequestOptions::media: the share of user turns that carry an image span.
inline constexpr uint32_t kMediaTurnPct = 25;
// RequestOptions::spike: the run's budget when none is given (a tebibyte: no request of these
// widths reaches it) and the period of the requests under a budget of 0.
inline constexpr int64_t kSpikeBudgetBytes = int64_t{1} << 40;
inline constexpr int64_t kSpikeEvery = 1000;

struct RequestOptions {
  std::string preset = "mixed";
  int32_t layers = 4;
  int64_t window = 4;
  std::string dtype = "f32";
  ModelDims dims;  // --kv-dims, --recurrent-dims
  int32_t conversations = 6;
  int64_t requests = 60;
  int64_t budget_bytes = 0;      // manager eviction budget; 0 = unlimited
  int64_t chunk = 5;             // prefill chunk, tokens
  int64_t capture_interval = 8;  // periodic prefill captures; 0 = none
  int64_t pre_thinking = 4;      // a capture at len - pre_thinking; 0 = none
  uint64_t seed = 1;
  // The seed also chooses the stack (preset, layers, window, dtype, and for half the seeds
  // the dims) and the budget, from unlimited down to a few snapshots' worth (constant
  // eviction); reported in the result.
  bool swarm = false;
  // Long contexts: conversations grow to kLongPromptTokens in user turns of up to
  // kLongTurnTokens, so KV buffers cross their 256-row growth steps inside the manager (page
  // in, split, extend and evict long nodes); with `swarm`, the seed also draws rotating
  // windows of 256 and more and prefill chunks up to 64.
  bool long_context = false;
  // Prompts of production length: conversations grow to kHugePromptTokens in user turns of
  // up to kHugeTurnTokens and diverge at any token, so trie edges of thousands of keys split
  // anywhere in them (not only at a trace's block boundaries), KV buffers grow dozens of
  // times and windows of 4,096 sit inside one node. With `swarm`, the seed draws windows up
  // to 4,097, chunks of 64-4,096 tokens, capture intervals of none to 4,096 and budgets in
  // megabytes, over the default widths. Exclusive with long_context.
  bool huge_context = false;
  // Media in the prompts (WorkloadOptions::media_pct): user turns that carry an image span,
  // whose positions hold its fold value, an effective token with bit 31 set (spec §3.1 Keys),
  // here a negative token id. Images repeat across conversations, so their spans are shared.
  bool media = false;
  // Memory that is plentiful until it is gone (WorkloadOptions::spike_every = kSpikeEvery):
  // every kSpikeEvery-th request runs under a budget of exactly 0, the others under the run's
  // budget, kSpikeBudgetBytes when none is given (always, with `swarm`), with no other
  // pressure, so one eviction pass takes the whole grown trie off the active path.
  // Exclusive with huge_context (hundreds of production-length prompts held at once).
  bool spike = false;
  // RequestDriverOptions::after_request: a test seam that plays a faulty manager; the
  // localizing re-run keeps it. Not part of the reproduce command.
  std::function<void(PrefixCache&, int64_t)> after_request;
};

struct RequestResult {
  uint64_t seed = 0;
  std::string stack;     // StackConfig::Describe()
  std::string mix;       // the seed's workload mix (WorkloadOptions::ToString())
  std::string derived;   // every option the seed derived in swarm mode (else empty)
  int64_t requests = 0;  // requests run (the failing one included)
  int64_t steps = 0;     // session calls and forwards
  uint64_t digest = 0;
  std::optional<RequestDivergence> divergence;
  std::deque<std::string> recent;  // the last few requests: plan and Begin outcome
  std::string reproduce;           // one-line command that re-runs this seed
  std::string trie_dump;           // DumpTrie of the final (or diverged) trie
  std::string trie_dot;            // TrieToDot of the same
  RequestCoverage coverage;
};

// InvalidArgument naming the field (its CLI flag) for an impossible option.
Status ValidateRequestOptions(const RequestOptions& options);
// REQUIRES: ValidateRequestOptions(options).ok(). With `record`, the run is also kept as a
// request trace that replays to the same digest.
RequestResult RunRequests(const RequestOptions& options, Trace* record = nullptr);
// The request options a request trace's header describes (stack, budget, prefill cadence,
// seed); workload fields keep their defaults.
RequestOptions OptionsFromHeader(const TraceHeader& header);
// The `kvtwin requests` command line that reproduces RunRequests(options).
std::string RequestsReproduceCommand(const RequestOptions& options);

}  // namespace kvtwin::sim
