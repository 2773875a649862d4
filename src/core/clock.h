// The logical clock. "Now" in kvtwin is a Tick handed out by a LogicalClock that strictly
// increases on every Advance(); there is no wall clock outside bench/ (STYLE §5.3), so LRU
// ages and every other "time" are deterministic. Single-threaded.
#pragma once

#include <cstdint>

namespace kvtwin {

enum class Tick : uint64_t {};

class LogicalClock {
 public:
  Tick Now() const { return now_; }
  // Moves time forward by one and returns the new now.
  Tick Advance() {
    now_ = Tick{static_cast<uint64_t>(now_) + 1};
    return now_;
  }

 private:
  Tick now_{0};
};

}  // namespace kvtwin
