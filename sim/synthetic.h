// SyntheticForward: how kvtwin makes values (spec README "Synthetic forward"). Every value
// depends on the whole prefix: h_p = H(h_{p-1}, token_p) with h_{-1} = the run's seed, and
// every per-layer row (K, V, conv input, gated-delta inputs) is derived from
// (layer, p, h_p). K/V rows are self-describing: their first seven elements are bytes
// (0..255, exact in float32 and bfloat16) of the position, of the low 24 bits of h_p and
// of the layer, so a report can say what a slot holds. This is the only place values are
// made; it holds no cache logic. Pure and deterministic; single-threaded.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "src/core/tensor.h"
#include "src/kernels.h"
#include "src/recurrent_cache.h"

namespace kvtwin::sim {

// Elements at the front of a K/V row that carry provenance.
inline constexpr int64_t kTagElements = 7;
// Positions the single-sequence drivers reach (a layer's offset is its row count).
inline constexpr int64_t kMaxPosition = (int64_t{1} << 24) - 1;
// Positions a multi-sequence batch can carry (int32, ggml's type; the causal cache refuses
// more). The tag keeps a position's low 24 bits, so rows beyond kMaxPosition are told apart
// by their hash and values, which are drawn from the whole position.
inline constexpr int64_t kMaxBatchPosition = std::numeric_limits<int32_t>::max();

// What a K/V row says about itself.
struct Provenance {
  bool valid = false;  // the tag bytes are integers in 0..255
  int64_t position = -1;
  uint32_t hash24 = 0;  // low 24 bits of h_p
  int32_t layer = -1;
  bool is_value = false;         // a V row (else K)
  std::string ToString() const;  // "pos 17 h=0x3fa2c1 L2 K" or "untagged row"
};

// The next rolling hash: H(h_prev, token).
uint64_t NextHash(uint64_t h_prev, int32_t token);

class SyntheticForward {
 public:
  // `seed` also seeds the per-layer kernel parameters.
  explicit SyntheticForward(uint64_t seed) : seed_(seed) {}
  uint64_t seed() const { return seed_; }

  // One K or V row of `cols` elements for (layer, p, h), rounded to `dtype`; its tag holds
  // p's low 24 bits. REQUIRES: cols >= kTagElements, 0 <= p <= kMaxBatchPosition.
  Tensor KvRow(DType dtype, int64_t cols, int32_t layer, int64_t p, uint64_t h,
               bool is_value) const;
  // Writes the same values into row `row` of `out` (no allocation).
  void FillKvRow(Tensor& out, int64_t row, int32_t layer, int64_t p, uint64_t h,
                 bool is_value) const;

  // An attention query row for (layer, p) (the simulator's attention check; no cache
  // stores it): the first kTagElements columns, which meet K's provenance tag (bytes up to
  // 255), in [-1/256, 1/256) so every score stays O(1), the others in [-1, 1).
  void FillQueryRow(MatF& out, int64_t row, int32_t layer, int64_t p) const;

  // The raw conv input row (conv_dim values in [-1, 1)) for (layer, p, h), in `dtype`.
  void FillConvInput(MatF& out, int64_t row, DType dtype, int32_t layer, int64_t p, uint64_t h,
                     int64_t conv_dim) const;
  // The gated-delta inputs of one token: qkv row and [beta_raw | alpha_raw] row.
  void FillGdnInput(MatF& qkv, MatF& ba, int64_t row, DType dtype, int32_t layer, int64_t p,
                    uint64_t h, const RecurrentDims& dims) const;
  // Per-layer kernel parameters (fixed for a run).
  ConvWeights ConvParams(int32_t layer, const RecurrentDims& dims) const;
  GdnParams GdnParamsFor(int32_t layer, const RecurrentDims& dims) const;

 private:
  uint64_t seed_;
};

// Decodes the provenance tag of row `row` of `t`.
Provenance DecodeRow(TensorView t, int64_t row);

// The RoPE shift of a synthetic K row: RoPE rotates by position, so moving a key moves its
// position and leaves its content; here that is re-encoding the position tag of row `row`
// as position + delta, modulo 2^24: a cell that never received its row (a refused forward
// committed its metadata) holds stale content that a Remove still shifts, and its tag may
// leave the range. An untagged row is left as it is (it is wrong already; the checker says so).
void ShiftPositionTag(Tensor& t, int64_t row, int64_t delta);

}  // namespace kvtwin::sim
