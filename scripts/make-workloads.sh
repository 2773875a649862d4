#!/usr/bin/env bash
# Regenerates the bundled workloads in traces/workloads/ (README "Bundled traces"):
# one generated request workload per preset, two op-level workloads, one of each kind at
# model widths off the defaults, and two down-sampled Mooncake traces made by the importer. Usage: scripts/make-workloads.sh [KVTWIN]
# (default build/default/sim/kvtwin); run from the repository root.
set -euo pipefail
kvtwin=${1:-build/default/sim/kvtwin}
out=traces/workloads
mooncake=../shared/traces-external/mooncake_synthetic_trace.jsonl
mkdir -p "$out"
"$kvtwin" gen --kind requests --seed 101 --preset dense --requests 120 --conversations 12 -o "$out/requests-dense.jsonl"
"$kvtwin" gen --kind requests --seed 102 --preset sliding --requests 120 --budget 3000 -o "$out/requests-sliding-budget3000.jsonl"
"$kvtwin" gen --kind requests --seed 103 --preset recurrent --requests 120 -o "$out/requests-recurrent.jsonl"
"$kvtwin" gen --kind requests --seed 104 --preset mixed --requests 120 --budget 1500 -o "$out/requests-mixed-budget1500.jsonl"
"$kvtwin" gen --kind requests --seed 105 --swarm --requests 120 -o "$out/requests-swarm.jsonl"
"$kvtwin" gen --kind ops --seed 106 --preset mixed --steps 3000 -o "$out/ops-mixed.jsonl"
"$kvtwin" gen --kind ops --seed 107 --swarm --steps 3000 -o "$out/ops-swarm.jsonl"
# Model widths off the tiny defaults (kv heads x Dk/Dv, recurrent tail, heads and widths).
"$kvtwin" gen --kind requests --seed 108 --preset mixed --requests 120 --budget 6000 --kv-dims 1,7,9 --recurrent-dims 1,3,6,4,2 -o "$out/requests-mixed-dims.jsonl"
"$kvtwin" gen --kind ops --seed 109 --preset recurrent --layers 4 --steps 3000 --kv-dims 3,3,4 --recurrent-dims 2,1,2,4,1 -o "$out/ops-recurrent-dims.jsonl"
"$kvtwin" import "$mooncake" --block-scale 1 --skip 2500 --limit 800 --preset dense -o "$out/mooncake-2500+800-scale1-dense.jsonl"
"$kvtwin" import "$mooncake" --block-scale 2 --limit 500 --preset mixed --budget 1000000 -o "$out/mooncake-500-scale2-mixed-budget1m.jsonl"
# MLA layers (spec §2.5): K alone and a V of no columns, kept one row per slot.
"$kvtwin" gen --kind ops --seed 110 --preset mixed --steps 3000 --kv-dims 2,4,0 -o "$out/ops-mixed-mla.jsonl"
"$kvtwin" gen --kind requests --seed 111 --preset mixed --requests 120 --budget 6000 --kv-dims 2,4,0 -o "$out/requests-mixed-mla.jsonl"
