// The kPrefix fuzz family: requests over a small pool of conversations at a tiny eviction
// budget, through the RequestDriver the request simulator uses (every check on), so the
// prefix manager's switch, page-in, capture attach, split, compaction and eviction run
// against the reference on byte strings a coverage-guided fuzzer steers.
//
// Method: the header picks the stack and the manager's cadence; each record is one request
// built the way RequestWorkload builds them (sim/request_workload.h) but with every choice
// read from a byte: which conversation, what the prompt is relative to that conversation's
// history (extend it exactly or with a dropped tail, diverge inside it, start over from the
// shared system prompt, repeat or retry it), the new tokens, the outputs and the
// decorations (user points, no captures, a cancel, one speculative step, isolated probes,
// an abandoned last step, memory pressure, how many sampled tokens stay unforwarded at the
// close).
// Tokens come mostly from 1..4 so branches hold equal tokens at equal positions (partial
// edge matches, splits, look-alike snapshots); one token byte in 16 is a rare token 5..8,
// so a node can grow past four children. The plans run are recorded as a kind-"requests"
// trace whose header rebuilds the same driver, so ReplayTrace reaches the same digest.
//
// Header (10 bytes, one FuzzedDataProvider; byte 9 first):
//   9 preset (PresetNames())  8 layers 1..4  7 window 1..8  6 dtype (odd: bf16; the widths
//   FuzzDimsOf(b), drawn when bit 1 is set)
//   5 budget (kBudgets)  4 chunk 1..8  3 capture interval 0..12  2 pre-thinking 0..6
//   1..0 run seed (16 bits)
// Record (kFields bytes, its own FuzzedDataProvider; field k is byte kFields - 1 - k): the
// Field enum below, each field one byte read in full and reduced against the state.
//
// Value fields (mode, arg; ResolveValue):
//   diverge point, user points  anchor = the conversation's history length (its last
//     prompt + outputs), window = the capture interval (the chunk when it is 0): cuts and
//     restore points land on periodic-capture boundaries; from/to = the last prompt's end
//     and the history's end (the frontier node's decode edge).
//   cancel_after                a count of prefill tokens after the cached prefix, so
//     anchor = 0 (the start of the prefill), window = the chunk (cancels at chunk
//     boundaries), no from/to.
// Single-threaded; equal bytes give equal runs.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <limits>
#include <utility>

#include "sim/fuzz_families.h"
#include "sim/replay.h"
#include "sim/request_driver.h"
#include "sim/stack.h"
#include "src/core/check.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

constexpr size_t kHeaderBytes = 10;
constexpr size_t kMaxRecords = 16;
constexpr size_t kConversations = 4;
constexpr int32_t kVocab = 4;  // tokens 1..kVocab
constexpr size_t kTurnMax = 4;
constexpr size_t kOutputsMax = 5;
constexpr size_t kRejectedMax = 3;
// Longer histories restart the conversation: prompts stay <= this many tokens, plans small
// enough for thousands of runs per second under sanitizers.
constexpr int64_t kMaxPromptTokens = 56;

// Tiny budgets (a few KV rows to a few dozen: f32 rows are 64 bytes per KV layer), so most
// session calls evict; 0 (unlimited) once, since it switches the driver from the eviction
// reference to the lock-step reference manager (exact trie, active path and pending).
constexpr std::array<int64_t, 16> kBudgets = {0,    100,  200,  300,  400,  600,  800,  1000,
                                              1300, 1600, 2000, 2500, 3000, 4000, 6000, 8000};
// budget_pct: mostly the run's budget, sometimes pressure (0 %: a budget of exactly 0) or
// headroom.
constexpr std::array<int64_t, 8> kBudgetPcts = {100, 100, 100, 0, 10, 25, 200, 400};

// Record fields, k = byte kFields - 1 - k. Each is one whole byte; how it is reduced:
enum Field : size_t {
  kConversation,  // % kConversations
  kAction,        // % kActions (Action)
  kDivergeMode,   // value field: the diverge cut, in [0, history]
  kDivergeArg,
  kDropped,    // extend with a dropped tail: 1 + byte % outputs tokens
  kTurnCount,  // % (kTurnMax + 1) new tokens ...; (byte / 5) % 8 == 7: an image span
  kTurnToken,  // ... from these kTurnMax fields
  kOutputCount = kTurnToken + kTurnMax,    // 1 + byte % kOutputsMax outputs ...
  kOutputToken,                            // ... from these kOutputsMax fields
  kSchedule = kOutputToken + kOutputsMax,  // % 4 == 0: no SchedulePrefillSnapshots
  kCancel,                                 // % 4 == 0: cancelled ... (else Unforwarded)
  kCancelMode,                             // ... value field: cancel_after, in [0, len]
  kCancelArg,
  kUserCount,  // % 3 user points ...; (byte / 3) % 8 == 7: each 2^32 further
  kUserMode0,  // ... value fields, each in [1, len + 1]
  kUserArg0,
  kUserMode1,
  kUserArg1,
  kSpecStep,       // odd: one speculative step at (byte / 2) % outputs (not when cancelled);
                   // even with (byte / 2) % 4 == 1: an abandoned last step (AddAbandoned)
  kSpecAccepted,   // % (outputs - step) accepted drafts
  kSpecRejected,   // % (kRejectedMax + 1) rejected drafts ...; >= 128: probed first
  kRejectedToken,  // ... from these kRejectedMax fields
  kBudgetPct = kRejectedToken + kRejectedMax,  // kBudgetPcts[byte % 8]; (byte / 8) % 4 == 1:
                                               // kBudgetPcts[byte / 32] after the prefill
  kFields,
};
using Record = std::array<uint8_t, kFields>;

enum class Action : uint8_t { kExtend, kExtendDropped, kDiverge, kNew, kRepeat, kRetry };
constexpr uint8_t kActions = 6;

// Bytes 240..255 are the rare tokens kVocab + 1 .. kVocab + 4: with four tokens no node
// could have more than four children (siblings start with distinct keys), and the
// production trie takes its indexed path only past four.
int32_t TokenOf(uint8_t byte) {
  return byte < 240 ? 1 + byte % kVocab : kVocab + 1 + (byte - 240) % 4;
}

TraceHeader ReadHeader(std::span<const uint8_t> bytes) {
  FuzzedDataProvider fdp(bytes.data(), bytes.size());
  TraceHeader h;
  h.kind = TraceKind::kRequests;
  const std::vector<std::string>& presets = PresetNames();
  h.preset = presets[fdp.ConsumeIntegralInRange<size_t>(0, presets.size() - 1)];
  h.layers = fdp.ConsumeIntegralInRange<int32_t>(1, 4);
  h.window = fdp.ConsumeIntegralInRange<int64_t>(1, 8);
  const uint8_t dtype = fdp.ConsumeIntegral<uint8_t>();  // what ConsumeBool reads, whole
  h.dtype = StackDTypesName(FuzzDTypesOf(dtype));
  h.dims = FuzzDimsOf(dtype);
  h.budget_bytes = kBudgets[fdp.ConsumeIntegralInRange<size_t>(0, kBudgets.size() - 1)];
  h.chunk = fdp.ConsumeIntegralInRange<int64_t>(1, 8);
  h.capture_interval = fdp.ConsumeIntegralInRange<int64_t>(0, 12);
  h.pre_thinking = fdp.ConsumeIntegralInRange<int64_t>(0, 6);
  h.seed = fdp.ConsumeIntegral<uint16_t>();
  h.source = "fuzz target prefix";
  return h;
}

// Turns records into plans, keeping each conversation's last request like RequestWorkload.
class PlanDecoder {
 public:
  explicit PlanDecoder(const TraceHeader& h)
      : chunk_(h.chunk), interval_(h.capture_interval > 0 ? h.capture_interval : h.chunk) {
    // One system prompt shared by every new conversation, from the run seed.
    Rng rng = Rng::Derive(h.seed, "prefix-fuzz-system");
    system_.resize(static_cast<size_t>(rng.Range(3, 8)));
    for (int32_t& t : system_) t = static_cast<int32_t>(rng.Range(1, kVocab));
  }

  RequestPlan Next(const Record& f, int64_t index) {
    RequestPlan plan;
    plan.index = index;
    plan.conversation = static_cast<int32_t>(f[kConversation] % kConversations);
    Conversation& c = conversations_[static_cast<size_t>(plan.conversation)];
    const Action action = ChooseAction(f, c);
    FillInputs(f, c, action, plan);
    for (size_t i = 0; i < 1 + f[kOutputCount] % kOutputsMax; ++i) {
      plan.outputs.push_back(TokenOf(f[kOutputToken + i]));
    }
    AddDecoration(f, c, plan);
    c.started = true;
    c.cancelled = plan.cancel_after_tokens >= 0;
    c.inputs = plan.inputs;
    c.outputs = plan.outputs;
    return plan;
  }

 private:
  struct Conversation {
    bool started = false;
    bool cancelled = false;  // the last request was cancelled (no outputs)
    std::vector<int32_t> inputs, outputs;
    int64_t history() const { return static_cast<int64_t>(inputs.size() + outputs.size()); }
  };

  static Action ChooseAction(const Record& f, const Conversation& c) {
    if (!c.started) return Action::kNew;
    const auto action = static_cast<Action>(f[kAction] % kActions);
    const bool grows =
        action == Action::kExtend || action == Action::kExtendDropped || action == Action::kDiverge;
    if (grows && c.history() + static_cast<int64_t>(kTurnMax) > kMaxPromptTokens) {
      return Action::kNew;
    }
    // Retrying a request that completed is repeating it.
    if (action == Action::kRetry && !c.cancelled) return Action::kRepeat;
    return action;
  }

  static RequestKind KindOf(Action action) {
    switch (action) {
      case Action::kExtend:
      case Action::kExtendDropped:
        return RequestKind::kExtend;
      case Action::kDiverge:
        return RequestKind::kDiverge;
      case Action::kNew:
        return RequestKind::kNew;
      case Action::kRepeat:
        return RequestKind::kRepeat;
      case Action::kRetry:
        return RequestKind::kRetry;
    }
    return RequestKind::kNew;
  }

  // What a history-relative value field resolves against (see the file comment).
  ValueContext HistoryContext(const Conversation& c) const {
    ValueContext v;
    v.anchor = c.history();
    v.window = interval_;
    if (c.started) {
      v.from = static_cast<int64_t>(c.inputs.size());
      v.to = c.history();
    }
    return v;
  }

  void FillInputs(const Record& f, const Conversation& c, Action action, RequestPlan& plan) const {
    plan.kind = KindOf(action);
    std::vector<int32_t> history = c.inputs;
    const auto n = static_cast<int64_t>(c.outputs.size());
    switch (action) {
      case Action::kNew:
        plan.inputs = system_;
        break;
      case Action::kExtend:
      case Action::kExtendDropped:
        plan.dropped = action == Action::kExtendDropped && n > 0 ? 1 + f[kDropped] % n : 0;
        history.insert(history.end(), c.outputs.begin(), c.outputs.end() - plan.dropped);
        plan.inputs = std::move(history);
        break;
      case Action::kDiverge: {
        history.insert(history.end(), c.outputs.begin(), c.outputs.end());
        const int64_t cut = std::clamp<int64_t>(
            ResolveValue(f[kDivergeMode], f[kDivergeArg], HistoryContext(c)), 0, c.history());
        plan.inputs.assign(history.begin(), history.begin() + cut);
        break;
      }
      case Action::kRepeat:
      case Action::kRetry:
        plan.inputs = c.inputs;  // exactly the same prompt
        return;
    }
    // No new tokens is legal (a prompt equal to what the conversation stored), an empty
    // prompt is not.
    const size_t turn = std::max<size_t>(f[kTurnCount] % (kTurnMax + 1), plan.inputs.empty());
    // (byte / 5) % 8 == 7: the turn is an image span instead, every position holding one
    // of two fold values (bit 31 set, spec §3.1 Keys: negative ids), by (byte / 40) % 2.
    const bool media = (f[kTurnCount] / 5) % 8 == 7;
    for (size_t i = 0; i < turn; ++i) {
      plan.inputs.push_back(media ? kExtremeFolds[(f[kTurnCount] / 40) % 2]
                                  : TokenOf(f[kTurnToken + i]));
    }
  }

  void AddDecoration(const Record& f, const Conversation& c, RequestPlan& plan) const {
    const auto len = static_cast<int64_t>(plan.inputs.size());
    plan.schedule = f[kSchedule] % 4 != 0;
    plan.budget_pct = kBudgetPcts[f[kBudgetPct] % kBudgetPcts.size()];
    // The byte's upper bits (the pick reads its low three): one in four moves the budget
    // again after the prefill, inside the open session.
    if ((f[kBudgetPct] / 8) % 4 == 1) {
      plan.budget_pct_after_prefill = kBudgetPcts[(f[kBudgetPct] / 32) % kBudgetPcts.size()];
    }
    const ValueContext history = HistoryContext(c);
    const std::array<std::pair<Field, Field>, 2> users = {
        {{kUserMode0, kUserArg0}, {kUserMode1, kUserArg1}}};
    // Up to len + 1: the manager clips points past the prompt.
    for (size_t i = 0; i < f[kUserCount] % 3u; ++i) {
      const int64_t v = ResolveValue(f[users[i].first], f[users[i].second], history);
      plan.user_offsets.push_back(std::clamp<int64_t>(v, 1, len + 1));
      // (count byte / 3) % 8 == 7: 2^32 further, past every prompt (the manager drops it).
      if ((f[kUserCount] / 3) % 8 == 7) plan.user_offsets.back() += kFarUserPoint;
    }
    if (f[kCancel] % 4 == 0) {
      ValueContext prefill;  // anchor 0: the start of the prefill
      prefill.window = chunk_;
      plan.cancel_after_tokens =
          std::clamp<int64_t>(ResolveValue(f[kCancelMode], f[kCancelArg], prefill), 0, len);
      plan.outputs.clear();  // a cancelled request never decodes, so it samples nothing
      return;
    }
    AddSpeculation(f, plan);
    plan.unforwarded = Unforwarded(f[kCancel], plan);
    AddAbandoned(f, plan);
  }

  // An uncancelled request's RequestPlan::unforwarded from the rest of its cancel byte:
  // (byte / 4) % 8 == 0 forwards the last sampled token too, == 1 reports 2 + (byte / 32)
  // % 3 tokens unforwarded (as many as the outputs and the speculative step leave room
  // for), else the usual 1.
  static int64_t Unforwarded(uint8_t byte, const RequestPlan& plan) {
    if ((byte / 4) % 8 == 0) return 0;
    if ((byte / 4) % 8 != 1) return 1;
    int64_t last_end = 0;
    for (const SpeculativeStep& s : plan.speculation) last_end = std::max(last_end, s.end());
    const auto n = static_cast<int64_t>(plan.outputs.size());
    const int64_t k = std::min({int64_t{2} + (byte / 32) % 3, n, n + 1 - last_end});
    return k >= 2 ? k : 1;
  }

  // One step within the outputs: it samples outputs [step, step + accepted + 1), so
  // accepted < outputs - step. The first rejected draft differs from the bonus token the
  // target samples in its place (else it would have been accepted).
  // Bit 7 of the rejected-count byte (the count reads its low bits) probes the step
  // through isolated wrappers first (SpeculativeStep::probe).
  static void AddSpeculation(const Record& f, RequestPlan& plan) {
    const auto n = static_cast<int64_t>(plan.outputs.size());
    if (f[kSpecStep] % 2 == 0) return;
    SpeculativeStep spec;
    spec.step = (f[kSpecStep] / 2) % n;
    spec.accepted = f[kSpecAccepted] % (n - spec.step);
    const int32_t bonus = plan.outputs[static_cast<size_t>(spec.step + spec.accepted)];
    for (size_t i = 0; i < f[kSpecRejected] % (kRejectedMax + 1); ++i) {
      const int32_t t = TokenOf(f[kRejectedToken + i]);
      spec.rejected.push_back(i == 0 && t == bonus ? bonus % kVocab + 1 : t);
    }
    spec.probe = f[kSpecRejected] >= 128;
    plan.speculation.push_back(std::move(spec));
  }

  // An even step byte, which places no committed step, with (byte / 2) % 4 == 1 ends the
  // decode on an abandoned step (SpeculativeStep::abandoned) when the last sampled token is
  // left unforwarded: its drafts as a committed step's would be, probed by bit 7 as well.
  static void AddAbandoned(const Record& f, RequestPlan& plan) {
    if (f[kSpecStep] % 2 != 0 || (f[kSpecStep] / 2) % 4 != 1 || plan.unforwarded != 1) return;
    SpeculativeStep spec;
    spec.step = plan.decoded_outputs();
    spec.abandoned = true;
    for (size_t i = 0; i < f[kSpecRejected] % (kRejectedMax + 1); ++i) {
      spec.rejected.push_back(TokenOf(f[kRejectedToken + i]));
    }
    spec.probe = f[kSpecRejected] >= 128;
    plan.speculation.push_back(std::move(spec));
  }

  int64_t chunk_, interval_;
  std::vector<int32_t> system_;
  std::array<Conversation, kConversations> conversations_;
};

// The stack the header names; the header comes from ReadHeader, so it is always valid.
StackConfig StackOf(const TraceHeader& h) {
  Result<StackConfig> stack = TraceStack(h);
  KV_CHECK(stack.ok(), stack.status().ToString());
  return *std::move(stack);
}

}  // namespace

FuzzLayout PrefixFuzzLayout() {
  return FuzzLayout{.header_bytes = kHeaderBytes,
                    .record_bytes = kFields,
                    .value_fields = {kDivergeMode, kCancelMode, kUserMode0, kUserMode1},
                    .max_records = kMaxRecords};
}

namespace {

// The records of `parts`, at most `max_records` of them (all with -1); attention re-checked
// by `counts` (null: the first forward of each shape).
FuzzRun RunPrefixFuzzOnce(const FuzzParts& parts, bool audit_every_call, int64_t max_records,
                          ShapeRunCounts* counts, bool record_trace) {
  FuzzRun run;
  run.trace.header = ReadHeader(parts.header);
  const TraceHeader& h = run.trace.header;
  // Built exactly as the replay of the recorded trace builds it (sim/replay.cc).
  RequestDriverOptions options = TraceDriverOptions(h);
  options.audit_every_call = audit_every_call;
  options.shape_run_counts = counts;
  RequestDriver driver(StackOf(h), options, TraceValueSeed(h));
  PlanDecoder decoder(h);
  std::optional<RequestDivergence> divergence;
  for (const std::span<const uint8_t> bytes : parts.records) {  // at most kMaxRecords
    if (max_records >= 0 && run.events >= max_records) break;
    RequestPlan plan = decoder.Next(ReadFields<kFields>(bytes), run.events);
    divergence = driver.Run(plan);
    if (record_trace) run.trace.events.emplace_back(std::move(plan));
    ++run.events;
    if (divergence) break;  // the driver must not be used after a divergence
  }
  if (!divergence) divergence = driver.FinalAudit();
  run.digest = driver.digest();
  run.attention_checks = driver.attention_checks();
  if (!divergence) return run;
  run.divergence = divergence->ToString();
  run.divergence_kind = DivergenceKind(divergence->mismatch.what);
  if (!audit_every_call && divergence->unaudited_calls > 0) {
    // Localized as the replay localizes (sim/replay.cc), so both report the same. The trace
    // stays this run's: its amortized replay must fail too, to localize the same way. Without
    // the counts, which this run has advanced: the re-run checks every forward this one
    // could have.
    const FuzzRun first = RunPrefixFuzzOnce(parts, /*audit_every_call=*/true, run.events,
                                            /*counts=*/nullptr, /*record_trace=*/false);
    KV_CHECK(first.divergence.has_value(),
             "a run auditing every call passed the request at which the amortized one failed");
    run.divergence = *first.divergence + "\n  " +
                     LocalizedNote(divergence->request, divergence->unaudited_calls);
    run.divergence_kind = first.divergence_kind;
  }
  return run;
}

}  // namespace

FuzzRun RunPrefixFuzz(const FuzzParts& parts, ShapeRunCounts& counts, bool record_trace) {
  return RunPrefixFuzzOnce(parts, /*audit_every_call=*/false, -1, &counts, record_trace);
}

}  // namespace kvtwin::sim
