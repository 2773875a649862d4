// Trace format v1, reading (sim/trace.h; writing is in trace_write.cc). Each line is parsed
// on its own and decoded field by field into a TraceHeader, RequestPlan, Op or MsOp (kind
// "multiseq": trace_multiseq.cc; shared helpers: trace_json.h), with every
// type and range a replay relies on checked here, so a malformed trace becomes one
// InvalidArgument "FILE:LINE: /pointer: reason" instead of a KV_CHECK abort deep in a
// driver. Fields of an object are checked in a fixed order (unknown keys first, in key
// order), so the reported problem is the same on every run.
#include "sim/trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string_view>

#include "sim/request_driver.h"
#include "sim/stack.h"
#include "sim/trace_json.h"

namespace kvtwin::sim {
namespace {

using trace_json::DecodeInt;
using trace_json::DecodeInts;
using trace_json::DecodeMsOp;
using trace_json::DecodeMultiSeq;
using trace_json::Expected;
using trace_json::Fields;
using trace_json::Json;
using trace_json::Keys;
using trace_json::kMaxInt32;
using trace_json::kMaxLength;
using trace_json::Need;
using trace_json::Quote;
using trace_json::Where;

// StackConfig::Validate's limit; checked here before StackFromPreset builds the layers.
constexpr int64_t kMaxLayers = 127;
// budget x budget_pct / 100 must not overflow in the request driver.
constexpr int64_t kMaxBudgetBytes = int64_t{1} << 48;
constexpr int64_t kMaxBudgetPct = 10000;

Status ParseLine(const Where& w, const std::string& text, Json* out) {
  // Parsed with exceptions, caught here and turned into the one-line error: nlohmann
  // throws out_of_range for a number beyond a double ("1e99999") even with
  // allow_exceptions=false (found by the trace_reader fuzz target; the input is in
  // fuzz/corpus/trace_reader/number-overflow).
  try {
    *out = Json::parse(text);
    return Status::Ok();
  } catch (const Json::exception& e) {
    std::string what = e.what();
    const size_t at = what.find("at line 1, ");
    if (at != std::string::npos) what = what.substr(at + 11);
    if (what.size() > 200) what = what.substr(0, 200) + "...";
    return w.Error("", "not JSON: " + what);
  }
}

const char* ReadError() { return errno != 0 ? std::strerror(errno) : "unknown error"; }

bool IsBlank(const std::string& text) { return text.find_first_not_of(" \t\r") == text.npos; }

// ---- Header ----

// The model's "kv" and "recurrent" (each optional, every field required when present);
// ModelDims' verdict on each part is reported at its object.
Status DecodeDims(const Fields& m, ModelDims* dims) {
  const Json* kv = nullptr;
  KV_RETURN_IF_ERROR(m.Object("kv", &kv, Need::kOptional));
  if (kv != nullptr) {
    const Fields k(m.where(), *kv, m.Ptr("kv"));
    static constexpr std::string_view kKvKeys[] = {"head_dim", "heads", "value_dim"};
    KV_RETURN_IF_ERROR(k.OnlyKeys(kKvKeys));
    KV_RETURN_IF_ERROR(k.Int("heads", 1, kMaxHeads, &dims->kv_heads, Need::kRequired));
    KV_RETURN_IF_ERROR(k.Int("head_dim", 1, kMaxHeadWidth, &dims->head_dim, Need::kRequired));
    KV_RETURN_IF_ERROR(k.Int("value_dim", 0, kMaxHeadWidth, &dims->value_dim, Need::kRequired));
  }
  const Json* rec = nullptr;
  KV_RETURN_IF_ERROR(m.Object("recurrent", &rec, Need::kOptional));
  if (rec != nullptr) {
    const Fields r(m.where(), *rec, m.Ptr("recurrent"));
    static constexpr std::string_view kRecKeys[] = {"conv_tail", "head_k_dim", "head_v_dim",
                                                    "num_k_heads", "num_v_heads"};
    KV_RETURN_IF_ERROR(r.OnlyKeys(kRecKeys));
    RecurrentDims& d = dims->recurrent;
    KV_RETURN_IF_ERROR(r.Int("conv_tail", 0, kMaxConvTail, &d.conv_tail, Need::kRequired));
    KV_RETURN_IF_ERROR(r.Int("num_k_heads", 1, kMaxHeads, &d.num_k_heads, Need::kRequired));
    KV_RETURN_IF_ERROR(r.Int("num_v_heads", 1, kMaxHeads, &d.num_v_heads, Need::kRequired));
    KV_RETURN_IF_ERROR(r.Int("head_k_dim", 1, kMaxHeadWidth, &d.head_k_dim, Need::kRequired));
    KV_RETURN_IF_ERROR(r.Int("head_v_dim", 1, kMaxHeadWidth, &d.head_v_dim, Need::kRequired));
  }
  if (const Status kv_ok = dims->ValidateKv(); !kv_ok.ok()) return m.Error("kv", kv_ok.message());
  const Status rec_ok = dims->ValidateRecurrent();
  return rec_ok.ok() ? rec_ok : m.Error("recurrent", rec_ok.message());
}

Status DecodeModel(const Fields& f, TraceHeader* h) {
  const Json* model = nullptr;
  KV_RETURN_IF_ERROR(f.Object("model", &model, Need::kRequired));
  const Fields m(f.where(), *model, f.Ptr("model"));
  static constexpr std::string_view kKeys[] = {"dtype",  "kv",        "layers",
                                               "preset", "recurrent", "window"};
  KV_RETURN_IF_ERROR(m.OnlyKeys(kKeys));
  KV_RETURN_IF_ERROR(m.String("dtype", &h->dtype, Need::kRequired));
  const Result<StackDTypes> dtype = ParseStackDTypes(h->dtype);
  if (!dtype.ok()) return m.Error("dtype", dtype.status().message());
  KV_RETURN_IF_ERROR(m.Int("layers", 1, kMaxLayers, &h->layers, Need::kRequired));
  KV_RETURN_IF_ERROR(m.String("preset", &h->preset, Need::kRequired));
  // Stateless layers (the "holey" preset) exist only at the request level.
  const std::vector<std::string> presets = AcceptedPresetNames(h->kind == TraceKind::kRequests);
  if (std::find(presets.begin(), presets.end(), h->preset) == presets.end()) {
    return m.Error("preset", fmt::format("unknown preset {} (expected one of {})", Quote(h->preset),
                                         fmt::join(presets, ", ")));
  }
  KV_RETURN_IF_ERROR(m.Length("window", 1, &h->window, Need::kRequired));
  KV_RETURN_IF_ERROR(DecodeDims(m, &h->dims));
  // Whatever else the stack itself refuses, reported before any replay starts.
  const Result<StackConfig> stack =
      StackFromPreset(h->preset, h->layers, h->window, *dtype, h->dims);
  if (!stack.ok()) return f.Error("model", stack.status().message());
  return Status::Ok();
}

// Characters as JSON Schema's maxLength counts them: code points (UTF-8 lead bytes).
size_t CodePoints(std::string_view s) {
  return static_cast<size_t>(std::ranges::count_if(
      s, [](const char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

// "pass" or "divergence: KIND"; "" is the default (no expectation). The kind is not
// checked against the known mismatches: new checks bring new kinds.
Status DecodeExpect(const Fields& f, TraceHeader* h) {
  KV_RETURN_IF_ERROR(f.String("expect", &h->expect, Need::kOptional));
  const std::string& e = h->expect;
  const size_t chars = CodePoints(e);
  if (chars > kExpectMaxChars) {
    return f.Error("expect",
                   fmt::format("too long: {} characters (at most {})", chars, kExpectMaxChars));
  }
  const bool divergence =
      e.starts_with(kExpectDivergencePrefix) && e.size() > kExpectDivergencePrefix.size();
  if (e.empty() || e == kExpectPass || divergence) return Status::Ok();
  return f.Error("expect", fmt::format("expected \"pass\" or \"divergence: KIND\", got {}",
                                       Quote(e.size() > 60 ? e.substr(0, 60) + "..." : e)));
}

std::string UnknownCounter(TraceKind kind) {
  return fmt::format("unknown coverage counter of a \"{}\" trace (expected one of {})",
                     kind == TraceKind::kMultiSeq ? "multiseq" : "requests",
                     fmt::join(ReachCounterNames(kind), ", "));
}

// "reaches": {"COUNTER": N, ...}, N in [1, kMaxReachClaim]. An ops trace has no driver
// coverage (its events are the ops themselves), and a trace that documents a divergence is
// not replayed to its end, so neither may claim a reach.
Status DecodeReaches(const Fields& f, TraceHeader* h) {
  const Json* reaches = nullptr;
  KV_RETURN_IF_ERROR(f.Object("reaches", &reaches, Need::kOptional));
  if (reaches == nullptr) return Status::Ok();
  if (h->kind == TraceKind::kOps) {
    return f.Error("reaches", "only allowed in a \"requests\" or \"multiseq\" trace");
  }
  if (h->expect.starts_with(kExpectDivergencePrefix)) {
    return f.Error("reaches", "not allowed with a \"divergence: ...\" expectation");
  }
  if (reaches->empty()) return f.Error("reaches", "names no counter (leave it out instead)");
  const Fields r(f.where(), *reaches, f.Ptr("reaches"));
  const std::vector<std::string> counters = ReachCounterNames(h->kind);
  for (auto it = reaches->begin(); it != reaches->end(); ++it) {
    if (std::find(counters.begin(), counters.end(), it.key()) == counters.end()) {
      return r.Error(it.key(), UnknownCounter(h->kind));
    }
    ReachClaim claim{it.key(), 0};
    KV_RETURN_IF_ERROR(r.Int(it.key(), 1, kMaxReachClaim, &claim.at_least, Need::kRequired));
    h->reaches.push_back(std::move(claim));
  }
  return Status::Ok();
}

// The header keys of one kind only, reported like an ops header's request fields.
Status CheckKindKeys(const Fields& f, TraceKind kind) {
  static constexpr std::string_view kNotMultiSeq[] = {"budget", "capture_interval", "chunk",
                                                      "model", "pre_thinking"};
  static constexpr std::string_view kMultiSeqOnly[] = {"conv", "multiseq"};
  if (kind == TraceKind::kMultiSeq) {
    for (const std::string_view key : kNotMultiSeq) {
      if (f.Has(key)) return f.Error(key, "not allowed in a \"multiseq\" trace");
    }
    return Status::Ok();
  }
  for (const std::string_view key : kMultiSeqOnly) {
    if (f.Has(key)) return f.Error(key, "only allowed in a \"multiseq\" trace");
  }
  return Status::Ok();
}

// Required in a requests header so the replay's driver options are explicit.
Status DecodeDriverOptions(const Fields& f, TraceHeader* h) {
  static constexpr std::string_view kRequestOnly[] = {"budget", "capture_interval", "chunk",
                                                      "pre_thinking"};
  if (h->kind == TraceKind::kMultiSeq) return Status::Ok();  // CheckKindKeys refused them
  if (h->kind == TraceKind::kOps) {
    for (const std::string_view key : kRequestOnly) {
      if (f.Has(key)) return f.Error(key, "only allowed in a \"requests\" trace");
    }
    return Status::Ok();
  }
  KV_RETURN_IF_ERROR(f.Int("budget", 0, kMaxBudgetBytes, &h->budget_bytes, Need::kRequired));
  KV_RETURN_IF_ERROR(f.Length("capture_interval", 0, &h->capture_interval, Need::kRequired));
  KV_RETURN_IF_ERROR(f.Length("chunk", 1, &h->chunk, Need::kRequired));
  return f.Length("pre_thinking", 0, &h->pre_thinking, Need::kRequired);
}

// "format" and "version" come first: a file of another kind or version says so, rather
// than failing on whichever field happens to differ.
Status DecodeHeader(const Where& w, const Json& j, TraceHeader* h) {
  if (!j.is_object()) return w.Error("", Expected("an object", j));
  const Fields f(w, j, "");
  const Json* format = f.Find("format");
  if (format == nullptr || !format->is_string() || *format != kTraceFormat) {
    return f.Error("format", "not a kvtwin trace");
  }
  int64_t version = 0;
  KV_RETURN_IF_ERROR(f.Int("version", std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max(), &version, Need::kRequired));
  if (version != kTraceVersion) {
    return f.Error("version", fmt::format("unsupported version {} (this kvtwin reads version {})",
                                          version, kTraceVersion));
  }
  std::string kind;
  KV_RETURN_IF_ERROR(f.String("kind", &kind, Need::kRequired));
  if (kind != "requests" && kind != "ops" && kind != "multiseq") {
    return f.Error("kind", fmt::format("unknown trace kind {} (expected \"requests\", \"ops\" or "
                                       "\"multiseq\")",
                                       Quote(kind)));
  }
  h->kind = kind == "ops"        ? TraceKind::kOps
            : kind == "multiseq" ? TraceKind::kMultiSeq
                                 : TraceKind::kRequests;
  static constexpr std::string_view kKeys[] = {
      "budget", "capture_interval", "chunk",        "conv",    "expect", "format", "kind",
      "model",  "multiseq",         "pre_thinking", "reaches", "seed",   "source", "version"};
  KV_RETURN_IF_ERROR(f.OnlyKeys(kKeys));
  KV_RETURN_IF_ERROR(CheckKindKeys(f, h->kind));
  const Json* seed = f.Find("seed");
  if (seed == nullptr) return f.Error("seed", "missing required field");
  if (!seed->is_number_unsigned()) {
    return f.Error("seed", seed->is_number_integer() ? "must be >= 0, got " + seed->dump()
                                                     : Expected("an integer", *seed));
  }
  h->seed = seed->get<uint64_t>();
  KV_RETURN_IF_ERROR(h->kind == TraceKind::kMultiSeq ? DecodeMultiSeq(f, h) : DecodeModel(f, h));
  KV_RETURN_IF_ERROR(f.String("source", &h->source, Need::kOptional));
  KV_RETURN_IF_ERROR(DecodeExpect(f, h));
  KV_RETURN_IF_ERROR(DecodeReaches(f, h));
  return DecodeDriverOptions(f, h);
}

// ---- Requests ----

// "inputs", or "blocks" + "block_len" + "prompt_len" expanded through BlockTokens.
Status DecodePrompt(const Fields& f, std::vector<int32_t>* inputs) {
  static constexpr std::string_view kBlockKeys[] = {"blocks", "block_len", "prompt_len"};
  if (f.Has("inputs")) {
    for (const std::string_view key : kBlockKeys) {
      if (f.Has(key)) return f.Error(key, "not allowed with \"inputs\"");
    }
    // A negative id is an effective token with bit 31 set: a position of a media span
    // holding its fold value (spec §3.1 Keys). Outputs and drafts are sampled text, never media.
    return f.Ints("inputs", std::numeric_limits<int32_t>::min(), kMaxInt32, 1, inputs,
                  Need::kRequired);
  }
  if (!f.Has("blocks")) return f.Error("inputs", "missing required field (or \"blocks\")");
  std::vector<int64_t> blocks;
  int64_t block_len = 0, prompt_len = 0;
  KV_RETURN_IF_ERROR(
      f.Ints("blocks", 0, std::numeric_limits<int64_t>::max(), 1, &blocks, Need::kRequired));
  KV_RETURN_IF_ERROR(f.Length("block_len", 1, &block_len, Need::kRequired));
  KV_RETURN_IF_ERROR(f.Length("prompt_len", 1, &prompt_len, Need::kRequired));
  const auto n = static_cast<int64_t>(blocks.size());
  const int64_t last = prompt_len - block_len * (n - 1);
  if (last < 1 || last > block_len) {
    return f.Error("prompt_len",
                   fmt::format("{} blocks of {} tokens hold {}..{} tokens, not {}", n, block_len,
                               block_len * (n - 1) + 1, block_len * n, prompt_len));
  }
  inputs->clear();
  inputs->reserve(static_cast<size_t>(prompt_len));
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int32_t> tokens =
        BlockTokens(blocks[static_cast<size_t>(i)], i + 1 < n ? block_len : last);
    inputs->insert(inputs->end(), tokens.begin(), tokens.end());
  }
  return Status::Ok();
}

// "outputs", or "output_len" expanded through GeneratedTokens of the request's index. At
// least one unless the request is cancelled: a cancelled request never decodes, so it may
// have none (both absent, an empty "outputs" or "output_len" 0).
Status DecodeOutputs(const Fields& f, int64_t index, bool cancelled,
                     std::vector<int32_t>* outputs) {
  const size_t min = cancelled ? 0 : 1;
  if (f.Has("outputs")) {
    if (f.Has("output_len")) return f.Error("output_len", "not allowed with \"outputs\"");
    const Json& v = *f.Find("outputs");
    if (!cancelled && v.is_array() && v.empty()) {
      return f.Error("outputs",
                     "must not be empty (only a request with \"cancel_after\" may "
                     "have no outputs)");
    }
    return f.Ints("outputs", 0, kMaxInt32, min, outputs, Need::kRequired);
  }
  if (!f.Has("output_len")) {
    if (cancelled) return Status::Ok();
    return f.Error("outputs", "missing required field (or \"output_len\")");
  }
  int64_t n = 0;
  KV_RETURN_IF_ERROR(f.Length("output_len", static_cast<int64_t>(min), &n, Need::kRequired));
  *outputs = GeneratedTokens(index, n);
  return Status::Ok();
}

// One step of "speculation" (at `ptr`): its fields, then its place among the steps. The
// step must fit the decode (request_session.cc Decode): it forwards at step `step` and
// reports outputs [step, step + accepted + 1) as sampled, so all of them must exist, and the
// next step can start only after them. `rejected` may be empty (every draft accepted, or
// none drafted). `previous`: the step before (null for the first). `outputs`: what the
// decode forwards sample (RequestPlan::decoded_outputs), `unforwarded` how many of the
// outputs are never forwarded.
Status DecodeStep(const Fields& f, const Json& v, const std::string& ptr,
                  const SpeculativeStep* previous, int64_t outputs, int64_t unforwarded,
                  SpeculativeStep* step) {
  if (!v.is_object()) return f.where().Error(ptr, Expected("an object", v));
  const Fields s(f.where(), v, ptr);
  static constexpr std::string_view kKeys[] = {"abandoned", "accepted", "probe", "rejected",
                                               "step"};
  KV_RETURN_IF_ERROR(s.OnlyKeys(kKeys));
  KV_RETURN_IF_ERROR(s.Length("accepted", 0, &step->accepted, Need::kRequired));
  KV_RETURN_IF_ERROR(s.Ints("rejected", 0, kMaxInt32, 0, &step->rejected, Need::kRequired));
  KV_RETURN_IF_ERROR(s.Length("step", 0, &step->step, Need::kRequired));
  KV_RETURN_IF_ERROR(s.Bool("probe", &step->probe, Need::kOptional));
  KV_RETURN_IF_ERROR(s.Bool("abandoned", &step->abandoned, Need::kOptional));
  if (previous != nullptr && step->step <= previous->step) {
    return s.Error("step", fmt::format("steps must be sorted: step {} after step {}", step->step,
                                       previous->step));
  }
  if (previous != nullptr && step->step < previous->end()) {
    return s.Error("step",
                   fmt::format("step {} overlaps the previous step, which samples up to "
                               "step {} + accepted {} + 1 = {}",
                               step->step, previous->step, previous->accepted, previous->end()));
  }
  if (step->abandoned) {
    // It forwards the last sampled token, which a decode with "unforwarded" 1 leaves
    // unforwarded, and rolls back; it samples nothing, so no draft of it is accepted.
    if (step->accepted != 0) {
      return s.Error("accepted",
                     fmt::format("an abandoned step accepts nothing, got {}", step->accepted));
    }
    if (unforwarded != 1) {
      return s.Error("abandoned", fmt::format("needs \"unforwarded\" 1 (the last sampled token "
                                              "left for the step to forward), got {}",
                                              unforwarded));
    }
    if (step->step != outputs) {
      return s.Error("step", fmt::format("an abandoned step comes at the forward of the last "
                                         "sampled token, step {}, got {}",
                                         outputs, step->step));
    }
    return Status::Ok();
  }
  if (step->step >= outputs) {
    return s.Error("step",
                   fmt::format("step {} is past the last of the {} outputs", step->step, outputs));
  }
  if (step->end() > outputs) {
    const std::string decoded =
        unforwarded >= 2 ? fmt::format(" the decode samples (\"unforwarded\" is {})", unforwarded)
                         : std::string();
    return s.Error("accepted", fmt::format("step {} + accepted {} + 1 exceeds the {} outputs{}",
                                           step->step, step->accepted, outputs, decoded));
  }
  return Status::Ok();
}

// An empty array is the default (no speculation), allowed with "cancel_after" too.
Status DecodeSpeculation(const Fields& f, RequestPlan* plan) {
  const Json* v = f.Find("speculation");
  if (v == nullptr) return Status::Ok();
  if (!v->is_array()) return f.Error("speculation", Expected("an array", *v));
  if (v->size() > static_cast<size_t>(kMaxLength)) {
    return f.Error("speculation",
                   fmt::format("too long: {} entries (at most {})", v->size(), kMaxLength));
  }
  if (!v->empty() && plan->cancel_after_tokens >= 0) {
    return f.Error("speculation",
                   "not allowed with \"cancel_after\" (a cancelled request has no decode)");
  }
  const int64_t n = plan->decoded_outputs();
  std::vector<SpeculativeStep>& steps = plan->speculation;
  steps.clear();
  for (size_t k = 0; k < v->size(); ++k) {
    SpeculativeStep step;
    const std::string ptr = fmt::format("{}/{}", f.Ptr("speculation"), k);
    // Any step after one would also fail the order checks below; this says why.
    if (!steps.empty() && steps.back().abandoned) {
      return f.where().Error(ptr, "a step after an abandoned one (the decode ends there)");
    }
    KV_RETURN_IF_ERROR(DecodeStep(f, (*v)[k], ptr, steps.empty() ? nullptr : &steps.back(), n,
                                  plan->unforwarded, &step));
    steps.push_back(std::move(step));
  }
  return Status::Ok();
}

// 1 unless given: the last sampled token is not forwarded. A cancelled request has no
// decode, so only the default; otherwise up to every output.
Status DecodeUnforwarded(const Fields& f, RequestPlan* plan) {
  if (!f.Has("unforwarded")) return Status::Ok();
  if (plan->cancel_after_tokens >= 0) {
    return f.Error("unforwarded",
                   "not allowed with \"cancel_after\" (a cancelled request has no decode)");
  }
  KV_RETURN_IF_ERROR(f.Length("unforwarded", 0, &plan->unforwarded, Need::kRequired));
  const auto n = static_cast<int64_t>(plan->outputs.size());
  if (plan->unforwarded > n) {
    return f.Error("unforwarded", fmt::format("{} exceeds the {} outputs", plan->unforwarded, n));
  }
  return Status::Ok();
}

Status DecodeRequestKind(const Fields& f, RequestKind* kind) {
  std::string name = "new";
  KV_RETURN_IF_ERROR(f.String("request_kind", &name, Need::kOptional));
  for (const RequestKind k : {RequestKind::kNew, RequestKind::kExtend, RequestKind::kDiverge,
                              RequestKind::kRepeat, RequestKind::kRetry}) {
    if (name == RequestKindName(k)) {
      *kind = k;
      return Status::Ok();
    }
  }
  return f.Error("request_kind",
                 fmt::format("unknown request kind {} (expected new, extend, diverge, repeat or "
                             "retry)",
                             Quote(name)));
}

Status DecodeRequest(const Where& w, const Json& j, int64_t index, RequestPlan* plan) {
  const Fields f(w, j, "");
  if (f.Has("op")) return f.Error("op", "an op event in a \"requests\" trace");
  static constexpr std::string_view kKeys[] = {
      "block_len",    "blocks",       "budget_pct",  "budget_pct_after_prefill",
      "cancel_after", "conversation", "dropped",     "inputs",
      "output_len",   "outputs",      "prompt_len",  "request_kind",
      "schedule",     "speculation",  "unforwarded", "user_points"};
  KV_RETURN_IF_ERROR(f.OnlyKeys(kKeys));
  plan->index = index;
  KV_RETURN_IF_ERROR(DecodePrompt(f, &plan->inputs));
  // Before the outputs: whether the request may have none depends on it.
  KV_RETURN_IF_ERROR(f.Length("cancel_after", 0, &plan->cancel_after_tokens, Need::kOptional));
  KV_RETURN_IF_ERROR(DecodeOutputs(f, index, plan->cancel_after_tokens >= 0, &plan->outputs));
  KV_RETURN_IF_ERROR(f.Int("budget_pct", 0, kMaxBudgetPct, &plan->budget_pct, Need::kOptional));
  KV_RETURN_IF_ERROR(f.Int("budget_pct_after_prefill", 0, kMaxBudgetPct,
                           &plan->budget_pct_after_prefill, Need::kOptional));
  KV_RETURN_IF_ERROR(f.Int("conversation", 0, kMaxInt32, &plan->conversation, Need::kOptional));
  KV_RETURN_IF_ERROR(f.Length("dropped", 0, &plan->dropped, Need::kOptional));
  KV_RETURN_IF_ERROR(DecodeRequestKind(f, &plan->kind));
  KV_RETURN_IF_ERROR(f.Bool("schedule", &plan->schedule, Need::kOptional));
  KV_RETURN_IF_ERROR(DecodeUnforwarded(f, plan));
  KV_RETURN_IF_ERROR(DecodeSpeculation(f, plan));
  // Any int64: the manager drops a point outside (cached, len] (spec §3.4), so one far
  // past the prompt (or at or below 0) is a legal request that schedules nothing.
  return f.Ints("user_points", std::numeric_limits<int64_t>::min(),
                std::numeric_limits<int64_t>::max(), 0, &plan->user_offsets, Need::kOptional);
}

// ---- Ops ----

// Out-of-range restore targets, split points, prepare offsets and speculation acceptances
// are legal (they test how the caches refuse or clamp them); the bound only keeps the
// drivers' arithmetic on them (value + 1, at - from) far from overflow.
constexpr int64_t kMaxProbe = kMaxLength;

// A rectangle field [q_lo, q_hi, k_lo, k_hi] (`name`), present exactly when `wanted`.
Status DecodeRect(const Fields& f, const char* name, bool wanted, const char* allowed_with,
                  const std::string& mask, MaskRect* out) {
  *out = MaskRect{};
  const Json* rect = f.Find(name);
  if (!wanted) {
    return rect == nullptr ? Status::Ok()
                           : f.Error(name, fmt::format("only allowed with mask {}", allowed_with));
  }
  if (rect == nullptr) {
    return f.Error(name, fmt::format("missing required field (mask {})", Quote(mask)));
  }
  if (rect->is_array() && rect->size() != 4) {
    return f.Error(name,
                   fmt::format("expected [q_lo, q_hi, k_lo, k_hi], got {} entries", rect->size()));
  }
  std::vector<int64_t> r;
  KV_RETURN_IF_ERROR(f.Ints(name, 0, kMaxLength, 4, &r, Need::kRequired));
  for (const size_t hi : {size_t{1}, size_t{3}}) {
    if (r[hi] < r[hi - 1]) {
      return f.where().Error(fmt::format("{}/{}", f.Ptr(name), hi),
                             fmt::format("{} is below the lower bound {}", r[hi], r[hi - 1]));
    }
  }
  *out = MaskRect{r[0], r[1], r[2], r[3]};
  return Status::Ok();
}

Status DecodeMask(const Fields& f, Op* op) {
  std::string mask = "causal";
  KV_RETURN_IF_ERROR(f.String("mask", &mask, Need::kOptional));
  const std::optional<MaskForm> form = ParseMaskForm(mask);
  if (!form) {
    return f.Error(
        "mask",
        fmt::format("unknown mask {} (expected causal, zero, relax, block, relax_block or array)",
                    Quote(mask)));
  }
  op->mask = *form;
  KV_RETURN_IF_ERROR(DecodeRect(f, "rect", HasRect(op->mask),
                                "\"relax\", \"block\", \"relax_block\" or \"array\"", mask,
                                &op->rect));
  KV_RETURN_IF_ERROR(
      DecodeRect(f, "block", HasBlockRect(op->mask), "\"relax_block\"", mask, &op->block));
  return Status::Ok();
}

// write and speculate: forwards through every layer, so no "layer" (an abandoned
// speculation names how many layers its forward reached, at most the stack's).
// `padding_alone`: every layer is recurrent, so a write may have no tokens and only padding
// (spec §2.3 Put advances by the real length); attention layers need a row per write.
Status DecodeForward(const Fields& f, int32_t layers, bool padding_alone, Op* op) {
  const bool speculate = op->kind == OpKind::kSpeculate;
  const size_t min_tokens = speculate ? 2 : padding_alone ? 0 : 1;
  KV_RETURN_IF_ERROR(f.Ints("tokens", 0, kMaxInt32, min_tokens, &op->tokens, Need::kRequired));
  KV_RETURN_IF_ERROR(f.Length("pad", 0, &op->pad, Need::kOptional));
  if (op->tokens.empty() && op->pad == 0) {
    return f.Error("tokens", "empty with no \"pad\" (a write forwards at least one row)");
  }
  KV_RETURN_IF_ERROR(f.Bool("segmented", &op->segmented, Need::kOptional));
  KV_RETURN_IF_ERROR(DecodeMask(f, op));
  if (!speculate) return Status::Ok();
  // Any count the commit takes (it clamps), the extremes of its type included.
  KV_RETURN_IF_ERROR(f.Int("accepted", std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max(), &op->value, Need::kRequired));
  KV_RETURN_IF_ERROR(f.Int("abandon_after", 0, layers, &op->abandon_after, Need::kOptional));
  return f.Bool("isolated", &op->isolated, Need::kOptional);
}

// Ops on one layer. Slots are only range-checked as numbers here: whether a slot exists
// depends on the pool at replay time.
Status DecodeLayerOp(const Fields& f, int32_t layers, Op* op) {
  KV_RETURN_IF_ERROR(f.Int("layer", 0, kMaxInt32, &op->layer, Need::kRequired));
  if (op->layer >= layers) {
    return f.Error(
        "layer", fmt::format("layer {} out of range (the stack has {} layers)", op->layer, layers));
  }
  switch (op->kind) {
    case OpKind::kSnapshot:
      return f.Int("from", 0, kMaxLength, &op->value, Need::kRequired);
    case OpKind::kRestore:
      KV_RETURN_IF_ERROR(f.Int("slot", -1, kMaxInt32, &op->slot, Need::kRequired));
      return f.Int("target", -kMaxProbe, kMaxProbe, &op->value, Need::kRequired);
    case OpKind::kMerge:
      KV_RETURN_IF_ERROR(f.Int("child", -1, kMaxInt32, &op->slot2, Need::kRequired));
      return f.Int("parent", -1, kMaxInt32, &op->slot, Need::kRequired);
    case OpKind::kSplit:
      KV_RETURN_IF_ERROR(f.Int("at", -kMaxProbe, kMaxProbe, &op->value, Need::kRequired));
      return f.Int("slot", -1, kMaxInt32, &op->slot, Need::kRequired);
    case OpKind::kPrepare:
      // Order is not checked: unsorted offsets are a status the drivers compare.
      return f.Ints("offsets", -kMaxProbe, kMaxProbe, 0, &op->offsets, Need::kRequired);
    case OpKind::kClose:
      return f.Int("slot", 0, kMaxInt32, &op->slot, Need::kRequired);
    default:
      return Status::Ok();
  }
}

// The keys an op of each kind may carry, "op" included, in key order.
Keys OpKeys(OpKind kind) {
  static constexpr std::string_view kWrite[] = {"block", "mask",      "op",    "pad",
                                                "rect",  "segmented", "tokens"};
  static constexpr std::string_view kSpeculate[] = {
      "abandon_after", "accepted", "block",     "isolated", "mask", "op",
      "pad",           "rect",     "segmented", "tokens"};
  static constexpr std::string_view kSnapshot[] = {"from", "layer", "op"};
  static constexpr std::string_view kRestore[] = {"layer", "op", "slot", "target"};
  static constexpr std::string_view kMerge[] = {"child", "layer", "op", "parent"};
  static constexpr std::string_view kSplit[] = {"at", "layer", "op", "slot"};
  static constexpr std::string_view kPrepare[] = {"layer", "offsets", "op"};
  static constexpr std::string_view kClose[] = {"layer", "op", "slot"};
  static constexpr std::string_view kLayerOnly[] = {"layer", "op"};
  switch (kind) {
    case OpKind::kWrite:
      return kWrite;
    case OpKind::kSpeculate:
      return kSpeculate;
    case OpKind::kSnapshot:
      return kSnapshot;
    case OpKind::kRestore:
      return kRestore;
    case OpKind::kMerge:
      return kMerge;
    case OpKind::kSplit:
      return kSplit;
    case OpKind::kPrepare:
      return kPrepare;
    case OpKind::kClose:
      return kClose;
    case OpKind::kFree:
    case OpKind::kTake:
      return kLayerOnly;
  }
  return kLayerOnly;
}

Status DecodeOp(const Where& w, const Json& j, int32_t layers, bool padding_alone, Op* op) {
  const Fields f(w, j, "");
  std::string name;
  KV_RETURN_IF_ERROR(f.String("op", &name, Need::kRequired));
  bool known = false;
  for (uint8_t k = 0; k <= static_cast<uint8_t>(OpKind::kSpeculate) && !known; ++k) {
    op->kind = static_cast<OpKind>(k);
    known = name == OpKindName(op->kind);
  }
  if (!known) return f.Error("op", fmt::format("unknown op {}", Quote(name)));
  KV_RETURN_IF_ERROR(f.OnlyKeys(OpKeys(op->kind), fmt::format(" for op \"{}\"", name)));
  if (op->kind == OpKind::kWrite || op->kind == OpKind::kSpeculate) {
    return DecodeForward(f, layers, padding_alone, op);
  }
  return DecodeLayerOp(f, layers, op);
}

}  // namespace

// ---- Reading a file ----

std::vector<std::string> ReachCounterNames(TraceKind kind) {
  std::vector<std::string> names;
  if (kind == TraceKind::kMultiSeq) {
    for (const auto& field : MsCoverage::Fields()) names.emplace_back(field.name);
  } else if (kind == TraceKind::kRequests) {
    for (const auto& field : RequestCoverage::Fields()) names.emplace_back(field.name);
  }
  return names;
}

Result<ReachClaim> ParseReachClaim(std::string_view text) {
  const size_t eq = text.find('=');
  ReachClaim claim{std::string(text.substr(0, eq)), 1};
  bool ok = !claim.counter.empty();
  if (ok && eq != std::string_view::npos) {
    const std::string_view n = text.substr(eq + 1);
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), claim.at_least);
    ok = ec == std::errc() && end == n.data() + n.size() && claim.at_least >= 1 &&
         claim.at_least <= kMaxReachClaim;
  }
  if (!ok) {
    return InvalidArgument(fmt::format("'{}': expected COUNTER or COUNTER=N with N in 1..{}",
                                       std::string(text), kMaxReachClaim));
  }
  return claim;
}

Status CheckReachCounter(const ReachClaim& claim, TraceKind kind) {
  if (kind == TraceKind::kOps) {
    return InvalidArgument(
        fmt::format("'{}': an ops trace has no coverage counters to claim", claim.counter));
  }
  const std::vector<std::string> names = ReachCounterNames(kind);
  if (std::find(names.begin(), names.end(), claim.counter) != names.end()) return Status::Ok();
  return InvalidArgument(fmt::format("'{}': {}", claim.counter, UnknownCounter(kind)));
}

Result<std::unique_ptr<TraceReader>> TraceReader::Open(const std::string& path) {
  errno = 0;
  auto in = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!in->is_open()) {
    return IoError(fmt::format("{}: cannot open: {}", path, ReadError()));
  }
  return Start(path, std::move(in));
}

Result<std::unique_ptr<TraceReader>> TraceReader::FromText(const std::string& name,
                                                           std::string text) {
  return Start(name, std::make_unique<std::istringstream>(std::move(text)));
}

Result<std::unique_ptr<TraceReader>> TraceReader::Start(const std::string& path,
                                                        std::unique_ptr<std::istream> in) {
  std::unique_ptr<TraceReader> reader(new TraceReader(path, std::move(in)));
  std::istream& s = *reader->in_;
  std::string text;
  reader->line_ = 1;
  const Where w{reader->path_, 1};
  const bool read = static_cast<bool>(std::getline(s, text));
  if (!read || (IsBlank(text) && s.peek() == std::istream::traits_type::eof())) {
    if (s.bad()) return IoError(fmt::format("{}: cannot read: {}", path, ReadError()));
    return w.Error("", "empty trace (no header)");
  }
  if (IsBlank(text)) return w.Error("", "empty line");
  Json j;
  KV_RETURN_IF_ERROR(ParseLine(w, text, &j));
  KV_RETURN_IF_ERROR(DecodeHeader(w, j, &reader->header_));
  if (reader->header_.kind == TraceKind::kOps) {
    // The header decoded, so its stack builds (DecodeHeader validates it the same way).
    const Result<StackConfig> stack = TraceStack(reader->header_);
    reader->padding_alone_ = stack.ok() && stack->TakesPaddingAlone();
  }
  return reader;
}

Result<StackConfig> TraceStack(const TraceHeader& header) {
  Result<StackDTypes> dtype = ParseStackDTypes(header.dtype);
  if (!dtype.ok()) return dtype.status();
  return StackFromPreset(header.preset, header.layers, header.window, *dtype, header.dims);
}

Result<std::optional<TraceEvent>> TraceReader::Next() {
  std::string text;
  std::istream& in = *in_;
  if (!std::getline(in, text)) {
    if (in.bad()) {
      return IoError(fmt::format("{}: cannot read after line {}: {}", path_, line_, ReadError()));
    }
    return std::optional<TraceEvent>();
  }
  ++line_;
  const Where w{path_, line_};
  if (IsBlank(text)) {
    // One empty line at the end is what many editors leave; anywhere else it is a mistake.
    if (in.peek() == std::istream::traits_type::eof()) return std::optional<TraceEvent>();
    return w.Error("", "empty line");
  }
  Json j;
  KV_RETURN_IF_ERROR(ParseLine(w, text, &j));
  if (!j.is_object()) return w.Error("", Expected("an object", j));
  if (header_.kind == TraceKind::kMultiSeq) {
    MsOp op;
    KV_RETURN_IF_ERROR(DecodeMsOp(w, j, header_.multiseq.max_seqs, &op));
    return std::optional<TraceEvent>(std::move(op));
  }
  if (header_.kind == TraceKind::kOps) {
    Op op;
    KV_RETURN_IF_ERROR(DecodeOp(w, j, header_.layers, padding_alone_, &op));
    return std::optional<TraceEvent>(std::move(op));
  }
  RequestPlan plan;
  KV_RETURN_IF_ERROR(DecodeRequest(w, j, next_index_, &plan));
  ++next_index_;
  return std::optional<TraceEvent>(std::move(plan));
}

namespace {

Result<Trace> ReadAll(Result<std::unique_ptr<TraceReader>> reader) {
  if (!reader.ok()) return reader.status();
  Trace trace;
  trace.header = (*reader)->header();
  while (true) {
    Result<std::optional<TraceEvent>> event = (*reader)->Next();
    if (!event.ok()) return event.status();
    if (!event->has_value()) return trace;
    trace.events.push_back(std::move(**event));
  }
}

}  // namespace

Result<Trace> ReadTrace(const std::string& path) { return ReadAll(TraceReader::Open(path)); }

Result<Trace> ParseTrace(const std::string& name, std::string text) {
  return ReadAll(TraceReader::FromText(name, std::move(text)));
}

}  // namespace kvtwin::sim
