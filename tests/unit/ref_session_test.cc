// Goal: pin the reference session contract (model/ref_session.h) to the contract that
// src/prefix_cache.h documents, state by state, since the request driver makes exactly the
// calls it refuses and expects the manager to refuse them too.
// Method: walk a session through its legal calls and compare, at each state, the status
// class of all six calls with a table written from the header's comments.
#include "model/ref_session.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace kvtwin::model {
namespace {

using Want = std::map<SessionCall, StatusCode>;
constexpr StatusCode kOk = StatusCode::kOk;
constexpr StatusCode kFp = StatusCode::kFailedPrecondition;
constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;

void ExpectCalls(const RefSession& s, bool moved, const Want& want, const std::string& state) {
  for (SessionCall call : kSessionCalls) {
    EXPECT_EQ(StatusCodeName(s.Expect(call, moved)), StatusCodeName(want.at(call)))
        << SessionCallName(call) << " " << state;
  }
}

TEST(RefSession, WithoutASessionOnlyABeginWithAPromptIsLegal) {
  const RefSession s;
  ExpectCalls(s, false,
              {{SessionCall::kBegin, kOk},
               {SessionCall::kBeginEmpty, kInvalid},
               {SessionCall::kSchedule, kFp},
               {SessionCall::kAttach, kFp},
               {SessionCall::kAddOutputs, kFp},
               {SessionCall::kClose, kFp}},
              "before Begin");
}

TEST(RefSession, AnOpenSessionRefusesBeginAndAScheduleOnceTheCachesMoved) {
  RefSession s;
  s.Begun();
  const Want fresh = {{SessionCall::kBegin, kFp},      {SessionCall::kBeginEmpty, kFp},
                      {SessionCall::kSchedule, kOk},   {SessionCall::kAttach, kOk},
                      {SessionCall::kAddOutputs, kOk}, {SessionCall::kClose, kOk}};
  ExpectCalls(s, false, fresh, "after Begin");
  Want moved = fresh;
  moved[SessionCall::kSchedule] = kFp;
  ExpectCalls(s, true, moved, "after a prefill chunk");
}

TEST(RefSession, ScheduleIsRefusedAfterAScheduleOrAnAttach) {
  RefSession scheduled;
  scheduled.Begun();
  scheduled.Scheduled();
  RefSession attached;
  attached.Begun();
  attached.Attached();  // with nothing pending too: the attach is what counts
  const Want want = {{SessionCall::kBegin, kFp},      {SessionCall::kBeginEmpty, kFp},
                     {SessionCall::kSchedule, kFp},   {SessionCall::kAttach, kOk},
                     {SessionCall::kAddOutputs, kOk}, {SessionCall::kClose, kOk}};
  ExpectCalls(scheduled, false, want, "after Schedule");
  ExpectCalls(attached, false, want, "after Attach (a second attach is a legal no-op)");
}

TEST(RefSession, CloseEndsTheSessionAndANewBeginStartsClean) {
  RefSession s;
  s.Begun();
  s.Scheduled();
  s.Attached();
  s.Closed();
  EXPECT_FALSE(s.open());
  EXPECT_EQ(s.Expect(SessionCall::kClose, false), kFp);
  s.Begun();
  EXPECT_EQ(s.Expect(SessionCall::kSchedule, false), kOk);
}

}  // namespace
}  // namespace kvtwin::model
