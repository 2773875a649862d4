#include "sim/recorder.h"

#include <fmt/format.h>

#include <utility>

namespace kvtwin::sim {

Result<std::unique_ptr<TraceRecorder>> TraceRecorder::Open(const std::string& path,
                                                           TraceHeader header) {
  const TraceKind kind = header.kind;
  Result<std::unique_ptr<TraceWriter>> w = TraceWriter::Create(path, header);
  if (!w.ok()) return w.status();
  return std::unique_ptr<TraceRecorder>(new TraceRecorder(std::move(*w), kind));
}

Status TraceRecorder::NeedRequest(const char* call) const {
  if (kind_ != TraceKind::kRequests) {
    return FailedPrecondition(fmt::format("{}: an op-level trace records ops only", call));
  }
  if (!open_) return FailedPrecondition(fmt::format("{}: no request is open", call));
  return Status::Ok();
}

Status TraceRecorder::BeginRequest(int32_t conversation, std::span<const int32_t> prompt) {
  if (kind_ != TraceKind::kRequests) {
    return FailedPrecondition("BeginRequest: an op-level trace records ops only");
  }
  if (open_) return FailedPrecondition("BeginRequest: the previous request is still open");
  if (prompt.empty()) return InvalidArgument("BeginRequest: empty prompt");
  if (conversation < 0) return InvalidArgument("BeginRequest: negative conversation id");
  // A prompt token may be negative: an effective token with bit 31 set, a media span's fold
  // value (spec §3.1 Keys). Sampled tokens are text.
  RequestPlan plan;
  plan.index = next_index_;
  plan.conversation = conversation;
  plan.inputs.assign(prompt.begin(), prompt.end());
  open_ = std::move(plan);
  return Status::Ok();
}

Status TraceRecorder::UserPoint(int64_t prefix_length) {
  if (Status s = NeedRequest("UserPoint"); !s.ok()) return s;
  if (prefix_length < 1) return InvalidArgument("UserPoint: a prefix length is >= 1");
  open_->user_offsets.push_back(prefix_length);
  return Status::Ok();
}

Status TraceRecorder::NoCaptures() {
  if (Status s = NeedRequest("NoCaptures"); !s.ok()) return s;
  open_->schedule = false;
  return Status::Ok();
}

Status TraceRecorder::BudgetPercent(int64_t pct) {
  if (Status s = NeedRequest("BudgetPercent"); !s.ok()) return s;
  if (pct < 1) return InvalidArgument("BudgetPercent: >= 1 percent");
  open_->budget_pct = pct;
  return Status::Ok();
}

Status TraceRecorder::Cancel(int64_t prefill_tokens) {
  if (Status s = NeedRequest("Cancel"); !s.ok()) return s;
  if (prefill_tokens < 0) return InvalidArgument("Cancel: negative prefill token count");
  if (!open_->outputs.empty()) return FailedPrecondition("Cancel: decode already started");
  if (open_->unforwarded != 1) return FailedPrecondition("Cancel: Unforwarded was set");
  open_->cancel_after_tokens = prefill_tokens;
  return EndRequest();
}

namespace {

// After an abandoned step the decode is over (SpeculativeStep::abandoned).
Status DecodeEnded(const RequestPlan& plan, const char* call) {
  if (plan.speculation.empty() || !plan.speculation.back().abandoned) return Status::Ok();
  return FailedPrecondition(fmt::format("{}: after an abandoned speculation", call));
}

}  // namespace

Status TraceRecorder::Sampled(std::span<const int32_t> tokens) {
  if (Status s = NeedRequest("Sampled"); !s.ok()) return s;
  if (Status s = DecodeEnded(*open_, "Sampled"); !s.ok()) return s;
  for (const int32_t t : tokens) {
    if (t < 0) return InvalidArgument(fmt::format("Sampled: negative token {}", t));
  }
  open_->outputs.insert(open_->outputs.end(), tokens.begin(), tokens.end());
  return Status::Ok();
}

Status TraceRecorder::Speculated(std::span<const int32_t> drafts, int64_t accepted, int32_t bonus) {
  if (Status s = NeedRequest("Speculated"); !s.ok()) return s;
  if (Status s = DecodeEnded(*open_, "Speculated"); !s.ok()) return s;
  if (accepted < 0 || accepted > static_cast<int64_t>(drafts.size())) {
    return InvalidArgument(
        fmt::format("Speculated: accepted {} of {} drafts", accepted, drafts.size()));
  }
  for (const int32_t t : drafts) {
    if (t < 0) return InvalidArgument(fmt::format("Speculated: negative draft {}", t));
  }
  if (bonus < 0) return InvalidArgument("Speculated: negative bonus token");
  // At the decode forward of the next sampled token: after every earlier step's end.
  SpeculativeStep step;
  step.step = static_cast<int64_t>(open_->outputs.size());
  step.accepted = accepted;
  step.rejected.assign(drafts.begin() + accepted, drafts.end());
  open_->speculation.push_back(std::move(step));
  open_->outputs.insert(open_->outputs.end(), drafts.begin(), drafts.begin() + accepted);
  open_->outputs.push_back(bonus);
  return Status::Ok();
}

Status TraceRecorder::Abandoned(std::span<const int32_t> drafts) {
  if (Status s = NeedRequest("Abandoned"); !s.ok()) return s;
  if (Status s = DecodeEnded(*open_, "Abandoned"); !s.ok()) return s;
  if (open_->outputs.empty()) return FailedPrecondition("Abandoned: no sampled token");
  for (const int32_t t : drafts) {
    if (t < 0) return InvalidArgument(fmt::format("Abandoned: negative draft {}", t));
  }
  // At the forward of the last sampled token, which stays unforwarded.
  SpeculativeStep step;
  step.step = static_cast<int64_t>(open_->outputs.size());
  step.abandoned = true;
  step.rejected.assign(drafts.begin(), drafts.end());
  open_->speculation.push_back(std::move(step));
  return Status::Ok();
}

Status TraceRecorder::Probed() {
  if (Status s = NeedRequest("Probed"); !s.ok()) return s;
  // Only right after its step: a token sampled since starts a forward of its own.
  const int64_t sampled = static_cast<int64_t>(open_->outputs.size());
  if (open_->speculation.empty() || open_->speculation.back().end() != sampled) {
    return FailedPrecondition("Probed: no speculative step just recorded");
  }
  if (open_->speculation.back().probe)
    return FailedPrecondition("Probed: the step is probed already");
  open_->speculation.back().probe = true;
  return Status::Ok();
}

Status TraceRecorder::Unforwarded(int64_t count) {
  if (Status s = NeedRequest("Unforwarded"); !s.ok()) return s;
  if (count < 0) return InvalidArgument("Unforwarded: negative count");
  open_->unforwarded = count;
  return Status::Ok();
}

Status TraceRecorder::EndRequest() {
  if (Status s = NeedRequest("EndRequest"); !s.ok()) return s;
  if (open_->outputs.empty() && open_->cancel_after_tokens < 0) {
    return FailedPrecondition("EndRequest: no sampled token");
  }
  // The reader's rules for "unforwarded" (sim/trace.cc): the request stays open on a refusal.
  const auto n = static_cast<int64_t>(open_->outputs.size());
  if (open_->cancel_after_tokens < 0 && open_->unforwarded > n) {
    return FailedPrecondition(
        fmt::format("EndRequest: {} unforwarded of {} sampled tokens", open_->unforwarded, n));
  }
  for (const SpeculativeStep& step : open_->speculation) {
    if (step.abandoned && open_->unforwarded != 1) {
      return FailedPrecondition(
          fmt::format("EndRequest: an abandoned speculation leaves 1 token unforwarded, not {}",
                      open_->unforwarded));
    }
    if (step.end() > open_->decoded_outputs()) {
      return FailedPrecondition(
          fmt::format("EndRequest: {} unforwarded tokens include the speculative step at {}",
                      open_->unforwarded, step.step));
    }
  }
  if (Status s = writer_->Write(*open_); !s.ok()) return s;
  open_.reset();
  ++next_index_;
  return Status::Ok();
}

Status TraceRecorder::Record(const Op& op) {
  if (kind_ != TraceKind::kOps) return FailedPrecondition("Record: a requests trace");
  return writer_->Write(op);
}

Status TraceRecorder::Finish() {
  if (open_) return FailedPrecondition("Finish: a request is still open");
  return writer_->Commit();
}

}  // namespace kvtwin::sim
