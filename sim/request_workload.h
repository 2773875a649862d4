// RequestWorkload: seeded request streams for the request-level simulator (sim/requests.h).
// A small pool of conversations shares one system prompt. Each request picks a
// conversation (the most recent one more often, so exact continuations with no other
// session in between are common) and either
//   extends its last request exactly (inputs + all outputs, or with a dropped tail of the
//     last response) with a new user turn,
//   diverges from its history at a random earlier point,
//   starts a new conversation that shares only the system prompt,
//   repeats its last prompt exactly, or
//   retries a prefill that was cancelled.
// On top, at per-seed rates (WorkloadOptions): a cancel after a random number of prefill
// chunks (the request then has no outputs), extra user restore points, a caller that asks
// for no captures at all, speculative decode (one step, or two when the outputs leave
// room), and a budget above or below the run's for one request. Tokens come from a small
// vocabulary so equal tokens at equal positions on different branches are common (partial
// edge matches, splits, look-alike branches). Outputs are planned here: the driver replays
// them as the sampled tokens. Single-threaded.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "src/core/rng.h"

namespace kvtwin::sim {

// The extreme fold values of a media span (spec §3.1 Keys: bit 31 set), as kvtwin's negative
// int32 ids: bit 31 alone (0x80000000) and every bit (0xFFFFFFFF), where a sign or width
// slip shows most. Drawn by the request workload and the prefix fuzz records.
inline constexpr std::array<int32_t, 2> kExtremeFolds = {std::numeric_limits<int32_t>::min(), -1};
// How far past the prompt a far user restore point lies: dropped by the manager (spec
// §3.4 clips to (cached, len]), back in range if narrowed to 32 bits.
inline constexpr int64_t kFarUserPoint = int64_t{1} << 32;

enum class RequestKind : uint8_t { kNew, kExtend, kDiverge, kRepeat, kRetry };
const char* RequestKindName(RequestKind kind);

// One speculative decode step: at decode forward `step` (0 = the seed) forward the current
// token, `accepted` drafts equal to the next planned tokens, then `rejected` other drafts,
// and commit accepted + 1. It samples outputs [step, step + accepted + 1): the accepted
// drafts and the bonus token.
struct SpeculativeStep {
  int64_t step = 0;
  int64_t accepted = 0;
  std::vector<int32_t> rejected;
  // Before the step, the same tokens go through BeginIsolatedSpeculation (a caller that
  // scores drafts for instrumentation, spec §2.7): the wrappers never touch live state.
  bool probe = false;
  // The step's transaction is destroyed without a commit (a client that disconnects while
  // the drafts are validated; spec §2.6 item 5: every exit path rolls back), and the decode
  // ends there: the step forwards the last sampled token and its drafts and samples nothing.
  // Only the last step, at step == RequestPlan::decoded_outputs() with unforwarded 1 and no
  // accepted draft, so the caches end where a plain close would leave them.
  bool abandoned = false;
  // The first decode forward after the step: where the next step may start.
  int64_t end() const { return abandoned ? step : step + accepted + 1; }
  friend bool operator==(const SpeculativeStep&, const SpeculativeStep&) = default;
};

struct RequestPlan {
  int64_t index = 0;
  RequestKind kind = RequestKind::kNew;
  int32_t conversation = 0;
  std::vector<int32_t> inputs;
  // Every sampled token. At least one unless cancelled (a cancelled request never
  // decodes, so it may have none).
  std::vector<int32_t> outputs;
  // How many of the last outputs are never forwarded before Close (spec §3 close: the
  // caches rest at or below the stored tokens): 1, the usual decode loop (the last sampled
  // token is reported, not forwarded); 0, a server that forwards that token too (it streams
  // its stop token through the model), so the caches end at every stored token; k >= 2,
  // tokens reported past a stop without being forwarded (the decode ends k - 1 forwards
  // early and reports the rest). At most outputs.size(); 1 when cancelled.
  int64_t unforwarded = 1;
  int64_t dropped = 0;  // kExtend: tokens of the last response left out
  std::vector<int64_t> user_offsets;
  bool schedule = true;  // call SchedulePrefillSnapshots at all
  // >= 0: cancel once that many prefill tokens were forwarded (the last chunk is cut to
  // fit; 0 = before the first chunk) and close without attach or decode.
  int64_t cancel_after_tokens = -1;
  // Speculative decode steps (none: plain decode), sorted and apart: each step starts at
  // or after the previous one's end(), and every end() <= outputs.size(). None when
  // cancelled.
  std::vector<SpeculativeStep> speculation;
  // Memory pressure: the eviction budget for this request, in percent of the run's budget
  // (a server whose headroom changes between requests); 0 is a budget of exactly 0, every
  // evictable node goes. A run without a budget ignores it.
  int64_t budget_pct = 100;
  // >= 0: the budget changes again once the prefill is forwarded, to this percent of the
  // run's, while the session is open (a server whose headroom moves mid-request): the
  // attach's and the close's eviction passes run under it. -1: unchanged.
  int64_t budget_pct_after_prefill = -1;
  // The outputs the decode forwards sample, the speculative steps' included: every
  // output but the unforwarded ones past the first (so the speculative steps end by it).
  int64_t decoded_outputs() const {
    return static_cast<int64_t>(outputs.size()) - std::max<int64_t>(unforwarded, 1) + 1;
  }
  std::string ToString() const;  // one summary line
};

// Per-request rates (percent) and the vocabulary. Swarm testing: each seed draws its own
// mix, so some runs hammer one mechanism (many cancels, callers that never schedule
// captures, ...) without the others diluting it.
struct WorkloadOptions {
  int32_t conversations = 6;
  int64_t max_prompt_tokens = 160;  // longer histories restart the conversation
  int64_t turn_max = 8;             // new user tokens per request: 1..turn_max
  int32_t vocab = 5;                // tokens are 1..vocab
  uint32_t user_pct = 25;           // extra user restore points
  uint32_t unscheduled_pct = 10;    // no SchedulePrefillSnapshots at all
  uint32_t cancel_pct = 12;         // close after part of the prefill
  uint32_t speculate_pct = 33;      // speculative decode (one step, or two with room)
  uint32_t pressure_pct = 0;        // a budget other than the run's for one request
  // Conversations restarted on top of the usual mix: every restart adds a branch where the
  // system prompt ends, so the trie grows nodes with many children (the production trie's
  // wide-node path) and evictions that merge their one-child parents into them.
  uint32_t restart_pct = 0;
  // User turns that carry an image span: a run of 1..kMediaSpanMax positions holding one
  // fold value (spec §3.1 Keys: bit 31 set, so never a text token id; a negative int32 here),
  // drawn from kMediaImages images per workload, so conversations share them. Drawn from a
  // stream of its own: 0 leaves every other draw as it was.
  uint32_t media_pct = 0;
  // > 0: requests spike_every - 1, 2 * spike_every - 1, ... run under a budget of exactly 0
  // (RequestPlan::budget_pct 0) and the others under the run's. Under a run budget that
  // nothing reaches, the trie grows for spike_every - 1 requests without an eviction, then
  // one pass takes every evictable node: a pass of thousands of victims, which the usual
  // mixes (a trie a few dozen nodes deep into its budget) never run. Drawn from no stream.
  int64_t spike_every = 0;
  // A mix drawn from `rng` (the conversation count is kept).
  static WorkloadOptions Swarm(Rng& rng, int32_t conversations);
  // "vocab 5, user 25%, unscheduled 10%, cancel 12%, speculate 33%, pressure 0%, restart 0%"
  std::string ToString() const;
};

class RequestWorkload {
 public:
  RequestWorkload(Rng rng, WorkloadOptions options);
  RequestPlan Next();

 private:
  struct Conversation {
    bool started = false;
    bool cancelled = false;  // the last request was cancelled (no outputs)
    std::vector<int32_t> inputs;
    std::vector<int32_t> outputs;
  };
  RequestKind ChooseKind(const Conversation& c);
  void FillInputs(RequestPlan& plan, const Conversation& c);
  void AddDecoration(RequestPlan& plan);
  void AddSpeculation(RequestPlan& plan);
  std::vector<int32_t> Tokens(int64_t count);
  int32_t Token();

  // How many outputs stay unforwarded (RequestPlan::unforwarded), from a stream of its
  // own, so every other choice of a seed's stream is what it was before the draw existed.
  void AddUnforwarded(RequestPlan& plan);
  // Isolated probes and an abandoned last step (SpeculativeStep), from a stream of their own
  // for the same reason, in workloads that speculate.
  void AddSpeculationExits(RequestPlan& plan);
  // RequestPlan::budget_pct_after_prefill, in workloads under pressure, from a stream of
  // its own likewise.
  void AddSessionBudget(RequestPlan& plan);
  // An image span over part of the user turn `turn` (WorkloadOptions::media_pct), from a
  // stream of its own likewise.
  void AddMedia(std::vector<int32_t>& turn);

  Rng rng_;
  Rng tail_rng_;
  Rng exit_rng_;
  Rng budget_rng_;
  Rng media_rng_;
  std::vector<int32_t> images_;  // the workload's fold values (negative ids)
  WorkloadOptions options_;
  std::vector<int32_t> system_;
  std::vector<Conversation> conversations_;
  int32_t recent_ = 0;
  int64_t next_index_ = 0;
};

}  // namespace kvtwin::sim
