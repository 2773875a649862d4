#!/usr/bin/env bash
# Goal: one formatting for every first-party C++ file (.clang-format), so diffs show only
# real changes. Method: clang-format --dry-run --Werror over the source folders.
set -u
root=${1:-.}
cd "$root" || exit 2
command -v clang-format >/dev/null || { echo "clang-format not installed"; exit 1; }
files=$(find src model sim fuzz tests bench -name '*.h' -o -name '*.cc' | sort)
# shellcheck disable=SC2086
if ! out=$(clang-format --dry-run --Werror $files 2>&1); then
  echo "not clang-formatted (run: clang-format -i <file>):"
  grep -E '^[^ ].*error:' <<<"$out" | cut -d: -f1 | sort -u
  exit 1
fi
echo "format: ok"
