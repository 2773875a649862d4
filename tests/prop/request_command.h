// The rapidcheck model and command of the request state machine: the model is a small
// pool of conversations that share one system prompt, each remembering what its last
// request stored (inputs, and outputs unless it was cancelled); a command is one request
// (sim::RequestPlan) built from that pool the way sim::RequestWorkload builds them (new,
// extend with an optional dropped tail, diverge, repeat, retry after a cancel, plus user
// offsets, unscheduled captures, cancels, speculative steps, memory pressure). The
// system under test is a RequestDriver, which checks the manager after every session call.
// A plan carries its tokens, so any subsequence of commands is still a valid run: shrinking
// only needs the conversation it names to exist. A KV_CHECK abort cannot be shrunk, so the
// running case's plans are kept where a SIGABRT handler can print them. Single-threaded.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "prop/abort_log.h"
#include "sim/request_driver.h"
#include "sim/request_workload.h"

namespace kvtwin::sim::prop {

inline constexpr size_t kConversationsMax = 3;
inline constexpr int64_t kTurnMax = 6;     // fresh tokens of a user turn
inline constexpr int64_t kOutputsMax = 6;  // sampled tokens of a request
// Longer histories restart the conversation: keeps a case cheap (runtime budget).
inline constexpr int64_t kHistoryMax = 64;

// A value in [lo, hi], uniform at every size: rapidcheck scales inRange by the case's size,
// which would make early cases all short prompts with no decorations. Shrinks towards lo.
template <typename T>
T Pick(T lo, T hi) {
  return *rc::gen::resize(100, rc::gen::inRange<T>(lo, hi + 1));
}
// Shrinks towards false, so a shrunk plan keeps only the decorations the failure needs.
inline bool Chance(int pct) { return Pick(0, 99) >= 100 - pct; }

struct Conversation {
  std::vector<int32_t> inputs;
  std::vector<int32_t> outputs;  // empty after a cancel
  bool cancelled = false;
};

struct RequestModel {
  int32_t vocab = 4;  // tokens are 1..vocab: look-alike branches are common
  std::vector<int32_t> system;
  std::vector<Conversation> conversations;
  int32_t recent = 0;  // the last conversation served, favoured as the next one
};

inline std::vector<int32_t> Tokens(const RequestModel& m, int64_t count) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(Pick(1, m.vocab));
  return out;
}

inline RequestKind GenKind(const Conversation* c) {
  if (c == nullptr) return RequestKind::kNew;  // a fresh slot of the pool
  if (c->cancelled && Chance(75)) return RequestKind::kRetry;
  const auto history = static_cast<int64_t>(c->inputs.size() + c->outputs.size());
  if (history + kTurnMax + kOutputsMax > kHistoryMax) return RequestKind::kNew;
  const int roll = Pick(0, 99);  // shrinks towards the commonest kind, extend
  if (roll < 50) return RequestKind::kExtend;
  if (roll < 72) return RequestKind::kDiverge;
  if (roll < 86) return RequestKind::kNew;
  return RequestKind::kRepeat;
}

// The prompt of `plan.kind` over conversation `c` (null for a fresh slot).
inline void GenInputs(const RequestModel& m, const Conversation* c, RequestPlan& plan) {
  std::vector<int32_t> history = c != nullptr ? c->inputs : std::vector<int32_t>{};
  switch (plan.kind) {
    case RequestKind::kNew:
      plan.inputs = m.system;
      break;
    case RequestKind::kExtend: {
      const auto n = static_cast<int64_t>(c->outputs.size());
      plan.dropped = n > 0 && Chance(33) ? Pick<int64_t>(1, n) : 0;
      history.insert(history.end(), c->outputs.begin(), c->outputs.end() - plan.dropped);
      plan.inputs = history;
      break;
    }
    case RequestKind::kDiverge: {
      history.insert(history.end(), c->outputs.begin(), c->outputs.end());
      const auto n = static_cast<int64_t>(history.size());
      plan.inputs.assign(history.begin(), history.begin() + (n >= 2 ? Pick<int64_t>(1, n - 1) : 0));
      break;
    }
    case RequestKind::kRepeat:
    case RequestKind::kRetry:
      plan.inputs = c->inputs;  // exactly the same prompt
      return;
  }
  const std::vector<int32_t> turn = Tokens(m, Pick<int64_t>(1, kTurnMax));
  plan.inputs.insert(plan.inputs.end(), turn.begin(), turn.end());
}

// One speculative decode step at or after decode forward `from`, as RequestWorkload draws
// it: decode forwards are [seed, g1 .. g(n-1)], so a step at i accepts at most n-1-i
// drafts; the first rejected draft differs from the bonus token the target samples instead.
// REQUIRES: from <= n - 1.
inline SpeculativeStep GenStep(const RequestModel& m, const RequestPlan& plan, int64_t from) {
  const auto n = static_cast<int64_t>(plan.outputs.size());
  SpeculativeStep spec;
  spec.step = Pick<int64_t>(from, n - 1);
  spec.accepted = Pick<int64_t>(0, n - 1 - spec.step);
  spec.rejected = Tokens(m, Pick<int64_t>(spec.accepted == 0 ? 1 : 0, 3));
  const int32_t bonus = plan.outputs[static_cast<size_t>(spec.step + spec.accepted)];
  if (!spec.rejected.empty() && spec.rejected.front() == bonus) {
    spec.rejected.front() = bonus % m.vocab + 1;
  }
  return spec;
}

// One step, then more while the outputs leave room (each one after the previous one's
// end), so requests with two or three steps are common. Shrinks towards one step.
inline void GenSpeculation(const RequestModel& m, RequestPlan& plan) {
  const auto n = static_cast<int64_t>(plan.outputs.size());
  for (int64_t from = 0; from <= n - 1 && (plan.speculation.empty() || Chance(50));) {
    plan.speculation.push_back(GenStep(m, plan, from));
    from = plan.speculation.back().end();
  }
}

inline void GenDecoration(const RequestModel& m, RequestPlan& plan) {
  const auto len = static_cast<int64_t>(plan.inputs.size());
  if (Chance(25)) {
    const int64_t a = Pick<int64_t>(1, len);
    const int64_t b = Pick<int64_t>(1, len);
    plan.user_offsets = a == b ? std::vector<int64_t>{a} : std::vector<int64_t>{a, b};
  }
  plan.schedule = !Chance(15);
  // A server whose headroom changes between requests (ignored with an unlimited budget).
  if (Chance(10)) plan.budget_pct = Chance(50) ? 200 : (Chance(50) ? 25 : 0);
  // Headroom that moves again inside the session, before the attach's eviction pass.
  if (Chance(10)) plan.budget_pct_after_prefill = Chance(50) ? 300 : (Chance(50) ? 20 : 0);
  if (Chance(15)) {
    plan.cancel_after_tokens = Pick<int64_t>(0, 16);
    // No decode, so no speculation; the planned outputs are never used, and a recorded
    // cancel has none at all (both forms must run).
    if (Chance(50)) plan.outputs.clear();
    return;
  }
  if (plan.outputs.size() >= 2 && Chance(33)) GenSpeculation(m, plan);
  for (SpeculativeStep& s : plan.speculation) s.probe = Chance(15);
  // The decode may end on an abandoned step: the last sampled token and its drafts
  // forwarded, then rolled back without a commit (the last token stays unforwarded).
  if (Chance(10)) {
    SpeculativeStep spec;
    spec.step = plan.decoded_outputs();
    spec.abandoned = true;
    spec.probe = Chance(25);
    spec.rejected = Tokens(m, Pick<int64_t>(0, 3));
    plan.speculation.push_back(std::move(spec));
  }
}

inline RequestPlan GenPlan(const RequestModel& m) {
  RequestPlan plan;
  const auto pool = static_cast<int32_t>(m.conversations.size());
  const bool room = m.conversations.size() < kConversationsMax;
  // The recent conversation often goes on: continuations with no session in between.
  plan.conversation = pool > 0 && Chance(60) ? m.recent : Pick(0, room ? pool : pool - 1);
  const Conversation* c = plan.conversation < pool ? &m.conversations[plan.conversation] : nullptr;
  plan.kind = GenKind(c);
  GenInputs(m, c, plan);
  plan.outputs = Tokens(m, Pick<int64_t>(1, kOutputsMax));
  GenDecoration(m, plan);
  return plan;
}

// Everything a reader needs to replay the plan by hand (ToString omits the tokens).
inline std::string PlanText(const RequestPlan& p) {
  const std::string summary = p.ToString();
  // The generation-time "#index " prefix is dropped: after shrinking, the position in the
  // printed list is the request number (the driver's report counts the same way).
  std::string s = summary.substr(summary.find(' ') + 1);
  s += fmt::format(" | inputs [{}] outputs [{}]", fmt::join(p.inputs, " "),
                   fmt::join(p.outputs, " "));
  for (size_t k = 0; k < p.speculation.size(); ++k) {
    s += fmt::format("{}[{}]", k == 0 ? " rejected " : " ",
                     fmt::join(p.speculation[k].rejected, " "));
  }
  if (p.budget_pct != 100) s += fmt::format(" budget {}%", p.budget_pct);
  return s;
}

// The driver plus the number of requests it ran, so each report names the request by its
// position in the (shrunk) command list.
struct RequestSut {
  RequestDriver driver;
  int64_t ran = 0;
};

struct RequestCommand : rc::state::Command<RequestModel, RequestSut> {
  RequestPlan plan;

  explicit RequestCommand(const RequestModel& m) : plan(GenPlan(m)) {}

  // Shrinking drops earlier commands: the conversation must still exist (or be the next
  // fresh slot of the pool for a new one). The tokens are the plan's own.
  void checkPreconditions(const RequestModel& m) const override {
    const auto pool = static_cast<int32_t>(m.conversations.size());
    RC_PRE(plan.conversation < pool ||
           (plan.kind == RequestKind::kNew && plan.conversation == pool));
  }

  void apply(RequestModel& m) const override {
    if (plan.conversation == static_cast<int32_t>(m.conversations.size())) {
      m.conversations.emplace_back();
    }
    // A cancelled request stores its prompt only: the next one may retry it.
    Conversation& c = m.conversations[static_cast<size_t>(plan.conversation)];
    c.cancelled = plan.cancel_after_tokens >= 0;
    c.inputs = plan.inputs;
    c.outputs = c.cancelled ? std::vector<int32_t>{} : plan.outputs;
    m.recent = plan.conversation;
  }

  void run(const RequestModel&, RequestSut& sut) const override {
    RequestPlan numbered = plan;
    numbered.index = sut.ran++;
    AbortLog::Note(fmt::format("#{} {}", numbered.index, PlanText(numbered)));
    if (auto d = sut.driver.Run(numbered)) RC_FAIL(d->ToString());
  }

  void show(std::ostream& os) const override { os << PlanText(plan); }
};

}  // namespace kvtwin::sim::prop
