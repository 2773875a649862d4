#!/usr/bin/env bash
# Goal: scripts/operator-mutants.py still writes usable mutants for every family. A family
# whose site finder broke (a regex that no longer matches today's src/, a patch built from
# the wrong line) would make a batch report "did not apply" or measure nothing, and nobody
# runs a batch on every change.
# Method: each family draws 40 sites with a pinned seed into a scratch directory; every
# patch must name its change on a `Description:` first line, touch only src/, remove one
# line and add one (the order family's swap moves one line past its neighbour), and apply
# to the tree (`patch --dry-run`).
# Usage: operator_mutants.sh ROOT
set -u
root=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
for family in classic swap arith args guard order member; do
  out="$tmp/$family"
  if ! python3 "$root/scripts/operator-mutants.py" "$out" --family "$family" --seed 1 \
       --count 40 > "$tmp/log" 2>&1; then
    echo "FAIL: $family: the generator failed:"; head -5 "$tmp/log"; fail=1; continue
  fi
  n=0
  for p in "$out"/*.patch; do
    [ -e "$p" ] || continue
    n=$((n + 1))
    name="$family/$(basename "$p")"
    head -1 "$p" | grep -q '^Description: operator mutant .' || { echo "FAIL: $name: no Description"; fail=1; }
    if grep -E '^\+\+\+ ' "$p" | grep -vqE '^\+\+\+ b/src/'; then
      echo "FAIL: $name: patches a file outside src/"; fail=1
    fi
    added=$(grep -cE '^\+([^+]|$)' "$p"); removed=$(grep -cE '^-([^-]|$)' "$p")
    [ "$added" -eq 1 ] && [ "$removed" -eq 1 ] ||
      { echo "FAIL: $name: adds $added lines and removes $removed, not one each"; fail=1; }
    if ! msg=$(patch --dry-run --force -s -p1 -d "$root" < "$p" 2>&1); then
      echo "FAIL: $name does not apply:"; echo "$msg" | head -3; fail=1
    fi
  done
  [ "$n" -eq 40 ] || { echo "FAIL: $family wrote $n patches, not 40"; fail=1; }
done
echo "operator mutants: $([ $fail -eq 0 ] && echo 'every family writes 40 patches that apply' || echo FAIL)"
exit $fail
