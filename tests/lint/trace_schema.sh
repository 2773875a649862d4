#!/usr/bin/env bash
# Goal: traces/trace-v1.schema.json describes what the writer writes: every line of every
# bundled trace (traces/workloads/, traces/regress/) validates against it, and lines the
# reader refuses (a width out of range, an unknown field, a model part missing a field) are
# refused by the schema too, so the schema cannot pass everything.
# Method: python3-jsonschema (Draft 2020-12) over each line; the first failures are printed
# as FILE:LINE: message. Usage: trace_schema.sh ROOT
set -euo pipefail
root=${1:-.}
python3 - "$root" <<'EOF'
import glob, json, sys
from jsonschema import Draft202012Validator

root = sys.argv[1]
schema = json.load(open(f"{root}/traces/trace-v1.schema.json"))
Draft202012Validator.check_schema(schema)
validator = Draft202012Validator(schema)
failures, lines = [], 0
files = sorted(glob.glob(f"{root}/traces/workloads/*.jsonl") + glob.glob(f"{root}/traces/regress/*.jsonl"))
for path in files:
    with open(path) as f:
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            lines += 1
            for e in validator.iter_errors(json.loads(text)):
                failures.append(f"{path}:{n}: {e.message[:200]}")
                break

# Lines the reader refuses (tests/unit/trace_test.cc has their messages).
header = json.loads(open(f"{root}/traces/workloads/requests-mixed-dims.jsonl").readline())
def edited(edit):
    h = json.loads(json.dumps(header))
    edit(h)
    return h
refused = {
    "kv heads 65": edited(lambda h: h["model"]["kv"].update(heads=65)),
    "recurrent without head_v_dim": edited(lambda h: h["model"]["recurrent"].pop("head_v_dim")),
    "unknown model field": edited(lambda h: h["model"].update(heads=2)),
    "conv_tail -1": edited(lambda h: h["model"]["recurrent"].update(conv_tail=-1)),
}
# A forward's edits are copy_prefix / remove objects (the reader's DecodeEdits).
event = json.loads(open(f"{root}/traces/regress/multiseq-remove-before-put-keeps-startforward-mask.jsonl").readlines()[1])
def edited_event(edit):
    e = json.loads(json.dumps(event))
    edit(e)
    return e
refused.update({
    "an edit that is a forward": edited_event(lambda e: e["edits"].append({"op": "forward", "batch": [[0, 1, 2]]})),
    "an edit that is a probe": edited_event(lambda e: e["edits"].append({"op": "can_resume", "seq": 0, "pos": 1})),
    "an edit with an unknown field": edited_event(lambda e: e["edits"][0].update(dst=1)),
    "17 edits": edited_event(lambda e: e.update(edits=e["edits"] * 17)),
})
for name, line in refused.items():
    if validator.is_valid(line):
        failures.append(f"the schema accepts a line the reader refuses: {name}")

if len(files) < 10 or lines < 1000:
    failures.append(f"only {len(files)} traces with {lines} lines found under {root}/traces")
for f in failures[:20]:
    print(f"FAIL: {f}")
print(f"{len(files)} traces, {lines} lines, {len(failures)} failures")
sys.exit(1 if failures else 0)
EOF
