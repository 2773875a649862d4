#include "bench/scaling_workload.h"

#include <utility>

namespace kvtwin::bench {

ChatWorkload::ChatWorkload(uint64_t seed, ChatShape shape) : shape_(shape) {
  Rng rng = Rng::Derive(seed, "system prompt");
  AppendTokens(system_, shape_.system_tokens, rng);
}

void ChatWorkload::AppendTokens(std::vector<int32_t>& out, int64_t count, Rng& rng) const {
  // Token 0 is left out: some importers use it as padding.
  for (int64_t i = 0; i < count; ++i)
    out.push_back(static_cast<int32_t>(rng.Range(1, shape_.vocab - 1)));
}

sim::RequestPlan ChatWorkload::WithOutputs(sim::RequestPlan plan, Rng& rng) const {
  AppendTokens(plan.outputs, shape_.outputs, rng);
  return plan;
}

sim::RequestPlan ChatWorkload::Open(int32_t conversation, Rng& rng) const {
  sim::RequestPlan plan;
  plan.kind = sim::RequestKind::kNew;
  plan.conversation = conversation;
  plan.inputs = system_;
  AppendTokens(plan.inputs, rng.Range(shape_.user_min, shape_.user_max), rng);
  return WithOutputs(std::move(plan), rng);
}

sim::RequestPlan ChatWorkload::Continue(const sim::RequestPlan& last, Rng& rng,
                                        int64_t user_tokens) const {
  sim::RequestPlan plan;
  plan.kind = sim::RequestKind::kExtend;
  plan.conversation = last.conversation;
  plan.inputs = last.inputs;
  plan.inputs.insert(plan.inputs.end(), last.outputs.begin(), last.outputs.end());
  const int64_t n = user_tokens >= 0 ? user_tokens : rng.Range(shape_.user_min, shape_.user_max);
  AppendTokens(plan.inputs, n, rng);
  return WithOutputs(std::move(plan), rng);
}

}  // namespace kvtwin::bench
