#!/usr/bin/env bash
# Installs the Debian packages that kvtwin's build, tests, fuzzers and benchmarks need,
# and only those that are missing, so a repeat run costs one dpkg query. graphviz (`dot`)
# renders the trie DOT export in a test; gnuplot-nox draws the `make bench` plots; patch
# plants the mutant catalogue (`make mutants`, and a lint test that every patch applies);
# python3 runs the operator-mutant generator (and the lint test that its patches apply);
# python3-jsonschema checks the bundled traces against the trace schema (a lint test).
set -euo pipefail
pkgs=(cmake ninja-build make g++ clang libclang-rt-14-dev
      libeigen3-dev librapidcheck-dev nlohmann-json3-dev libgtest-dev libgmock-dev
      libbenchmark-dev libcli11-dev libfmt-dev libxxhash-dev pkg-config graphviz
      clang-format gnuplot-nox patch python3 python3-jsonschema)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "setup: installing ${missing[*]}"
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
