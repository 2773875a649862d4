// Goal: pin the double-precision recurrent reference (model/ref_recurrent.h) to spec
// §2.4.2 / §5.3, since production delta states are checked against it with a tolerance.
// Method: single gated-delta steps against closed forms F(x)(S) = g S (I - b k k^T) + b v k^T
// worked out by hand for tiny heads (Dk = Dv = 1, or a 3-4-5 key); head grouping and
// padding identities; the folder's memo against a memo-free fold over logs that share a
// prefix, are truncated, or overflow the memo; the read-out and the conv output row against
// hand computations; conv tail positions.
#include "model/ref_recurrent.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace kvtwin::model {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

VecD Vec(std::initializer_list<double> values) {
  VecD v(static_cast<Eigen::Index>(values.size()));
  Eigen::Index i = 0;
  for (double x : values) v(i++) = x;
  return v;
}

RefGdnParams Params(const RefGdnDims& dims, double dt_bias, double a_exp) {
  return RefGdnParams{dims, VecD::Constant(dims.num_v_heads, dt_bias),
                      VecD::Constant(dims.num_v_heads, a_exp)};
}

// SplitMix64 finalizer: a stand-in for the driver's provenance hash.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Appends tokens with rolling hashes h_p = Mix(h_{p-1} ^ id), so h names the whole prefix.
TokenLog Extend(TokenLog log, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    const uint64_t prev = log.empty() ? 7 : log.back().h;
    log.push_back(Token{id, Mix(prev ^ static_cast<uint64_t>(id))});
  }
  return log;
}

std::vector<int32_t> IdRange(int32_t begin, int32_t end) {
  std::vector<int32_t> ids;
  for (int32_t id = begin; id < end; ++id) ids.push_back(id);
  return ids;
}

// A value in [-1, 1) derived from a hash and a salt.
double Unit(uint64_t h, uint64_t salt) {
  return static_cast<double>(Mix(h + salt * 0x632BE59BD9B4E019ull) >> 11) * 0x1.0p-52 - 1.0;
}

// Inputs derived from (position, h_p), as the synthetic forward does (README).
RefGdnToken Inputs(const RefGdnDims& d, int64_t position, const Token& token) {
  const uint64_t h = token.h + static_cast<uint64_t>(position);
  auto fill = [&](int64_t n, uint64_t salt) {
    VecD v(n);
    for (int64_t i = 0; i < n; ++i) v(i) = Unit(h, salt * 1000 + static_cast<uint64_t>(i));
    return v;
  };
  return RefGdnToken{fill(d.num_k_heads * d.head_k_dim, 1), fill(d.num_k_heads * d.head_k_dim, 2),
                     fill(d.num_v_heads * d.head_v_dim, 3), fill(d.num_v_heads, 4),
                     fill(d.num_v_heads, 5)};
}

// The definition S_P = F(x_{P-1}) o ... o F(x_0)(0), with no memo.
MatD FoldWithoutMemo(const RefGdnParams& params, const TokenLog& log, int64_t length) {
  const RefGdnDims& d = params.dims;
  MatD state = MatD::Zero(d.num_v_heads * d.head_v_dim, d.head_k_dim);
  for (int64_t p = 0; p < length; ++p) {
    RefGdnStep(state, Inputs(d, p, log[static_cast<size_t>(p)]), params);
  }
  return state;
}

RefGdnFolder MakeFolder(const RefGdnParams& params, int64_t* calls = nullptr) {
  return RefGdnFolder(params,
                      [dims = params.dims, calls](int64_t p, const Token& t, RefGdnToken& out) {
                        if (calls != nullptr) ++*calls;
                        out = Inputs(dims, p, t);
                      });
}

const RefGdnDims kScalar{1, 1, 1, 1};
const RefGdnDims kSmall{1, 2, 4, 4};

// ---- RefGdnStep ----

// Dk = Dv = 1, S0 = 4, k = 1, v = 2, alpha + dt_bias = 0, A = 1, beta_raw = 0:
// g = exp(-ln 2) = 1/2, b = 1/2, k^ = 1/sqrt(1 + 1e-6), so
// S = g S0 (1 - b k^2) + b v k^ = 2 - k^2 + k^ (= 2 up to the RMSNorm epsilon).
TEST(RefGdnStep, SingleScalarTokenMatchesTheClosedForm) {
  MatD state = MatD::Constant(1, 1, 4.0);
  RefGdnStep(state, RefGdnToken{Vec({1}), Vec({1}), Vec({2}), Vec({0}), Vec({0})},
             Params(kScalar, 0.0, 1.0));
  const double k_hat = 1.0 / std::sqrt(1.0 + 1e-6);
  EXPECT_NEAR(state(0, 0), 2.0 - k_hat * k_hat + k_hat, 1e-14);
  EXPECT_NEAR(state(0, 0), 2.0, 1e-6);
}

// Dk = Dv = 1, S0 = 8, k = 1, v = 2, alpha_raw = 0.5 with dt_bias = -0.5 (sum 0), A = 1,
// beta_raw = ln 3: g = 1/2, b = sigmoid(ln 3) = 3/4, and with k^ = 1 (up to epsilon)
// S = g S0 (1 - b) + b v = 4 / 4 + 3 / 2 = 5/2.
TEST(RefGdnStep, GatesAddDtBiasToAlphaAndTakeTheSigmoidOfBeta) {
  MatD state = MatD::Constant(1, 1, 8.0);
  RefGdnStep(state, RefGdnToken{Vec({1}), Vec({1}), Vec({2}), Vec({std::log(3.0)}), Vec({0.5})},
             Params(kScalar, -0.5, 1.0));
  const double k_hat = 1.0 / std::sqrt(1.0 + 1e-6);
  EXPECT_NEAR(state(0, 0), 4.0 * (1.0 - 0.75 * k_hat * k_hat) + 0.75 * 2.0 * k_hat, 1e-14);
  EXPECT_NEAR(state(0, 0), 2.5, 1e-5);  // the epsilon moves it by 4.5 * 5e-7
}

// Dk = 2, k = (3, 4): mean(k^2) = 12.5, so k^ = k / sqrt(12.5) / sqrt(2) = (0.6, 0.8);
// from S = 0 with b = 1/2 and v = 2 the state is b v k^T = (0.6, 0.8).
TEST(RefGdnStep, KeyIsRmsNormalizedAndScaledByRootDk) {
  const RefGdnDims dims{1, 1, 2, 1};
  MatD state = MatD::Zero(1, 2);
  RefGdnStep(state, RefGdnToken{Vec({0, 0}), Vec({3, 4}), Vec({2}), Vec({0}), Vec({0})},
             Params(dims, 0.0, 1.0));
  const double scale = std::sqrt(12.5 + 1e-6) * std::sqrt(2.0);
  EXPECT_NEAR(state(0, 0), 3.0 / scale, 1e-15);
  EXPECT_NEAR(state(0, 1), 4.0 / scale, 1e-15);
  EXPECT_NEAR(state(0, 0), 0.6, 1e-7);
  EXPECT_NEAR(state(0, 1), 0.8, 1e-7);
}

// Hk = 2, Hv = 4: heads 0, 1 read key head 0 and heads 2, 3 read key head 1 (h / 2, not
// h % 2). Key head 1 is zero, so heads 2 and 3 stay zero.
TEST(RefGdnStep, ValueHeadsReadTheKeyHeadOfTheirGroup) {
  const RefGdnDims dims{2, 4, 1, 1};
  MatD state = MatD::Zero(4, 1);
  RefGdnStep(state,
             RefGdnToken{Vec({1, 1}), Vec({1, 0}), Vec({1, 1, 1, 1}), Vec({0, 0, 0, 0}),
                         Vec({0, 0, 0, 0})},
             Params(dims, 0.0, 1.0));
  EXPECT_NEAR(state(0, 0), 0.5, 1e-6);
  EXPECT_NEAR(state(1, 0), 0.5, 1e-6);
  EXPECT_EQ(state(2, 0), 0.0);
  EXPECT_EQ(state(3, 0), 0.0);
}

// §2.4.2: a padded token (q, k, v zero, beta_raw = alpha_raw = -inf) is an identity step.
TEST(RefGdnStep, PaddedTokenLeavesTheStateUnchanged) {
  MatD state = MatD::Zero(8, 4);
  for (int64_t i = 0; i < state.size(); ++i) state.data()[i] = 0.25 * static_cast<double>(i);
  const MatD before = state;
  RefGdnStep(state,
             RefGdnToken{VecD::Zero(4), VecD::Zero(4), VecD::Zero(8), VecD::Constant(2, -kInf),
                         VecD::Constant(2, -kInf)},
             Params(kSmall, 0.5, 2.0));
  EXPECT_TRUE(state == before);
}

// softplus(1000) = 1000, so with A = 1e-3 the decay is e^-1; a naive log(1 + e^x) would
// overflow to inf and zero the state. k = 0 isolates the decay.
TEST(RefGdnStep, DecayUsesAStableSoftplusForLargeGateInputs) {
  MatD state = MatD::Constant(1, 1, 1.0);
  RefGdnStep(state, RefGdnToken{Vec({0}), Vec({0}), Vec({5}), Vec({0}), Vec({1000})},
             Params(kScalar, 0.0, 1e-3));
  EXPECT_NEAR(state(0, 0), std::exp(-1.0), 1e-15);
}

// ---- RefGdnFolder ----

TEST(RefGdnFolder, EmptyPrefixIsTheZeroState) {
  RefGdnFolder folder = MakeFolder(Params(kSmall, 0.3, 0.7));
  const MatD state = folder.StateAfter(Extend({}, {1, 2}), 0);
  EXPECT_TRUE(state == MatD::Zero(8, 4));
}

TEST(RefGdnFolder, MemoMatchesAFreshFoldAfterTruncationAndBranching) {
  const RefGdnParams params = Params(kSmall, 0.3, 0.7);
  const TokenLog shared = Extend({}, IdRange(0, 5));
  const TokenLog a = Extend(shared, IdRange(100, 107));
  const TokenLog b = Extend(shared, IdRange(200, 207));
  RefGdnFolder folder = MakeFolder(params);
  const std::vector<std::pair<const TokenLog*, int64_t>> visits = {
      {&a, 12}, {&b, 12}, {&a, 3}, {&b, 7}, {&a, 12}, {&b, 5}, {&a, 9}};
  for (const auto& [log, length] : visits) {
    EXPECT_TRUE(folder.StateAfter(*log, length) == FoldWithoutMemo(params, *log, length))
        << (log == &a ? "a" : "b") << " at " << length;
  }
  EXPECT_FALSE(FoldWithoutMemo(params, a, 12) == FoldWithoutMemo(params, b, 12));
}

TEST(RefGdnFolder, FoldsOnlyTokensBeyondTheLongestMemoizedPrefix) {
  const RefGdnParams params = Params(kSmall, 0.3, 0.7);
  const TokenLog a = Extend({}, IdRange(0, 12));
  const TokenLog b = Extend(Extend({}, IdRange(0, 5)), IdRange(200, 207));
  int64_t calls = 0;
  RefGdnFolder folder = MakeFolder(params, &calls);
  static_cast<void>(folder.StateAfter(a, 6));
  EXPECT_EQ(calls, 6);
  static_cast<void>(folder.StateAfter(a, 9));
  EXPECT_EQ(calls, 9);
  static_cast<void>(folder.StateAfter(a, 4));
  EXPECT_EQ(calls, 9);
  static_cast<void>(folder.StateAfter(b, 9));  // shares positions 0..4 with a
  EXPECT_EQ(calls, 13);
}

// The memo is keyed by the prefix hash, not by the last token: same last ids, other prefix.
TEST(RefGdnFolder, StateDependsOnTheWholePrefixNotTheLastToken) {
  const RefGdnParams params = Params(kSmall, 0.3, 0.7);
  const TokenLog a = Extend({}, {1, 2, 3});
  const TokenLog b = Extend({}, {9, 2, 3});
  RefGdnFolder folder = MakeFolder(params);
  const MatD state_a = folder.StateAfter(a, 3);
  const MatD state_b = folder.StateAfter(b, 3);
  EXPECT_TRUE(state_b == FoldWithoutMemo(params, b, 3));
  EXPECT_FALSE(state_a == state_b);
}

// A fold of 40 tokens memoizes 33 states (position 31 and the last 32), so 2,100 distinct
// logs overflow the 65,536-entry memo, which is then cleared: the first log's state must be
// folded again (the clear happened) and still be exact.
// `count` logs of `length` tokens that share no prefix.
std::vector<TokenLog> DistinctLogs(int32_t count, int32_t length) {
  std::vector<TokenLog> logs;
  for (int32_t i = 0; i < count; ++i)
    logs.push_back(Extend({}, IdRange(i * 100, i * 100 + length)));
  return logs;
}

TEST(RefGdnFolder, ResultsStayExactWhenTheMemoOverflows) {
  const RefGdnParams params = Params(kScalar, 0.3, 0.7);
  constexpr int32_t kLogs = 2100, kLength = 40;
  const std::vector<TokenLog> logs = DistinctLogs(kLogs, kLength);
  int64_t calls = 0;
  RefGdnFolder folder = MakeFolder(params, &calls);
  for (const TokenLog& log : logs) static_cast<void>(folder.StateAfter(log, kLength));
  const int64_t before = calls;
  EXPECT_TRUE(folder.StateAfter(logs.front(), kLength) ==
              FoldWithoutMemo(params, logs.front(), kLength));
  EXPECT_GT(calls, before) << "the memo was never cleared";
  EXPECT_TRUE(folder.StateAfter(logs.back(), 10) == FoldWithoutMemo(params, logs.back(), 10));
  EXPECT_TRUE(folder.StateAfter(logs.back(), kLength - 5) ==
              FoldWithoutMemo(params, logs.back(), kLength - 5));
}

// The memo is bounded in bytes too: a state of 8 value heads of 32 x 32 is 64 KB, so 64 MB
// hold 1,024 of them, and 40 logs of 33 checkpoints each (1,320 entries, far below the
// 65,536-entry bound) overflow it. Before the byte bound the memo held 2^16 such states
// (4 GB). The first log's state must be folded again (the clear happened) and be exact.
TEST(RefGdnFolder, AWideStateBoundsTheMemoInBytes) {
  const RefGdnParams params = Params(RefGdnDims{1, 8, 32, 32}, 0.3, 0.7);
  constexpr int32_t kLogs = 40, kLength = 40;
  const std::vector<TokenLog> logs = DistinctLogs(kLogs, kLength);
  int64_t calls = 0;
  RefGdnFolder folder = MakeFolder(params, &calls);
  for (const TokenLog& log : logs) static_cast<void>(folder.StateAfter(log, kLength));
  EXPECT_EQ(calls, kLogs * kLength);
  EXPECT_TRUE(folder.StateAfter(logs.front(), kLength) ==
              FoldWithoutMemo(params, logs.front(), kLength));
  EXPECT_EQ(calls, (kLogs + 1) * kLength) << "the memo kept more than 64 MB of states";
  // The last logs were folded after the clear: still memoized.
  static_cast<void>(folder.StateAfter(logs.back(), kLength));
  EXPECT_EQ(calls, (kLogs + 1) * kLength);
}

// A fold memoizes checkpoints (every 32nd position, the fold's last 32), not every token: a
// query inside a long fold re-folds at most 32 tokens, and a fold three times the memo's
// capacity no longer overflows it (memoizing every token cleared the memo twice on the
// way, so a later query near the start re-folded from 0).
TEST(RefGdnFolder, ALongFoldKeepsCheckpointsWithinTheMemo) {
  const RefGdnParams params = Params(kScalar, 0.3, 0.7);
  const int32_t n = 3 << 16;
  const TokenLog log = Extend({}, IdRange(0, n));
  int64_t calls = 0;
  RefGdnFolder folder = MakeFolder(params, &calls);
  static_cast<void>(folder.StateAfter(log, n));
  EXPECT_EQ(calls, n);
  for (const int64_t length : {int64_t{100}, int64_t{5000}, int64_t{n / 2 + 7}, int64_t{n - 3}}) {
    const int64_t before = calls;
    EXPECT_TRUE(folder.StateAfter(log, length) == FoldWithoutMemo(params, log, length))
        << "at " << length;
    EXPECT_LE(calls - before, 32) << "at " << length;
  }
}

// ---- Read-out and conv output ----

// Dk = 2, q = (3, 4): mean(q^2) = 12.5, so q^ = q / sqrt(12.5) / Dk (the (1/sqrt(Dk))^2 of
// the spec); S = [[1, 2]] gives y = 11 / (2 sqrt(12.5)) = 1.5556, where the key's
// 1/sqrt(Dk) would give 11 / 5 = 2.2.
TEST(RefGdnReadOut, QueryIsRmsNormalizedAndScaledByDk) {
  const RefGdnDims dims{1, 1, 2, 1};
  MatD state(1, 2);
  state << 1.0, 2.0;
  VecD y;
  RefGdnReadOut(state, RefGdnToken{Vec({3, 4}), Vec({9, 9}), Vec({0}), Vec({0}), Vec({0})},
                Params(dims, 0.0, 1.0), y);
  ASSERT_EQ(y.size(), 1);
  const double scale = std::sqrt(12.5 + 1e-6) * 2.0;
  EXPECT_NEAR(y(0), (1.0 * 3.0 + 2.0 * 4.0) / scale, 1e-15);
  EXPECT_NEAR(y(0), 1.5556349, 1e-7);
}

// Hk = 2, Hv = 4, Dk = Dv = 1: value heads 0, 1 read query head 0 and 2, 3 query head 1;
// a zero query (a padded token's) reads out zero whatever the state.
TEST(RefGdnReadOut, ValueHeadsReadTheQueryHeadOfTheirGroup) {
  const RefGdnDims dims{2, 4, 1, 1};
  const MatD state = Vec({1, 2, 3, 4});
  VecD y;
  RefGdnReadOut(state,
                RefGdnToken{Vec({2, 0}), Vec({1, 1}), Vec({0, 0, 0, 0}), Vec({0, 0, 0, 0}),
                            Vec({0, 0, 0, 0})},
                Params(dims, 0.0, 1.0), y);
  const double q_hat = 2.0 / std::sqrt(4.0 + 1e-6);  // RMSNorm of one element, Dk = 1
  EXPECT_NEAR(y(0), 1.0 * q_hat, 1e-15);
  EXPECT_NEAR(y(1), 2.0 * q_hat, 1e-15);
  EXPECT_EQ(y(2), 0.0);
  EXPECT_EQ(y(3), 0.0);
}

// Two channels, tail 2 (window rows t-2, t-1, t): out[c] = b[c] + sum_j w(c, j) window(j, c),
// tap j against window row j (oldest first), then SiLU when asked.
TEST(RefConvRow, WeighsTheWindowOldestFirstAddsTheBiasThenSilu) {
  const float rows[3][2] = {{1, 10}, {2, 20}, {3, 30}};
  const std::vector<const float*> window = {rows[0], rows[1], rows[2]};
  MatD w(2, 3);
  w << 1, 0, 0,  // channel 0 takes the oldest row only
      0, 0, 2;   // channel 1 twice the newest
  VecD out;
  RefConvRow(window, w, Vec({0.5, -1}), /*silu=*/false, out);
  EXPECT_EQ(out(0), 1.5);
  EXPECT_EQ(out(1), 59.0);
  RefConvRow(window, w, VecD(), /*silu=*/true, out);
  EXPECT_NEAR(out(0), 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(out(1), 60.0 / (1.0 + std::exp(-60.0)), 1e-12);
}

// ---- Conv tail ----

TEST(ExpectedConvTailPositions, ListsTheLastTailPositionsWithNegativesForZeroRows) {
  EXPECT_EQ(ExpectedConvTailPositions(10, 3), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(ExpectedConvTailPositions(2, 3), (std::vector<int64_t>{-1, 0, 1}));
  EXPECT_EQ(ExpectedConvTailPositions(0, 2), (std::vector<int64_t>{-2, -1}));
  EXPECT_TRUE(ExpectedConvTailPositions(5, 0).empty());
}

}  // namespace
}  // namespace kvtwin::model
