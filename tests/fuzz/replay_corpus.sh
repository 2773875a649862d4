#!/usr/bin/env bash
# Goal: every seed-corpus entry of a fuzz target (fuzz/corpus/NAME/) still runs clean in
# replay mode, in the g++ build, without clang: the corpus is a regression suite as much as
# a fuzzing start, and a crash artifact kept there stays fixed.
# Method: `kvtwin replay --fuzz-input ENTRY --target NAME --save TMP` for each entry (the
# same decoder the fuzz target uses); any exit but 0 fails, with the entry and its output.
# Usage: replay_corpus.sh KVTWIN NAME CORPUS_DIR
set -u
kvtwin=$1 target=$2 dir=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
n=0 fail=0
for entry in "$dir"/*; do
  [ -f "$entry" ] || continue
  n=$((n + 1))
  if ! out=$("$kvtwin" replay --quiet --fuzz-input "$entry" --target "$target" \
               --save "$tmp/trace.jsonl" 2>&1); then
    echo "FAIL: $entry"; echo "$out" | head -40; fail=1
  fi
done
[ "$n" -gt 0 ] || { echo "no corpus entries in $dir"; exit 1; }
echo "fuzz-replay $target: $n entries, $([ $fail -eq 0 ] && echo pass || echo FAIL)"
exit $fail
