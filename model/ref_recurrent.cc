// The reference gated-delta fold (spec §2.4.2, §5.3) in double precision, written as plain
// loops in the order the spec states the rule (decay, read, delta correction), so that a
// reader can check it against the formula line by line. The read-out y = S q̂ and the conv
// output are not part of the state: RefGdnReadOut and RefConvRow compute them on request,
// for the output checks.
#include "model/ref_recurrent.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace kvtwin::model {
namespace {

// Bounds the memo: the simulator visits millions of distinct prefixes, and every entry is a
// whole state. Clearing costs one re-fold from position 0 on the next miss and can never
// change a result, because the memo only caches S_P. Bounded in bytes too: at a real
// model's widths a state is tens of kilobytes (8 value heads of 32 x 32 keys: 64 KB), and
// 2^16 of them filled 4 GB per layer, most of a replay's time spent faulting pages in.
constexpr size_t kMemoEntriesMax = size_t{1} << 16;
constexpr size_t kMemoBytesMax = size_t{64} << 20;
constexpr size_t kMemoEntriesMin = 64;

size_t MemoEntries(Eigen::Index rows, Eigen::Index cols) {
  const auto bytes = static_cast<size_t>(rows * cols) * sizeof(double);
  return std::clamp(kMemoBytesMax / std::max<size_t>(bytes, 1), kMemoEntriesMin, kMemoEntriesMax);
}

// A fold memoizes the state after token p only at checkpoints: every kCheckpointStride-th
// position and the last kCheckpointStride tokens of the fold (where the next check, a
// speculative commit or a short rewind looks). At real context lengths memoizing every
// token filled the memo within a few requests (clearing it, so a restore re-folded from 0)
// and cost a map insert and a state copy per token; now a miss re-folds at most
// kCheckpointStride tokens past a checkpoint. Which states are memoized never changes S_P.
constexpr int64_t kCheckpointStride = 32;

bool IsCheckpoint(int64_t p, int64_t fold_end) {
  return (p + 1) % kCheckpointStride == 0 || fold_end - p <= kCheckpointStride;
}

constexpr double kRmsEps = 1e-6;

// log(1 + e^x) without overflow for large x (naive exp(x) is inf beyond ~709, which would
// turn a moderate x * a_exp into a zero decay).
double Softplus(double x) {
  return x > 0.0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

// 1 / (1 + e^-x) evaluated on the side where the exponential cannot overflow; -inf gives 0.
double Sigmoid(double x) {
  if (x >= 0.0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

// sqrt(mean(x^2) + eps) over x = vec[begin, begin + n): the RMSNorm denominator.
double RmsOf(const VecD& vec, int64_t begin, int64_t n) {
  double sum_sq = 0.0;
  for (int64_t j = 0; j < n; ++j) sum_sq += vec(begin + j) * vec(begin + j);
  return std::sqrt(sum_sq / static_cast<double>(n) + kRmsEps);
}

void CheckShapes(const MatD& state, const RefGdnToken& token, const RefGdnParams& params) {
  const RefGdnDims& d = params.dims;
  KV_CHECK(d.num_k_heads >= 1 && d.num_v_heads % d.num_k_heads == 0,
           "value heads must be a multiple of key heads");
  KV_CHECK(state.rows() == d.num_v_heads * d.head_v_dim && state.cols() == d.head_k_dim,
           "state must be [(Hv*Dv) x Dk]");
  KV_CHECK(token.q.size() == d.num_k_heads * d.head_k_dim, "q must be [Hk*Dk]");
  KV_CHECK(token.k.size() == d.num_k_heads * d.head_k_dim, "k must be [Hk*Dk]");
  KV_CHECK(token.v.size() == d.num_v_heads * d.head_v_dim, "v must be [Hv*Dv]");
  KV_CHECK(token.beta_raw.size() == d.num_v_heads && token.alpha_raw.size() == d.num_v_heads,
           "beta_raw and alpha_raw must be [Hv]");
  KV_CHECK(params.dt_bias.size() == d.num_v_heads && params.a_exp.size() == d.num_v_heads,
           "dt_bias and a_exp must be [Hv]");
}

MatD ZeroState(const RefGdnDims& d) {
  return MatD::Zero(d.num_v_heads * d.head_v_dim, d.head_k_dim);
}

}  // namespace

void RefGdnStep(MatD& state, const RefGdnToken& token, const RefGdnParams& params) {
  CheckShapes(state, token, params);
  const RefGdnDims& d = params.dims;
  const int64_t group = d.num_v_heads / d.num_k_heads;
  const double scale = std::sqrt(static_cast<double>(d.head_k_dim));
  for (int64_t h = 0; h < d.num_v_heads; ++h) {
    const int64_t g = h / group;  // the key head this value head reads
    // k̂ = RMSNorm(k_g) / sqrt(Dk), element j = k(g Dk + j) / rms / scale (no weight).
    const int64_t k0 = g * d.head_k_dim;
    const double rms = RmsOf(token.k, k0, d.head_k_dim);
    const auto k_hat = [&](int64_t j) { return token.k(k0 + j) / rms / scale; };
    const double decay =
        std::exp(-Softplus(token.alpha_raw(h) + params.dt_bias(h)) * params.a_exp(h));
    const double beta = Sigmoid(token.beta_raw(h));
    for (int64_t i = 0; i < d.head_v_dim; ++i) {
      const int64_t row = h * d.head_v_dim + i;
      double m = 0.0;  // (S k̂)_i after the decay
      for (int64_t j = 0; j < d.head_k_dim; ++j) {
        state(row, j) *= decay;
        m += state(row, j) * k_hat(j);
      }
      const double delta = beta * (token.v(row) - m);
      for (int64_t j = 0; j < d.head_k_dim; ++j) state(row, j) += delta * k_hat(j);
    }
  }
}

void RefGdnReadOut(const MatD& state, const RefGdnToken& token, const RefGdnParams& params,
                   VecD& y) {
  CheckShapes(state, token, params);
  const RefGdnDims& d = params.dims;
  const int64_t group = d.num_v_heads / d.num_k_heads;
  const auto dk = static_cast<double>(d.head_k_dim);
  y.resize(d.num_v_heads * d.head_v_dim);
  for (int64_t h = 0; h < d.num_v_heads; ++h) {
    // q̂ = RMSNorm(q_g) / Dk: the (1/sqrt(Dk))^2 of the spec, element j = q(g Dk + j) / rms / Dk.
    const int64_t q0 = (h / group) * d.head_k_dim;
    const double rms = RmsOf(token.q, q0, d.head_k_dim);
    for (int64_t i = 0; i < d.head_v_dim; ++i) {
      const int64_t row = h * d.head_v_dim + i;
      double sum = 0.0;
      for (int64_t j = 0; j < d.head_k_dim; ++j)
        sum += state(row, j) * (token.q(q0 + j) / rms / dk);
      y(row) = sum;
    }
  }
}

void RefConvRow(std::span<const float* const> window, const MatD& w, const VecD& bias, bool silu,
                VecD& out) {
  const Eigen::Index channels = w.rows();
  const auto taps = static_cast<Eigen::Index>(window.size());
  KV_CHECK(w.cols() == taps, "conv weights must be [C x (conv_tail + 1)] over as many rows");
  KV_CHECK(bias.size() == 0 || bias.size() == channels, "conv bias must be [C] or empty");
  out.resize(channels);
  for (Eigen::Index c = 0; c < channels; ++c) {
    double sum = bias.size() == 0 ? 0.0 : bias(c);
    for (Eigen::Index j = 0; j < taps; ++j) {
      sum += w(c, j) * static_cast<double>(window[static_cast<size_t>(j)][c]);
    }
    // SiLU(x) = x * sigmoid(x).
    out(c) = silu ? sum * Sigmoid(sum) : sum;
  }
}

RefGdnFolder::RefGdnFolder(RefGdnParams params, InputFn inputs)
    : params_(std::move(params)),
      inputs_(std::move(inputs)),
      rows_(params_.dims.num_v_heads * params_.dims.head_v_dim),
      cols_(params_.dims.head_k_dim),
      memo_entries_(MemoEntries(rows_, cols_)) {
  KV_CHECK(static_cast<bool>(inputs_), "the folder needs an input function");
}

void RefGdnFolder::Reset(RefGdnParams params) {
  params_ = std::move(params);
  rows_ = params_.dims.num_v_heads * params_.dims.head_v_dim;
  cols_ = params_.dims.head_k_dim;
  memo_entries_ = MemoEntries(rows_, cols_);
  memo_.clear();
  arena_.clear();
}

void RefGdnFolder::Recall(size_t index, MatD& into) const {
  const auto n = static_cast<size_t>(rows_ * cols_);
  KV_CHECK((index + 1) * n <= arena_.size(), "a memo index past the arena");
  into.resize(rows_, cols_);
  std::copy_n(arena_.data() + index * n, n, into.data());
}

const MatD& RefGdnFolder::StateAfter(std::span<const Token> log, int64_t length) {
  KV_CHECK(
      0 <= length && length <= static_cast<int64_t>(log.size()),
      "fold length " + std::to_string(length) + " outside a log of " + std::to_string(log.size()));
  if (length == 0) {
    result_ = ZeroState(params_.dims);
    return result_;
  }
  const auto at = [&](int64_t p) -> const Token& { return log[static_cast<size_t>(p)]; };
  // Walk back to the longest prefix whose state is memoized (h names the whole prefix).
  int64_t folded = length;
  auto hit = memo_.end();
  while (folded > 0 && (hit = memo_.find(at(folded - 1).h)) == memo_.end()) --folded;
  if (folded == length) {
    Recall(hit->second, result_);
    return result_;
  }
  if (folded > 0) {
    Recall(hit->second, state_);
  } else {
    state_ = ZeroState(params_.dims);
  }
  for (int64_t p = folded; p < length; ++p) {
    inputs_(p, at(p), token_);
    RefGdnStep(state_, token_, params_);
    if (IsCheckpoint(p, length)) Memoize(at(p).h);
  }
  result_ = state_;
  return result_;
}

void RefGdnFolder::Memoize(uint64_t h) {
  const auto n = static_cast<size_t>(rows_ * cols_);
  if (memo_.size() >= memo_entries_) {
    memo_.clear();
    arena_.clear();
  }
  const auto [it, inserted] = memo_.try_emplace(h, arena_.size() / n);
  if (inserted) {
    arena_.insert(arena_.end(), state_.data(), state_.data() + n);
  } else {
    std::copy_n(state_.data(), n, arena_.data() + it->second * n);
  }
}

void RefGdnFolder::ReadOuts(std::span<const Token> log, int64_t from, int64_t to, MatD& y) {
  KV_CHECK(0 <= from && from <= to && to <= static_cast<int64_t>(log.size()),
           "read-outs of [" + std::to_string(from) + ", " + std::to_string(to) +
               ") outside a log of " + std::to_string(log.size()));
  state_ = StateAfter(log, from);
  y.resize(to - from, rows_);
  for (int64_t p = from; p < to; ++p) {
    const Token& token = log[static_cast<size_t>(p)];
    inputs_(p, token, token_);
    RefGdnStep(state_, token_, params_);
    if (IsCheckpoint(p, to)) Memoize(token.h);
    RefGdnReadOut(state_, token_, params_, read_out_);
    y.row(p - from) = read_out_.transpose();
  }
}

std::vector<int64_t> ExpectedConvTailPositions(int64_t length, int64_t conv_tail) {
  KV_CHECK(length >= 0 && conv_tail >= 0, "negative length or conv tail");
  std::vector<int64_t> positions;
  for (int64_t p = length - conv_tail; p < length; ++p) positions.push_back(p);
  return positions;
}

}  // namespace kvtwin::model
