#!/usr/bin/env bash
# Goal: determinism (STYLE §5). No wall clock, ambient randomness or <random> distributions
# outside bench/, and nothing that orders output by pointer value.
# Method: grep first-party sources (comments included: a mention is cheap to reword).
set -u
root=${1:-.}
cd "$root" || exit 2
pattern='system_clock|steady_clock|high_resolution_clock|std::random_device|[^_a-zA-Z]rand\(\)|srand\(|std::mt19937|_distribution<|std::shuffle|#include <random>|time\(nullptr\)|time\(NULL\)'
hits=$(grep -rnE "$pattern" src model sim fuzz tests --include='*.h' --include='*.cc' 2>/dev/null)
if [ -n "$hits" ]; then
  echo "banned calls (wall clock or ambient randomness) outside bench/:"
  echo "$hits"
  exit 1
fi
echo "banned calls: ok"
