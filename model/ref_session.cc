// RefSession: the session contract, rule by rule as src/prefix_cache.h documents it.
#include "model/ref_session.h"

namespace kvtwin::model {

std::string_view SessionCallName(SessionCall call) {
  switch (call) {
    case SessionCall::kBegin:
      return "Begin";
    case SessionCall::kBeginEmpty:
      return "Begin(empty prompt)";
    case SessionCall::kSchedule:
      return "SchedulePrefillSnapshots";
    case SessionCall::kAttach:
      return "AttachPrefillSnapshots";
    case SessionCall::kAddOutputs:
      return "AddOutputs";
    case SessionCall::kClose:
      return "Close";
  }
  return "?";
}

StatusCode RefSession::Expect(SessionCall call, bool caches_moved) const {
  switch (call) {
    case SessionCall::kBegin:
      return open_ ? StatusCode::kFailedPrecondition : StatusCode::kOk;
    case SessionCall::kBeginEmpty:
      return open_ ? StatusCode::kFailedPrecondition : StatusCode::kInvalidArgument;
    case SessionCall::kSchedule:
      if (!open_ || scheduled_ || attached_ || caches_moved) return StatusCode::kFailedPrecondition;
      return StatusCode::kOk;
    case SessionCall::kAttach:
    case SessionCall::kAddOutputs:
    case SessionCall::kClose:
      return open_ ? StatusCode::kOk : StatusCode::kFailedPrecondition;
  }
  return StatusCode::kOk;
}

}  // namespace kvtwin::model
