// A reused FuzzSession's execution frees everything it allocates, as libFuzzer's per-input
// leak check needs: it counts mallocs and frees during one execution, and an execution that
// leaves more allocated than it found is run again and then searched for leaks. Before the
// layer targets cleared their driver after each input, the state an input built was freed
// only by the next input's Reset, so any input that ended with more held than the previous
// one looked leaky. Counted here the same way, by interposing the C allocator (this test is
// its own executable, so nothing else sees the counting); sanitizer builds own the allocator
// and skip it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "sim/fuzz_input.h"
#include "tests/sim/fuzz_corpus.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVTWIN_COUNTS_MALLOC 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || \
    __has_feature(thread_sanitizer)
#define KVTWIN_COUNTS_MALLOC 0
#endif
#endif
#ifndef KVTWIN_COUNTS_MALLOC
#define KVTWIN_COUNTS_MALLOC 1
#endif

namespace {

bool counting = false;
int64_t mallocs = 0, frees = 0;

}  // namespace

#if KVTWIN_COUNTS_MALLOC
// glibc's own entry points, which its malloc and free call too.
extern "C" void* __libc_malloc(size_t size);
extern "C" void* __libc_calloc(size_t n, size_t size);
extern "C" void* __libc_realloc(void* p, size_t size);
extern "C" void* __libc_memalign(size_t alignment, size_t size);
extern "C" void __libc_free(void* p);

extern "C" void* malloc(size_t size) {
  if (counting) ++mallocs;
  return __libc_malloc(size);
}
extern "C" void* calloc(size_t n, size_t size) {
  if (counting) ++mallocs;
  return __libc_calloc(n, size);
}
extern "C" void* realloc(void* p, size_t size) {
  // Only the two ends count: a realloc that grows or moves a block is one malloc and one
  // free, so it leaves the balance as it was.
  if (counting && p == nullptr) ++mallocs;
  if (counting && p != nullptr && size == 0) ++frees;
  return __libc_realloc(p, size);
}
extern "C" void* aligned_alloc(size_t alignment, size_t size) {
  if (counting) ++mallocs;
  return __libc_memalign(alignment, size);
}
extern "C" int posix_memalign(void** out, size_t alignment, size_t size) {
  if (counting) ++mallocs;
  *out = __libc_memalign(alignment, size);
  return *out != nullptr || size == 0 ? 0 : 12;  // ENOMEM
}
extern "C" void free(void* p) {
  if (counting && p != nullptr) ++frees;
  __libc_free(p);
}
#endif

namespace kvtwin::sim {
namespace {

// Counts one execution the way libFuzzer's MallocFreeTracer does.
struct Counts {
  int64_t mallocs, frees;
};
Counts Execute(FuzzSession& session, const Bytes& input) {
  mallocs = frees = 0;
  counting = true;
  {
    const FuzzRun run = session.Run(input.data(), input.size(), /*record_trace=*/false);
    EXPECT_FALSE(run.divergence.has_value()) << *run.divergence;
  }
  counting = false;
  return {mallocs, frees};
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
