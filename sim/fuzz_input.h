// Fuzz inputs: how the libFuzzer targets (fuzz/) and `kvtwin replay --fuzz-input` turn
// bytes into a lock-step run, and how the structure-aware mutator edits them. Living in
// sim/ (not fuzz/) so the g++-built CLI decodes a crash artifact exactly as the clang-built
// target did: one decoder, two callers.
//
// Input layout (every target but kTraceReader): `header_bytes` bytes picking the cache
// shape, then whole records of `record_bytes` bytes, one op / request / batch each; a short
// header is read as if zero-padded and a trailing partial record is ignored. Each part is
// read by its own FuzzedDataProvider, and every field is one byte consumed with a fixed,
// state-independent range, so field k of a record is always byte record_bytes - 1 - k
// (FuzzedDataProvider reads integers from the end). What a field means is resolved against
// the reference state when the record is applied (an index modulo the pool size, an offset
// relative to the current one), so almost every byte string is a valid run and a mutation
// of one byte changes one decision.
//
// Value fields (offsets, targets, split points, lengths) are two bytes, a mode and an
// argument, so the custom mutator can aim them at the boundaries where cache bugs live:
//   kRelative      anchor + (arg % 16) - 8      (anchor: the field's natural base, e.g. the
//                                                 layer's current offset)
//   kAbsolute      arg
//   kWindow        W - 1 + arg % 3              (W - 1, W, W + 1; W the shape's window or
//                                                 the target's characteristic length)
//   kBehindWindow  anchor - W - 1 + arg % 3
//   kSnapshotEnd   an end of the addressed snapshot/node ± 1: (arg % 2 ? to : from) +
//                  (arg / 2) % 3 - 1            (no snapshot: as kRelative)
// with mode = mode byte % 5. ResolveValue() is that table.
//
// A run records every applied event as a replayable trace (sim/trace.h) whose replay
// reaches the same verdict and digest, so a crash artifact becomes a JSON trace that
// `kvtwin shrink` minimizes. Deterministic: equal bytes give equal runs. Single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/trace.h"

namespace kvtwin::sim {

enum class FuzzTarget : uint8_t {
  kKv,           // full-KV layers (preset dense)
  kRotating,     // rotating (sliding-window) layers (preset rotating)
  kRecurrent,    // gated-delta layers (preset recurrent, < 4 layers)
  kSpeculation,  // speculation-heavy ops over a mixed stack
  kPrefix,       // requests over a small pool of conversations at a tiny budget
  kHybrid,       // multi-sequence hybrid cache (MultiSeqDriver)
  kTraceReader,  // trace format v1 text: read, write back, read again, replay small ones
};

// "kv", "rotating", "recurrent", "speculation", "prefix", "hybrid", "trace_reader": the
// names of the fuzz/ executables (NAME_fuzz) and of --target.
const char* FuzzTargetName(FuzzTarget target);
std::optional<FuzzTarget> ParseFuzzTarget(std::string_view name);
const std::vector<FuzzTarget>& AllFuzzTargets();

enum class ValueMode : uint8_t { kRelative, kAbsolute, kWindow, kBehindWindow, kSnapshotEnd };
inline constexpr int kValueModes = 5;

// What a value field resolves against. `from`/`to`: the addressed snapshot's ends, if any.
struct ValueContext {
  int64_t anchor = 0;
  int64_t window = 1;
  std::optional<int64_t> from, to;
};
int64_t ResolveValue(uint8_t mode, uint8_t arg, const ValueContext& context);

// The model widths of a layer or prefix header's dtype byte, whose bit 0 is the dtype: bit 1
// set draws them (DrawModelDims) from a stream named by bits 2-7, else the defaults. They
// ride in spare bits of an existing byte, so every input keeps its layout and one bit flip
// moves a run between the tiny default widths and 64 others.
ModelDims FuzzDimsOf(uint8_t dtype_byte);
// The dtypes of the same byte: bit 0 the activation dtype (bf16 when set); bits 2 and 3
// both set put V in the other dtype (StackDTypes::v), so a quarter of the inputs store K
// and V in two dtypes, which llama.cpp's --cache-type-k / --cache-type-v allow.
StackDTypes FuzzDTypesOf(uint8_t dtype_byte);

struct FuzzLayout {
  size_t header_bytes = 0;
  size_t record_bytes = 0;  // 0: unstructured (kTraceReader)
  // Field indices (k: byte record_bytes - 1 - k) of each value field's mode byte; its
  // argument is field k + 1.
  std::vector<size_t> value_fields;
  size_t max_records = 0;  // records past this many are ignored
};
FuzzLayout LayoutOf(FuzzTarget target);

struct FuzzRun {
  // The events applied (records that resolve to no valid event are skipped), as a trace
  // whose replay gives the same verdict; header.source names the target.
  Trace trace;
  std::optional<std::string> divergence;  // the report, as `kvtwin replay` prints it
  std::string divergence_kind;            // DivergenceKind of the mismatch
  uint64_t digest = 0;
  int64_t events = 0;
  // Forwards whose attention arithmetic was checked (layer and prefix targets; see
  // FuzzSession).
  int64_t attention_checks = 0;
};

// Decodes `data` for `target` and runs it in lock step (a fresh FuzzSession's Run, trace
// recorded). kTraceReader: `trace` is the parsed
// trace when the text is a valid one (else empty) and `divergence` reports a broken
// reader property (a write/read round trip that changes the trace, a replay that crashes
// the checks rather than reporting an input error).
FuzzRun RunFuzzInput(FuzzTarget target, const uint8_t* data, size_t size);

struct FuzzParts;
struct LayerFuzzState;
class ShapeRunCounts;

// Runs inputs of one target like RunFuzzInput, keeping the lock-step driver and the input
// buffers between runs (a fuzz target executes thousands of inputs a second, and under
// ASan building them is a large share of each). Each run starts from a Reset driver, so its
// verdict, report, digest and event count are RunFuzzInput's for the same bytes, whatever
// ran before (tests/sim/fuzz_session_test.cc holds it to that), with one exception kept on
// purpose: the layer and prefix targets re-check attention arithmetic after doubling
// numbers of runs (ShapeRunCounts, sim/checks.h), a subset of what a fresh run checks. So a
// divergence a session reports, RunFuzzInput reports too, at that step or an earlier one;
// an input a fresh run passes, a session passes identically. With `record_trace` false
// the trace's events are not kept: the libFuzzer targets need only the verdict, and
// `kvtwin replay --fuzz-input` rebuilds the trace from the artifact. Single-threaded.
class FuzzSession {
 public:
  explicit FuzzSession(FuzzTarget target);
  ~FuzzSession();
  FuzzSession(const FuzzSession&) = delete;
  FuzzSession& operator=(const FuzzSession&) = delete;

  FuzzRun Run(const uint8_t* data, size_t size, bool record_trace);

 private:
  FuzzTarget target_;
  std::unique_ptr<LayerFuzzState> layers_;
  std::unique_ptr<FuzzParts> parts_;
  std::unique_ptr<ShapeRunCounts> shape_runs_;
};

// libFuzzer's byte-level mutator (LLVMFuzzerMutate), passed in so sim/ does not link
// libFuzzer: mutates data[0, size) in place within max_size, returns the new size.
using ByteMutator = size_t (*)(uint8_t* data, size_t size, size_t max_size);

// The structure-aware mutation (LLVMFuzzerCustomMutator): splits the input into header and
// records and does one of: insert a record (a copy of another, or fresh bytes), delete one,
// swap two, aim a value field at a boundary (kWindow, kBehindWindow, kSnapshotEnd, or
// kRelative with arg 8 = the anchor itself), or byte-mutate the header or one record with
// `bytes`. Returns the new size (header + whole records, <= max_size). kTraceReader: `bytes`
// over the whole input. Deterministic in `seed`.
size_t MutateFuzzInput(FuzzTarget target, uint8_t* data, size_t size, size_t max_size,
                       uint32_t seed, ByteMutator bytes);

}  // namespace kvtwin::sim
