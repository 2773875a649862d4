// Goal: coverage-guided search for divergences between the production caches and the
// reference, one executable per FuzzTarget (KVTWIN_FUZZ_TARGET names it). Method: the
// bytes go through a FuzzSession, the same decoder and lock-step drivers that
// `kvtwin replay --fuzz-input` uses (RunFuzzInput), and a divergence aborts with its report, so
// every crash artifact replays outside the fuzzer. The custom mutator edits whole records and aims
// value fields at window and snapshot boundaries (MutateFuzzInput). No logic here.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "sim/fuzz_input.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

kvtwin::sim::FuzzTarget Target() {
  static const kvtwin::sim::FuzzTarget target = [] {
    const auto parsed = kvtwin::sim::ParseFuzzTarget(KVTWIN_FUZZ_TARGET);
    if (!parsed) {
      std::fprintf(stderr, "unknown fuzz target %s\n", KVTWIN_FUZZ_TARGET);
      std::abort();
    }
    return *parsed;
  }();
  return target;
}

// One session for the process: its driver is Reset per execution, and the trace is not
// recorded (a crash artifact is replayed, trace and all, by `kvtwin replay --fuzz-input`).
kvtwin::sim::FuzzSession& Session() {
  static kvtwin::sim::FuzzSession session(Target());
  return session;
}

}  // namespace

// ASan's defaults for these executables: the quarantine of OSS-Fuzz's runner image (which
// ClusterFuzzLite runs too), 10 MB instead of 256 MB, so a local run measures what the scale-out
// engine runs. A use after free is still caught within an execution: the largest seed of any
// target allocates at most 2.5 MB in all (valgrind's dhat on `kvtwin replay --fuzz-input`), so
// nothing it frees leaves the quarantine before it ends. The 256 MB default only cycles every
// allocation through cold pages: a third of the CPU time. ASAN_OPTIONS overrides this.
extern "C" const char* __asan_default_options() { return "quarantine_size_mb=10"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kvtwin::sim::FuzzRun run = Session().Run(data, size, /*record_trace=*/false);
  if (run.divergence) {
    std::fprintf(stderr, "%s\nreproduce: kvtwin replay --fuzz-input ARTIFACT --target %s\n",
                 run.divergence->c_str(), KVTWIN_FUZZ_TARGET);
    std::abort();
  }
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  return kvtwin::sim::MutateFuzzInput(Target(), data, size, max_size, seed, &LLVMFuzzerMutate);
}
