// Rng: the one source of randomness. xoshiro256** seeded through SplitMix64, with our own
// bounded-integer mapping (Lemire's multiply-shift with rejection), so a seed produces the
// same stream on every compiler and platform (no <random> distributions, STYLE §5.2).
// Consumers get independent streams by name: Rng::Derive(root_seed, "workload").
// Single-threaded; pass it explicitly by reference.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvtwin {

// One SplitMix64 step: advances `state` and returns a well-mixed 64-bit value.
uint64_t SplitMix64(uint64_t& state);

class Rng {
 public:
  explicit Rng(uint64_t seed);

  // A stream that depends on `seed` and `name` only.
  static Rng Derive(uint64_t seed, std::string_view name);
  // A child stream named `name` drawn from this one (advances this stream once).
  Rng Fork(std::string_view name);

  uint64_t Next();
  // Uniform in [0, bound); REQUIRES: bound > 0.
  uint64_t Below(uint64_t bound);
  // Uniform in [lo, hi] (inclusive); REQUIRES: lo <= hi.
  int64_t Range(int64_t lo, int64_t hi);
  // True with probability numerator / denominator; REQUIRES: 0 < denominator.
  bool Chance(uint64_t numerator, uint64_t denominator);
  // Uniform float in [0, 1) with 24 random bits (exact in float32).
  float Unit();

 private:
  uint64_t s_[4];
};

// FNV-1a over a name, for stream derivation only (never persisted as a hash of data).
uint64_t NameHash(std::string_view name);

}  // namespace kvtwin
