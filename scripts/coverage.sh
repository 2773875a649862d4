#!/usr/bin/env bash
# Goal: show which lines of the production caches (src/*.cc) kvtwin's differential checks
# never execute. A bug planted on such a line can only be caught by a hand-written unit test
# (or not at all), so this is where new op forms, generator weights or checks are owed.
# It is a measurement, not a test: it never fails on what it finds.
#
# Method: the `coverage` preset (g++ --coverage, -O1, tests on) into build/coverage. The
# counters are zeroed, then two tiers run in order and gcov reads src/ after each:
#   differential  `kvtwin run` (the bundled sweeps, request streams and traces), the
#                 rapidcheck machines (ctest -L prop) and the fuzz corpora in replay mode
#                 (ctest -L fuzz-replay): everything that compares production with the
#                 reference;
#   all tests     the above plus the unit and sim tests (ctest -L 'unit|sim').
# Counts accumulate, so "all tests" includes the differential tier. Only src/*.cc is
# reported: code inlined from headers is counted in each including file separately and
# gcov cannot merge it here. Closing braces gcov marks after exhaustive returns are skipped.
#
# Output: build/coverage/COVERAGE.md (per file: executable lines, missed by the differential
# tier, missed by every test; then each line the differential tier missed, with its text
# and whether a unit or sim test reaches it); each step's output in build/coverage/STEP.log, and a
# failing step stops the script (exit 2). Usage: scripts/coverage.sh (make coverage).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build=build/coverage
jobs=${JOBS:-$(nproc)}

cmake --preset coverage >/dev/null
cmake --build --preset coverage -j "$jobs" >/dev/null
find "$build" -name '*.gcda' -delete

objects=("$root/$build/src/CMakeFiles/kvtwin_cache.dir" "$root/$build/src/CMakeFiles/kvtwin_core.dir/core")
mangled="${root//\//#}#src#"  # gcov -p names a source file by its path, '/' written '#'

# gcov_tier DIR: gcov of every src/ object into DIR (one NAME.cc.gcov per source file).
gcov_tier() {
  rm -rf "$1" && mkdir -p "$1"
  (cd "$1" && for dir in "${objects[@]}"; do
     for gcda in "$dir"/*.gcda; do
       if [ -e "$gcda" ]; then gcov -p -o "$dir" "$gcda" >/dev/null; fi
     done
   done)
}

# run LABEL CMD...: one step of a tier, its output in build/coverage/LABEL.log; a failure
# stops the script with one line (a failing check makes the counts meaningless).
run() {
  local label=$1; shift
  "$@" >"$build/$label.log" 2>&1 ||
    { echo "coverage: $label failed, see $build/$label.log" >&2; exit 2; }
}

echo "coverage: differential tier (kvtwin run, prop, fuzz-replay)" >&2
run kvtwin-run "$build/sim/kvtwin" run
run ctest-differential ctest --test-dir "$build" -L 'prop|fuzz-replay' -j "$jobs" --output-on-failure
gcov_tier "$build/gcov-differential"
echo "coverage: unit and sim tests" >&2
run ctest-unit-sim ctest --test-dir "$build" -L 'unit|sim' -j "$jobs" --output-on-failure
gcov_tier "$build/gcov-all"

# status FILE: "line<TAB>hit|miss<TAB>text" for every executable line of one gcov file.
status() {
  awk -F: '{
    count = $1; gsub(/ /, "", count); line = $2 + 0
    # A template prints its line once per instantiation after the summed line: keep the sum.
    if (count == "-" || line == 0 || seen[line]++) next
    text = $0; sub(/^[^:]*:[^:]*:/, "", text)
    if (text ~ /^[ \t]*}[;)]?[ \t]*$/) next
    print line "\t" ((count ~ /^(#####|=====)$/) ? "miss" : "hit") "\t" text
  }' "$1"
}

report="$build/COVERAGE.md"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
{
  echo "# src/ line coverage by kvtwin's checks"
  echo
  echo "Written by \`scripts/coverage.sh\` (\`make coverage\`); see its header for the method."
  echo
  echo "| file | executable lines | missed by the differential tier | missed by every test |"
  echo "|---|---:|---:|---:|"
} >"$work/report"
: >"$work/missed"
for diff_file in "$build/gcov-differential/$mangled"*.cc.gcov; do
  [ -e "$diff_file" ] || continue
  name=${diff_file##*/}; name=${name#"$mangled"}; name=src/${name%.gcov}; name=${name//#//}
  status "$diff_file" | sort -k1,1 >"$work/diff"
  status "$build/gcov-all/${diff_file##*/}" | sort -k1,1 >"$work/all"
  lines=$(wc -l <"$work/diff")
  diff_miss=$(awk -F'\t' '$2 == "miss"' "$work/diff" | wc -l)
  all_miss=$(awk -F'\t' '$2 == "miss"' "$work/all" | wc -l)
  echo "| \`$name\` | $lines | $diff_miss | $all_miss |" >>"$work/report"
  # Lines the differential tier missed, each with whether any test reaches it.
  join -t $'\t' <(awk -F'\t' '$2 == "miss" {print $1 "\t" $3}' "$work/diff") \
                <(cut -f1,2 "$work/all") |
    sort -n | awk -F'\t' -v f="$name" '{printf "- `%s:%s` (%s): `%s`\n", f, $1, ($3 == "hit" ? "unit/sim tests only" : "no test"), $2}' >>"$work/missed"
done
{
  echo
  echo "## Lines the differential tier never executes"
  echo
  if [ -s "$work/missed" ]; then cat "$work/missed"; else echo "None."; fi
} >>"$work/report"
mv "$work/report" "$report"  # whole or not at all
echo "coverage: $report" >&2
