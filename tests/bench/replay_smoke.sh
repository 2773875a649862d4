#!/usr/bin/env bash
# Goal: `make bench`'s replay tools still replay. `make bench` is not part of CI, and once a
# change to the Mooncake options left replay_bench refusing every production and differential
# run (exit 2) for a whole session before anyone benchmarked. Method: every mode at block
# scales 1 and 16 over the first requests of the recorded trace, one run each; the three modes
# must count the same requests, block accesses and tokens, the differential run must pass,
# and bench_report must merge the parts. No timing is asserted (benchmarks, not tests).
# Usage: replay_smoke.sh REPLAY_BENCH BENCH_REPORT MOONCAKE_JSONL
set -euo pipefail
bench=$1 report=$2 trace=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "replay_smoke: $*" >&2; exit 1; }
# One JSON field of a replay_bench part, as printed by Python's json module.
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
parts=()
for scale in 1 16; do
  for mode in lru production differential; do
    out="$tmp/$scale-$mode.json"
    "$bench" --mode "$mode" --scale "$scale" --limit 60 --repeat 1 --preset dense \
      --trace "$trace" --json "$out" >"$tmp/log" 2>&1 || fail "$mode at scale $scale: $(cat "$tmp/log")"
    parts+=("$out")
  done
  for key in requests block_accesses prompt_tokens output_tokens; do
    want=$(field "$tmp/$scale-lru.json" "$key")
    [ "$want" -gt 0 ] || fail "scale $scale: lru counted $key = $want"
    for mode in production differential; do
      got=$(field "$tmp/$scale-$mode.json" "$key")
      [ "$got" = "$want" ] || fail "scale $scale: $mode counted $key = $got, lru $want"
    done
  done
  [ "$(field "$tmp/$scale-differential.json" verdict)" = pass ] ||
    fail "scale $scale: the differential replay did not pass"
done
"$report" --replay "${parts[@]}" --out "$tmp/latest.json" >"$tmp/log" 2>&1 ||
  fail "bench_report: $(cat "$tmp/log")"
grep -q "(c)/(b)" "$tmp/log" || fail "bench_report printed no ratios: $(cat "$tmp/log")"
echo "replay_smoke: 6 replays and the report: pass"
