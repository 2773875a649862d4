// The recurrent kernels (spec §2.4): a causal depthwise conv with a carried tail and the
// gated-delta rule of Qwen3.5 GDN layers, each in a step-by-step form and a segmented form
// (state threaded through the segments between snapshot splits) that must agree. Inputs
// are float matrices whose values are already representable in the activation dtype; the
// delta state is float32. Padded rows (index >= real_len) are identity steps: they change
// neither the conv tail nor the delta state. Pure functions; no state.
#pragma once

#include <cstdint>
#include <vector>

#include "src/core/tensor.h"
#include "src/recurrent_cache.h"

namespace kvtwin {

struct ConvWeights {
  MatF w;     // [conv_dim x (conv_tail + 1)]; column j multiplies X[t + j]
  VecF bias;  // [conv_dim] or empty
  bool silu = false;
};

struct ConvResult {
  MatF out;                    // [L x conv_dim]; every row, padded ones over zeroed inputs
  std::vector<Tensor> states;  // tail at each interior split, then at real_len (tail dtype)
};

// out[t] = b + sum_j w[:, j] * X[t + j] over X = [tail ; x] (x rows >= real_len zeroed).
// REQUIRES: tail is [conv_tail x C], x is [L x C] in the tail's dtype, 0 <= real_len <= L,
// splits strictly ascending inside (0, real_len).
ConvResult CausalConv1D(const Tensor& tail, const Tensor& x, int64_t real_len,
                        const ConvWeights& weights, const std::vector<int64_t>& splits);

// The buffers of one conv: X = [tail ; x] in the tail's dtype and its float copy.
struct ConvScratch {
  Tensor window;
  MatF window_f;
};
// CausalConv1D into `out` (and `scratch`), reusing every buffer whose shape already fits:
// a forward of the same shape as the previous one allocates nothing. The value form calls
// this with fresh buffers, so the two cannot differ. `out`'s previous contents are ignored.
void CausalConv1DInto(const Tensor& tail, const Tensor& x, int64_t real_len,
                      const ConvWeights& weights, const std::vector<int64_t>& splits,
                      ConvScratch& scratch, ConvResult& out);

// The conv tail after the first n rows of `x` followed a conv whose tail was `tail`: the
// last conv_tail rows of [tail ; x[0, n)] (pure data movement, so exact).
// REQUIRES: same dtype and columns; 0 <= n <= x.rows().
Tensor ConvTailAfter(const Tensor& tail, const Tensor& x, int64_t n);

struct GdnParams {
  RecurrentDims dims;
  VecF dt_bias;  // [Hv]
  VecF a_exp;    // [Hv], A = exp(A_log) > 0
};

struct GdnInputs {
  MatF qkv;  // [L x (2*Hk*Dk + Hv*Dv)]: [q | k | v]
  MatF ba;   // [L x 2*Hv]: [beta_raw | alpha_raw]
};

struct GdnResult {
  MatF y;                    // [L x Hv*Dv]; padded rows are zero
  std::vector<MatF> states;  // state at each interior split, then at real_len
};

// One token of the gated-delta rule applied to `state` ([(Hv*Dv) x Dk]); writes the
// output row (Hv*Dv floats) to `y`.
void GatedDeltaStep(MatF& state, const float* qkv_row, const float* ba_row, const GdnParams& params,
                    float* y);
// Token by token over the whole forward, recording the state at every split.
GdnResult GatedDelta(const MatF& state, const GdnInputs& inputs, int64_t real_len,
                     const GdnParams& params, const std::vector<int64_t>& splits);
// GatedDelta into `out`, reusing its buffers as CausalConv1DInto does; the scan runs in
// place on out.states.back(). REQUIRES: `state` is not one of out.states.
void GatedDeltaInto(const MatF& state, const GdnInputs& inputs, int64_t real_len,
                    const GdnParams& params, const std::vector<int64_t>& splits, GdnResult& out);
// Segment by segment: one GatedDelta call per segment between splits, threading the state.
GdnResult GatedDeltaSegmented(const MatF& state, const GdnInputs& inputs, int64_t real_len,
                              const GdnParams& params, const std::vector<int64_t>& splits);
// The buffers GatedDeltaSegmentedInto reuses: one segment's inputs, its scan and the state
// threaded between segments.
struct GdnSegmentScratch {
  GdnInputs segment;
  GdnResult part;
  MatF state;
};
// GatedDeltaSegmented into `out`, reusing `scratch` and out's buffers (the value form calls
// this with fresh ones, so the two cannot differ).
void GatedDeltaSegmentedInto(const MatF& state, const GdnInputs& inputs, int64_t real_len,
                             const GdnParams& params, const std::vector<int64_t>& splits,
                             GdnSegmentScratch& scratch, GdnResult& out);

}  // namespace kvtwin
