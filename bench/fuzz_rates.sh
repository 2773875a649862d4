#!/usr/bin/env bash
# Goal: the exec/s of every libFuzzer target under ASan + UBSan on this machine, the
# figures the README quotes (a measurement, never a test assertion).
# Method: build the `fuzz` preset, then run each NAME_fuzz for SECONDS (default 30) with a
# pinned seed from a scratch copy of its seed corpus, and print libFuzzer's final
# average_exec_per_sec, executions and peak RSS as a markdown table.
# Usage: bench/fuzz_rates.sh [SECONDS]
set -euo pipefail
secs=${1:-30}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cmake --preset fuzz >/dev/null && cmake --build --preset fuzz -j "$(nproc)" >/dev/null
# Every target on one CPU, as in make bench (scripts/pin-cpu.sh says why).
source "$root/scripts/pin-cpu.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
kept=build/fuzz/rate-crashes; mkdir -p "$kept"
echo "| target | exec/s | executions | peak RSS (MB) |"
echo "|---|---:|---:|---:|"
for exe in build/fuzz/fuzz/*_fuzz; do
  name=$(basename "$exe" _fuzz)
  mkdir -p "$tmp/$name"
  [ -d "fuzz/corpus/$name" ] && cp -r "fuzz/corpus/$name/." "$tmp/$name/"
  dict=(); [ -f "fuzz/$name.dict" ] && dict=(-dict="fuzz/$name.dict")
  # A crash here is a finding: its artifact and libFuzzer's report are kept.
  out=$("${pin[@]}" "$exe" -seed=1 -max_total_time="$secs" -print_final_stats=1 "${dict[@]}" \
          -artifact_prefix="$kept/$name-" "$tmp/$name" 2>&1) || {
    echo "$out" > "$kept/$name.log"
    echo "| $name | CRASH: $(grep -m1 -E 'ERROR|Check failed|KV_CHECK|SUMMARY' <<<"$out"), see $kept/$name.log | | |"
    continue
  }
  stat() { grep -oE "stat::$1: *[0-9]+" <<<"$out" | grep -oE '[0-9]+$'; }
  echo "| $name | $(stat average_exec_per_sec) | $(stat number_of_executed_units) | $(stat peak_rss_mb) |"
done
