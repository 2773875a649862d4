// KV_CHECK: the always-on invariant check. A broken invariant or violated precondition is
// a programmer error: it prints the file, line, condition and message and aborts (exit
// status 134), in every build, independent of NDEBUG, because fuzzers and the simulator
// only see crashes. Operating errors that a correct caller can cause are values (status.h).
#pragma once

#include <string>

namespace kvtwin {

[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const std::string& message);

}  // namespace kvtwin

#define KV_CHECK(condition, ...)                                                       \
  do {                                                                                 \
    if (!(condition)) [[unlikely]] {                                                   \
      ::kvtwin::CheckFailed(__FILE__, __LINE__, #condition, std::string{__VA_ARGS__}); \
    }                                                                                  \
  } while (false)
