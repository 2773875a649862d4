// Trace format v1: a workload as JSON Lines, the unit users record, replay, shrink and
// keep in traces/regress/ (schema: traces/trace-v1.schema.json; README "Traces (format v1)").
//
// Line 1 is the header, every further line one event. Keys are sorted and optional fields
// at their default are left out, so equal traces are equal files and diffs are per event:
//
//   {"budget":0,"capture_interval":8,"chunk":5,"expect":"pass","format":"kvtwin-trace",
//    "kind":"requests","model":{"dtype":"f32","layers":4,"preset":"mixed","window":4},
//    "pre_thinking":4,"seed":1,"source":"kvtwin gen --seed 1","version":1}
//   {"conversation":2,"inputs":[1,2,3],"outputs":[4,5,6,7],
//    "speculation":[{"accepted":1,"rejected":[9],"step":0},{"accepted":0,"rejected":[],"step":2}]}
//   {"blocks":[7,8],"block_len":16,"conversation":0,"output_len":3,"prompt_len":20}
//   {"cancel_after":3,"inputs":[1,2,3,4,5]}
//   {"accepted":1,"op":"speculate","tokens":[4,1,2]}
//
// The model's optional "kv" {"heads","head_dim","value_dim"} and "recurrent" {"conv_tail",
// "num_k_heads","num_v_heads","head_k_dim","head_v_dim"} give the layers' widths (ModelDims,
// sim/stack.h), every field required in a present object; each is left out at its default:
//   "model":{"dtype":"f32","kv":{"head_dim":7,"heads":1,"value_dim":9},"layers":3,
//            "preset":"mixed","recurrent":{"conv_tail":1,"head_k_dim":4,"head_v_dim":2,
//            "num_k_heads":3,"num_v_heads":6},"window":4}
//
// The header's optional "expect" is the verdict a regression trace must replay to: "pass"
// or "divergence: KIND", KIND being DivergenceKind (sim/replay.h) of the mismatch; absent
// (TraceHeader::expect "") = no expectation. At most 1000 characters.
// The optional "reaches" (kinds "requests" and "multiseq", not with a "divergence: ..."
// expectation) is what a regression trace is kept for: {"COUNTER": N, ...} claims that a
// replay which passes ends with the driver's coverage counter COUNTER (a RequestCoverage or
// MsCoverage field name, e.g. "whole_state_copies") at N or more. A replay that passes
// short of a claim has verdict "unreached": the shape the trace pins has drifted away
// (its bug would no longer be caught by it), which a plain pass would hide.
//
// kind "requests": every event is a request (RequestPlan): "inputs" (prompt token ids) or
// "blocks" + "block_len" + "prompt_len" (block ids expanded by BlockTokens, the last block
// cut so the prompt has prompt_len tokens); "outputs" (every sampled token) or
// "output_len" (GeneratedTokens of the request's index), at least one unless the request
// has "cancel_after" (prefill tokens before a cancel; a cancelled request never decodes,
// so it may have no outputs at all); optional "conversation", "user_points", "schedule"
// (false: the caller asks for no captures), "speculation", "budget_pct", "dropped" and
// "request_kind" (informational). "speculation" is an array of speculative decode steps
// {"step","accepted","rejected"} (not with "cancel_after"): sorted, each at or after the
// previous one's step + accepted + 1 (a step samples accepted + 1 outputs), and each with
// step + accepted + 1 <= the number of outputs.
// kind "ops": every event is an op of a layer stack (sim/ops.h), named by "op": write,
// snapshot, restore, merge, split, free, prepare, take, close, speculate. A speculate with
// "abandon_after" (0..layers) is dropped without a commit after its forward reached that many
// layers: {"abandon_after":1,"accepted":0,"op":"speculate","tokens":[4,1,2]}.
// kind "multiseq": a multi-sequence run (sim/multi_seq_driver.h). The header has no "model"
// and no request fields; instead "multiseq" holds every MultiSeqConfig field but conv
// ("window" and "memory" an integer, or null or left out = kvtwin::kUnbounded; "dtype" as
// ParseDType reads it; MultiSeqConfig::Validate decides what is legal, reported at
// /multiseq) and "conv" is "as-specified" or "ideal"; "seed" is the run seed (the replay
// derives the driver's value seed from it exactly as RunMultiSeq does):
//   {"conv":"as-specified","format":"kvtwin-trace","kind":"multiseq","multiseq":{"capacity":8,
//    "chunk":0,"d_conv":1,"dtype":"f32","hidden":2,"kv_cols":12,"max_batch":16,"max_seqs":7,
//    "memory":5,"num_conv_layers":0,"padding":4,"permuted_v":false,"shift_supported":true,
//    "window":3},"seed":3,"source":"kvtwin multiseq --seeds 3..3 --steps 200","version":1}
// Every event is an MsOp (sim/multi_seq_ops.h), named by "op":
//   {"batch":[[0,4,17],[0,5,3]],"causal_off":[1],"op":"forward","reserve":true}
//   {"dst":2,"len":5,"op":"copy_prefix","src":0}
//   {"begin":3,"end":7,"op":"remove","seq":1}   ("end" absent = to the end)
//   {"op":"can_resume","pos":4,"seq":1}
//   {"batch":[[1,6,2]],"edits":[{"begin":0,"op":"remove","seq":1}],"op":"forward"}
// "batch" entries are [seq, pos, token]; "reserve" (default false), "causal_off" (batch
// indices, default []) and "edits" (copy_prefix / remove objects applied to the causal cache
// between StartForward and Put, at most 16, none on a reserve pass; default []) are left
// out at their defaults. Sequence ids are checked against
// max_seqs and positions against kMaxPosition here; whether an op is one a correct runner
// would issue at that point (ValidMsOp) is the replayer's to report.
//
// Readers check everything a replay relies on (format, version, kind, field types and
// ranges, unknown fields, per-kind required fields) and report the first problem as an
// InvalidArgument "FILE:LINE: /json/pointer: reason"; references that depend on replay
// state (a snapshot slot that does not exist yet) are the replayer's to report, in the same
// form. Writers write to a temporary file in the destination's directory and rename it on
// Commit, so a reader never sees half a trace. Single-threaded.
#pragma once

#include <cstdint>
#include <fstream>
#include <istream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "sim/multi_seq_driver.h"
#include "sim/multi_seq_ops.h"
#include "sim/ops.h"
#include "sim/request_workload.h"
#include "sim/stack.h"
#include "src/core/status.h"

namespace kvtwin::sim {

inline constexpr const char* kTraceFormat = "kvtwin-trace";
inline constexpr int kTraceVersion = 1;
// TraceHeader::expect: "pass", or the prefix then DivergenceKind; at most 1000 characters.
inline constexpr std::string_view kExpectPass = "pass";
inline constexpr std::string_view kExpectDivergencePrefix = "divergence: ";
inline constexpr size_t kExpectMaxChars = 1000;

// The largest count a "reaches" claim may name (counters are int64).
inline constexpr int64_t kMaxReachClaim = int64_t{1} << 48;

enum class TraceKind : uint8_t { kRequests, kOps, kMultiSeq };

// One "reaches" entry: coverage counter `counter` ends at `at_least` or more.
struct ReachClaim {
  std::string counter;
  int64_t at_least = 1;
  friend bool operator==(const ReachClaim&, const ReachClaim&) = default;
};

// The coverage counters a trace of `kind` can claim, in declaration order (RequestCoverage
// for "requests", MsCoverage for "multiseq"; none for "ops").
std::vector<std::string> ReachCounterNames(TraceKind kind);
// "COUNTER" (at least 1) or "COUNTER=N", N in [1, kMaxReachClaim] (a command line's
// --reach and --keep-reach); whether COUNTER exists depends on the trace's kind
// (CheckReachCounter). Errors: InvalidArgument quoting `text`.
Result<ReachClaim> ParseReachClaim(std::string_view text);
// Ok when `claim` names one of `kind`'s counters; else InvalidArgument "'COUNTER': unknown
// coverage counter of a "KIND" trace (expected one of ...)" (an ops trace has none).
Status CheckReachCounter(const ReachClaim& claim, TraceKind kind);

struct TraceHeader {
  TraceKind kind = TraceKind::kRequests;
  // value seed: the synthetic provenance of every row (kind "multiseq": the run seed)
  uint64_t seed = 1;
  std::string preset = "mixed";
  int32_t layers = 4;
  int64_t window = 4;
  std::string dtype = "f32";
  // The layers' widths ("kv" and "recurrent" in the model; each left out at its default).
  ModelDims dims;
  // kind "requests" only (RequestDriverOptions):
  int64_t budget_bytes = 0;  // 0 = unlimited
  int64_t chunk = 5;
  int64_t capture_interval = 8;
  int64_t pre_thinking = 4;
  // kind "multiseq" only: the cache shape, conv expectation included ("conv" in the file).
  MultiSeqConfig multiseq;
  std::string source;  // how the trace was made; informational
  // The verdict a replay must give (regression traces): "" = none, "pass", or
  // "divergence: KIND" with KIND = DivergenceKind(mismatch). Last but `reaches`: aggregate
  // initializations elsewhere list the members above in order.
  std::string expect;
  // What a passing replay must reach, in counter-name order (see "reaches" above).
  std::vector<ReachClaim> reaches;
  friend bool operator==(const TraceHeader&, const TraceHeader&) = default;
};

using TraceEvent = std::variant<RequestPlan, Op, MsOp>;

struct Trace {
  TraceHeader header;
  std::vector<TraceEvent> events;
};

// Deterministic tokens of Mooncake-style block `id` (a function of the id only): `len`
// tokens in [1, 2^30), the first one distinct for distinct ids, so two prompts share
// token-level prefixes exactly where they share block ids. REQUIRES: id >= 0, len >= 0.
std::vector<int32_t> BlockTokens(int64_t id, int64_t len);
// `len` generated tokens of request `index`, in [2^30, 2^31 - 1): never equal to a block
// token, so outputs are shared only with the request's own continuations.
std::vector<int32_t> GeneratedTokens(int64_t index, int64_t len);

// One line of JSON (no newline). Requests are written with explicit inputs and outputs.
std::string HeaderToJson(const TraceHeader& header);
std::string EventToJson(const TraceEvent& event);

// Streams a trace file event by event (constant memory in the trace length).
class TraceReader {
 public:
  // Opens `path` and reads the header. Errors: the file cannot be read; a malformed header.
  static Result<std::unique_ptr<TraceReader>> Open(const std::string& path);
  // Reads `text` as if it were a file called `name` (errors say "NAME:LINE: ...").
  static Result<std::unique_ptr<TraceReader>> FromText(const std::string& name, std::string text);
  const TraceHeader& header() const { return header_; }
  // The next event (nullopt at the end). Requests get index = their position (0-based).
  Result<std::optional<TraceEvent>> Next();
  // The line of the last event returned (1-based; the header is line 1).
  int64_t line() const { return line_; }
  const std::string& path() const { return path_; }

 private:
  TraceReader(std::string path, std::unique_ptr<std::istream> in)
      : path_(std::move(path)), in_(std::move(in)) {}
  static Result<std::unique_ptr<TraceReader>> Start(const std::string& path,
                                                    std::unique_ptr<std::istream> in);
  std::string path_;
  std::unique_ptr<std::istream> in_;
  TraceHeader header_;
  // Ops traces over recurrent layers only: a write may forward padding alone (no tokens).
  bool padding_alone_ = false;
  int64_t line_ = 0;
  int64_t next_index_ = 0;
};

// The layer stack a trace header names. Errors name the bad header value.
Result<StackConfig> TraceStack(const TraceHeader& header);

// Whole-file convenience over TraceReader.
Result<Trace> ReadTrace(const std::string& path);
// The same over text in memory, named `name` in errors.
Result<Trace> ParseTrace(const std::string& name, std::string text);

class TraceWriter {
 public:
  // Creates the temporary file next to `path` and writes the header line.
  static Result<std::unique_ptr<TraceWriter>> Create(const std::string& path,
                                                     const TraceHeader& header);
  ~TraceWriter();  // removes the temporary file unless committed
  // REQUIRES: the event's kind matches the header's.
  Status Write(const TraceEvent& event);
  // Flushes and renames the temporary file over `path`.
  Status Commit();

 private:
  TraceWriter(std::string path, std::string tmp, TraceKind kind, std::ofstream out)
      : path_(std::move(path)), tmp_(std::move(tmp)), kind_(kind), out_(std::move(out)) {}
  std::string path_, tmp_;
  TraceKind kind_;
  std::ofstream out_;
  bool committed_ = false;
};

// Whole-trace convenience over TraceWriter.
Status WriteTrace(const std::string& path, const Trace& trace);

}  // namespace kvtwin::sim
