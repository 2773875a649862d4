#include "sim/shrink.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>

#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

class Shrinker {
 public:
  Shrinker(const ShrinkOptions& options, Trace start, ReplayResult first)
      : o_(options), best_(std::move(start)), last_(std::move(first)) {
    kind_ = last_.divergence_kind;
    diverging_ = last_.divergence.has_value();
  }

  ShrinkResult Run(int64_t original_events) {
    // Events after the failing one never ran: drop them before anything else.
    if (diverging_) best_.events.resize(static_cast<size_t>(last_.failing_event + 1));
    for (int round = 0; round < 8 && Budget(); ++round) {
      const int64_t before = replays_accepted_;
      DropEvents();
      DropSequences();
      ShrinkSetup();
      SimplifyEvents();
      MergeTokenValues();
      if (replays_accepted_ == before) break;  // a fixpoint
    }
    ShrinkResult r;
    r.trace = std::move(best_);
    r.last = std::move(last_);
    r.kind = kind_;
    r.replays = replays_;
    r.original_events = original_events;
    return r;
  }

 private:
  bool Budget() const { return replays_ < o_.max_replays; }

  // Accepts `candidate` when it still diverges the same way.
  bool Try(Trace candidate, const char* what) {
    if (!Budget()) return false;
    ++replays_;
    ReplayResult r = o_.replay ? o_.replay(candidate) : ReplayTrace(candidate);
    // A passing input keeps passing candidates (ones that reach the kept claims).
    if (r.input_error || r.divergence.has_value() != diverging_ || r.divergence_kind != kind_ ||
        !r.Reaches(o_.keep_reaches)) {
      return false;
    }
    ++replays_accepted_;
    // The failing event may move earlier: later events are dead weight.
    if (diverging_) candidate.events.resize(static_cast<size_t>(r.failing_event + 1));
    best_ = std::move(candidate);
    last_ = std::move(r);
    if (o_.progress) o_.progress(fmt::format("{}: {} events", what, best_.events.size()));
    return true;
  }

  // ddmin over the event list: chunks of n/2, n/4, ..., 1.
  void DropEvents() {
    for (size_t chunk = std::max<size_t>(1, best_.events.size() / 2);; chunk /= 2) {
      for (size_t start = 0; start < best_.events.size() && Budget();) {
        Trace c = best_;
        const size_t end = std::min(start + chunk, c.events.size());
        c.events.erase(c.events.begin() + static_cast<ptrdiff_t>(start),
                       c.events.begin() + static_cast<ptrdiff_t>(end));
        if (c.events.empty() || !Try(std::move(c), "drop events")) start += chunk;
      }
      if (chunk == 1) break;
    }
  }

  void ShrinkSetup() {
    const TraceHeader h = best_.header;
    if (h.kind == TraceKind::kMultiSeq) {
      ShrinkMultiSeqShape();
      return;
    }
    for (int32_t layers = 1; layers < h.layers; ++layers) {
      Trace c = best_;
      c.header.layers = layers;
      std::erase_if(c.events, [&](const TraceEvent& e) {
        const Op* op = std::get_if<Op>(&e);
        return op != nullptr && op->kind != OpKind::kWrite && op->kind != OpKind::kSpeculate &&
               op->layer >= layers;
      });
      if (!c.events.empty() && Try(std::move(c), "fewer layers")) break;
    }
    for (int64_t w = 1; w < best_.header.window; ++w) {
      Trace c = best_;
      c.header.window = w;
      if (Try(std::move(c), "smaller window")) break;
    }
    if (h.kind != TraceKind::kRequests) return;
    auto set = [&](int64_t TraceHeader::*field, int64_t value, const char* what) {
      if (best_.header.*field == value) return;
      Trace c = best_;
      c.header.*field = value;
      Try(std::move(c), what);
    };
    set(&TraceHeader::capture_interval, 0, "no periodic captures");
    set(&TraceHeader::pre_thinking, 0, "no pre-thinking capture");
    set(&TraceHeader::budget_bytes, 0, "unlimited budget");
  }

  // Tries `edit` on a copy of event i; keeps it when it still diverges.
  template <typename Edit>
  bool TryEvent(size_t i, Edit edit, const char* what) {
    if (i >= best_.events.size()) return false;
    Trace c = best_;
    if (!edit(c.events[i])) return false;  // nothing to change
    return Try(std::move(c), what);
  }

  // ddmin over a vector inside event i (`get` returns it), keeping at least `min_size`.
  template <typename Get>
  void ShrinkList(size_t i, Get get, size_t min_size, const char* what) {
    if (i >= best_.events.size()) return;
    for (size_t chunk = std::max<size_t>(1, get(best_.events[i]).size() / 2);; chunk /= 2) {
      for (size_t start = 0; i < best_.events.size() && start < get(best_.events[i]).size() &&
                             get(best_.events[i]).size() > min_size && Budget();) {
        const bool ok = TryEvent(
            i,
            [&](TraceEvent& e) {
              auto& v = get(e);
              const size_t end = std::min({start + chunk, v.size(), start + v.size() - min_size});
              if (end <= start) return false;
              v.erase(v.begin() + static_cast<ptrdiff_t>(start),
                      v.begin() + static_cast<ptrdiff_t>(end));
              return true;
            },
            what);
        if (!ok) start += chunk;
      }
      if (chunk == 1 || i >= best_.events.size()) break;
    }
  }

  void SimplifyEvents() {
    for (size_t i = 0; i < best_.events.size() && Budget(); ++i) {
      if (std::holds_alternative<RequestPlan>(best_.events[i])) {
        SimplifyRequest(i);
      } else if (std::holds_alternative<MsOp>(best_.events[i])) {
        SimplifyMsOp(i);
      } else {
        SimplifyOp(i);
      }
    }
  }

  static RequestPlan& Plan(TraceEvent& e) { return std::get<RequestPlan>(e); }
  static Op& OpOf(TraceEvent& e) { return std::get<Op>(e); }
  static MsOp& MsOpOf(TraceEvent& e) { return std::get<MsOp>(e); }

  // Multi-sequence traces: every event that involves sequence `seq` loses it (its tokens
  // leave every batch; its copies, removes and probes go), for each sequence in turn; if
  // the failure needs the sequence's copies or edits, then only its tokens leave the
  // batches. A bug between two sequences of eight then shows with two.
  void DropSequences() {
    if (best_.header.kind != TraceKind::kMultiSeq) return;
    for (int32_t seq = best_.header.multiseq.max_seqs - 1; seq >= 0 && Budget(); --seq) {
      if (!TryWithout(seq, /*batches_only=*/false)) TryWithout(seq, /*batches_only=*/true);
    }
  }

  bool TryWithout(int32_t seq, bool batches_only) {
    Trace c = best_;
    bool changed = false;
    std::erase_if(c.events, [&](TraceEvent& e) {
      MsOp& op = MsOpOf(e);
      if (op.kind != MsOpKind::kForward) {
        const bool involved =
            !batches_only && (op.seq == seq || (op.kind == MsOpKind::kCopyPrefix && op.dst == seq));
        changed |= involved;
        return involved;
      }
      const size_t before = op.batch.size();
      std::erase_if(op.batch, [&](const MsBatchToken& t) { return t.seq == seq; });
      if (op.batch.size() == before) return false;
      changed = true;
      op.causal_off.clear();  // indices into the old batch
      return op.batch.empty();
    });
    return changed && !c.events.empty() &&
           Try(std::move(c), batches_only ? "a sequence out of the batches" : "drop a sequence");
  }

  // Smaller cache shapes, one field at a time, each as far down as it still fails (a shape
  // the replay refuses is an input error, so Try rejects it).
  void ShrinkMultiSeqShape() {
    using Field = int64_t MultiSeqConfig::*;
    for (const Field field : {&MultiSeqConfig::kv_cols, &MultiSeqConfig::hidden,
                              &MultiSeqConfig::d_conv, &MultiSeqConfig::padding}) {
      while (Budget() && best_.header.multiseq.*field > 1) {
        Trace c = best_;
        c.header.multiseq.*field /= 2;
        if (!Try(std::move(c), "smaller cache shape")) break;
      }
    }
    while (Budget() && best_.header.multiseq.num_conv_layers > 0) {
      Trace c = best_;
      --c.header.multiseq.num_conv_layers;
      if (!Try(std::move(c), "fewer conv layers")) break;
    }
  }

  // A forward's batch keeps equal tokens per sequence: it shrinks by each sequence's last
  // token at once.
  void ShortenBatch(size_t i) {
    for (int guard = 0; guard < 64 && i < best_.events.size() && Budget(); ++guard) {
      const bool ok = TryEvent(
          i,
          [](TraceEvent& e) {
            MsOp& op = MsOpOf(e);
            if (op.kind != MsOpKind::kForward || op.batch.size() < 2) return false;
            std::map<int32_t, size_t> last;
            for (size_t k = 0; k < op.batch.size(); ++k) last[op.batch[k].seq] = k;
            if (last.size() == op.batch.size()) return false;  // one token per sequence
            std::vector<MsBatchToken> kept;
            for (size_t k = 0; k < op.batch.size(); ++k)
              if (last[op.batch[k].seq] != k) kept.push_back(op.batch[k]);
            op.batch = std::move(kept);
            op.causal_off.clear();
            return true;
          },
          "shorter batch");
      if (!ok) break;
    }
  }

  void SimplifyMsOp(size_t i) {
    ShortenBatch(i);
    TryEvent(
        i, [](TraceEvent& e) { return !std::exchange(MsOpOf(e).causal_off, {}).empty(); },
        "causal forward");
    TryEvent(
        i, [](TraceEvent& e) { return std::exchange(MsOpOf(e).reserve, false); }, "no reserve");
    // Each edit between StartForward and Put, last first (indices below stay put).
    for (size_t k = MsOpOf(best_.events[i]).edits.size(); k-- > 0;) {
      TryEvent(
          i,
          [k](TraceEvent& e) {
            std::vector<MsOp>& edits = MsOpOf(e).edits;
            if (k >= edits.size()) return false;
            edits.erase(edits.begin() + static_cast<std::ptrdiff_t>(k));
            return true;
          },
          "one edit fewer");
    }
  }

  void SimplifyRequest(size_t i) {
    SimplifySpeculation(i);
    // A cancelled request without outputs stays cancelled: an uncancelled one needs one.
    TryEvent(
        i,
        [](TraceEvent& e) {
          RequestPlan& p = Plan(e);
          if (p.cancel_after_tokens < 0 || p.outputs.empty()) return false;
          p.cancel_after_tokens = -1;
          return true;
        },
        "no cancel");
    TryEvent(
        i, [](TraceEvent& e) { return !std::exchange(Plan(e).user_offsets, {}).empty(); },
        "no user points");
    TryEvent(
        i, [](TraceEvent& e) { return !std::exchange(Plan(e).schedule, true); },
        "default captures");
    TryEvent(
        i, [](TraceEvent& e) { return std::exchange(Plan(e).budget_pct, 100) != 100; },
        "run budget");
    TryEvent(
        i, [](TraceEvent& e) { return std::exchange(Plan(e).budget_pct_after_prefill, -1) >= 0; },
        "no budget change after the prefill");
    TryEvent(
        i, [](TraceEvent& e) { return std::exchange(Plan(e).unforwarded, 1) != 1; },
        "last output unforwarded");
    ShrinkList(
        i, [](TraceEvent& e) -> std::vector<int32_t>& { return Plan(e).inputs; }, 1,
        "shorter prompt");
    if (i < best_.events.size()) {
      ShrinkList(
          i, [](TraceEvent& e) -> std::vector<int32_t>& { return Plan(e).outputs; },
          MinOutputs(Plan(best_.events[i])), "fewer outputs");
    }
  }

  // Every step at once, then one step at a time while two or more are left (dropping the
  // last one is what "no speculation" tried); what is left stays sorted and apart.
  void SimplifySpeculation(size_t i) {
    if (TryEvent(
            i, [](TraceEvent& e) { return !std::exchange(Plan(e).speculation, {}).empty(); },
            "no speculation")) {
      return;
    }
    auto steps = [&] {
      return i < best_.events.size() ? Plan(best_.events[i]).speculation.size() : size_t{0};
    };
    for (size_t k = 0; k < steps() && steps() >= 2 && Budget();) {
      const bool ok = TryEvent(
          i,
          [k](TraceEvent& e) {
            std::vector<SpeculativeStep>& spec = Plan(e).speculation;
            spec.erase(spec.begin() + static_cast<ptrdiff_t>(k));
            return true;
          },
          "one speculative step fewer");
      if (!ok) ++k;
    }
  }

  // The outputs a request must keep: what its speculative steps sample (a speculative step
  // reports outputs up to its end) and the unforwarded ones past them, at least one unless
  // it is cancelled (no decode at all).
  static size_t MinOutputs(const RequestPlan& plan) {
    int64_t min = plan.cancel_after_tokens >= 0 ? 0 : 1;
    for (const SpeculativeStep& s : plan.speculation) min = std::max(min, s.end());
    if (plan.cancel_after_tokens < 0) {
      min = std::max(min + std::max<int64_t>(plan.unforwarded, 1) - 1, plan.unforwarded);
    }
    return static_cast<size_t>(min);
  }

  void SimplifyOp(size_t i) {
    const OpKind kind = OpOf(best_.events[i]).kind;
    if (kind == OpKind::kWrite || kind == OpKind::kSpeculate) {
      ShrinkList(
          i, [](TraceEvent& e) -> std::vector<int32_t>& { return OpOf(e).tokens; },
          kind == OpKind::kWrite ? 1 : 2, "shorter forward");
    }
    // A write of padding alone keeps its padding (without it, it would forward nothing).
    TryEvent(
        i,
        [](TraceEvent& e) { return !OpOf(e).tokens.empty() && std::exchange(OpOf(e).pad, 0) != 0; },
        "no padding");
    TryEvent(
        i, [](TraceEvent& e) { return std::exchange(OpOf(e).segmented, false); },
        "plain recurrent form");
    TryEvent(
        i, [](TraceEvent& e) { return std::exchange(OpOf(e).isolated, false); },
        "committed speculation");
    TryEvent(
        i, [](TraceEvent& e) { return std::exchange(OpOf(e).abandon_after, -1) != -1; },
        "speculation run to its commit");
    // A mask holding both rectangles first loses one of them.
    TryEvent(
        i,
        [](TraceEvent& e) {
          Op& op = OpOf(e);
          if (!HasBlockRect(op.mask)) return false;
          op.mask = MaskForm::kRelax;
          op.block = MaskRect{};
          return true;
        },
        "relaxed mask without the block");
    TryEvent(
        i,
        [](TraceEvent& e) {
          Op& op = OpOf(e);
          if (!HasBlockRect(op.mask)) return false;
          op.mask = MaskForm::kBlock;
          op.rect = std::exchange(op.block, MaskRect{});
          return true;
        },
        "blocked mask without the relaxation");
    TryEvent(
        i,
        [](TraceEvent& e) {
          Op& op = OpOf(e);
          if (op.mask == MaskForm::kCausal) return false;
          op.mask = MaskForm::kCausal;
          op.rect = op.block = MaskRect{};
          return true;
        },
        "causal mask");
    if (kind == OpKind::kPrepare) {
      ShrinkList(
          i, [](TraceEvent& e) -> std::vector<int64_t>& { return OpOf(e).offsets; }, 0,
          "fewer capture offsets");
    }
    // Snapshot from, restore target, split at, accepted drafts: toward 0, halving.
    if (kind == OpKind::kSnapshot || kind == OpKind::kRestore || kind == OpKind::kSplit ||
        kind == OpKind::kSpeculate) {
      for (int guard = 0; guard < 64 && i < best_.events.size(); ++guard) {
        const bool ok = TryEvent(
            i,
            [](TraceEvent& e) {
              int64_t& v = OpOf(e).value;
              if (v == 0) return false;
              v = v / 2;
              return true;
            },
            "smaller value");
        if (!ok) break;
      }
    }
  }

  // Null for multi-sequence ops: their tokens are left as they are.
  static std::vector<int32_t>* TokensOf(TraceEvent& e) {
    if (auto* p = std::get_if<RequestPlan>(&e)) return &p->inputs;
    if (auto* op = std::get_if<Op>(&e)) return &op->tokens;
    return nullptr;
  }

  // Replaces every occurrence of a token value by a smaller value already in use (or 1),
  // largest values first; prompts that shared a prefix keep sharing it.
  void MergeTokenValues() {
    std::map<int32_t, int64_t> uses;
    if (best_.header.kind == TraceKind::kMultiSeq) return;
    for (TraceEvent& e : best_.events) {
      for (const int32_t t : *TokensOf(e)) ++uses[t];
      if (auto* p = std::get_if<RequestPlan>(&e)) {
        for (const int32_t t : p->outputs) ++uses[t];
      }
    }
    std::vector<int32_t> values;
    for (const auto& [v, n] : uses) values.push_back(v);
    for (size_t k = values.size(); k-- > 0 && Budget();) {
      const int32_t from = values[k];
      for (const int32_t to : {1, k > 0 ? values[0] : 1}) {
        if (to >= from) continue;
        Trace c = best_;
        for (TraceEvent& e : c.events) {
          std::ranges::replace(*TokensOf(e), from, to);
          if (auto* p = std::get_if<RequestPlan>(&e)) std::ranges::replace(p->outputs, from, to);
        }
        if (Try(std::move(c), "smaller token values")) break;
      }
    }
  }

  const ShrinkOptions& o_;
  Trace best_;
  ReplayResult last_;
  std::string kind_;
  bool diverging_ = true;  // false: a passing input shrunk to its kept claims
  int64_t replays_ = 0;
  int64_t replays_accepted_ = 0;
};

}  // namespace

ShrinkResult Shrink(const Trace& given, const ShrinkOptions& options) {
  // The input's own reach claims are about the input: a candidate short of them would be
  // "unreached", neither a pass nor a divergence. The kept claims are options.keep_reaches.
  Trace trace = given;
  trace.header.reaches.clear();
  ReplayResult first = options.replay ? options.replay(trace) : ReplayTrace(trace);
  KV_CHECK(first.divergence.has_value() || (first.passed() && !options.keep_reaches.empty()),
           "Shrink needs a diverging trace, or a passing one and claims to keep");
  KV_CHECK(first.Reaches(options.keep_reaches), "Shrink needs a trace that meets its kept claims");
  Shrinker s(options, trace, std::move(first));
  return s.Run(static_cast<int64_t>(trace.events.size()));
}

std::string GtestSnippet(const std::string& path, const std::string& test_name) {
  return fmt::format(
      "// Replays the minimized trace; it must pass now that the bug is fixed.\n"
      "TEST(Regress, {}) {{\n"
      "  const kvtwin::sim::ReplayResult r = kvtwin::sim::ReplayFile(\"{}\", {{}});\n"
      "  EXPECT_TRUE(r.passed()) << r.verdict() << \"\\n\" << r.detail();\n"
      "}}\n",
      test_name, path);
}

}  // namespace kvtwin::sim
