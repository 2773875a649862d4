#!/usr/bin/env bash
# Goal: the lint scripts can fail. Method: plant an upward include and a wall-clock call in
# a scratch tree and require each script to reject it (and to accept the clean tree).
set -u
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"/{src/core,model,sim,fuzz,tests}
echo '#include "src/core/check.h"' > "$tmp/src/a.cc"
bash "$here/layering.sh" "$tmp" >/dev/null || { echo "layering rejects a clean tree"; exit 1; }
bash "$here/banned_calls.sh" "$tmp" >/dev/null || { echo "banned_calls rejects a clean tree"; exit 1; }
echo '#include "sim/lockstep.h"' >> "$tmp/src/a.cc"
bash "$here/layering.sh" "$tmp" >/dev/null && { echo "layering missed src -> sim"; exit 1; }
echo '#include "src/core/check.h"' > "$tmp/src/a.cc"
echo 'auto t = std::chrono::steady_clock::now();' > "$tmp/model/b.cc"
bash "$here/banned_calls.sh" "$tmp" >/dev/null && { echo "banned_calls missed steady_clock"; exit 1; }
echo "lint self-test: ok"
