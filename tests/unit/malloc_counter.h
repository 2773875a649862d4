// Counts the C allocator's calls within a scope, for tests that hold a path to allocating
// nothing (or to freeing what it allocated). It interposes malloc and free, so include it in
// exactly one file of a test executable of its own: every other test in that executable
// would be counted through it too. Sanitizer builds own the allocator; there
// KVTWIN_COUNTS_MALLOC is 0 and the counts stay 0 (tests skip).
#pragma once

#include <cstddef>
#include <cstdint>

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

namespace kvtwin::alloc_count {

// Set while counting; the counts since the last reset.
inline bool counting = false;
inline int64_t mallocs = 0, frees = 0;

struct AllocCounts {
  int64_t mallocs = 0, frees = 0;
};

// The allocator calls `f()` makes.
template <class F>
AllocCounts CountAllocations(F&& f) {
  mallocs = frees = 0;
  counting = true;
  f();
  counting = false;
  return {mallocs, frees};
}

}  // namespace kvtwin::alloc_count

#if KVTWIN_COUNTS_MALLOC
// glibc's own entry points, which its malloc and free call too.
extern "C" void* __libc_malloc(size_t size);
extern "C" void* __libc_calloc(size_t n, size_t size);
extern "C" void* __libc_realloc(void* p, size_t size);
extern "C" void* __libc_memalign(size_t alignment, size_t size);
extern "C" void __libc_free(void* p);

extern "C" void* malloc(size_t size) {
  if (kvtwin::alloc_count::counting) ++kvtwin::alloc_count::mallocs;
  return __libc_malloc(size);
}
extern "C" void* calloc(size_t n, size_t size) {
  if (kvtwin::alloc_count::counting) ++kvtwin::alloc_count::mallocs;
  return __libc_calloc(n, size);
}
extern "C" void* realloc(void* p, size_t size) {
  // Only the two ends count: a realloc that grows or moves a block is one malloc and one
  // free, so it leaves the balance as it was.
  if (kvtwin::alloc_count::counting && p == nullptr) ++kvtwin::alloc_count::mallocs;
  if (kvtwin::alloc_count::counting && p != nullptr && size == 0) ++kvtwin::alloc_count::frees;
  return __libc_realloc(p, size);
}
extern "C" void* aligned_alloc(size_t alignment, size_t size) {
  if (kvtwin::alloc_count::counting) ++kvtwin::alloc_count::mallocs;
  return __libc_memalign(alignment, size);
}
extern "C" int posix_memalign(void** out, size_t alignment, size_t size) {
  if (kvtwin::alloc_count::counting) ++kvtwin::alloc_count::mallocs;
  *out = __libc_memalign(alignment, size);
  return *out != nullptr || size == 0 ? 0 : 12;  // ENOMEM
}
extern "C" void free(void* p) {
  if (kvtwin::alloc_count::counting && p != nullptr) ++kvtwin::alloc_count::frees;
  __libc_free(p);
}
#endif
