#!/bin/bash -eu
# Builds every kvtwin fuzz target with the engine's compiler, flags and fuzzing engine
# ($CXX, $CXXFLAGS with the sanitizer of this build, $LIB_FUZZING_ENGINE) and puts them in
# $OUT with their seed corpora (NAME_fuzz_seed_corpus.zip) and dictionaries, as
# ClusterFuzzLite and OSS-Fuzz expect. Also runs unchanged outside Docker, e.g.
#   CXX=clang++ CXXFLAGS="-fsanitize=address,fuzzer-no-link" \
#   LIB_FUZZING_ENGINE=-fsanitize=fuzzer SRC=.. OUT=/tmp/out .clusterfuzzlite/build.sh
src=${SRC}/kvtwin
[ -d "$src" ] || src=$(cd "$(dirname "$0")/.." && pwd)
build=${WORK:-/tmp}/kvtwin-fuzz-build
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_CXX_FLAGS="$CXXFLAGS" \
  -DKVTWIN_TESTS=OFF -DKVTWIN_FUZZ=ON -DKVTWIN_FUZZ_ENGINE="$LIB_FUZZING_ENGINE" \
  -DKVTWIN_FMT_HEADER_ONLY=ON
cmake --build "$build" -j "$(nproc)"
for exe in "$build"/fuzz/*_fuzz; do
  name=$(basename "$exe")
  cp "$exe" "$OUT/"
  target=${name%_fuzz}
  if [ -d "$src/fuzz/corpus/$target" ]; then
    (cd "$src/fuzz/corpus/$target" && zip -q -r "$OUT/${name}_seed_corpus.zip" .)
  fi
  [ -f "$src/fuzz/$target.dict" ] && cp "$src/fuzz/$target.dict" "$OUT/$name.dict"
done
