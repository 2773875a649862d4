// A reused FuzzSession's execution frees everything it allocates, as libFuzzer's per-input
// leak check needs: it counts mallocs and frees during one execution, and an execution that
// leaves more allocated than it found is run again and then searched for leaks. Before the
// layer targets cleared their driver after each input, the state an input built was freed
// only by the next input's Reset, so any input that ended with more held than the previous
// one looked leaky. Counted here the same way, by interposing the C allocator
// (tests/unit/malloc_counter.h; this test is its own executable, so nothing else sees the
// counting); sanitizer builds own the allocator and skip it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "sim/fuzz_input.h"
#include "tests/sim/fuzz_corpus.h"
#include "tests/unit/malloc_counter.h"

namespace kvtwin::sim {
namespace {

using Counts = alloc_count::AllocCounts;

// Counts one execution the way libFuzzer's MallocFreeTracer does.
Counts Execute(FuzzSession& session, const Bytes& input) {
  return alloc_count::CountAllocations([&] {
    const FuzzRun run = session.Run(input.data(), input.size(), /*record_trace=*/false);
    EXPECT_FALSE(run.divergence.has_value()) << *run.divergence;
  });
}

// Per input, run as the fuzzer would after another input: its header alone (fresh caches,
// nothing held), or that header with another layer count (byte 3 is the layer field of
// every layer target). Warm-up runs of both first, so buffers the session keeps have their
// capacity. The input's run must free what it allocated: without Clear it keeps its
// snapshots and logs until the next run, and without parked layers a stack that grows
// builds new layers that it leaves behind.
TEST(FuzzSession, AnExecutionFreesWhatItAllocates) {
  if (!KVTWIN_COUNTS_MALLOC) GTEST_SKIP() << "the sanitizer owns the allocator";
  for (const FuzzTarget target :
       {FuzzTarget::kKv, FuzzTarget::kRotating, FuzzTarget::kRecurrent, FuzzTarget::kSpeculation}) {
    const size_t header = LayoutOf(target).header_bytes;
    ASSERT_EQ(header, 4u) << "byte 3 is the layer field of a 4-byte layer-target header";
    FuzzSession session(target);
    int checked = 0;
    for (const Bytes& input : CorpusEntries(target, 12)) {
      if (input.size() <= header) continue;
      Bytes same(input.begin(), input.begin() + static_cast<std::ptrdiff_t>(header));
      Bytes other = same;
      other[3] = static_cast<uint8_t>(other[3] + 1);  // another layer count
      for (const bool another : {false, true}) {
        const Bytes& before = another ? other : same;
        for (int warm = 0; warm < 2; ++warm) {
          Execute(session, before);
          Execute(session, input);
        }
        Execute(session, before);
        const Counts run = Execute(session, input);
        const std::string where = std::string(FuzzTargetName(target)) + " input " +
                                  std::to_string(checked) + " after " +
                                  (another ? "another layer count" : "its header");
        ASSERT_GT(run.mallocs, 0) << "the allocator is not interposed: nothing was counted";
        EXPECT_EQ(run.mallocs, run.frees) << where;
        const Counts after = Execute(session, before);
        EXPECT_EQ(after.mallocs, after.frees) << where << ", the run after it";
      }
      ++checked;
    }
    EXPECT_GT(checked, 0) << FuzzTargetName(target);
  }
}

}  // namespace
}  // namespace kvtwin::sim
