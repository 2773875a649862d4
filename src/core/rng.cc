#include "src/core/rng.h"

#include "src/core/check.h"

namespace kvtwin {
namespace {

// __extension__ keeps -Wpedantic quiet about the 128-bit product.
__extension__ typedef unsigned __int128 U128;

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t NameHash(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

Rng::Rng(uint64_t seed) {
  uint64_t sm = seed;
  for (uint64_t& word : s_) word = SplitMix64(sm);
}

Rng Rng::Derive(uint64_t seed, std::string_view name) {
  uint64_t mixed = seed ^ NameHash(name);
  return Rng(SplitMix64(mixed));
}

Rng Rng::Fork(std::string_view name) { return Derive(Next(), name); }

uint64_t Rng::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

uint64_t Rng::Below(uint64_t bound) {
  KV_CHECK(bound > 0, "Rng::Below needs a positive bound");
  // Lemire: the high word of x * bound is uniform once the low word clears the threshold.
  U128 m = static_cast<U128>(Next()) * bound;
  auto low = static_cast<uint64_t>(m);
  if (low < bound) {
    const uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      m = static_cast<U128>(Next()) * bound;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

int64_t Rng::Range(int64_t lo, int64_t hi) {
  KV_CHECK(lo <= hi, "Rng::Range needs lo <= hi");
  const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
  if (span == 0) return static_cast<int64_t>(Next());  // the whole 64-bit range
  return static_cast<int64_t>(static_cast<uint64_t>(lo) + Below(span));
}

bool Rng::Chance(uint64_t numerator, uint64_t denominator) {
  KV_CHECK(denominator > 0, "Rng::Chance needs a positive denominator");
  return Below(denominator) < numerator;
}

float Rng::Unit() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }

}  // namespace kvtwin
