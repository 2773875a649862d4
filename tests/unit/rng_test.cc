// Rng is the one source of randomness: every seeded workload, swarm draw and reproduce
// command depends on its stream. The stream is pinned to the published algorithms
// (SplitMix64's known first output; xoshiro256** and Lemire's bounded draw computed by an
// independent implementation), and each bounded draw is held to its range, the whole
// 64-bit span included.
#include "src/core/rng.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <vector>

namespace kvtwin {
namespace {

TEST(Rng, SplitMix64MatchesItsPublishedFirstOutput) {
  uint64_t state = 0;
  EXPECT_EQ(SplitMix64(state), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(state, 0x9e3779b97f4a7c15ULL);  // the golden-ratio increment
}

TEST(Rng, StreamIsXoshiro256StarStarSeededBySplitMix64) {
  Rng raw(1);
  EXPECT_EQ(raw.Next(), 0xb3f2af6d0fc710c5ULL);
  EXPECT_EQ(raw.Next(), 0x853b559647364ceaULL);
  EXPECT_EQ(raw.Next(), 0x92f89756082a4514ULL);
  Rng bounded(1);
  std::vector<uint64_t> draws;
  for (int i = 0; i < 8; ++i) draws.push_back(bounded.Below(10));
  EXPECT_EQ(draws, (std::vector<uint64_t>{7, 5, 5, 3, 6, 1, 0, 3}));
}

TEST(Rng, BelowAndRangeStayInsideTheirBounds) {
  Rng rng(7);
  std::set<int64_t> seen;
  for (int i = 0; i < 2000; ++i) {
    const int64_t v = rng.Range(-3, 3);
    ASSERT_GE(v, -3);
    ASSERT_LE(v, 3);
    seen.insert(v);
  }
  EXPECT_EQ(seen.size(), 7u);  // both ends reached
  EXPECT_EQ(rng.Range(5, 5), 5);
  EXPECT_EQ(rng.Below(1), 0u);
  // A bound just past 2^63 rejects almost half of the products: still below it.
  const uint64_t big = (uint64_t{1} << 63) + 1;
  for (int i = 0; i < 200; ++i) ASSERT_LT(rng.Below(big), big);
}

// Range over every int64 has a span of 2^64, which wraps to 0: it is the raw stream.
// Below is unbiased for every bound, not only small ones. Lemire's multiply maps the 2^64
// words onto the bound; for b = 2/3 of 2^64 half the results have two preimages and half
// one, so without the rejection step two thirds of the draws would land on a result with
// two. 20,000 draws: that count within 5 standard deviations (354) of half.
TEST(Rng, BelowIsUnbiasedForABoundNearTheWordSize) {
  __extension__ using U128 = unsigned __int128;
  constexpr uint64_t kBound = 0xAAAAAAAAAAAAAAAAull;  // floor(2^65 / 3)
  const auto first_word = [](uint64_t y) {            // the smallest word mapped to y or above
    return ((static_cast<U128>(y) << 64) + kBound - 1) / kBound;
  };
  Rng rng(20261128);
  constexpr int kDraws = 20000;
  int two = 0;
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t y = rng.Below(kBound);
    two += first_word(y + 1) - first_word(y) == 2;
  }
  EXPECT_NEAR(two, kDraws / 2, 354);
}

TEST(Rng, RangeOverTheWholeInt64SpanDrawsBothSigns) {
  Rng rng(11);
  Rng raw(11);
  bool negative = false, positive = false;
  for (int i = 0; i < 64; ++i) {
    const int64_t v =
        rng.Range(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    EXPECT_EQ(static_cast<uint64_t>(v), raw.Next());
    negative = negative || v < 0;
    positive = positive || v > 0;
  }
  EXPECT_TRUE(negative && positive);
}

TEST(Rng, ChanceOfNothingNeverAndOfEverythingAlways) {
  Rng rng(3);
  int half = 0;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_FALSE(rng.Chance(0, 5));
    ASSERT_TRUE(rng.Chance(5, 5));
    half += rng.Chance(1, 2) ? 1 : 0;
  }
  EXPECT_GT(half, 400);
  EXPECT_LT(half, 600);
}

TEST(Rng, DerivedStreamsDependOnSeedAndNameOnly) {
  EXPECT_EQ(Rng::Derive(5, "workload").Next(), Rng::Derive(5, "workload").Next());
  EXPECT_NE(Rng::Derive(5, "workload").Next(), Rng::Derive(5, "swarm").Next());
  EXPECT_NE(Rng::Derive(5, "workload").Next(), Rng::Derive(6, "workload").Next());
  // Fork draws its seed from the parent, so two forks of one name differ.
  Rng parent(9);
  Rng a = parent.Fork("child");
  Rng b = parent.Fork("child");
  EXPECT_NE(a.Next(), b.Next());
}

}  // namespace
}  // namespace kvtwin
