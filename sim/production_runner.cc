#include "sim/production_runner.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "sim/forward.h"
#include "src/core/check.h"
#include "src/speculation.h"

namespace kvtwin::sim {

ProductionRunner::ProductionRunner(StackConfig config, RequestDriverOptions options,
                                   uint64_t value_seed)
    : config_(std::move(config)), options_(options), synth_(value_seed) {
  const Status valid = config_.Validate();
  KV_CHECK(valid.ok(), valid.ToString());
  KV_CHECK(options_.chunk >= 1, "prefill chunks hold at least one token");
  caches_ = BuildCaches(config_);
  kernels_ = DeriveLayerKernels(synth_, config_);
  manager_ = std::make_unique<PrefixCache>(Caches());
  for (const auto& c : caches_) {
    if (c != nullptr) live_.push_back(c.get());
  }
  manager_->set_max_paged_out_bytes(
      options_.budget_bytes > 0 ? options_.budget_bytes : std::numeric_limits<int64_t>::max());
}

// The manager holds raw pointers into caches_.
ProductionRunner::~ProductionRunner() { manager_.reset(); }

std::vector<LayerCache*> ProductionRunner::Caches() const {
  std::vector<LayerCache*> out;
  for (const auto& c : caches_) out.push_back(c.get());
  return out;
}

void ProductionRunner::Forward(std::span<const model::Token> tokens, Speculation* spec) {
  size_t wrapper = 0;
  for (size_t i = 0; i < caches_.size(); ++i) {
    if (caches_[i] == nullptr) continue;
    LayerCache& target = spec != nullptr ? spec->layer(wrapper++) : *caches_[i];
    const History history =
        ForwardSynthetic(target, config_, synth_, static_cast<int32_t>(i), offset_, tokens,
                         &kernels_.conv[i], &kernels_.gdn[i], 0, false, &scratch_);
    checksum_ += static_cast<uint64_t>(history.length);
  }
}

Status ProductionRunner::Probe(const SpeculativeStep& spec, std::span<const model::Token> tokens) {
  if (!spec.probe) return Status::Ok();
  Result<Speculation> s = BeginIsolatedSpeculation(live_);
  if (!s.ok()) return s.status();
  Forward(tokens, &*s);
  return Status::Ok();
}

Status ProductionRunner::Run(const RequestPlan& plan) {
  const auto len = static_cast<int64_t>(plan.inputs.size());
  model::TokenLog& stored = stored_;
  StoredTokensInto(plan, synth_.seed(), stored);

  int64_t budget = 0;
  if (options_.budget_bytes > 0) {
    budget = std::max<int64_t>(1, options_.budget_bytes * plan.budget_pct / 100);
    manager_->set_max_paged_out_bytes(budget);
  }
  Result<BeginReport> begun = manager_->Begin(plan.inputs);
  if (!begun.ok()) return begun.status();
  last_report_ = *begun;
  offset_ = begun->cached;
  if (plan.schedule) {
    PrefillCaptureOffsetsInto(options_, plan, capture_offsets_);
    if (Status s = manager_->SchedulePrefillSnapshots(capture_offsets_); !s.ok()) return s;
  }
  const bool cancelled = plan.cancel_after_tokens >= 0;
  for (int64_t pos = offset_; pos < len - 1;) {
    const int64_t done = pos - begun->cached;
    if (cancelled && done == plan.cancel_after_tokens) break;
    int64_t n = std::min(options_.chunk, len - 1 - pos);
    if (cancelled) n = std::min(n, plan.cancel_after_tokens - done);
    Forward({stored.data() + pos, static_cast<size_t>(n)}, nullptr);
    pos += n;
    offset_ = pos;
  }
  if (options_.budget_bytes > 0 && plan.budget_pct_after_prefill >= 0) {
    budget = std::max<int64_t>(1, options_.budget_bytes * plan.budget_pct_after_prefill / 100);
    manager_->set_max_paged_out_bytes(budget);
  }
  if (!cancelled) {
    if (Status s = manager_->AttachPrefillSnapshots(); !s.ok()) return s;
    const int64_t n = plan.decoded_outputs();
    auto next = plan.speculation.begin();
    model::TokenLog& drafts = drafts_;
    // A step's forward: the current token at `pos`, its accepted drafts, the rejected ones.
    const auto step_tokens = [&](int64_t pos, const SpeculativeStep& spec) {
      drafts.assign(stored.begin() + pos, stored.begin() + pos + 1 + spec.accepted);
      for (const int32_t t : spec.rejected) drafts.push_back({t, NextHash(drafts.back().h, t)});
    };
    for (int64_t i = 0; i < n;) {
      const int64_t pos = len - 1 + i;
      int64_t sampled = 1;
      if (next != plan.speculation.end() && i == next->step && !next->abandoned) {
        const SpeculativeStep& spec = *next++;
        step_tokens(pos, spec);
        if (Status s = Probe(spec, drafts); !s.ok()) return s;
        Result<Speculation> s = BeginSpeculation(live_);
        if (!s.ok()) return s.status();
        Forward(drafts, &*s);
        s->Commit(spec.accepted + 1);
        sampled = spec.accepted + 1;
      } else {
        Forward({stored.data() + pos, 1}, nullptr);
      }
      offset_ += sampled;
      const auto first = plan.outputs.begin() + i;
      if (Status s = manager_->AddOutputs({first, first + sampled}); !s.ok()) return s;
      i += sampled;
    }
    // An abandoned step (the last, at the forward of the last sampled token): forwarded
    // and dropped without a commit.
    if (next != plan.speculation.end() && next->abandoned) {
      const SpeculativeStep& spec = *next++;
      step_tokens(len - 1 + n, spec);  // accepted is 0: the last sampled token, then drafts
      if (Status s = Probe(spec, drafts); !s.ok()) return s;
      Result<Speculation> s = BeginSpeculation(live_);
      if (!s.ok()) return s.status();
      Forward(drafts, &*s);
    }
    // The unforwarded count (RequestPlan): the last sampled token forwarded too, or the
    // outputs past the decode reported without a forward.
    const auto all = static_cast<int64_t>(plan.outputs.size());
    if (plan.unforwarded == 0) {
      Forward({stored.data() + len - 1 + n, 1}, nullptr);
      ++offset_;
    } else if (n < all) {
      if (Status s = manager_->AddOutputs({plan.outputs.begin() + n, plan.outputs.end()});
          !s.ok()) {
        return s;
      }
    }
  }
  if (Status s = manager_->Close(); !s.ok()) return s;
  if (budget > 0) {
    manager_->set_max_paged_out_bytes(std::max<int64_t>(1, budget / 2));
    manager_->EnforceEvictionPolicy();
  }
  return Status::Ok();
}

}  // namespace kvtwin::sim
