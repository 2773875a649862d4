// RefSession: the reference for the session contract of the prefix-cache manager's API
// (src/prefix_cache.h, above spec §3.4's lifecycle): which session call is refused, with
// which status class, in which session state. The spec's Go code only ever calls the
// session in order; a C++ manager that accepts an out-of-order call instead of refusing it
// can schedule captures nobody attaches, or attach twice (mutant 102). Written from the
// documented contract, never from src/: the request driver tells it what happened and asks
// it which calls must be refused right now, then makes exactly those calls on the manager.
// Single-threaded value type.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "src/core/status.h"

namespace kvtwin::model {

enum class SessionCall : uint8_t {
  kBegin,       // Begin with the request's (non-empty) prompt
  kBeginEmpty,  // Begin with an empty prompt
  kSchedule,    // SchedulePrefillSnapshots
  kAttach,      // AttachPrefillSnapshots
  kAddOutputs,  // AddOutputs (no tokens)
  kClose,
};
inline constexpr std::array<SessionCall, 6> kSessionCalls = {
    SessionCall::kBegin,  SessionCall::kBeginEmpty, SessionCall::kSchedule,
    SessionCall::kAttach, SessionCall::kAddOutputs, SessionCall::kClose};
std::string_view SessionCallName(SessionCall call);

class RefSession {
 public:
  // What the legal calls did (the driver reports each one that succeeded).
  void Begun() {
    *this = RefSession{};
    open_ = true;
  }
  void Scheduled() { scheduled_ = true; }
  void Attached() { attached_ = true; }
  void Closed() { *this = RefSession{}; }
  bool open() const { return open_; }

  // The status class `call` gets now. `caches_moved`: a cache was written since Begin.
  //   Begin: FailedPrecondition while a session is open, else InvalidArgument for an
  //     empty prompt.
  //   SchedulePrefillSnapshots: FailedPrecondition without a session, after a schedule or
  //     an attach in this session, or once the caches moved (it must precede the prefill).
  //   AttachPrefillSnapshots, AddOutputs, Close: FailedPrecondition without a session.
  // Anything else is legal (kOk); a second attach is a legal no-op.
  StatusCode Expect(SessionCall call, bool caches_moved) const;

 private:
  bool open_ = false;
  bool scheduled_ = false;
  bool attached_ = false;
};

}  // namespace kvtwin::model
