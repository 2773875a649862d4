// Trace format v1, writing (sim/trace.h; reading is in trace.cc). nlohmann's objects are
// std::map-backed, so dump() sorts keys; with every optional field left out at its default
// (the reader's defaults) a trace has exactly one spelling. Each kind writes exactly the Op
// fields it uses, so ops round-trip through the reader for those fields.
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "sim/trace.h"
#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

using Json = nlohmann::json;

// Invalid UTF-8 in a string field (a source command line) is replaced, not thrown.
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json RequestJson(const RequestPlan& plan) {
  Json j = Json::object();
  j["inputs"] = plan.inputs;
  // Only a cancelled request may have none (the reader's rule); then the key is left out.
  if (!plan.outputs.empty()) j["outputs"] = plan.outputs;
  if (plan.conversation != 0) j["conversation"] = plan.conversation;
  if (!plan.user_offsets.empty()) j["user_points"] = plan.user_offsets;
  if (!plan.schedule) j["schedule"] = false;
  if (plan.cancel_after_tokens != -1) j["cancel_after"] = plan.cancel_after_tokens;
  if (plan.unforwarded != 1) j["unforwarded"] = plan.unforwarded;
  if (!plan.speculation.empty()) {
    Json steps = Json::array();
    for (const SpeculativeStep& step : plan.speculation) {
      Json s = Json::object();
      s["step"] = step.step;
      s["accepted"] = step.accepted;
      s["rejected"] = step.rejected;
      if (step.probe) s["probe"] = true;
      if (step.abandoned) s["abandoned"] = true;
      steps.push_back(std::move(s));
    }
    j["speculation"] = std::move(steps);
  }
  if (plan.budget_pct != 100) j["budget_pct"] = plan.budget_pct;
  if (plan.budget_pct_after_prefill >= 0) {
    j["budget_pct_after_prefill"] = plan.budget_pct_after_prefill;
  }
  if (plan.dropped != 0) j["dropped"] = plan.dropped;
  if (plan.kind != RequestKind::kNew) j["request_kind"] = RequestKindName(plan.kind);
  return j;
}

Json RectJson(const MaskRect& r) { return Json::array({r.q_lo, r.q_hi, r.k_lo, r.k_hi}); }

// write and speculate: tokens and the forward's form.
void ForwardJson(const Op& op, Json& j) {
  j["tokens"] = op.tokens;
  if (op.pad != 0) j["pad"] = op.pad;
  if (op.segmented) j["segmented"] = true;
  if (op.mask != MaskForm::kCausal) j["mask"] = MaskFormName(op.mask);
  if (HasRect(op.mask)) {
    j["rect"] = RectJson(op.rect);
  }
  if (HasBlockRect(op.mask)) {
    j["block"] = RectJson(op.block);
  }
  if (op.kind != OpKind::kSpeculate) return;
  j["accepted"] = op.value;
  if (op.isolated) j["isolated"] = true;
  if (op.abandon_after >= 0) j["abandon_after"] = op.abandon_after;
}

Json OpJson(const Op& op) {
  Json j = Json::object();
  j["op"] = OpKindName(op.kind);
  if (op.kind == OpKind::kWrite || op.kind == OpKind::kSpeculate) {
    ForwardJson(op, j);
    return j;
  }
  j["layer"] = op.layer;
  switch (op.kind) {
    case OpKind::kSnapshot:
      j["from"] = op.value;
      break;
    case OpKind::kRestore:
      j["slot"] = op.slot;
      j["target"] = op.value;
      break;
    case OpKind::kMerge:
      j["parent"] = op.slot;
      j["child"] = op.slot2;
      break;
    case OpKind::kSplit:
      j["slot"] = op.slot;
      j["at"] = op.value;
      break;
    case OpKind::kPrepare:
      j["offsets"] = op.offsets;
      break;
    case OpKind::kClose:
      j["slot"] = op.slot;
      break;
    default:  // free, take: the layer only
      break;
  }
  return j;
}

Json MsOpJson(const MsOp& op) {
  Json j = Json::object();
  j["op"] = MsOpKindName(op.kind);
  switch (op.kind) {
    case MsOpKind::kForward: {
      Json batch = Json::array();
      for (const MsBatchToken& t : op.batch) batch.push_back(Json::array({t.seq, t.pos, t.token}));
      j["batch"] = std::move(batch);
      if (op.reserve) j["reserve"] = true;
      if (!op.causal_off.empty()) j["causal_off"] = op.causal_off;
      if (!op.edits.empty()) {
        Json edits = Json::array();
        for (const MsOp& e : op.edits) edits.push_back(MsOpJson(e));
        j["edits"] = std::move(edits);
      }
      break;
    }
    case MsOpKind::kCopyPrefix:
      j["src"] = op.seq;
      j["dst"] = op.dst;
      j["len"] = op.begin;
      break;
    case MsOpKind::kRemove:
      j["seq"] = op.seq;
      j["begin"] = op.begin;
      if (op.end != kvtwin::kUnbounded) j["end"] = op.end;
      break;
    case MsOpKind::kCanResume:
      j["seq"] = op.seq;
      j["pos"] = op.begin;
      break;
  }
  return j;
}

// Every MultiSeqConfig field but conv (the header's "conv"); unbounded window and memory
// are left out.
Json MultiSeqJson(const MultiSeqConfig& c) {
  Json j = Json::object();
  if (c.window != kvtwin::kUnbounded) j["window"] = c.window;
  if (c.memory != kvtwin::kUnbounded) j["memory"] = c.memory;
  j["chunk"] = c.chunk;
  j["max_seqs"] = c.max_seqs;
  j["capacity"] = c.capacity;
  j["max_batch"] = c.max_batch;
  j["padding"] = c.padding;
  j["permuted_v"] = c.permuted_v;
  j["dtype"] = DTypeName(c.dtype);
  j["kv_cols"] = c.kv_cols;
  j["num_conv_layers"] = c.num_conv_layers;
  j["d_conv"] = c.d_conv;
  j["hidden"] = c.hidden;
  j["shift_supported"] = c.shift_supported;
  return j;
}

TraceKind KindOf(const TraceEvent& event) {
  if (std::holds_alternative<MsOp>(event)) return TraceKind::kMultiSeq;
  return std::holds_alternative<Op>(event) ? TraceKind::kOps : TraceKind::kRequests;
}

const char* KindName(TraceKind kind) {
  switch (kind) {
    case TraceKind::kRequests:
      return "requests";
    case TraceKind::kOps:
      return "ops";
    case TraceKind::kMultiSeq:
      return "multiseq";
  }
  return "?";
}

}  // namespace

std::string HeaderToJson(const TraceHeader& header) {
  Json j = Json::object();
  j["format"] = kTraceFormat;
  j["version"] = kTraceVersion;
  j["kind"] = KindName(header.kind);
  j["seed"] = header.seed;
  if (!header.source.empty()) j["source"] = header.source;
  if (!header.expect.empty()) j["expect"] = header.expect;
  for (const ReachClaim& claim : header.reaches) j["reaches"][claim.counter] = claim.at_least;
  if (header.kind == TraceKind::kMultiSeq) {
    j["multiseq"] = MultiSeqJson(header.multiseq);
    j["conv"] = header.multiseq.conv == ConvExpectation::kIdeal ? "ideal" : "as-specified";
    return Dump(j);
  }
  Json model = Json::object();
  model["preset"] = header.preset;
  model["layers"] = header.layers;
  model["window"] = header.window;
  model["dtype"] = header.dtype;
  // Left out at their defaults, so a trace of today's tiny stack reads as before.
  const ModelDims& d = header.dims;
  if (!d.KvAtDefault()) {
    model["kv"] = {{"heads", d.kv_heads}, {"head_dim", d.head_dim}, {"value_dim", d.value_dim}};
  }
  if (!d.RecurrentAtDefault()) {
    const RecurrentDims& r = d.recurrent;
    model["recurrent"] = {{"conv_tail", r.conv_tail},
                          {"num_k_heads", r.num_k_heads},
                          {"num_v_heads", r.num_v_heads},
                          {"head_k_dim", r.head_k_dim},
                          {"head_v_dim", r.head_v_dim}};
  }
  j["model"] = std::move(model);
  // Written even at their defaults: a replay's driver setup is then explicit in the file.
  if (header.kind == TraceKind::kRequests) {
    j["budget"] = header.budget_bytes;
    j["chunk"] = header.chunk;
    j["capture_interval"] = header.capture_interval;
    j["pre_thinking"] = header.pre_thinking;
  }
  return Dump(j);
}

std::string EventToJson(const TraceEvent& event) {
  if (const auto* op = std::get_if<Op>(&event)) return Dump(OpJson(*op));
  if (const auto* op = std::get_if<MsOp>(&event)) return Dump(MsOpJson(*op));
  return Dump(RequestJson(std::get<RequestPlan>(event)));
}

Result<std::unique_ptr<TraceWriter>> TraceWriter::Create(const std::string& path,
                                                         const TraceHeader& header) {
  // Same directory as `path`, so Commit's rename stays on one file system (atomic).
  std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<int64_t>(getpid()));
  errno = 0;
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out.is_open()) {
    return IoError(fmt::format("{}: cannot create {}: {}", path, tmp,
                               errno != 0 ? std::strerror(errno) : "unknown error"));
  }
  std::unique_ptr<TraceWriter> writer(
      new TraceWriter(path, std::move(tmp), header.kind, std::move(out)));
  writer->out_ << HeaderToJson(header) << '\n';
  if (!writer->out_) return IoError(fmt::format("{}: cannot write {}", path, writer->tmp_));
  return writer;  // the destructor removes the temporary file on every error path
}

TraceWriter::~TraceWriter() {
  if (committed_) return;
  out_.close();
  std::error_code ignored;  // best effort: nothing to report to from a destructor
  std::filesystem::remove(tmp_, ignored);
}

Status TraceWriter::Write(const TraceEvent& event) {
  KV_CHECK(!committed_, "TraceWriter::Write after Commit");
  KV_CHECK(KindOf(event) == kind_, "a trace event of the wrong kind for its header");
  out_ << EventToJson(event) << '\n';
  if (!out_) return IoError(fmt::format("{}: cannot write {}", path_, tmp_));
  return Status::Ok();
}

Status TraceWriter::Commit() {
  KV_CHECK(!committed_, "TraceWriter::Commit twice");
  out_.flush();
  if (!out_) return IoError(fmt::format("{}: cannot write {}", path_, tmp_));
  out_.close();
  if (out_.fail()) return IoError(fmt::format("{}: cannot close {}", path_, tmp_));
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec)
    return IoError(fmt::format("{}: cannot rename {} over it: {}", path_, tmp_, ec.message()));
  committed_ = true;
  return Status::Ok();
}

Status WriteTrace(const std::string& path, const Trace& trace) {
  Result<std::unique_ptr<TraceWriter>> writer = TraceWriter::Create(path, trace.header);
  if (!writer.ok()) return writer.status();
  for (const TraceEvent& event : trace.events) KV_RETURN_IF_ERROR((*writer)->Write(event));
  return (*writer)->Commit();
}

}  // namespace kvtwin::sim
