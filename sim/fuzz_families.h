// The per-family decoders behind RunFuzzInput (sim/fuzz_input.h is the contract: layout,
// value modes, recording). sim/fuzz_input.cc dispatches by target; each family lives in its
// own file: fuzz_layers.cc (kKv, kRotating, kRecurrent, kSpeculation over LockstepDriver),
// fuzz_prefix.cc (kPrefix over RequestDriver), fuzz_hybrid.cc (kHybrid over
// MultiSeqDriver), fuzz_input.cc (kTraceReader).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sim/fuzz_input.h"

namespace kvtwin::sim {

// An input cut along its layout: the header (zero-padded to header_bytes) and the whole
// records (at most max_records), each record_bytes long.
struct FuzzParts {
  std::vector<uint8_t> header;
  std::vector<std::vector<uint8_t>> records;
};
FuzzParts SplitFuzzInput(const FuzzLayout& layout, const uint8_t* data, size_t size);

FuzzLayout LayerFuzzLayout(FuzzTarget target);  // kKv, kRotating, kRecurrent, kSpeculation
FuzzRun RunLayerFuzz(FuzzTarget target, const FuzzParts& parts);

FuzzLayout PrefixFuzzLayout();
FuzzRun RunPrefixFuzz(const FuzzParts& parts);

FuzzLayout HybridFuzzLayout();
FuzzRun RunHybridFuzz(const FuzzParts& parts);

FuzzRun RunTraceReaderFuzz(const uint8_t* data, size_t size);

}  // namespace kvtwin::sim
