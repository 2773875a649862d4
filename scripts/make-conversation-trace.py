#!/usr/bin/env python3
"""Goal: a Mooncake-format trace larger than the bundled one, shaped like multi-turn chat
traffic, to see how a lock-step replay scales before a user feeds kvtwin hours of it. The
bundled synthetic trace mostly shares prefixes across conversations; Mooncake's public
conversation and tool-agent traces (not bundled) carry 2-3x its tokens and grow each
conversation turn by turn, which is what this writes.

Method: CONVERSATIONS conversations, each opening with one of 40 shared system prompts
(2-6 blocks), then 1-10 turns; each turn appends 1-12 new blocks to the previous turn's
hash_ids, so the ids form a real prefix tree (an id always has the same parent and depth),
and its last block holds 1-512 tokens (len(hash_ids) == ceil(input_length / 512)).
Turns start 20-90 s apart within a conversation, conversations anywhere in an hour; lines
are sorted by timestamp. Output lengths are 20-600 tokens. Seeded: the same arguments
write the same bytes.

Usage: scripts/make-conversation-trace.py OUT.jsonl [--conversations N] [--seed S]
  then: build/default/sim/kvtwin replay OUT.jsonl   (block scale 512: the real lengths)
"""
import argparse
import json
import os
import random
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--conversations", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    if args.conversations < 1:  # bad input: one line, exit 2, nothing written
        print(f"make-conversation-trace: --conversations must be >= 1, got {args.conversations}",
              file=sys.stderr)
        sys.exit(2)
    rng = random.Random(args.seed)
    next_id = 0
    system_prompts = []
    for _ in range(40):
        n = rng.randint(2, 6)
        system_prompts.append(list(range(next_id, next_id + n)))
        next_id += n
    lines = []
    for _ in range(args.conversations):
        ids = list(rng.choice(system_prompts))
        start = rng.randint(0, 3_600_000)
        for turn in range(rng.randint(1, 10)):
            added = rng.randint(1, 12)
            ids = ids + list(range(next_id, next_id + added))
            next_id += added
            input_length = 512 * (len(ids) - 1) + rng.randint(1, 512)
            output_length = rng.randint(20, 600)
            timestamp = start + turn * rng.randint(20_000, 90_000)
            lines.append((timestamp, input_length, output_length, ids))
    lines.sort(key=lambda line: line[0])
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        for ts, input_length, output_length, ids in lines:
            f.write(json.dumps({"timestamp": ts, "input_length": input_length,
                                "output_length": output_length, "hash_ids": ids}) + "\n")
    os.replace(tmp, args.out)  # nothing written half
    tokens = sum(line[1] for line in lines)
    print(f"{len(lines)} requests, {tokens} prompt tokens, {next_id} distinct blocks -> {args.out}")


if __name__ == "__main__":
    main()
