// The three scaling series of `scaling_bench` (issue 8, deliverable 3), each a list of
// points measured by replaying chat requests (bench/scaling_workload.h) through
// sim::ProductionRunner, the production call sequence without checks:
//   conversations  per-request cost against the number of cached conversations (target:
//                  flat within ±25 % from 1k to 100k);
//   context        per-request cost against the context length of one conversation;
//   memory         bytes the manager holds against the raw tensor bytes of the cached
//                  tokens (target: at most 1.5x).
// Each request is timed in thread CPU time (CLOCK_THREAD_CPUTIME_ID), which is what the
// verdicts and plots use: the machine that runs `make bench` may be shared, and CPU time
// does not count the time a neighbour holds the core. Wall time (steady_clock) is reported
// beside it. Clocks are allowed here and nowhere below bench/. Every run of a seed replays
// the same requests. Single-threaded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvtwin::bench {

struct ScalingOptions {
  bool quick = false;  // smaller sweeps for a smoke run
  uint64_t seed = 1;
  int64_t max_conversations = 0;  // > 0: stop the conversation sweep there (profiling)
};

// Summary of a list of per-request wall times.
struct Timing {
  double mean_ns = 0, median_ns = 0, p90_ns = 0;
  int64_t requests = 0;
};
Timing Summarize(std::vector<double> ns);

// Thread CPU and wall time of a list of requests, and the minor page faults they took.
struct Costs {
  std::vector<double> cpu_ns, wall_ns;
  int64_t minor_faults = 0;
};

struct ConversationPoint {
  int64_t conversations = 0;
  Timing measured;              // CPU time of the fixed measured requests
  Timing measured_wall;         // their wall time
  double populate_mean_ns = 0;  // CPU time of the N populating requests (new conversations)
  int64_t trie_nodes = 0;
  int64_t branch_children = 0;            // children of the node ending at the system prompt
  std::vector<double> repeat_medians_ns;  // CPU medians of every repeat (see .cc)
  int64_t measured_faults = 0;            // minor page faults of the measured requests
};

struct ContextPoint {
  int64_t context_tokens = 0;  // of the conversation before the measured requests
  Timing measured;             // CPU time
  Timing measured_wall;
  // CPU time of the harness's own per-request bookkeeping, redone outside the timed call:
  // ProductionRunner::Run copies the stored tokens and re-derives the provenance hash of
  // every one of them (sim::WithHashes), O(context) work no server does.
  Timing harness;
  double new_tokens_per_request = 0;  // user turn + outputs each measured request adds
  std::vector<double> repeat_medians_ns;
  int64_t measured_faults = 0;  // minor page faults of the measured requests
};

struct MemoryPoint {
  int64_t cached_tokens = 0;  // distinct tokens in the trie (sum of edge lengths)
  int64_t conversations = 0;
  int64_t snapshot_bytes = 0;    // paged_out_bytes(): every snapshot the trie holds
  int64_t live_bytes = 0;        // LiveBytes() of every live cache (capacity included)
  int64_t raw_bytes = 0;         // tokens x KV layers x (K + V cols) x dtype + recurrent states
  int64_t recurrent_states = 0;  // recurrent states counted in raw_bytes
  int64_t trie_nodes = 0;
  int64_t rss_delta_bytes = 0;  // process resident set growth since before the manager
  double held_ratio() const;    // (snapshot + live) / raw
  double rss_ratio() const;     // rss delta / raw
};

struct Series {
  std::string stack;  // StackConfig::Describe() of the layer stack it ran on
  std::string notes;  // what one request is
};
struct ConversationSeries : Series {
  std::vector<ConversationPoint> points;
};
struct ContextSeries : Series {
  std::vector<ContextPoint> points;
};
struct MemorySeries : Series {
  std::vector<MemoryPoint> points;
};

ConversationSeries RunConversationSeries(const ScalingOptions& options);
ContextSeries RunContextSeries(const ScalingOptions& options);
MemorySeries RunMemorySeries(const ScalingOptions& options);

}  // namespace kvtwin::bench
