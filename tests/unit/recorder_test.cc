// Goal: pin TraceRecorder (sim/recorder.h) to its contract: a server's events become the
// RequestPlans of format v1 — any number of speculative steps per request, each placed at
// the decode forward of the next sampled token; a cancelled request with no outputs at all
// — and the recorded trace reads back and replays through the RequestDriver with a pass;
// misuse is a Status and records nothing.
// Method: record into a file under testing::TempDir(), read it with ReadTrace and replay
// it with ReplayFile. Expected plans are written out by hand from the calls made.
#include "sim/recorder.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sim/replay.h"
#include "sim/trace.h"

namespace kvtwin::sim {
namespace {

std::string TracePath() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  return fmt::format("{}recorder_{}_{}.jsonl", testing::TempDir(), info->test_suite_name(),
                     info->name());
}

std::unique_ptr<TraceRecorder> OpenRecorder(const std::string& path) {
  Result<std::unique_ptr<TraceRecorder>> rec = TraceRecorder::Open(path, TraceHeader{});
  EXPECT_TRUE(rec.ok()) << rec.status().ToString();
  return rec.ok() ? std::move(*rec) : nullptr;
}

RequestPlan PlanAt(const Trace& trace, size_t i) {
  return std::get<RequestPlan>(trace.events.at(i));
}

TEST(TraceRecorder, RecordsSeveralSpeculativeStepsPerRequest) {
  const std::string path = TracePath();
  std::unique_ptr<TraceRecorder> rec = OpenRecorder(path);
  ASSERT_NE(rec, nullptr);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
  ASSERT_TRUE(rec->BeginRequest(0, prompt).ok());
  ASSERT_TRUE(rec->Speculated(std::vector<int32_t>{8}, 0, 9).ok());            // samples 9
  ASSERT_TRUE(rec->Sampled(std::vector<int32_t>{10}).ok());                    // 10
  ASSERT_TRUE(rec->Speculated(std::vector<int32_t>{11, 12, 13}, 2, 14).ok());  // 11 12 14
  ASSERT_TRUE(rec->Speculated(std::vector<int32_t>{15}, 1, 16).ok());          // 15 16
  ASSERT_TRUE(rec->Sampled(std::vector<int32_t>{17}).ok());                    // 17
  ASSERT_TRUE(rec->EndRequest().ok());
  ASSERT_TRUE(rec->Finish().ok());

  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  ASSERT_EQ(trace->events.size(), 1u);
  const RequestPlan plan = PlanAt(*trace, 0);
  EXPECT_EQ(plan.inputs, prompt);
  EXPECT_EQ(plan.outputs, (std::vector<int32_t>{9, 10, 11, 12, 14, 15, 16, 17}));
  const std::vector<SpeculativeStep> steps = {{0, 0, {8}}, {2, 2, {13}}, {5, 1, {}}};
  EXPECT_EQ(plan.speculation, steps);
  const ReplayResult r = ReplayFile(path, {});
  EXPECT_TRUE(r.passed()) << r.verdict() << "\n" << r.divergence.value_or("");
  EXPECT_EQ(r.coverage.speculative, 1);
}

TEST(TraceRecorder, ACancelledRequestHasNoOutputs) {
  const std::string path = TracePath();
  std::unique_ptr<TraceRecorder> rec = OpenRecorder(path);
  ASSERT_NE(rec, nullptr);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_TRUE(rec->BeginRequest(0, prompt).ok());
  ASSERT_TRUE(rec->Cancel(3).ok());  // ends the request
  // The retry of the same prompt, then a continuation of it.
  ASSERT_TRUE(rec->BeginRequest(0, prompt).ok());
  ASSERT_TRUE(rec->Sampled(std::vector<int32_t>{10, 11}).ok());
  ASSERT_TRUE(rec->EndRequest().ok());
  ASSERT_TRUE(rec->BeginRequest(0, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12}).ok());
  ASSERT_TRUE(rec->Cancel(0).ok());
  ASSERT_TRUE(rec->Finish().ok());

  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  ASSERT_EQ(trace->events.size(), 3u);
  EXPECT_EQ(PlanAt(*trace, 0).cancel_after_tokens, 3);
  EXPECT_TRUE(PlanAt(*trace, 0).outputs.empty());
  EXPECT_EQ(EventToJson(trace->events[0]), R"({"cancel_after":3,"inputs":[1,2,3,4,5,6,7,8,9]})");
  EXPECT_EQ(PlanAt(*trace, 1).outputs, (std::vector<int32_t>{10, 11}));
  EXPECT_TRUE(PlanAt(*trace, 2).outputs.empty());
  const ReplayResult r = ReplayFile(path, {});
  EXPECT_TRUE(r.passed()) << r.verdict() << "\n" << r.divergence.value_or("");
  EXPECT_EQ(r.coverage.cancelled, 2);
  EXPECT_EQ(r.coverage.completed, 1);
}

// A server that forwards its last sampled token, then one that reports tokens past a
// stop: the counts reach the trace, and the replay closes with the caches at every stored
// token, then three tokens short of them.
TEST(TraceRecorder, RecordsHowManySampledTokensWereNeverForwarded) {
  const std::string path = TracePath();
  std::unique_ptr<TraceRecorder> rec = OpenRecorder(path);
  ASSERT_NE(rec, nullptr);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  ASSERT_TRUE(rec->BeginRequest(0, prompt).ok());
  ASSERT_TRUE(rec->Sampled(std::vector<int32_t>{6, 7}).ok());
  ASSERT_TRUE(rec->Unforwarded(0).ok());
  ASSERT_TRUE(rec->EndRequest().ok());
  ASSERT_TRUE(rec->BeginRequest(0, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}).ok());
  ASSERT_TRUE(rec->Speculated(std::vector<int32_t>{9, 10}, 1, 11).ok());  // 9 11
  ASSERT_TRUE(rec->Sampled(std::vector<int32_t>{12, 13, 14}).ok());
  ASSERT_TRUE(rec->Unforwarded(5).ok());  // reaches into the speculative step
  EXPECT_EQ(rec->EndRequest().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(rec->Unforwarded(6).ok());  // more than were sampled
  EXPECT_EQ(rec->EndRequest().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(rec->Unforwarded(-1).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(rec->Unforwarded(3).ok());
  ASSERT_TRUE(rec->EndRequest().ok());
  ASSERT_TRUE(rec->BeginRequest(0, prompt).ok());
  ASSERT_TRUE(rec->Unforwarded(0).ok());
  EXPECT_EQ(rec->Cancel(2).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(rec->Unforwarded(1).ok());
  ASSERT_TRUE(rec->Cancel(2).ok());
  ASSERT_TRUE(rec->Finish().ok());

  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  ASSERT_EQ(trace->events.size(), 3u);
  EXPECT_EQ(PlanAt(*trace, 0).unforwarded, 0);
  EXPECT_EQ(PlanAt(*trace, 1).unforwarded, 3);
  EXPECT_EQ(PlanAt(*trace, 1).outputs, (std::vector<int32_t>{9, 11, 12, 13, 14}));
  EXPECT_EQ(PlanAt(*trace, 2).unforwarded, 1);
  EXPECT_EQ(EventToJson(trace->events[0]), R"({"inputs":[1,2,3,4,5],"outputs":[6,7],)"
                                           R"("unforwarded":0})");
  const ReplayResult r = ReplayFile(path, {});
  EXPECT_TRUE(r.passed()) << r.verdict() << "\n" << r.divergence.value_or("");
  EXPECT_EQ(r.coverage.forwarded_last, 1);
  EXPECT_EQ(r.coverage.past_stop, 1);
}

// A step dropped without a commit ends the decode: recorded at the forward of the last
// sampled token, nothing may be sampled after it, and the trace replays with a pass.
TEST(TraceRecorder, AnAbandonedSpeculationEndsTheDecode) {
  const std::string path = TracePath();
  std::unique_ptr<TraceRecorder> rec = OpenRecorder(path);
  ASSERT_NE(rec, nullptr);
  ASSERT_TRUE(rec->BeginRequest(0, std::vector<int32_t>{1, 2, 3, 4, 5}).ok());
  EXPECT_EQ(rec->Abandoned(std::vector<int32_t>{6}).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(rec->Speculated(std::vector<int32_t>{6, 7}, 1, 8).ok());  // samples 6 8
  ASSERT_TRUE(rec->Sampled(std::vector<int32_t>{9}).ok());
  EXPECT_EQ(rec->Abandoned(std::vector<int32_t>{-1}).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(rec->Abandoned(std::vector<int32_t>{10, 11}).ok());
  EXPECT_EQ(rec->Sampled(std::vector<int32_t>{12}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(rec->Speculated(std::vector<int32_t>{12}, 0, 13).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(rec->Abandoned(std::vector<int32_t>{12}).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(rec->Unforwarded(0).ok());
  EXPECT_EQ(rec->EndRequest().code(), StatusCode::kFailedPrecondition);  // it forwards the last
  ASSERT_TRUE(rec->Unforwarded(1).ok());
  ASSERT_TRUE(rec->EndRequest().ok());
  ASSERT_TRUE(rec->Finish().ok());

  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  const RequestPlan plan = PlanAt(*trace, 0);
  EXPECT_EQ(plan.outputs, (std::vector<int32_t>{6, 8, 9}));
  ASSERT_EQ(plan.speculation.size(), 2u);
  SpeculativeStep abandoned{3, 0, {10, 11}};
  abandoned.abandoned = true;
  EXPECT_EQ(plan.speculation[1], abandoned);
  const ReplayResult r = ReplayFile(path, {});
  EXPECT_TRUE(r.passed()) << r.verdict() << "\n" << r.divergence.value_or("");
  EXPECT_EQ(r.coverage.abandoned_steps, 1);
}

// A probe marks the step just recorded, committing or abandoned, and only that one: the
// trace carries it and replays it (one isolated forward per probed step).
TEST(TraceRecorder, AProbeMarksTheStepJustRecorded) {
  const std::string path = TracePath();
  std::unique_ptr<TraceRecorder> rec = OpenRecorder(path);
  ASSERT_NE(rec, nullptr);
  ASSERT_TRUE(rec->BeginRequest(0, std::vector<int32_t>{1, 2, 3, 4, 5}).ok());
  EXPECT_EQ(rec->Probed().code(), StatusCode::kFailedPrecondition);  // no step yet
  ASSERT_TRUE(rec->Speculated(std::vector<int32_t>{6, 7}, 1, 8).ok());
  ASSERT_TRUE(rec->Probed().ok());
  EXPECT_EQ(rec->Probed().code(), StatusCode::kFailedPrecondition);   // once
  ASSERT_TRUE(rec->Speculated(std::vector<int32_t>{9}, 0, 10).ok());  // not probed
  ASSERT_TRUE(rec->Sampled(std::vector<int32_t>{11}).ok());
  EXPECT_EQ(rec->Probed().code(), StatusCode::kFailedPrecondition);  // a sample since
  ASSERT_TRUE(rec->Abandoned(std::vector<int32_t>{12, 13}).ok());
  ASSERT_TRUE(rec->Probed().ok());
  ASSERT_TRUE(rec->EndRequest().ok());
  EXPECT_EQ(rec->Probed().code(), StatusCode::kFailedPrecondition);  // no request open
  ASSERT_TRUE(rec->Finish().ok());

  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  const RequestPlan plan = PlanAt(*trace, 0);
  ASSERT_EQ(plan.speculation.size(), 3u);
  EXPECT_TRUE(plan.speculation[0].probe);
  EXPECT_FALSE(plan.speculation[1].probe);
  EXPECT_TRUE(plan.speculation[2].probe);
  EXPECT_TRUE(plan.speculation[2].abandoned);
  const ReplayResult r = ReplayFile(path, {});
  EXPECT_TRUE(r.passed()) << r.verdict() << "\n" << r.divergence.value_or("");
  EXPECT_EQ(r.coverage.isolated_probes, 2);
  EXPECT_EQ(r.coverage.abandoned_steps, 1);
}

TEST(TraceRecorder, MisuseIsAStatusAndRecordsNothing) {
  const std::string path = TracePath();
  std::unique_ptr<TraceRecorder> rec = OpenRecorder(path);
  ASSERT_NE(rec, nullptr);
  const std::vector<int32_t> prompt = {1, 2, 3};
  EXPECT_EQ(rec->EndRequest().code(), StatusCode::kFailedPrecondition);  // nothing open
  ASSERT_TRUE(rec->BeginRequest(0, prompt).ok());
  EXPECT_EQ(rec->EndRequest().code(), StatusCode::kFailedPrecondition);  // nothing sampled
  EXPECT_EQ(rec->Speculated(std::vector<int32_t>{4}, 2, 5).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rec->Speculated(std::vector<int32_t>{-4}, 0, 5).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rec->Speculated(std::vector<int32_t>{4}, 1, -5).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(rec->Speculated(std::vector<int32_t>{4}, 1, 5).ok());
  EXPECT_EQ(rec->Cancel(1).code(), StatusCode::kFailedPrecondition);  // decode started
  ASSERT_TRUE(rec->EndRequest().ok());
  ASSERT_TRUE(rec->Finish().ok());
  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  ASSERT_EQ(trace->events.size(), 1u);
  EXPECT_EQ(PlanAt(*trace, 0).outputs, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(PlanAt(*trace, 0).speculation, (std::vector<SpeculativeStep>{{0, 1, {}}}));
  EXPECT_EQ(PlanAt(*trace, 0).cancel_after_tokens, -1);
}

}  // namespace
}  // namespace kvtwin::sim
