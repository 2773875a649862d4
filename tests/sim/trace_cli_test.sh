#!/usr/bin/env bash
# Goal: the trace commands keep their contract: a generated trace replays to the same
# digest as the run that generated it (ops, multiseq); malformed input exits 2 with one line naming the
# file, line and JSON pointer and writes nothing; --json / --junit reports are whole;
# Mooncake JSONL imports and replays, its prefill cadence following the block scale unless
# given; explain and shrink refuse what they cannot do; a replay short of its header's
# reach claims fails.
# Method: run the built binary (first argument) in a scratch directory.
set -u
kvtwin=$1
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A small Mooncake JSONL file (the format of ../shared/traces-external): shared first
# blocks, a short last block, a prompt that is a prefix of an earlier one.
mooncake=$tmp/mooncake.jsonl
{
  echo '{"timestamp": 0, "input_length": 1200, "output_length": 7, "hash_ids": [0, 1, 2]}'
  echo '{"timestamp": 5, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 3]}'
  echo '{"timestamp": 9, "input_length": 700, "output_length": 2, "hash_ids": [0, 1]}'
  echo '{"timestamp": 9, "input_length": 300, "output_length": 9, "hash_ids": [4]}'
  for i in $(seq 10 40); do
    echo "{\"timestamp\": $i, \"input_length\": 1600, \"output_length\": 4, \"hash_ids\": [0, 1, $((i * 2)), $((i * 2 + 1))]}"
  done
} >"$mooncake"
say() { echo "FAIL: $*"; fail=1; }
expect() {  # expect CODE PATTERN -- ARGS...
  local code=$1 pattern=$2; shift 3
  out=$("$kvtwin" "$@" 2>&1); got=$?
  if [ "$got" -ne "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    say "kvtwin $* -> exit $got (want $code), output:"; echo "$out" | head -5
  fi
}
digest_of() { grep -oE 'digest [0-9a-f]{16}$|^digest: [0-9a-f]{16}$' <<<"$1" | tail -1 | grep -oE '[0-9a-f]{16}'; }

# Ops: the sweep of one seed and the replay of its recorded trace agree on the digest.
sweep=$("$kvtwin" sweep --seeds 5 --preset mixed --steps 300 2>&1)
expect 0 '^wrote '                   -- gen --kind ops --seed 5 --preset mixed --steps 300 -o "$tmp/ops.jsonl"
replay=$("$kvtwin" replay "$tmp/ops.jsonl" 2>&1)
[ -n "$(digest_of "$sweep")" ] && [ "$(digest_of "$sweep")" = "$(digest_of "$replay")" ] ||
  say "ops trace digest differs from its sweep: $(digest_of "$sweep") vs $(digest_of "$replay")"

# Multi-sequence: `kvtwin multiseq` of one seed and the replay of its recorded trace agree.
multiseq=$("$kvtwin" multiseq --seeds 3 --steps 200 2>&1)
expect 0 '^wrote '                   -- gen --kind multiseq --seed 3 --steps 200 -o "$tmp/ms.jsonl"
head -1 "$tmp/ms.jsonl" | grep -q '"kind":"multiseq"' || say "gen --kind multiseq wrote no multiseq header"
replay=$("$kvtwin" replay "$tmp/ms.jsonl" 2>&1)
grep -q '^PASS: 1 file' <<<"$replay" || say "multiseq trace does not replay: $replay"
[ -n "$(digest_of "$multiseq")" ] && [ "$(digest_of "$multiseq")" = "$(digest_of "$replay")" ] ||
  say "multiseq trace digest differs from its run: $(digest_of "$multiseq") vs $(digest_of "$replay")"

# Requests: generated with a budget, replayed with reports.
expect 0 '^wrote '                   -- gen --kind requests --seed 3 --requests 40 --budget 3000 -o "$tmp/req.jsonl"
expect 0 '^PASS: 1 file'             -- replay "$tmp/req.jsonl" --json "$tmp/r.json" --junit "$tmp/r.xml"
grep -q '"verdict":"pass"' "$tmp/r.json" || say "--json has no pass verdict"
grep -q '<testsuite name="kvtwin replay" tests="1" failures="0" errors="0">' "$tmp/r.xml" ||
  say "--junit is not a passing suite"
# Auditing every session call checks more often but replays to the same digest.
# A header's reach claims: met, the replay passes; short of one, it fails (exit 1) with
# verdict unreached, the one line naming the header and counter, and a report saying so.
python3 - "$tmp/req.jsonl" "$tmp/reach-met.jsonl" "$tmp/reach-short.jsonl" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
header = json.loads(lines[0])
for path, n in ((sys.argv[2], 1), (sys.argv[3], 10**9)):
    header["reaches"] = {"completed": n}
    open(path, "w").write("\n".join([json.dumps(header, sort_keys=True)] + lines[1:]) + "\n")
PY
expect 0 '^PASS: 1 file'             -- replay "$tmp/reach-met.jsonl"
expect 0 ': coverage: completed=[0-9]+ cancelled=[0-9]+ .* trusting_forwards=[0-9]+$' -- replay "$tmp/reach-met.jsonl" --coverage --quiet
expect 1 "^$tmp/reach-short.jsonl:1: /reaches/completed: reached [0-9]+ time\(s\), the trace claims at least 1000000000$" -- replay "$tmp/reach-short.jsonl" --json "$tmp/reach.json" --junit "$tmp/reach.xml"
grep -q '"verdict":"unreached"' "$tmp/reach.json" || say "--json has no unreached verdict"
grep -q '<failure message="unreached" type="unreached">' "$tmp/reach.xml" || say "--junit: unreached is not a failure"
# Claims from the command line (--reach), beside the header's: for a Mooncake file, which has
# no header to carry them, as for a trace; a counter of another kind is an input error.
expect 0 '^PASS: 1 file'             -- replay "$tmp/req.jsonl" --reach completed --reach splits=1
expect 1 "^$tmp/req.jsonl:1: --reach completed: reached [0-9]+ time\(s\), the command claims at least 1000000000$" -- replay "$tmp/req.jsonl" --reach completed=1000000000
expect 1 "^reproduce: kvtwin replay $tmp/req.jsonl --reach completed=1000000000$" -- replay "$tmp/req.jsonl" --reach completed=1000000000
expect 1 "^$mooncake:1: --reach evictions: reached 0 time\(s\), the command claims at least 1$" -- replay "$mooncake" --limit 5 --reach evictions
expect 0 '^PASS: 1 file'             -- replay "$mooncake" --limit 5 --budget 1000 --reach evictions
expect 2 "^kvtwin: $tmp/req.jsonl:1: --reach 'cow_copies': unknown coverage counter of a \"requests\" trace" -- replay "$tmp/req.jsonl" --reach cow_copies
expect 2 "^kvtwin: $tmp/ops.jsonl:1: --reach 'completed': an ops trace has no coverage counters to claim$" -- replay "$tmp/ops.jsonl" --reach completed
expect 2 "^kvtwin: --reach 'splits=0': expected COUNTER or COUNTER=N" -- replay "$tmp/req.jsonl" --reach splits=0
amortized=$("$kvtwin" replay "$tmp/req.jsonl" 2>&1)
every=$("$kvtwin" replay "$tmp/req.jsonl" --audit-every-call 2>&1)
grep -q '^PASS: 1 file' <<<"$every" || say "--audit-every-call does not pass: $every"
[ -n "$(digest_of "$every")" ] && [ "$(digest_of "$every")" = "$(digest_of "$amortized")" ] ||
  say "--audit-every-call changes the digest: $(digest_of "$amortized") vs $(digest_of "$every")"


# Malformed input: exit 2, one line with file:line: /pointer, no report written.
printf '{"format":"kvtwin-trace","version":2,"kind":"ops","seed":1,"model":{"preset":"dense","layers":1,"window":4,"dtype":"f32"}}\n' >"$tmp/v2.jsonl"
expect 2 "^kvtwin: $tmp/v2.jsonl:1: /version: unsupported version 2" -- replay "$tmp/v2.jsonl" --json "$tmp/bad.json"
[ -e "$tmp/bad.json" ] && say "a report was written for malformed input"
head -1 "$tmp/req.jsonl" >"$tmp/badreq.jsonl"
echo '{"inputs":[1,-2147483649],"outputs":[3]}' >>"$tmp/badreq.jsonl"
expect 2 "^kvtwin: $tmp/badreq.jsonl:2: /inputs/1: " -- replay "$tmp/badreq.jsonl"
# A negative prompt id is a media fold value (bit 31 set), a negative output is not; user
# points outside (cached, len] are legal and dropped.
head -1 "$tmp/req.jsonl" >"$tmp/media.jsonl"
echo '{"inputs":[1,-2147483648,-2147483648,-1],"outputs":[3],"user_points":[0,-3,4294967298,2]}' >>"$tmp/media.jsonl"
expect 0 '^PASS: 1 file' -- replay "$tmp/media.jsonl"
head -1 "$tmp/req.jsonl" >"$tmp/badout.jsonl"
echo '{"inputs":[1,-2],"outputs":[-3]}' >>"$tmp/badout.jsonl"
expect 2 "^kvtwin: $tmp/badout.jsonl:2: /outputs/0: " -- replay "$tmp/badout.jsonl"
expect 2 'cannot open'               -- replay "$tmp/missing.jsonl"
expect 2 'block-scale'               -- replay "$mooncake" --block-scale 0

# Mooncake: replayed directly and through an imported trace, to the same digest.
direct=$("$kvtwin" replay "$mooncake" --block-scale 2 --limit 30 --preset dense 2>&1)
grep -q 'prefix reuse: matched' <<<"$direct" || say "Mooncake replay shows no prefix reuse: $direct"
expect 0 '^imported 30 requests'     -- import "$mooncake" -o "$tmp/moon.jsonl" --block-scale 2 --limit 30 --preset dense
imported=$("$kvtwin" replay "$tmp/moon.jsonl" 2>&1)
[ -n "$(digest_of "$direct")" ] && [ "$(digest_of "$direct")" = "$(digest_of "$imported")" ] ||
  say "imported Mooncake trace replays differently: $(digest_of "$direct") vs $(digest_of "$imported")"

# Mooncake cadence: chunk and capture interval default to one block (max(5, S), max(8, S));
# explicit flags win. The report's reproduce line carries the setup that ran.
cadence() {  # cadence ARGS... -> the "--chunk C --interval I" of the replay's report
  "$kvtwin" replay "$mooncake" --limit 3 --preset dense --quiet --json "$tmp/cad.json" "$@" >/dev/null 2>&1
  grep -oE -- '--chunk [0-9]+ --interval [0-9]+' "$tmp/cad.json" | head -1
}
[ "$(cadence --block-scale 64)" = "--chunk 64 --interval 64" ] || say "scale 64 cadence: $(cadence --block-scale 64)"
[ "$(cadence --block-scale 2)" = "--chunk 5 --interval 8" ] || say "scale 2 cadence: $(cadence --block-scale 2)"
[ "$(cadence --block-scale 64 --chunk 7 --interval 9)" = "--chunk 7 --interval 9" ] ||
  say "explicit cadence: $(cadence --block-scale 64 --chunk 7 --interval 9)"

# Another production trace shape (Alibaba's Bailian/Qwen traces): 16-token blocks,
# fractional timestamps in seconds, extra fields. Read at Mooncake's 512 the first line is
# refused and the block size that fits is named; with --trace-block 16 it replays, the
# scale defaulting to the recorded lengths, and the reproduce line carries the block.
qwen=$tmp/qwen.jsonl
{
  echo '{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.25, "input_length": 40, "output_length": 3, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}'
  echo '{"chat_id": 2, "parent_chat_id": 1, "timestamp": 1.5, "input_length": 70, "output_length": 2, "type": "text", "turn": 2, "hash_ids": [1, 2, 4, 5, 6]}'
} >"$qwen"
expect 2 "^kvtwin: $qwen:1: /hash_ids: .*--trace-block 16\)$" -- replay "$qwen"
expect 0 'matched 32 .* of 110 prompt tokens' -- replay "$qwen" --trace-block 16 --preset dense
expect 0 'matched 8 .* of 28 prompt tokens' -- replay "$qwen" --trace-block 16 --block-scale 4
expect 2 'block-scale must be in 1..16'     -- replay "$qwen" --trace-block 16 --block-scale 32
expect 2 'trace-block must be in'           -- replay "$qwen" --trace-block 0
"$kvtwin" replay "$qwen" --trace-block 16 --quiet --json "$tmp/qwen.json" >/dev/null 2>&1
grep -q -- '--trace-block 16 --block-scale 16 ' "$tmp/qwen.json" || say "the reproduce line lacks --trace-block 16"

# explain and shrink.
expect 0 'after event 3'             -- explain "$tmp/req.jsonl" --at 3 --dot "$tmp/t.dot"
head -1 "$tmp/t.dot" | grep -q '^digraph trie {$' || say "explain --dot did not write DOT"
expect 2 'has only'                  -- explain "$tmp/req.jsonl" --at 100000
expect 2 'does not diverge'          -- shrink "$tmp/req.jsonl" -o "$tmp/min.jsonl"
[ -e "$tmp/min.jsonl" ] && say "shrink wrote a file for a passing trace"
expect 2 "^kvtwin: --keep-reach 'nope': unknown coverage counter of a \"requests\" trace \\(expected one of completed, " -- shrink "$tmp/req.jsonl" -o "$tmp/min.jsonl" --keep-reach nope
expect 2 "^kvtwin: --keep-reach 'kv_gaps=0': expected COUNTER or COUNTER=N with N in 1\.\.281474976710656$" -- shrink "$tmp/req.jsonl" -o "$tmp/min.jsonl" --keep-reach kv_gaps=0
expect 2 "^kvtwin: --keep-reach 'kv_gaps=2x': expected COUNTER" -- shrink "$tmp/req.jsonl" -o "$tmp/min.jsonl" --keep-reach kv_gaps=2x
expect 2 "^kvtwin: --keep-reach 'kv_gaps': an ops trace has no coverage counters to claim$" -- shrink "$tmp/ops.jsonl" -o "$tmp/min.jsonl" --keep-reach kv_gaps
expect 2 "^kvtwin: $tmp/req.jsonl: replayed whole the trace reaches completed [0-9]+ time\\(s\\), below --keep-reach completed=1000000$" -- shrink "$tmp/req.jsonl" -o "$tmp/min.jsonl" --keep-reach completed=1000000
[ -e "$tmp/min.jsonl" ] && say "shrink wrote a file for a refused --keep-reach"
# A passing trace shrinks to what keeps passing and reaching the kept claims, which the
# output claims in its header.
expect 0 'passing and reaching completed=' -- shrink "$tmp/req.jsonl" -o "$tmp/min.jsonl" --keep-reach completed=3 --keep-reach splits
head -1 "$tmp/min.jsonl" | grep -q '"reaches":{"completed":3,"splits":1}' || say "the shrunk trace does not claim what it kept"
[ "$(wc -l <"$tmp/min.jsonl")" -lt "$(wc -l <"$tmp/req.jsonl")" ] || say "the passing trace did not shrink"
expect 0 '^PASS: 1 file'             -- replay "$tmp/min.jsonl"
# Ctrl-C: a valid partial summary and exit 130. The replay must outlast the 1 s sleep on any
# machine: 500 copies of the trace took 1.0 s here once the reference got faster, 3,000
# take about 6 s (interrupted after 1 s, so the test does not wait for them).
{ head -1 "$tmp/req.jsonl"; for _ in $(seq 3000); do tail -n +2 "$tmp/req.jsonl"; done; } >"$tmp/long.jsonl"
"$kvtwin" replay "$tmp/long.jsonl" --json "$tmp/partial.json" >"$tmp/int.out" 2>&1 &
pid=$!
sleep 1
kill -INT $pid
wait $pid
code=$?
[ $code -eq 130 ] || say "interrupted replay exited $code (want 130): $(tail -2 "$tmp/int.out")"
grep -q '^INTERRUPTED: ' "$tmp/int.out" || say "no partial summary after Ctrl-C: $(tail -2 "$tmp/int.out")"
grep -q '"verdict":"interrupted"' "$tmp/partial.json" 2>/dev/null ||
  say "the --json summary of an interrupted replay is missing or does not say so"

# Fuzz inputs: any bytes decode, are saved as a trace and replay to a verdict; the saved
# trace replays on its own to the same digest; bad targets and files exit 2.
# Compressed bytes: dense, varied and the same on every run.
gzip -9 -n -c "$tmp/req.jsonl" | head -c 600 >"$tmp/fuzz.bin"
for target in kv rotating recurrent speculation prefix hybrid; do
  out=$("$kvtwin" replay --fuzz-input "$tmp/fuzz.bin" --target $target --save "$tmp/f-$target.jsonl" 2>&1)
  [ $? -eq 0 ] || say "fuzz input (target $target) did not pass: $(tail -3 <<<"$out")"
  again=$("$kvtwin" replay "$tmp/f-$target.jsonl" 2>&1)
  [ -n "$(digest_of "$out")" ] && [ "$(digest_of "$out")" = "$(digest_of "$again")" ] ||
    say "saved fuzz trace ($target) replays differently"
done
expect 0 'pass \(target trace_reader\)' -- replay --fuzz-input "$tmp/req.jsonl" --target trace_reader
expect 2 'expected one of kv'         -- replay --fuzz-input "$tmp/fuzz.bin" --target nope
expect 2 'cannot open'                -- replay --fuzz-input "$tmp/missing.bin" --target kv
expect 2 'takes no trace files'       -- replay "$tmp/req.jsonl" --fuzz-input "$tmp/fuzz.bin" --target kv
expect 2 'give trace files'           -- replay
# Corpora: a folder per target (fuzz/corpus's layout) or, with --target, one target's folder;
# every entry is counted and run; a folder of neither kind and misuse exit 2.
mkdir -p "$tmp/corpus/prefix" "$tmp/corpus/hybrid" "$tmp/corpus/unknown" "$tmp/empty/kv"
cp "$tmp/fuzz.bin" "$tmp/corpus/prefix/a"
head -c 300 "$tmp/fuzz.bin" >"$tmp/corpus/prefix/b"
cp "$tmp/fuzz.bin" "$tmp/corpus/hybrid/c"
cp "$tmp/fuzz.bin" "$tmp/corpus/unknown/d"
expect 0 '^PASS: 3 fuzz corpus entries \(prefix 2, hybrid 1\)' -- replay --fuzz-corpus "$tmp/corpus"
expect 0 '^PASS: 2 fuzz corpus entries \(prefix 2\)' -- replay --fuzz-corpus "$tmp/corpus/prefix" --target prefix
expect 0 '^PASS: 1 fuzz corpus entries \(kv 1\)' -- replay --fuzz-corpus "$tmp/corpus/unknown" --target kv
expect 2 'holds no folder named after a target' -- replay --fuzz-corpus "$tmp/corpus/prefix"
expect 2 'is not a directory'         -- replay --fuzz-corpus "$tmp/corpus/prefix/a"
expect 2 'holds no corpus entries'    -- replay --fuzz-corpus "$tmp/empty"
expect 2 'holds no corpus entries'    -- replay --fuzz-corpus "$tmp/empty/kv" --target kv
expect 2 'expected one of kv'         -- replay --fuzz-corpus "$tmp/corpus" --target nope
expect 2 'takes no trace files'       -- replay "$tmp/req.jsonl" --fuzz-corpus "$tmp/corpus"
expect 2 'not both'                   -- replay --fuzz-corpus "$tmp/corpus" --fuzz-input "$tmp/fuzz.bin" --target kv
[ $fail -eq 0 ] && echo "trace cli: ok"
exit $fail
