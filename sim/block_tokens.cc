// BlockTokens and GeneratedTokens (declared in sim/trace.h). Traces that name prompts by
// block ids ("blocks") are expanded through these functions, so their values are part of
// the trace format: changing them changes what every such trace means. Both are pure
// functions of their arguments (XXH3, whose output is fixed since xxHash 0.8.0), never of
// std::hash or an Rng stream.
#include <xxhash.h>

#include <cstdint>
#include <vector>

#include "sim/trace.h"
#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

// Block tokens are 1 + (x mod kBlockSpan), i.e. in [1, 2^30); generated tokens are
// kGeneratedBase + (x mod kGeneratedSpan), i.e. in [2^30, 2^31 - 1). The two ranges are
// disjoint, so an output token never equals a prompt block token.
constexpr uint64_t kBlockSpan = (uint64_t{1} << 30) - 1;
constexpr uint64_t kGeneratedBase = uint64_t{1} << 30;
constexpr uint64_t kGeneratedSpan = (uint64_t{1} << 31) - 1 - kGeneratedBase;

// Separate seeds keep the block and generated families independent for equal arguments.
constexpr uint64_t kBlockSeed = 0x6b767477696e2d62;      // "kvtwin-b"
constexpr uint64_t kGeneratedSeed = 0x6b767477696e2d67;  // "kvtwin-g"

uint64_t Hash(int64_t a, int64_t b, uint64_t seed) {
  const uint64_t words[2] = {static_cast<uint64_t>(a), static_cast<uint64_t>(b)};
  return XXH3_64bits_withSeed(words, sizeof(words), seed);
}

}  // namespace

// Token 0 is 1 + (id mod (2^30 - 1)): exactly 1 + id for every id below 2^30 - 1, so two
// such ids differ in their first token and prompts share token prefixes exactly where they
// share block ids. Larger ids fold and may collide with a small one in the first token
// (real traces number their blocks densely from 0, far below the fold). Tokens 1.. are
// hashes of (id, j), so a short block is a prefix of a longer block of the same id.
std::vector<int32_t> BlockTokens(int64_t id, int64_t len) {
  KV_CHECK(id >= 0, "block ids are non-negative");
  KV_CHECK(len >= 0, "a block has a non-negative length");
  std::vector<int32_t> tokens(static_cast<size_t>(len));
  if (len == 0) return tokens;
  tokens[0] = static_cast<int32_t>(1 + static_cast<uint64_t>(id) % kBlockSpan);
  for (int64_t j = 1; j < len; ++j) {
    tokens[static_cast<size_t>(j)] = static_cast<int32_t>(1 + Hash(id, j, kBlockSeed) % kBlockSpan);
  }
  return tokens;
}

std::vector<int32_t> GeneratedTokens(int64_t index, int64_t len) {
  KV_CHECK(len >= 0, "a request generates a non-negative number of tokens");
  std::vector<int32_t> tokens(static_cast<size_t>(len));
  for (int64_t j = 0; j < len; ++j) {
    tokens[static_cast<size_t>(j)] =
        static_cast<int32_t>(kGeneratedBase + Hash(index, j, kGeneratedSeed) % kGeneratedSpan);
  }
  return tokens;
}

}  // namespace kvtwin::sim
