#!/usr/bin/env bash
# Goal: every patch of the mutant catalogue (tests/mutants/*.patch) still plants its bug in
# today's src/. A patch whose context drifted (src/ edited around it) is reported by
# `make mutants` as "did not apply", so the catalogue silently loses that mutant until the
# next full run; this catches the drift on the change that causes it.
# Method: `patch --dry-run` of each patch against the source tree (nothing is written), and
# each patch names its bug on a first `Description:` line and touches only src/.
# Usage: mutant_patches_test.sh ROOT
set -u
root=$1
n=0 fail=0
for p in "$root"/tests/mutants/*.patch; do
  n=$((n + 1))
  name=$(basename "$p")
  head -1 "$p" | grep -q '^Description: .' || { echo "FAIL: $name: no Description: first line"; fail=1; }
  if grep -E '^\+\+\+ ' "$p" | grep -vqE '^\+\+\+ b/src/'; then
    echo "FAIL: $name: patches a file outside src/"; fail=1
  fi
  if ! out=$(patch --dry-run --force -s -p1 -d "$root" < "$p" 2>&1); then
    echo "FAIL: $name does not apply to src/:"; echo "$out" | head -5; fail=1
  fi
done
[ "$n" -ge 25 ] || { echo "FAIL: only $n patches in tests/mutants"; fail=1; }
echo "mutant patches: $n, $([ $fail -eq 0 ] && echo 'all apply' || echo FAIL)"
exit $fail
