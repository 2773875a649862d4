#!/usr/bin/env bash
# Goal: how a lock-step replay's cost grows with the model's widths (--kv-dims,
# --recurrent-dims), from the tiny defaults to a real model's, a measurement for issue 8
# (never a test assertion).
# Method: replay the first REQUESTS (default 20) requests of the Mooncake trace at block
# scale 16 on the recurrent preset (gated-delta layers with a full KV layer every fourth),
# 4 layers, in lock step, once per width set, with /usr/bin/time; print wall seconds, CPU
# seconds and peak RSS as a markdown table. The digest column shows each run passed.
# Usage: bench/width_scaling.sh [REQUESTS] [KVTWIN] (default build/default/sim/kvtwin).
set -euo pipefail
requests=${1:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
kvtwin=${2:-$root/build/default/sim/kvtwin}
trace=${KVTWIN_MOONCAKE:-$root/../shared/traces-external/mooncake_synthetic_trace.jsonl}
[ -x "$kvtwin" ] || { echo "width_scaling: no kvtwin at '$kvtwin'" >&2; exit 2; }
[ -r "$trace" ] || { echo "width_scaling: cannot read the Mooncake trace '$trace'" >&2; exit 2; }
source "$root/scripts/pin-cpu.sh"
# name | kv H,DK,DV | recurrent TAIL,HK,HV,DK,DV
sets=(
  "defaults|2,4,5|3,2,4,2,3"
  "kv 8x32|8,32,32|3,2,4,2,3"
  "kv 8x128|8,128,128|3,2,4,2,3"
  "rec 2x8 of 8|2,4,5|3,2,4,8,8"
  "rec 4x8 of 32|2,4,5|3,4,8,32,32"
  "rec 16x32 of 64|2,4,5|3,16,32,64,64"
  "both 8x128, 4x8 of 32|8,128,128|3,4,8,32,32"
)
echo "| widths | kv | recurrent | state doubles | wall s | CPU s | peak RSS (MB) | verdict |"
echo "|---|---|---|---:|---:|---:|---:|---|"
for set in "${sets[@]}"; do
  IFS='|' read -r name kv rec <<<"$set"
  IFS=',' read -r _ _ hv _ dv <<<"$rec"
  IFS=',' read -r _ _ _ dk _ <<<"$rec"
  out=$( { /usr/bin/time -f "TIME %e %U %S %M" "${pin[@]}" "$kvtwin" replay "$trace" \
             --limit "$requests" --block-scale 16 --preset recurrent --layers 4 \
             --kv-dims "$kv" --recurrent-dims "$rec"; } 2>&1 ) || true
  read -r _ wall user sys rss <<<"$(grep '^TIME' <<<"$out")"
  verdict=$(grep -m1 -oE '^(PASS|FAIL)[^,]*' <<<"$out" || echo "error")
  echo "| $name | $kv | $rec | $((hv * dv * dk)) | $wall | $(printf "%.2f" "$(echo "$user + $sys" | bc)") | $((rss / 1024)) | $verdict |"
done
