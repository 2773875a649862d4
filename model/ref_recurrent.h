// The reference meaning of a recurrent layer's state and outputs (spec §2.4, §5.3), in
// double precision and written from the math, not from src/: after P folded tokens the conv tail
// is the raw conv inputs of positions P-conv_tail .. P-1 (zero rows before 0) and the delta
// state is S_P = F(x_{P-1}) o ... o F(x_0) (0) of the gated-delta rule. RefGdnFolder keeps a
// memo of states keyed by the provenance hash of the last folded token (a hash of the whole
// prefix), so checking after every step folds only new tokens; that is transparent: the
// memo never changes what S_P is. The memo's states live in one flat arena and the inputs are
// written into one reused token, so a fold allocates nothing once warm (the checks run after
// every fuzz step, where each allocation is costly under ASan). Single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory_resource>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/ref_cache.h"
#include "src/core/tensor.h"

namespace kvtwin::model {

struct RefGdnDims {
  int64_t num_k_heads = 1, num_v_heads = 2, head_k_dim = 4, head_v_dim = 4;
};

// One token's inputs to the gated-delta rule, as the production kernel receives them.
struct RefGdnToken {
  VecD q, k;       // [Hk*Dk] each
  VecD v;          // [Hv*Dv]
  VecD beta_raw;   // [Hv]
  VecD alpha_raw;  // [Hv]
};

struct RefGdnParams {
  RefGdnDims dims;
  VecD dt_bias;  // [Hv]
  VecD a_exp;    // [Hv]
};

// S <- F(x)(S) for one token; S is [(Hv*Dv) x Dk] (row h*Dv + i, column j).
void RefGdnStep(MatD& state, const RefGdnToken& token, const RefGdnParams& params);
// The token's output row (spec §2.4.2): y_h = S_h q̂, q̂ = RMSNorm(q_g) / Dk, over `state`,
// the state after the token's own step. `y` becomes [Hv*Dv] (row h*Dv + i).
void RefGdnReadOut(const MatD& state, const RefGdnToken& token, const RefGdnParams& params,
                   VecD& y);

// One output row of the causal depthwise conv (spec §2.4.1): out[c] = b[c] + Σ_j w(c, j) ·
// window[j][c] over the window of the conv_tail + 1 raw conv input rows ending at the token
// (oldest first, zero rows before position 0; each row C floats, read in place), then SiLU
// when `silu`. `bias` is [C] or empty (no bias); `w` is [C x (conv_tail + 1)]. `out`
// becomes [C].
void RefConvRow(std::span<const float* const> window, const MatD& w, const VecD& bias, bool silu,
                VecD& out);

class RefGdnFolder {
 public:
  // Writes the inputs of the token at position p given its provenance into `out` (which
  // holds the previous token's inputs: same sizes, so resizing is free).
  using InputFn = std::function<void(int64_t position, const Token& token, RefGdnToken& out)>;
  RefGdnFolder(RefGdnParams params, InputFn inputs);
  // As if constructed with `params` (same input function): the memo is forgotten, its
  // buffers kept.
  void Reset(RefGdnParams params);

  // S_P for the first `length` tokens of `log` (zeros for length 0). The reference stays
  // valid until the next call (checkers compare it in place instead of copying a state).
  const MatD& StateAfter(std::span<const Token> log, int64_t length);
  // The read-outs of tokens [from, to) of `log`: row p - from of `y` ([(to - from) x Hv*Dv])
  // is RefGdnReadOut over S_{p+1} with token p's inputs. Folds from the longest memoized
  // prefix and memoizes the states it reaches at checkpoints (every 32nd position and the
  // fold's last 32), as StateAfter does, so a StateAfter(log, to) that follows is a lookup.
  // REQUIRES: 0 <= from <= to <= |log|.
  void ReadOuts(std::span<const Token> log, int64_t from, int64_t to, MatD& y);

 private:
  // Copies memoized state `index` into `into`.
  void Recall(size_t index, MatD& into) const;
  // Memoizes state_ as the state after the token whose provenance hash is `h`.
  void Memoize(uint64_t h);

  RefGdnParams params_;
  InputFn inputs_;
  Eigen::Index rows_, cols_;  // of every state
  size_t memo_entries_;       // the memo's bound at these widths
  // Nodes come from a pool, so a warm memo inserts without calling malloc.
  std::pmr::unsynchronized_pool_resource pool_;
  std::pmr::unordered_map<uint64_t, size_t> memo_{&pool_};  // h of the last token -> index
  std::vector<double> arena_;  // state i at [i * rows_ * cols_, (i + 1) * rows_ * cols_)
  RefGdnToken token_;          // the inputs of the token being folded
  VecD read_out_;              // one row of ReadOuts
  MatD state_;                 // the state being folded
  MatD result_;                // what StateAfter returns
};

// The positions whose raw conv inputs form the tail after `length` tokens, oldest first;
// negative entries stand for zero rows.
std::vector<int64_t> ExpectedConvTailPositions(int64_t length, int64_t conv_tail);

}  // namespace kvtwin::model
