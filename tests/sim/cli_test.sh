#!/usr/bin/env bash
# Goal: the kvtwin CLI keeps its contract: exit 0 on a passing sweep with the verdict line,
# exit 2 with a one-line error on bad input, and the root seed printed first by `run`;
# `requests` writes its --dot output whole, as DOT that Graphviz renders.
# Method: run the built binary (first argument) on good and bad command lines.
set -u
kvtwin=$1
fail=0
expect() {  # expect CODE PATTERN -- ARGS...
  local code=$1 pattern=$2; shift 3
  out=$("$kvtwin" "$@" 2>&1); got=$?
  if [ "$got" -ne "$code" ] || ! grep -qE "$pattern" <<<"$out"; then
    echo "FAIL: kvtwin $* -> exit $got (want $code), output:"; echo "$out" | head -5; fail=1
  fi
}
expect 0 '^PASS: 3 runs'            -- sweep --seeds 1..3 --preset sliding --steps 200
expect 0 '^PASS: 2 runs'            -- sweep --seeds 4..7 --shard 1/2 --preset mixed --steps 100
expect 0 '^PASS: 2 runs'            -- sweep --seeds 1..2 --swarm --steps 200
expect 2 'seeds'                    -- sweep --seeds 9..3
expect 2 'seeds'                    -- sweep --seeds abc
expect 2 'shard'                    -- sweep --seeds 1..2 --shard 2/2
expect 2 'unknown preset'           -- sweep --seeds 1 --preset nope
expect 2 'window must be >= 1'      -- sweep --seeds 1 --window 0
expect 2 'dtype'                    -- sweep --seeds 1 --dtype f16
expect 2 'steps'                    -- sweep --seeds 1 --steps 0
expect 0 '^PASS: 2 runs'            -- sweep --seeds 1..2 --steps 200 --kv-dims 1,7,9 --recurrent-dims 1,3,6,4,2
expect 2 '^kvtwin: --kv-dims must be HEADS,DK,DV'       -- sweep --seeds 1 --kv-dims 2,4
expect 2 '^kvtwin: --kv-dims: kv heads x head_dim = 6'  -- sweep --seeds 1 --kv-dims 1,6,9
expect 2 '^kvtwin: --recurrent-dims: recurrent num_v_heads \(3\) must be a multiple' -- requests --seeds 1 --recurrent-dims 1,2,3,1,1
expect 2 '^kvtwin: --recurrent-dims: recurrent conv_tail must be in 0..16, got -1' -- requests --seeds 1 --recurrent-dims -1,1,1,1,1
expect 0 '^PASS: 1 runs, 60 requests' -- requests --seeds 1 --preset mixed --recurrent-dims 0,1,1,1,1
expect 2 '.'                        -- frobnicate
expect 0 '^PASS: 3 runs, 180 requests' -- requests --seeds 1..3 --preset mixed
expect 0 '^PASS: 2 runs, 80 requests'  -- requests --seeds 4..5 --preset sliding --dtype bf16 --budget 3000 --requests 40
expect 2 'seeds'                    -- requests --seeds 5..1
expect 2 '^kvtwin: --conversations' -- requests --seeds 1 --conversations 0
expect 2 '^kvtwin: --requests'      -- requests --seeds 1 --requests 0
expect 2 '^kvtwin: --budget'        -- requests --seeds 1 --budget -5
expect 2 '^kvtwin: --chunk'         -- requests --seeds 1 --chunk 0
expect 2 '^kvtwin: --window'        -- requests --seeds 1 --window 0
expect 2 'unknown preset'           -- requests --seeds 1 --preset nope
expect 2 '^kvtwin: --dtype'         -- requests --seeds 1 --dtype f16
expect 2 '^kvtwin: --dot'           -- requests --seeds 1 --requests 2 --dot /nonexistent-dir/trie.dot
# --spike defaults to the 1,000 requests its first budget of 0 needs, and refuses fewer.
expect 0 '^PASS: 1 runs, 1000 requests' -- requests --seeds 2 --swarm --spike
expect 2 '^kvtwin: --spike needs --requests >= 1000' -- requests --seeds 1 --spike --requests 999
expect 2 '^kvtwin: --spike and --huge are exclusive' -- requests --seeds 1 --spike --huge
expect 0 '^PASS: 5 runs'            -- multiseq --seeds 1..5 --steps 200
expect 1 'documented weakness|^reproduce: kvtwin multiseq' -- multiseq --seeds 1..40 --conv ideal
expect 2 '^kvtwin: --conv'          -- multiseq --seeds 1 --conv nope
expect 2 '^kvtwin: --steps'         -- multiseq --seeds 1 --steps 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$("$kvtwin" requests --seeds 1..2 --conversations 20 --requests 80 --dump --dot "$tmp/trie.dot" 2>&1)
if [ $? -ne 0 ] || ! grep -q '^final trie (seed 2):' <<<"$out" || ! grep -q '^root last=' <<<"$out"; then
  echo "FAIL: requests --dump/--dot run:"; echo "$out" | tail -5; fail=1
fi
if ! head -1 "$tmp/trie.dot" 2>/dev/null | grep -q '^digraph trie {$' || [ -e "$tmp/trie.dot.tmp" ]; then
  echo "FAIL: --dot did not leave a whole DOT file"; fail=1
fi
if command -v dot >/dev/null; then
  if ! dot -Tsvg "$tmp/trie.dot" -o "$tmp/trie.svg" || ! grep -q '<svg' "$tmp/trie.svg"; then
    echo "FAIL: dot -Tsvg cannot render the --dot output"; fail=1
  fi
fi
out=$("$kvtwin" run --seeds-per-config 1 --steps 50 2>&1)
head -1 <<<"$out" | grep -q '^kvtwin run: root seed 1$' || { echo "FAIL: run does not print the seed first"; fail=1; }
tail -1 <<<"$out" | grep -q '^PASS: ' || { echo "FAIL: run has no verdict line"; fail=1; }
# The corpus stage runs every target's seed corpus, so its count is never zero.
grep -qE '^  fuzz corpora +[1-9][0-9]* entries \(kv [1-9].*trace_reader [1-9][0-9]*\): pass$' <<<"$out" ||
  { echo "FAIL: run did not replay the fuzz corpora"; fail=1; }
[ $fail -eq 0 ] && echo "cli: ok"
exit $fail
