// Dimensions shared by the micro benchmarks: one recurrent (gated delta) layer shape,
// Qwen3.5-like heads at a benchmark-friendly size.
#pragma once

#include "src/recurrent_cache.h"

namespace kvtwin::bench {

inline RecurrentDims BenchRecurrentDims() {
  RecurrentDims d;
  d.num_k_heads = 2;
  d.num_v_heads = 4;
  d.head_k_dim = 64;
  d.head_v_dim = 64;
  return d;
}

}  // namespace kvtwin::bench
