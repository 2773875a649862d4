#!/usr/bin/env bash
# Goal: every libFuzzer target builds with clang + ASan + UBSan and survives a short,
# pinned-seed run from its seed corpus, so a target that no longer links, or that a
# change made crash on its own corpus, fails `make test` rather than a nightly campaign.
# Method: configure and build the `fuzz` preset (build/fuzz), then run each NAME_fuzz with
# -seed=1 and a fixed -runs count (deterministic, unlike a time limit), reading the seed
# corpus and writing new units to a scratch dir so the source tree stays untouched.
# Without clang and libFuzzer it says so and passes (the g++ tiers still replay the
# corpora through fuzz-replay).
# Usage: smoke.sh SOURCE_DIR [RUNS]
set -u
src=$1 runs=${2:-2000}
if ! command -v clang++ >/dev/null || [ -z "$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null)" ]; then
  echo "fuzz smoke: clang++ or libFuzzer missing, skipped"; exit 0
fi
cd "$src" || exit 2
if ! cmake --preset fuzz >/dev/null || ! cmake --build --preset fuzz -j 2 >/dev/null; then
  echo "FAIL: the fuzz preset does not build:"; cmake --build --preset fuzz -j 2 2>&1 | tail -30
  exit 1
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
for exe in build/fuzz/fuzz/*_fuzz; do
  name=$(basename "$exe" _fuzz)
  mkdir -p "$tmp/$name"
  dict=(); [ -f "fuzz/$name.dict" ] && dict=(-dict="fuzz/$name.dict")
  if ! out=$("$exe" -seed=1 -runs="$runs" "${dict[@]}" -artifact_prefix="$tmp/" \
               "$tmp/$name" "fuzz/corpus/$name" 2>&1); then
    echo "FAIL: $name"; echo "$out" | tail -60; fail=1
  else
    echo "$name: $(grep -E '^Done|#[0-9]+ *DONE' <<<"$out" | tail -1)"
  fi
done
exit $fail
