// TraceRecorder: what an embedding program (an inference server under test, a load
// generator, a unit test) calls to record its workload as a kvtwin trace that `kvtwin
// replay` checks and `kvtwin shrink` minimizes. It mirrors the server's own events —
// a request's prompt, its restore points, a cancel, every sampled token and speculative
// step — or, for a layer-stack harness, each cache operation. Events stream to the file;
// Finish() publishes it atomically, so an interrupted program leaves no half trace.
//
//   auto rec = TraceRecorder::Open("run.jsonl", header).value();
//   rec->BeginRequest(conversation, prompt);
//   rec->UserPoint(12);                       // optional
//   rec->Sampled(first_token);                // after the prefill
//   rec->Speculated(drafts, accepted, bonus); // a speculative decode step (any number)
//   rec->Sampled(token); ...
//   rec->Abandoned(drafts);                   // optional: a step dropped, the decode ends
//   rec->Probed();                            // optional, after either: scored isolated first
//   rec->Unforwarded(0);                      // optional: the last token was forwarded too
//   rec->EndRequest();
//   rec->Finish();
//
// Misuse (an event outside a request, a request that ends without any sampled token and
// was not cancelled, an op in a requests trace) is a FailedPrecondition / InvalidArgument
// Status; nothing is recorded for the offending call. Single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "sim/trace.h"

namespace kvtwin::sim {

class TraceRecorder {
 public:
  static Result<std::unique_ptr<TraceRecorder>> Open(const std::string& path, TraceHeader header);

  // Request-level traces.
  // `prompt` holds effective tokens: a negative id is one with bit 31 set, a position of a
  // media span holding its fold value (spec §3.1 Keys).
  Status BeginRequest(int32_t conversation, std::span<const int32_t> prompt);
  Status UserPoint(int64_t prefix_length);  // a prefix the caller wants restorable
  Status NoCaptures();                      // the caller asks for no prefill captures
  Status BudgetPercent(int64_t pct);        // this request's memory headroom
  // The prefill was cancelled after `prefill_tokens`; the request ends with no decode and
  // no outputs. Refused once a token was sampled.
  Status Cancel(int64_t prefill_tokens);
  // Tokens sampled by ordinary decode steps (one per step).
  Status Sampled(std::span<const int32_t> tokens);
  // One speculative decode step: `drafts` proposed, the first `accepted` of them kept,
  // plus the target model's `bonus` token. A request may have any number of them, between
  // and after ordinary samples (each starts where the tokens sampled so far end).
  Status Speculated(std::span<const int32_t> drafts, int64_t accepted, int32_t bonus);
  // A speculative step dropped without a commit (a client gone while `drafts` were being
  // validated): the decode ends there, so only EndRequest may follow, with the last
  // sampled token unforwarded (SpeculativeStep::abandoned). Needs a sampled token.
  Status Abandoned(std::span<const int32_t> drafts);
  // The speculative step just recorded (Speculated or Abandoned, with nothing sampled
  // since) was first scored through an isolated speculation with the same tokens
  // (SpeculativeStep::probe, spec §2.7): a server that validates drafts without touching
  // its caches before it runs the real step.
  Status Probed();
  // How many of the sampled tokens the server never forwarded before closing the request
  // (RequestPlan::unforwarded; 1 unless called: the last sampled token). 0 when it forwards
  // that token too; more when it reported tokens past a stop. Checked at EndRequest against
  // the sampled tokens and the speculative steps; refused on a cancelled request.
  Status Unforwarded(int64_t count);
  Status EndRequest();

  // Op-level traces.
  Status Record(const Op& op);

  // Publishes the file. REQUIRES: no request open (else FailedPrecondition).
  Status Finish();

 private:
  explicit TraceRecorder(std::unique_ptr<TraceWriter> writer, TraceKind kind)
      : writer_(std::move(writer)), kind_(kind) {}
  Status NeedRequest(const char* call) const;

  std::unique_ptr<TraceWriter> writer_;
  TraceKind kind_;
  std::optional<RequestPlan> open_;
  int64_t next_index_ = 0;
};

}  // namespace kvtwin::sim
