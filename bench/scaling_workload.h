// ChatWorkload: the chat requests the scaling benchmarks replay through ProductionRunner.
// Every conversation opens with one shared system prompt, then a user turn of random
// tokens and a few sampled outputs; a continuation re-sends the whole stored history
// (inputs + outputs) plus a new user turn, as a chat client does. User tokens are drawn
// from a vocabulary of realistic size, so distinct conversations diverge right after the
// system prompt and the node ending there gets one child per distinct first user token.
// Deterministic: every token comes from the Rng the caller passes. Single-threaded.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/request_workload.h"
#include "src/core/rng.h"

namespace kvtwin::bench {

struct ChatShape {
  int64_t system_tokens = 12;
  int64_t user_min = 4;  // tokens of one user turn, inclusive range
  int64_t user_max = 20;
  int64_t outputs = 4;  // sampled tokens per request (the last one is never forwarded)
  int32_t vocab = 32000;
};

class ChatWorkload {
 public:
  // The system prompt is drawn from `seed` alone, so every workload of a seed shares it.
  ChatWorkload(uint64_t seed, ChatShape shape);

  const ChatShape& shape() const { return shape_; }
  const std::vector<int32_t>& system() const { return system_; }
  // A new conversation: the system prompt, one user turn, `outputs` sampled tokens.
  sim::RequestPlan Open(int32_t conversation, Rng& rng) const;
  // The next request of the conversation whose last request was `last`: its stored tokens
  // (inputs + outputs), `user_tokens` new ones (drawn from the user range if < 0), and new
  // outputs.
  sim::RequestPlan Continue(const sim::RequestPlan& last, Rng& rng, int64_t user_tokens = -1) const;

 private:
  void AppendTokens(std::vector<int32_t>& out, int64_t count, Rng& rng) const;
  sim::RequestPlan WithOutputs(sim::RequestPlan plan, Rng& rng) const;

  ChatShape shape_;
  std::vector<int32_t> system_;
};

}  // namespace kvtwin::bench
