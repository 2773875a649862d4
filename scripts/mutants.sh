#!/usr/bin/env bash
# Goal: measure how fast kvtwin's checks catch plausible bugs in src/. Each
# tests/mutants/NN-name.patch plants one bug; a mutant is "killed" when some check of the
# fast gate fails on it, and the time to detection is what this script reports
# (tests/mutants/RESULTS.md). It is a measurement, not a test: survivors do not fail it.
#
# Method:
# * One scratch copy of the *working tree* (not `git archive`: uncommitted work is what we
#   want to measure) under ${TMPDIR:-/tmp}/kvtwin-mutants/tree, without build/ and .git/.
#   The copy persists between runs as a cache; each run re-syncs it, copying only files
#   whose content differs (with a fresh mtime, so ninja rebuilds exactly those). Delete the
#   directory to start from nothing.
# * Configured once with the `default` preset (g++, Release, -Werror, tests) into
#   scratch/build, and, if clang and libFuzzer are usable, with the `fuzz` preset into
#   scratch/build-fuzz. A fuzz build that fails only drops the fuzz stage (said so in the
#   results). Only the gate's binaries are built, with -j2.
# * Baseline: the unmutated tree must pass every check (else exit 2), which also gives
#   each check's duration. MUTANTS_BASELINE=0 skips it (for quick reruns).
# * Per mutant: `patch -p1`, incremental build of the fast gate's binaries, then the checks
#   in order, stopping at the first failure (any non-zero exit, a KV_CHECK abort or a
#   timeout). The binaries of a later stage are rebuilt only when the gate reaches that
#   stage; build time is not counted. Seconds = sum of the check durations up to and
#   including the failing one. Then `patch -R` and a byte comparison of src/ against the
#   pristine copy (a difference is a setup error).
# * Verdicts: killed, survived, did not compile (a catalogue defect), did not apply.
#   A survivor's argument comes from `Survivor:` lines in the patch header.
#
# Usage: scripts/mutants.sh [PATTERN]   (PATTERN: substring of the patch file names)
#   A full run writes tests/mutants/RESULTS.md; a subset writes scratch/RESULTS.md.
#   Environment: MUTANTS_SOURCE=worktree (default) or head (`git archive HEAD`, for a working
#   tree that is mid-edit), MUTANTS_FUZZ_SECONDS (per fuzz target, default 5; 0 skips the
#   fuzz stage), MUTANTS_BASELINE=0, MUTANTS_JOBS (ninja -j, default 2), MUTANTS_MEM_MB (the
#   address-space cap of each release check, default 4096), MUTANTS_DIR (the
#   patches, default tests/mutants: another directory, such as the operator mutants of
#   scripts/operator-mutants.py, is measured like a subset).
# Exit: 0 after a measurement (survivors included), 2 on a setup error (one line).
set -euo pipefail

die() { echo "mutants: $*" >&2; exit 2; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mutants_dir="${MUTANTS_DIR:-$root/tests/mutants}"
scratch="${TMPDIR:-/tmp}/kvtwin-mutants"
tree="$scratch/tree"
pristine="$scratch/pristine-src"
build="$scratch/build"
fuzz_build="$scratch/build-fuzz"
logs="$scratch/logs"
jobs="${MUTANTS_JOBS:-2}"
fuzz_seconds="${MUTANTS_FUZZ_SECONDS:-5}"
mem_cap_mb="${MUTANTS_MEM_MB:-4096}"
[[ "$mem_cap_mb" =~ ^[1-9][0-9]*$ ]] || die "MUTANTS_MEM_MB must be a positive number of MiB, got '$mem_cap_mb'"

pattern=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    -j*) ;;  # accepted and ignored: the machine is shared, builds use MUTANTS_JOBS
    -*) die "unknown option $1" ;;
    *) [ -z "$pattern" ] || die "one PATTERN only"; pattern="$1" ;;
  esac
  shift
done

for tool in cmake ninja patch cmp timeout g++ awk flock; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
# NN-name.patch with two or more digits, in numeric order (a glob sorts 100 before 11).
patches=()
while IFS= read -r name; do
  case "$name" in *"$pattern"*) patches+=("$mutants_dir/$name") ;; esac
done < <(ls "$mutants_dir" | grep -E '^[0-9]{2,}-.*\.patch$' | sort -n)
[ ${#patches[@]} -gt 0 ] || die "no patch in $mutants_dir matches '${pattern}'"

# One run at a time per scratch directory: a second run would re-sync the tree and patch its
# src/ under the first one. A run started meanwhile waits here.
mkdir -p "$scratch"
exec 9>"$scratch/lock"
flock 9

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
run_start=$(now)
rm -rf "$logs"  # this run's logs only
mkdir -p "$scratch" "$logs"

# ------------------------------------------------------------------ scratch tree
# The tree to measure: the working tree, or with MUTANTS_SOURCE=head the committed HEAD
# (`git archive`), for when the working tree is in the middle of an edit and does not build.
from="$root"
if [ "${MUTANTS_SOURCE:-worktree}" = head ]; then
  command -v git >/dev/null || die "MUTANTS_SOURCE=head needs git"
  from="$scratch/head"
  rm -rf "$from" && mkdir -p "$from"
  git -C "$root" archive HEAD | tar -x -C "$from" || die "git archive HEAD failed"
elif [ "${MUTANTS_SOURCE:-worktree}" != worktree ]; then
  die "MUTANTS_SOURCE must be worktree or head"
fi

sync_tree() {
  mkdir -p "$tree"
  (cd "$from" && find . \( -path ./build -o -path ./.git \) -prune -o -type f -print) |
    sort >"$scratch/files.src"
  local f copied=0
  while IFS= read -r f; do
    if ! cmp -s "$from/$f" "$tree/$f"; then
      mkdir -p "$(dirname "$tree/$f")"
      cp "$from/$f" "$tree/$f"  # no -p: a fresh mtime makes ninja rebuild it
      copied=$((copied + 1))
    fi
  done <"$scratch/files.src"
  (cd "$tree" && find . -type f -print) | sort >"$scratch/files.dst"
  comm -13 "$scratch/files.src" "$scratch/files.dst" | while IFS= read -r f; do
    rm -f "$tree/$f"
  done
  rm -rf "$pristine"
  cp -r "$tree/src" "$pristine"
  echo "scratch tree: $tree, from ${MUTANTS_SOURCE:-worktree} ($copied files updated)"
}

tree_clean() { diff -r -q "$tree/src" "$pristine" >/dev/null 2>&1; }

sync_tree || die "cannot copy the working tree to $tree"

# ------------------------------------------------------------------ checks
# One row per check, in gate order: name | stage | command (run with bash -c in $tree).
# Stages: fast (kvtwin and prop binaries), fuzz (libFuzzer targets), tests (the remaining
# unit and sim test binaries). Seeds and case counts are fixed, so the gate is
# deterministic except for the time-boxed fuzz stage.
kv="$build/sim/kvtwin"
t="$build/tests"
check_names=() check_stages=() check_cmds=()
add_check() { check_names+=("$1"); check_stages+=("$2"); check_cmds+=("$3"); }

# A property machine stops at its first failing property (--gtest_fail_fast): the verdict is
# in, and a second machine's shrinking of the same bug took 100 s of a 0.5 s kill (176).
ff=--gtest_fail_fast
add_check prop-layer-kv fast "$t/prop_layer_state_machine_test $ff --gtest_filter='*FullKv*'"
add_check prop-layer-rotating fast "$t/prop_layer_state_machine_test $ff --gtest_filter='*Rotating*'"
add_check prop-layer-recurrent fast "$t/prop_layer_state_machine_test $ff --gtest_filter='*Recurrent*'"
add_check prop-mixed-stack fast "$t/prop_mixed_stack_state_machine_test $ff"
add_check prop-multiseq fast "$t/prop_multi_seq_state_machine_test $ff"
# Unlimited (exact lock step with the reference manager), then the two budgets of
# tests/sim/requests_test.cc: moderate (tie-breaks decide real evictions) and tiny.
add_check requests fast "$kv requests --seeds 1..10"
add_check requests-budget fast "$kv requests --seeds 1..10 --budget 20000"
add_check requests-tiny-budget fast "$kv requests --seeds 1..10 --budget 3000"
add_check requests-swarm fast "$kv requests --swarm --seeds 1..1000"
# Long contexts (past the KV growth steps, windows of 256 and more) and per-layer windows.
add_check requests-long fast "$kv requests --swarm --long --conversations 3 --seeds 1..40"
# Production lengths: prompts to 24,000 tokens diverging anywhere, trie edges of thousands of
# keys split late, windows to 4,097 (about 10 s).
add_check requests-huge fast "$kv requests --swarm --huge --conversations 3 --seeds 1..24"
add_check requests-staggered fast "$kv requests --preset staggered --seeds 1..10 --budget 3000"
# Media spans: prompt keys with bit 31 set (negative ids), shared across conversations.
add_check requests-media fast "$kv requests --swarm --media --seeds 1..200"
# A trie grown to a thousand and more nodes without an eviction, then one pass under a budget
# of 0 that must take every evictable node (mutant 296 fell only to a unit test; about 1 s).
add_check requests-spike fast "$kv requests --swarm --spike --requests 1000 --seeds 1..8"
add_check multiseq fast "$kv multiseq --seeds 1..60"
# Production-sized multi-sequence caches: thousands of cells a sequence, windows to 4,097,
# ubatches of 512 (a first-fit scan that starts from a hint past 4,096 cells; about 16 s).
add_check multiseq-huge fast "$kv multiseq --huge --seeds 1..8"
add_check sweep fast "$kv sweep --seeds 1..16"
add_check sweep-swarm fast "$kv sweep --swarm --seeds 1..16"
# Rows of a production width: buffers and snapshots past a mebibyte (about 4 s a seed).
add_check sweep-wide-rows fast "$kv sweep --preset mixed --layers 2 --window 300 --kv-dims 8,128,128 --steps 400 --seeds 1..6"
add_check sweep-wide-state fast "$kv sweep --preset recurrent --layers 2 --recurrent-dims 3,4,8,64,64 --steps 400 --seeds 1..4"
add_check sweep-wide-state-bf16 fast "$kv sweep --preset recurrent --layers 2 --recurrent-dims 3,4,8,64,64 --dtype bf16 --steps 400 --seeds 1..4"
# A production window (Phi-3's 2047), the ring taken past W and wrapped (`make run` runs
# 1024, 2047 and 4096): about 2 s.
add_check sweep-big-window fast "$kv sweep --preset rotating --layers 2 --window 2047 --seeds 1..1"
for preset in Dense Sliding Recurrent Mixed; do
  add_check "prop-requests-${preset,,}" fast \
    "$t/prop_request_state_machine_test $ff --gtest_filter='RequestStateMachine.${preset}*'"
done
# The bundled traces `make run` replays: the minimized regressions pin scenarios the seeded
# streams reach rarely (mutant 128 fell to fuzz-prefix after 35 s; this replay takes 0.5 s).
add_check traces fast "$kv replay traces/regress/*.jsonl traces/workloads/*.jsonl"
# The fuzz targets' bundled corpora, as `make run`'s corpus stage runs them (about 1 s): each
# entry was kept for reaching code nothing before it reached, so they hold shapes no seeded
# stream draws. The fuzz stage feeds them to libFuzzer too, but only when it runs; a whole
# state copied beside a capture (302-304) fell to nothing else in the fast stage.
add_check corpora fast "$kv replay --fuzz-corpus fuzz/corpus --quiet"
# The recorded Mooncake trace at its 512-token blocks, the two windows `make run` replays
# (sim/cli_production.cc): prompts of tens of thousands of tokens, whole-prompt trie edges split
# late, windows of 4,096 under eviction (mutant 271 falls here in 3 s). About 6 s.
mooncake="$root/../shared/traces-external/mooncake_synthetic_trace.jsonl"
if [ -f "$mooncake" ]; then
  add_check production-trace fast "$kv replay '$mooncake' --skip 3925 --limit 50 --interval 0 --quiet &&
    $kv replay '$mooncake' --skip 3925 --limit 50 --preset sliding --window 4096 --dtype bf16/f32 \
    --budget 60000000 --chunk 1536 --interval 4096 --quiet"
fi
fuzz_names=(kv rotating recurrent speculation prefix hybrid trace_reader)
for name in "${fuzz_names[@]}"; do
  # A fresh corpus directory first (libFuzzer writes there), the bundled seeds second.
  add_check "fuzz-$name" fuzz "rm -rf '$scratch/corpus-$name' && mkdir -p '$scratch/corpus-$name' &&
    ASAN_OPTIONS=detect_leaks=0 '$fuzz_build/fuzz/${name}_fuzz' -seed=1 \
    -max_total_time=$fuzz_seconds -artifact_prefix='$scratch/corpus-$name/' \
    '$scratch/corpus-$name' \$( [ -d fuzz/corpus/$name ] && echo fuzz/corpus/$name )"
done
test_targets=()
for f in "$tree"/tests/unit/*_test.cc "$tree"/tests/sim/*_test.cc; do
  [ -e "$f" ] || continue
  folder=$(basename "$(dirname "$f")")
  target="${folder}_$(basename "$f" .cc)"
  test_targets+=("$target")
  add_check "$target" tests "$t/$target"
done
for s in "$tree"/tests/sim/*_test.sh; do
  [ -e "$s" ] || continue
  add_check "sim-$(basename "$s" .sh)" tests "bash tests/sim/$(basename "$s") $kv"
done
fast_targets=(kvtwin prop_layer_state_machine_test prop_mixed_stack_state_machine_test
              prop_multi_seq_state_machine_test prop_request_state_machine_test)
fuzz_targets=()
for name in "${fuzz_names[@]}"; do fuzz_targets+=("${name}_fuzz"); done

# A fast check takes under 2 s unmutated, so 120 s is 60 times its need: a mutant that hangs
# (a loop that no longer advances) or sends a property into a long shrink is killed in two
# minutes, not ten.
timeout_of() {
  case "$1" in fast) echo 120 ;; fuzz) echo $((fuzz_seconds * 4 + 60)) ;; *) echo 900 ;; esac
}

# ------------------------------------------------------------------ builds
configure() {
  if [ ! -f "$build/build.ninja" ]; then
    (cd "$tree" && cmake --preset default -B "$build" >"$logs/configure.log" 2>&1) ||
      die "configure failed, see $logs/configure.log"
  fi
  fuzz_ok=0
  fuzz_reason="clang++ not found"
  if [ "$fuzz_seconds" = 0 ]; then
    fuzz_reason="MUTANTS_FUZZ_SECONDS=0"
  elif command -v clang++ >/dev/null; then
    if [ -f "$fuzz_build/build.ninja" ] ||
       (cd "$tree" && cmake --preset fuzz -B "$fuzz_build" >"$logs/configure-fuzz.log" 2>&1); then
      fuzz_ok=1
    else
      fuzz_reason="the fuzz preset does not configure (see $logs/configure-fuzz.log)"
    fi
  fi
}

# build_stage STAGE LOG: builds the binaries of one stage; returns non-zero on failure.
build_stage() {
  case "$1" in
    fast) ninja -C "$build" -j "$jobs" "${fast_targets[@]}" >"$2" 2>&1 ;;
    tests) ninja -C "$build" -j "$jobs" "${test_targets[@]}" >"$2" 2>&1 ;;
    fuzz) ninja -C "$fuzz_build" -j "$jobs" "${fuzz_targets[@]}" >"$2" 2>&1 ;;
  esac
}

configure
echo "building the unmutated gate (fast, tests$([ $fuzz_ok = 1 ] && echo ", fuzz"))"
build_stage fast "$logs/build-base.log" ||
  die "the unmutated tree does not build, see $logs/build-base.log"
build_stage tests "$logs/build-base-tests.log" ||
  die "the unmutated tests do not build, see $logs/build-base-tests.log"
if [ $fuzz_ok = 1 ] && ! build_stage fuzz "$logs/build-base-fuzz.log"; then
  fuzz_ok=0
  fuzz_reason="the fuzz targets do not build (see $logs/build-base-fuzz.log)"
fi

# run_check I LOG: runs check I with its timeout; sets check_secs; returns its status.
run_check() {
  local start status
  start=$(now)
  set +e
  # `; exit` keeps the subshell from exec'ing timeout, so an abort's "Aborted" line goes
  # to the log, not to this script's stderr.
  # The release checks run under an address-space cap: a mutant that allocates without end
  # (an index that never advances, a size off by a factor) fails its check in seconds with
  # bad_alloc instead of taking the machine down before its timeout. Not the fuzz stage:
  # ASan reserves terabytes of address space up front.
  (cd "$tree" && { [ "${check_stages[$1]}" = fuzz ] || ulimit -v $((mem_cap_mb * 1024)); } &&
    timeout "$(timeout_of "${check_stages[$1]}")" bash -c "${check_cmds[$1]}"; exit) \
    >"$2" 2>&1 </dev/null
  status=$?
  set -e
  check_secs=$(elapsed "$start" "$(now)")
  return $status
}

# ------------------------------------------------------------------ baseline
declare -A base_secs=()
skipped_checks=()
if [ "${MUTANTS_BASELINE:-1}" != 0 ]; then
  echo "baseline: running every check on the unmutated tree"
  for i in "${!check_names[@]}"; do
    [ "${check_stages[$i]}" = fuzz ] && [ $fuzz_ok = 0 ] && continue
    if run_check "$i" "$logs/baseline-${check_names[$i]}.log"; then
      base_secs[${check_names[$i]}]=$check_secs
    elif [ "${check_stages[$i]}" = fuzz ]; then
      skipped_checks+=("${check_names[$i]}")  # a fuzz target that fails unmutated is unusable
    else
      die "baseline check ${check_names[$i]} fails on the unmutated tree," \
        "see $logs/baseline-${check_names[$i]}.log"
    fi
    echo "  ${check_names[$i]}: ${check_secs}s"
  done
fi
check_usable() {
  [ "${check_stages[$1]}" = fuzz ] && [ $fuzz_ok = 0 ] && return 1
  local s
  for s in "${skipped_checks[@]+"${skipped_checks[@]}"}"; do
    [ "$s" = "${check_names[$1]}" ] && return 1
  done
  return 0
}

# ------------------------------------------------------------------ mutants
header_field() {  # header_field FILE KEY: the KEY: lines before the diff, joined
  awk -v key="$2:" '/^(diff |--- )/ { exit } index($0, key) == 1 {
      sub("^" key "[ \t]*", ""); printf "%s%s", (n++ ? " " : ""), $0 }' "$1"
}

# Rows: name, description, verdict, killed by, seconds, separated by US (\x1f): a tab is
# IFS whitespace, so `read` would merge the empty "killed by" of a survivor.
results=()
for p in "${patches[@]}"; do
  name=$(basename "$p" .patch)
  desc=$(header_field "$p" Description)
  verdict="" by="" secs=""
  mlog="$logs/$name"
  if grep -E '^\+\+\+ ' "$p" | grep -qvE '^\+\+\+ b/src/'; then
    verdict="did not apply"; by="(touches files outside src/)"
  elif ! patch -p1 -s --dry-run -d "$tree" <"$p" >"$mlog.apply.log" 2>&1 ||
     ! patch -p1 -s --no-backup-if-mismatch -d "$tree" <"$p" >>"$mlog.apply.log" 2>&1; then
    verdict="did not apply"
  elif ! build_stage fast "$mlog.build.log"; then
    verdict="did not compile"
    by="$(grep -m1 'error:' "$mlog.build.log" | sed 's|^.*/tree/||' | cut -c1-100 || true)"
  else
    built_tests=0 built_fuzz=0 total=0
    for i in "${!check_names[@]}"; do
      check_usable "$i" || continue
      stage=${check_stages[$i]}
      if [ "$stage" = tests ] && [ $built_tests = 0 ]; then
        built_tests=1
        if ! build_stage tests "$mlog.build-tests.log"; then
          verdict="did not compile"; by="(unit/sim tests)"; break
        fi
      fi
      if [ "$stage" = fuzz ] && [ $built_fuzz = 0 ]; then
        built_fuzz=1
        if ! build_stage fuzz "$mlog.build-fuzz.log"; then
          verdict="did not compile"; by="(fuzz targets)"; break
        fi
      fi
      status=0
      run_check "$i" "$mlog.check.log" || status=$?
      total=$(awk -v a="$total" -v b="$check_secs" 'BEGIN { printf "%.1f", a + b }')
      if [ $status -ne 0 ]; then
        verdict="killed"; by=${check_names[$i]}; secs=$total
        case $status in 124) by+=" (timeout)" ;; 134) by+=" (abort)" ;; esac
        break
      fi
    done
    [ -n "$verdict" ] || { verdict="survived"; secs=$total; }
  fi
  if [ "$verdict" != "did not apply" ]; then  # applied: reverse it
    patch -p1 -R -s --no-backup-if-mismatch -d "$tree" <"$p" >>"$mlog.apply.log" 2>&1 ||
      die "$name does not reverse cleanly, see $mlog.apply.log"
  fi
  tree_clean || die "src/ differs from the pristine copy after reversing $name"
  printf '%-45s %-16s %-28s %s\n' "$name" "$verdict" "$by" "$secs"
  results+=("$name"$'\x1f'"$desc"$'\x1f'"$verdict"$'\x1f'"$by"$'\x1f'"$secs")
done

# ------------------------------------------------------------------ report
if [ -z "$pattern" ] && [ -z "${MUTANTS_DIR:-}" ]; then
  out="$mutants_dir/RESULTS.md"
else
  out="$scratch/RESULTS.md"
fi
total_secs=$(elapsed "$run_start" "$(now)")
n_killed=0 n_survived=0 n_nocompile=0 n_noapply=0
killed_secs=()
for row in "${results[@]}"; do
  IFS=$'\x1f' read -r name desc verdict by secs <<<"$row"
  case "$verdict" in
    killed) n_killed=$((n_killed + 1)); killed_secs+=("$secs") ;;
    survived) n_survived=$((n_survived + 1)) ;;
    "did not compile") n_nocompile=$((n_nocompile + 1)) ;;
    *) n_noapply=$((n_noapply + 1)) ;;
  esac
done
median="n/a"
if [ "$n_killed" -gt 0 ]; then
  median=$(printf '%s\n' "${killed_secs[@]}" | sort -g | awk '{ t[NR] = $1 } END {
    if (NR % 2) print t[(NR + 1) / 2]; else printf "%.1f\n", (t[NR / 2] + t[NR / 2 + 1]) / 2 }')
fi
{
  echo "# Mutant catalogue: results"
  echo
  echo "Written by \`scripts/mutants.sh${pattern:+ $pattern}\` (\`make mutants\`) on the" \
    "$([ "${MUTANTS_SOURCE:-worktree}" = head ] && echo "committed HEAD" || echo "working tree");" \
    "do not edit by hand."
  echo "Each row is one patch of \`tests/mutants/\`, a plausible bug planted in \`src/\`. Seconds:"
  echo "time to detection, the summed wall time of the gate's checks up to and including the"
  echo "one that failed (builds excluded; for a survivor, the whole gate)."
  echo
  echo "| # | mutant | description | verdict | killed by | seconds |"
  echo "|---|---|---|---|---|---|"
  for row in "${results[@]}"; do
    IFS=$'\x1f' read -r name desc verdict by secs <<<"$row"
    echo "| ${name%%-*} | \`${name#*-}\` | $desc | $verdict | ${by:+\`$by\`} | $secs |"
  done
  echo
  echo "**Summary:** ${#results[@]} mutants: $n_killed killed, $n_survived survived," \
    "$n_nocompile did not compile, $n_noapply did not apply; median time to detection" \
    "$median$([ "$median" = n/a ] || echo " s")."
  echo
  echo "## Survivors"
  echo
  any=0
  for row in "${results[@]}"; do
    IFS=$'\x1f' read -r name desc verdict by secs <<<"$row"
    [ "$verdict" = survived ] || continue
    any=1
    note=$(header_field "$mutants_dir/$name.patch" Survivor)
    no_note="no argument recorded yet (add a \`Survivor:\` line to the patch header:"
    no_note+=" equivalent, or which check is missing)."
    echo "- \`$name\`: ${note:-$no_note}"
  done
  [ $any = 1 ] || echo "None."
  echo
  echo "## Killed only by the unit/sim test binaries"
  echo
  fuzz_too=""
  [ $fuzz_ok = 0 ] || fuzz_too=" and the fuzz stage"
  echo "Missed by the fast gate (prop machines, kvtwin runs)$fuzz_too, caught by a"
  echo "hand-written test: a gap in the differential checks, explained by the patch's \`Gap:\`"
  echo "lines."
  echo
  any=0
  for row in "${results[@]}"; do
    IFS=$'\x1f' read -r name desc verdict by secs <<<"$row"
    [ "$verdict" = killed ] || continue
    for i in "${!check_names[@]}"; do
      [ "${check_names[$i]}" = "${by%% *}" ] && [ "${check_stages[$i]}" = tests ] || continue
      any=1
      note=$(header_field "$mutants_dir/$name.patch" Gap)
      : "${note:=no analysis recorded yet (add a \`Gap:\` line to the patch header).}"
      echo "- \`$name\` (\`$by\`): $note"
    done
  done
  [ $any = 1 ] || echo "None."
  echo
  echo "## The gate"
  echo
  echo "In order; the gate stops at the first failing check. Baseline seconds on the"
  echo "unmutated tree. Commands run from the scratch tree root."
  echo
  echo "| check | stage | baseline s | command |"
  echo "|---|---|---|---|"
  for i in "${!check_names[@]}"; do
    n=${check_names[$i]}
    cmd=${check_cmds[$i]//$build/build}
    cmd=${cmd//$fuzz_build/build-fuzz}
    cmd=${cmd//$scratch/scratch}
    cmd=$(tr -s ' \n' ' ' <<<"$cmd" | sed 's/ *$//')
    state=""
    check_usable "$i" || state=" (skipped)"
    echo "| \`$n\`$state | ${check_stages[$i]} | ${base_secs[$n]:-} | \`${cmd//|/\\|}\` |"
  done
  echo
  if [ $fuzz_ok = 1 ]; then
    echo "Fuzz stage: ran, ${fuzz_seconds} s per target (-seed=1; time-boxed, so not" \
      "deterministic)."
    [ ${#skipped_checks[@]} -eq 0 ] ||
      echo "Skipped because they fail on the unmutated tree: ${skipped_checks[*]}."
  else
    echo "Fuzz stage: **skipped** ($fuzz_reason)."
  fi
  echo
  echo "Full run: ${total_secs} s wall, $(nproc) cores, builds at -j${jobs}."
} >"$out"
echo "results: $out (${total_secs} s)"
