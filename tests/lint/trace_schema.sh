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
# Reach claims: per kind, a floor of 1 or more, never on ops or documented divergences.
ops_header = json.loads(open(f"{root}/traces/workloads/ops-mixed.jsonl").readline())
ms_header = json.loads(open(f"{root}/traces/regress/multiseq-remove-before-put-keeps-startforward-mask.jsonl").readline())
def with_reaches(h, reaches, **extra):
    h = json.loads(json.dumps(h))
    h["reaches"] = reaches
    h.update(extra)
    return h
refused.update({
    "a reach claim of 0": with_reaches(header, {"evictions": 0}),
    "no reach claim": with_reaches(header, {}),
    "an unknown counter": with_reaches(header, {"evicted": 1}),
    "a multiseq counter in a requests trace": with_reaches(header, {"cow_copies": 1}),
    "a requests counter in a multiseq trace": with_reaches(ms_header, {"evictions": 1}),
    "a reach claim in an ops trace": with_reaches(ops_header, {"evictions": 1}),
    "a reach claim on a documented divergence": with_reaches(header, {"evictions": 1}, expect="divergence: layer # history"),
})
for name, line in {"a requests claim": with_reaches(header, {"evictions": 2}, expect="pass"),
                   "a multiseq claim": with_reaches(ms_header, {"cow_copies": 1})}.items():
    if not validator.is_valid(line):
        failures.append(f"the schema refuses a line the reader accepts: {name}")
# The counter names per kind are the drivers' field tables (RequestCoverage::Fields,
# MsCoverage::Fields), which the reader checks claims against.
import re
for kind, source, member in (("requests", "sim/request_driver.cc", "RequestCoverage"),
                             ("multiseq", "sim/multi_seq_checks.cc", "MsCoverage")):
    names = re.findall(r'\{"(\w+)", &' + member + "::", open(f"{root}/{source}").read())
    rules = [r["then"]["properties"]["reaches"]["propertyNames"]["enum"]
             for r in schema["$defs"]["header"]["allOf"]
             if r["if"].get("properties", {}).get("kind", {}).get("const") == kind
             and "reaches" in r["then"].get("properties", {})]
    if not names or rules != [names]:
        failures.append(f"the schema's {kind} reach counters differ from {source}'s {member}::Fields")
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
