// The per-family decoders behind RunFuzzInput (sim/fuzz_input.h is the contract: layout,
// value modes, recording). sim/fuzz_input.cc dispatches by target; each family lives in its
// own file: fuzz_layers.cc (kKv, kRotating, kRecurrent, kSpeculation over LockstepDriver),
// fuzz_prefix.cc (kPrefix over RequestDriver), fuzz_hybrid.cc (kHybrid over
// MultiSeqDriver), fuzz_input.cc (kTraceReader).
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sim/fuzz_input.h"
#include "sim/lockstep.h"

namespace kvtwin::sim {

// An input cut along its layout: the header (zero-padded to header_bytes) and the whole
// records (at most max_records), each record_bytes long. Records view the input bytes
// (one execution runs thousands of times a second; copying every record was a tenth of
// its allocations), so a FuzzParts lives no longer than the input it was cut from.
struct FuzzParts {
  std::vector<uint8_t> header;
  std::vector<std::span<const uint8_t>> records;
};
FuzzParts SplitFuzzInput(const FuzzLayout& layout, const uint8_t* data, size_t size);
// The same cut into `parts`, reusing its buffers.
void SplitFuzzInputInto(const FuzzLayout& layout, const uint8_t* data, size_t size,
                        FuzzParts& parts);

// LayoutOf(target), built once: the layout is fixed per target, and the decoder and the
// mutator run once per execution each.
const FuzzLayout& CachedLayout(FuzzTarget target);

// The N one-byte fields of a header or record, in field order: field k is byte N - 1 - k
// (FuzzedDataProvider reads integers from the end), whatever the state, so a mutation of
// one byte changes one decision and the layout table can address every field.
template <size_t N>
std::array<uint8_t, N> ReadFields(std::span<const uint8_t> bytes) {
  FuzzedDataProvider in(bytes.data(), bytes.size());
  std::array<uint8_t, N> fields{};
  for (uint8_t& f : fields) f = in.ConsumeIntegral<uint8_t>();
  return fields;
}

FuzzLayout LayerFuzzLayout(FuzzTarget target);  // kKv, kRotating, kRecurrent, kSpeculation
// What the layer family keeps between the executions of a FuzzSession: the driver (Reset
// per execution) and the op being applied when no trace is recorded.
struct LayerFuzzState {
  std::unique_ptr<LockstepDriver> driver;
  Op op;
};
// `counts`: the session's ShapeRunCounts, shared by every run's oracles (sim/checks.h).
FuzzRun RunLayerFuzz(FuzzTarget target, const FuzzParts& parts, LayerFuzzState& state,
                     ShapeRunCounts& counts, bool record_trace);

FuzzLayout PrefixFuzzLayout();
FuzzRun RunPrefixFuzz(const FuzzParts& parts, ShapeRunCounts& counts, bool record_trace);

FuzzLayout HybridFuzzLayout();
FuzzRun RunHybridFuzz(const FuzzParts& parts, bool record_trace);

FuzzRun RunTraceReaderFuzz(const uint8_t* data, size_t size);

}  // namespace kvtwin::sim
