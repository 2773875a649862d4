#include "sim/request_workload.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

constexpr int64_t kOutputsMax = 6;
// Image spans (WorkloadOptions::media_pct): at most this long (a long turn holds one whole),
// from this many images per workload.
constexpr int64_t kMediaSpanMax = 64;
constexpr int kMediaImages = 3;
constexpr int64_t kSpeculativeRejectedMax = 3;
constexpr size_t kSpeculativeStepsMax = 2;

}  // namespace

const char* RequestKindName(RequestKind kind) {
  switch (kind) {
    case RequestKind::kNew:
      return "new";
    case RequestKind::kExtend:
      return "extend";
    case RequestKind::kDiverge:
      return "diverge";
    case RequestKind::kRepeat:
      return "repeat";
    case RequestKind::kRetry:
      return "retry";
  }
  return "?";
}

WorkloadOptions WorkloadOptions::Swarm(Rng& rng, int32_t conversations) {
  auto pick = [&rng](std::initializer_list<uint32_t> values) {
    return *(values.begin() + rng.Below(values.size()));
  };
  WorkloadOptions o;
  o.conversations = conversations;
  // Small on purpose: different branches often hold equal tokens at equal positions, which
  // is what makes a snapshot from the wrong branch look plausible.
  o.vocab = static_cast<int32_t>(pick({3, 5, 8, 16}));
  o.user_pct = pick({0, 25, 50});
  o.unscheduled_pct = pick({0, 10, 50});
  o.cancel_pct = pick({0, 12, 33});
  o.speculate_pct = pick({0, 33, 67});
  o.pressure_pct = pick({0, 25, 50});
  o.restart_pct = pick({0, 25, 50});
  return o;
}

std::string WorkloadOptions::ToString() const {
  const WorkloadOptions defaults;
  const std::string lengths =
      max_prompt_tokens != defaults.max_prompt_tokens || turn_max != defaults.turn_max
          ? fmt::format(", prompts to {}, turns to {}", max_prompt_tokens, turn_max)
          : std::string();
  const std::string media = media_pct > 0 ? fmt::format(", media {}%", media_pct) : "";
  const std::string spike =
      spike_every > 0 ? fmt::format(", a budget of 0 every {} requests", spike_every) : "";
  return fmt::format(
      "vocab {}, user {}%, unscheduled {}%, cancel {}%, speculate {}%, pressure {}%, restart "
      "{}%{}{}{}",
      vocab, user_pct, unscheduled_pct, cancel_pct, speculate_pct, pressure_pct, restart_pct,
      lengths, media, spike);
}

std::string RequestPlan::ToString() const {
  std::string s = fmt::format("#{} {} conv {} len {} gen {}", index, RequestKindName(kind),
                              conversation, inputs.size(), outputs.size());
  if (dropped > 0) s += fmt::format(" dropped {}", dropped);
  if (!user_offsets.empty()) s += fmt::format(" user {}", fmt::join(user_offsets, ","));
  if (!schedule) s += " unscheduled";
  if (cancel_after_tokens >= 0) s += fmt::format(" cancel after {} tokens", cancel_after_tokens);
  if (unforwarded != 1) s += fmt::format(" unforwarded {}", unforwarded);
  for (size_t k = 0; k < speculation.size(); ++k) {
    const SpeculativeStep& spec = speculation[k];
    s += fmt::format("{}step {} accept {} reject {}{}{}", k == 0 ? " spec(" : "; ", spec.step,
                     spec.accepted, spec.rejected.size(), spec.probe ? " probed" : "",
                     spec.abandoned ? " abandoned" : "");
  }
  if (!speculation.empty()) s += ")";
  if (budget_pct_after_prefill >= 0) {
    s += fmt::format(" budget {}% after prefill", budget_pct_after_prefill);
  }
  return s;
}

RequestWorkload::RequestWorkload(Rng rng, WorkloadOptions options)
    : rng_(rng),
      tail_rng_(rng.Fork("unforwarded")),
      exit_rng_(rng.Fork("speculation-exits")),
      budget_rng_(rng.Fork("session-budget")),
      media_rng_(rng.Fork("media")),
      options_(options) {
  KV_CHECK(options_.conversations >= 1 && options_.vocab >= 2,
           "a workload needs a conversation and two tokens");
  system_ = Tokens(rng_.Range(4, 10));
  conversations_.resize(static_cast<size_t>(options_.conversations));
  for (int i = 0; i < kMediaImages; ++i) {
    // A fold value: 32 bits with bit 31 forced, as a negative int32; one in four extreme.
    images_.push_back(
        media_rng_.Chance(1, 4)
            ? kExtremeFolds[media_rng_.Below(kExtremeFolds.size())]
            : static_cast<int32_t>(static_cast<uint32_t>(media_rng_.Next()) | 0x80000000u));
  }
}

int32_t RequestWorkload::Token() { return static_cast<int32_t>(rng_.Range(1, options_.vocab)); }

std::vector<int32_t> RequestWorkload::Tokens(int64_t count) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(Token());
  return out;
}

RequestPlan RequestWorkload::Next() {
  RequestPlan plan;
  plan.index = next_index_++;
  // The most recent conversation often goes on: continuations with no session between.
  plan.conversation =
      rng_.Chance(3, 5) ? recent_ : static_cast<int32_t>(rng_.Below(conversations_.size()));
  Conversation& c = conversations_[static_cast<size_t>(plan.conversation)];
  plan.kind = ChooseKind(c);
  FillInputs(plan, c);
  plan.outputs = Tokens(rng_.Range(1, kOutputsMax));
  AddDecoration(plan);
  const bool cancelled = plan.cancel_after_tokens >= 0;
  // A cancelled request samples nothing (the outputs were drawn before the cancel was).
  if (cancelled) plan.outputs.clear();
  if (!cancelled) {
    AddUnforwarded(plan);
    AddSpeculationExits(plan);
  }
  AddSessionBudget(plan);
  if (options_.spike_every > 0 && (plan.index + 1) % options_.spike_every == 0) {
    plan.budget_pct = 0;
  }
  c.started = true;
  c.cancelled = cancelled;
  c.inputs = plan.inputs;
  c.outputs = plan.outputs;
  recent_ = plan.conversation;
  return plan;
}

RequestKind RequestWorkload::ChooseKind(const Conversation& c) {
  if (!c.started) return RequestKind::kNew;
  if (c.cancelled && rng_.Chance(3, 4)) return RequestKind::kRetry;
  const int64_t history = static_cast<int64_t>(c.inputs.size() + c.outputs.size());
  if (history + options_.turn_max + kOutputsMax > options_.max_prompt_tokens) {
    return RequestKind::kNew;
  }
  if (options_.restart_pct > 0 && rng_.Chance(options_.restart_pct, 100)) return RequestKind::kNew;
  const uint64_t roll = rng_.Below(100);
  if (roll < 50) return RequestKind::kExtend;
  if (roll < 72) return RequestKind::kDiverge;
  if (roll < 86) return RequestKind::kNew;
  return RequestKind::kRepeat;
}

void RequestWorkload::FillInputs(RequestPlan& plan, const Conversation& c) {
  std::vector<int32_t> history = c.inputs;
  switch (plan.kind) {
    case RequestKind::kNew:
      plan.inputs = system_;
      // A variant system prompt that shares only a preamble with the others (templates
      // that differ after a common head): the shared prompt's node splits inside, and its
      // head becomes a one-child parent above the node where every conversation branches,
      // the widest of the trie, once the variants are evicted.
      if (rng_.Chance(1, 4)) {
        plan.inputs.resize(static_cast<size_t>(rng_.Range(1, std::ssize(system_) - 1)));
      }
      break;
    case RequestKind::kExtend: {
      const auto n = static_cast<int64_t>(c.outputs.size());
      plan.dropped = n > 0 && rng_.Chance(1, 3) ? rng_.Range(1, n) : 0;
      history.insert(history.end(), c.outputs.begin(), c.outputs.end() - plan.dropped);
      plan.inputs = history;
      break;
    }
    case RequestKind::kDiverge: {
      history.insert(history.end(), c.outputs.begin(), c.outputs.end());
      const auto n = static_cast<int64_t>(history.size());
      const int64_t cut = n >= 2 ? rng_.Range(1, n - 1) : 0;
      plan.inputs.assign(history.begin(), history.begin() + cut);
      break;
    }
    case RequestKind::kRepeat:
    case RequestKind::kRetry:
      plan.inputs = c.inputs;
      return;  // exactly the same prompt
  }
  std::vector<int32_t> turn = Tokens(rng_.Range(1, options_.turn_max));
  AddMedia(turn);
  plan.inputs.insert(plan.inputs.end(), turn.begin(), turn.end());
}

void RequestWorkload::AddMedia(std::vector<int32_t>& turn) {
  if (options_.media_pct == 0 || !media_rng_.Chance(options_.media_pct, 100)) return;
  // Within the turn, so its length (bounded by turn_max) stays what the text drew; a span
  // may end the turn (an image at the end of a message) or be all of it.
  const auto n = static_cast<int64_t>(turn.size());
  const int64_t at = media_rng_.Range(0, n - 1);
  const int64_t len = std::min(media_rng_.Range(1, kMediaSpanMax), n - at);
  const int32_t fold = images_[static_cast<size_t>(media_rng_.Below(images_.size()))];
  std::fill(turn.begin() + at, turn.begin() + at + len, fold);
}

void RequestWorkload::AddDecoration(RequestPlan& plan) {
  const auto len = static_cast<int64_t>(plan.inputs.size());
  if (rng_.Chance(options_.user_pct, 100)) {
    const int64_t a = rng_.Range(1, len);
    const int64_t b = rng_.Range(1, len);
    plan.user_offsets = a == b ? std::vector<int64_t>{a} : std::vector<int64_t>{a, b};
    // One pair in seven (by its values, so every stream stays) asks for b 2^32 tokens later
    // instead: far past the prompt, dropped (spec §3.4), but b again at 32 bits.
    if (a != b && (a + b) % 7 == 0) plan.user_offsets.back() += kFarUserPoint;
  }
  plan.schedule = !rng_.Chance(options_.unscheduled_pct, 100);
  if (rng_.Chance(options_.pressure_pct, 100)) {
    const int64_t scales[] = {0, 25, 200, 400};  // 0: a budget of exactly 0
    plan.budget_pct = scales[rng_.Below(4)];
  }
  if (rng_.Chance(options_.cancel_pct, 100)) {
    plan.cancel_after_tokens = rng_.Range(0, 16);
    return;  // no decode, so no speculation
  }
  AddSpeculation(plan);
}

// Decode forwards F = [seed, g1 .. g(n-1)]; a step at i may accept up to n-1-i drafts. The
// first step is drawn over the whole decode; a second one, at even odds, where the first
// left at least one decode forward.
void RequestWorkload::AddSpeculation(RequestPlan& plan) {
  const auto n = static_cast<int64_t>(plan.outputs.size());
  if (n < 2 || !rng_.Chance(options_.speculate_pct, 100)) return;
  for (int64_t from = 0; from <= n - 1 && plan.speculation.size() < kSpeculativeStepsMax &&
                         (plan.speculation.empty() || rng_.Chance(1, 2));) {
    SpeculativeStep spec;
    spec.step = rng_.Range(from, n - 1);
    spec.accepted = rng_.Range(0, n - 1 - spec.step);
    const int64_t rejected = rng_.Range(spec.accepted == 0 ? 1 : 0, kSpeculativeRejectedMax);
    spec.rejected = Tokens(rejected);
    // The first rejected draft differs from the token the target samples instead (the bonus).
    const int32_t bonus = plan.outputs[static_cast<size_t>(spec.step + spec.accepted)];
    if (!spec.rejected.empty() && spec.rejected.front() == bonus) {
      spec.rejected.front() = bonus % options_.vocab + 1;
    }
    from = spec.end();
    plan.speculation.push_back(std::move(spec));
  }
}

// One request in six forwards its last sampled token too; one in eight reports two to four
// tokens past a stop, as far as its speculative steps leave room (they end by the
// decoded outputs).
void RequestWorkload::AddUnforwarded(RequestPlan& plan) {
  const auto n = static_cast<int64_t>(plan.outputs.size());
  const uint64_t roll = tail_rng_.Below(48);
  if (roll < 8) {
    plan.unforwarded = 0;
    return;
  }
  if (roll >= 14 || n < 2) return;
  int64_t last_end = 0;
  for (const SpeculativeStep& s : plan.speculation) last_end = std::max(last_end, s.end());
  const int64_t room = n + 1 - last_end;  // the largest count the steps leave
  plan.unforwarded = std::min(tail_rng_.Range(2, std::min<int64_t>(n, 4)), room);
  if (plan.unforwarded < 2) plan.unforwarded = 1;
}

// One committed step in six is probed first; one request in four of a speculating
// workload (one in eight when it already speculates) ends on an abandoned step of one to
// three drafts, where its last sampled token would have been left unforwarded anyway.
void RequestWorkload::AddSpeculationExits(RequestPlan& plan) {
  if (options_.speculate_pct == 0) return;
  for (SpeculativeStep& s : plan.speculation) s.probe = exit_rng_.Chance(1, 6);
  if (plan.unforwarded != 1 || plan.outputs.empty()) return;
  if (!exit_rng_.Chance(1, plan.speculation.empty() ? 4 : 8)) return;
  SpeculativeStep spec;
  spec.step = plan.decoded_outputs();
  spec.abandoned = true;
  spec.probe = exit_rng_.Chance(1, 4);
  const int64_t drafts = exit_rng_.Range(1, kSpeculativeRejectedMax);
  for (int64_t i = 0; i < drafts; ++i) {
    spec.rejected.push_back(static_cast<int32_t>(exit_rng_.Range(1, options_.vocab)));
  }
  plan.speculation.push_back(std::move(spec));
}

// Half as often as the pressure before Begin, and from the same scales.
void RequestWorkload::AddSessionBudget(RequestPlan& plan) {
  if (!budget_rng_.Chance(options_.pressure_pct, 200)) return;
  const int64_t scales[] = {0, 25, 200, 400};
  plan.budget_pct_after_prefill = scales[budget_rng_.Below(4)];
}

}  // namespace kvtwin::sim
