// Goal: pin trace format v1 (sim/trace.h) to its contract: headers, every op kind and
// requests with every optional field round-trip exactly through the writer and the reader;
// multi-sequence headers and every MsOp kind round-trip the same way;
// the writer's text is canonical (sorted keys, defaults left out); "blocks" and
// "output_len" expand through BlockTokens / GeneratedTokens; every malformed input is
// refused with its exact "FILE:LINE: /pointer: reason"; a TraceWriter leaves nothing behind
// unless committed and replaces the destination in one rename.
// Method: small files under testing::TempDir(), named after the running test. Expected
// values come from the structs written (round trips), from hand-written JSON text, or from
// BlockTokens / GeneratedTokens themselves, never from a second implementation.
#include "sim/trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace kvtwin::sim {

// Found by argument-dependent lookup, so gtest prints a step readably in a mismatch.
void PrintTo(const SpeculativeStep& s, std::ostream* os) {
  *os << fmt::format("{{step {} accepted {} rejected [{}]{}{}}}", s.step, s.accepted,
                     fmt::join(s.rejected, ","), s.probe ? " probe" : "",
                     s.abandoned ? " abandoned" : "");
}

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kRequestsHeader =
    R"({"budget":0,"capture_interval":8,"chunk":5,"format":"kvtwin-trace","kind":"requests",)"
    R"("model":{"dtype":"f32","layers":4,"preset":"mixed","window":4},"pre_thinking":4,)"
    R"("seed":1,"version":1})";
const std::string kOpsHeader =
    R"({"format":"kvtwin-trace","kind":"ops",)"
    R"("model":{"dtype":"f32","layers":4,"preset":"mixed","window":4},"seed":1,"version":1})";

// A model's "kv" and "recurrent" objects.
Json KvDims(int64_t heads, int64_t head_dim, int64_t value_dim) {
  return {{"heads", heads}, {"head_dim", head_dim}, {"value_dim", value_dim}};
}
Json RecurrentDimsJson(int64_t tail, int64_t hk, int64_t hv, int64_t dk, int64_t dv) {
  return {{"conv_tail", tail},
          {"num_k_heads", hk},
          {"num_v_heads", hv},
          {"head_k_dim", dk},
          {"head_v_dim", dv}};
}

std::string TestName() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  return fmt::format("trace_{}_{}", info->test_suite_name(), info->name());
}

// A fresh, empty directory for this test (ctest runs tests in parallel processes).
fs::path TestDir() {
  const fs::path dir = fs::path(testing::TempDir()) / TestName();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string WriteFile(const std::string& text) {
  const std::string path = testing::TempDir() + TestName() + ".jsonl";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  return text;
}

// The error of reading `text`, its file name replaced by "FILE" so expectations read well.
std::string ErrorOfText(const std::string& text) {
  const std::string path = WriteFile(text);
  const Result<Trace> trace = ReadTrace(path);
  if (trace.ok()) return "(read without error)";
  EXPECT_EQ(trace.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = trace.status().message();
  return m.rfind(path, 0) == 0 ? "FILE" + m.substr(path.size()) : m;
}
std::string ErrorOf(const std::vector<std::string>& lines) { return ErrorOfText(Lines(lines)); }

// The requests header with one edit.
std::string Header(const std::function<void(Json&)>& edit) {
  Json j = Json::parse(kRequestsHeader);
  edit(j);
  return j.dump();
}

auto Tie(const RequestPlan& p) {
  return std::tie(p.index, p.kind, p.conversation, p.inputs, p.outputs, p.dropped, p.user_offsets,
                  p.schedule, p.cancel_after_tokens, p.speculation, p.budget_pct, p.unforwarded,
                  p.budget_pct_after_prefill);
}
auto Tie(const Op& o) {
  return std::tie(o.kind, o.layer, o.tokens, o.pad, o.segmented, o.mask, o.rect, o.block, o.value,
                  o.isolated, o.abandon_after, o.slot, o.slot2, o.offsets);
}

Op MakeOp(OpKind kind, int32_t layer) {
  Op op;
  op.kind = kind;
  op.layer = layer;
  return op;
}

// Every op kind, each with every field it uses away from its default.
std::vector<Op> EveryOpKind() {
  std::vector<Op> ops;
  Op write = MakeOp(OpKind::kWrite, 0);
  write.tokens = {0, 5, 2147483647};
  write.pad = 3;
  write.segmented = true;
  write.mask = MaskForm::kRelax;
  write.rect = MaskRect{1, 3, 0, 7};
  ops.push_back(write);
  Op zero = MakeOp(OpKind::kWrite, 0);
  zero.tokens = {4};
  zero.mask = MaskForm::kZero;
  ops.push_back(zero);
  Op block = write;
  block.mask = MaskForm::kBlock;
  ops.push_back(block);
  Op both = write;
  both.mask = MaskForm::kRelaxBlock;
  both.block = MaskRect{2, 4, 1, 9};
  ops.push_back(both);
  Op pure = write;
  pure.mask = MaskForm::kArray;
  ops.push_back(pure);
  Op speculate = write;
  speculate.kind = OpKind::kSpeculate;
  speculate.value = -2;  // out of range on purpose: legal, it tests the clamp
  speculate.isolated = true;
  ops.push_back(speculate);
  Op abandoned = zero;
  abandoned.kind = OpKind::kSpeculate;
  abandoned.tokens = {4, 1};
  abandoned.value = 1;
  abandoned.abandon_after = 4;  // the whole stack of the ops header
  ops.push_back(abandoned);
  Op snapshot = MakeOp(OpKind::kSnapshot, 3);
  snapshot.value = 7;
  ops.push_back(snapshot);
  Op restore = MakeOp(OpKind::kRestore, 2);
  restore.slot = 4;
  restore.value = -1;  // the generator makes targets below zero too
  ops.push_back(restore);
  Op merge = MakeOp(OpKind::kMerge, 1);
  merge.slot = 2;
  merge.slot2 = 5;
  ops.push_back(merge);
  Op split = MakeOp(OpKind::kSplit, 3);
  split.slot = 6;
  split.value = 9;
  ops.push_back(split);
  ops.push_back(MakeOp(OpKind::kFree, 2));
  Op prepare = MakeOp(OpKind::kPrepare, 1);
  prepare.offsets = {9, 4, -1};  // unsorted and behind: the cache's status to report
  ops.push_back(prepare);
  ops.push_back(MakeOp(OpKind::kTake, 3));
  Op close = MakeOp(OpKind::kClose, 2);
  close.slot = 8;
  ops.push_back(close);
  return ops;
}

// Requests with every optional field away from its default (a cancel and a speculation
// cannot share a request): two speculative steps back to back, one that accepts every
// draft, a cancel without outputs and one that keeps its planned outputs; a close with
// the last output forwarded too, and one with every output unforwarded.
std::vector<RequestPlan> EveryRequestField() {
  RequestPlan a;
  a.index = 0;
  a.kind = RequestKind::kExtend;
  a.conversation = 3;
  a.inputs = {1, 2, 3, 4, 5, 6};
  a.outputs = {7, 8, 9, 10};
  a.dropped = 2;
  a.user_offsets = {2, 5};
  a.schedule = false;
  // The first samples output 0, so the second may start at decode forward 1.
  a.speculation = {SpeculativeStep{0, 0, {13}}, SpeculativeStep{1, 2, {11, 12}}};
  a.speculation[1].probe = true;
  a.budget_pct = 250;
  RequestPlan b;
  b.index = 1;
  b.kind = RequestKind::kRetry;
  b.inputs = {0, 2147483647};
  b.cancel_after_tokens = 0;
  RequestPlan c;
  c.index = 2;
  c.kind = RequestKind::kDiverge;
  c.inputs = {3};
  c.outputs = {4, 5};
  c.speculation = {SpeculativeStep{0, 1, {}}};  // every draft accepted: nothing rejected
  c.unforwarded = 0;
  RequestPlan d = c;
  d.index = 3;
  d.kind = RequestKind::kRepeat;
  d.speculation = {};
  d.unforwarded = 2;
  RequestPlan e = b;
  e.index = 4;
  e.outputs = {1};
  e.cancel_after_tokens = 7;
  e.budget_pct_after_prefill = 0;  // cancelled: the close's page-out runs under it
  // Ends on an abandoned step after a committed one: the forward of the last output.
  RequestPlan g = a;
  g.index = 5;
  g.speculation.push_back(SpeculativeStep{4, 0, {6, 6}});
  g.speculation.back().abandoned = true;
  g.speculation.back().probe = true;
  g.budget_pct_after_prefill = 300;
  return {a, b, c, d, e, g};
}

TEST(TraceJson, DefaultHeaderIsTheDocumentedLine) {
  TraceHeader h;
  h.source = "kvtwin gen --seed 1";
  EXPECT_EQ(HeaderToJson(h),
            R"({"budget":0,"capture_interval":8,"chunk":5,"format":"kvtwin-trace",)"
            R"("kind":"requests","model":{"dtype":"f32","layers":4,"preset":"mixed",)"
            R"("window":4},"pre_thinking":4,"seed":1,"source":"kvtwin gen --seed 1","version":1})");
}

TEST(TraceJson, OpsHeaderHasNoDriverOptionsAndNoEmptySource) {
  TraceHeader h;
  h.kind = TraceKind::kOps;
  EXPECT_EQ(HeaderToJson(h), kOpsHeader);
}

TEST(TraceJson, EventsAreWrittenWithSortedKeysAndDefaultsLeftOut) {
  RequestPlan plan;
  plan.index = 5;  // not written: the reader numbers requests by position
  plan.conversation = 2;
  plan.inputs = {1, 2, 3};
  plan.outputs = {4, 5};
  EXPECT_EQ(EventToJson(plan), R"({"conversation":2,"inputs":[1,2,3],"outputs":[4,5]})");
  Op speculate = MakeOp(OpKind::kSpeculate, 0);
  speculate.tokens = {4, 1, 2};
  speculate.value = 1;
  EXPECT_EQ(EventToJson(speculate), R"({"accepted":1,"op":"speculate","tokens":[4,1,2]})");
  Op write = MakeOp(OpKind::kWrite, 0);
  write.tokens = {7};
  EXPECT_EQ(EventToJson(write), R"({"op":"write","tokens":[7]})");
  Op restore = MakeOp(OpKind::kRestore, 0);
  restore.value = 3;
  EXPECT_EQ(EventToJson(restore), R"({"layer":0,"op":"restore","slot":-1,"target":3})");
}

TEST(TraceJson, AnOpWritesOnlyTheFieldsItsKindUses) {
  Op snapshot = EveryOpKind()[0];  // a write's tokens, pad, mask, ...
  snapshot.kind = OpKind::kSnapshot;
  snapshot.layer = 1;
  snapshot.value = 7;
  snapshot.slot = 3;
  snapshot.offsets = {1};
  EXPECT_EQ(EventToJson(snapshot), R"({"from":7,"layer":1,"op":"snapshot"})");
  const std::string path = WriteFile(Lines({kOpsHeader, EventToJson(snapshot)}));
  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  Op expected = MakeOp(OpKind::kSnapshot, 1);
  expected.value = 7;
  EXPECT_EQ(Tie(std::get<Op>(trace->events.at(0))), Tie(expected));
}

TEST(TraceRoundTrip, HeaderWithEveryFieldSet) {
  TraceHeader h;
  h.seed = std::numeric_limits<uint64_t>::max();
  h.preset = "sliding";
  h.layers = 7;
  h.window = 9;
  h.dtype = "bf16";
  h.budget_bytes = 123456;
  h.chunk = 3;
  h.capture_interval = 16;
  h.pre_thinking = 2;
  h.source = "kvtwin gen --seed 18446744073709551615";
  h.expect = "divergence: layer # history";
  const std::string path = (TestDir() / "h.jsonl").string();
  ASSERT_TRUE(WriteTrace(path, Trace{h, {}}).ok());
  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  EXPECT_EQ(trace->header, h);
  EXPECT_TRUE(trace->events.empty());
  EXPECT_EQ(ReadFile(path), HeaderToJson(h) + "\n");
}

TEST(TraceRoundTrip, ModelDimsEachPartWrittenOnlyOffItsDefault) {
  // Each part alone, then both: a part at its default is left out, so a trace of the
  // default stack reads as before dims existed.
  ModelDims kv_only;
  kv_only.kv_heads = 1;
  kv_only.head_dim = 7;
  kv_only.value_dim = 9;
  ModelDims rec_only;
  rec_only.recurrent = {
      .conv_tail = 1, .num_k_heads = 3, .num_v_heads = 6, .head_k_dim = 4, .head_v_dim = 2};
  ModelDims both = kv_only;
  both.recurrent = rec_only.recurrent;
  ModelDims mla = kv_only;  // a zero-width V (spec §2.5's MLA variant)
  mla.value_dim = 0;
  for (const ModelDims& dims : {ModelDims{}, kv_only, rec_only, both, mla}) {
    TraceHeader h;
    h.dims = dims;
    const Json model = Json::parse(HeaderToJson(h))["model"];
    EXPECT_EQ(model.contains("kv"), !dims.KvAtDefault()) << dims.Describe();
    EXPECT_EQ(model.contains("recurrent"), !dims.RecurrentAtDefault()) << dims.Describe();
    const std::string path = (TestDir() / "h.jsonl").string();
    ASSERT_TRUE(WriteTrace(path, Trace{h, {}}).ok());
    const Result<Trace> trace = ReadTrace(path);
    ASSERT_TRUE(trace.ok()) << trace.status().ToString();
    EXPECT_EQ(trace->header.dims, dims) << dims.Describe();
  }
  TraceHeader h;
  h.dims = both;
  EXPECT_EQ(Json::parse(HeaderToJson(h))["model"].dump(),
            R"({"dtype":"f32","kv":{"head_dim":7,"heads":1,"value_dim":9},"layers":4,)"
            R"("preset":"mixed","recurrent":{"conv_tail":1,"head_k_dim":4,"head_v_dim":2,)"
            R"("num_k_heads":3,"num_v_heads":6},"window":4})");
}

TEST(TraceRoundTrip, KAndVInTwoDtypesReachTheStack) {
  // "K/V": K (and the activations) in the first dtype, V rows in the second; one name for
  // both when they agree, so a stack's description reads back as the header it came from.
  for (const char* name : {"bf16/f32", "f32/bf16", "bf16", "f32"}) {
    TraceHeader h;
    h.dtype = name;
    const std::string path = (TestDir() / "h.jsonl").string();
    ASSERT_TRUE(WriteTrace(path, Trace{h, {}}).ok());
    const Result<Trace> trace = ReadTrace(path);
    ASSERT_TRUE(trace.ok()) << trace.status().ToString();
    const Result<StackConfig> stack = TraceStack(trace->header);
    ASSERT_TRUE(stack.ok()) << stack.status().ToString();
    EXPECT_EQ(StackDTypesName(StackDTypes(stack->dtype, stack->v_dtype)), name);
    EXPECT_NE(stack->Describe().find(std::string("] ") + name + " "), std::string::npos)
        << stack->Describe();
  }
  const Result<StackDTypes> same = ParseStackDTypes("bfloat16/bf16");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->dtype, DType::kBFloat16);
  EXPECT_FALSE(same->v.has_value());
  const Result<StackDTypes> apart = ParseStackDTypes("float32/bfloat16");
  ASSERT_TRUE(apart.ok());
  EXPECT_EQ(apart->dtype, DType::kFloat32);
  EXPECT_EQ(apart->v, DType::kBFloat16);
}

TEST(TraceRoundTrip, OpsHeaderKeepsTheDriverOptionDefaults) {
  TraceHeader h;
  h.kind = TraceKind::kOps;
  h.preset = "recurrent";
  h.layers = 8;
  const std::string path = (TestDir() / "h.jsonl").string();
  ASSERT_TRUE(WriteTrace(path, Trace{h, {}}).ok());
  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  EXPECT_EQ(trace->header, h);
}

TEST(TraceJson, ExpectIsWrittenOnlyWhenSet) {
  TraceHeader h;
  h.kind = TraceKind::kOps;
  EXPECT_EQ(HeaderToJson(h).find("expect"), std::string::npos);
  h.expect = "pass";
  EXPECT_EQ(HeaderToJson(h),
            R"({"expect":"pass","format":"kvtwin-trace","kind":"ops",)"
            R"("model":{"dtype":"f32","layers":4,"preset":"mixed","window":4},"seed":1,)"
            R"("version":1})");
}

TEST(TraceRoundTrip, ExpectedVerdictsOfBothKinds) {
  for (const TraceKind kind : {TraceKind::kRequests, TraceKind::kOps}) {
    // The longest expectations: 12 characters of prefix, the rest kind. Characters are code
    // points: "§" is two bytes of UTF-8 but one character.
    const std::vector<std::string> expects = {
        "pass", "divergence: Begin outcome (the greedy switch of spec §#.#)",
        "divergence: " + std::string(kExpectMaxChars - 12, 'k'),
        "divergence: " + std::string(kExpectMaxChars - 13, 'k') + "§"};
    for (const std::string& expect : expects) {
      TraceHeader h;
      h.kind = kind;
      h.expect = expect;
      const std::string path = (TestDir() / "h.jsonl").string();
      ASSERT_TRUE(WriteTrace(path, Trace{h, {}}).ok());
      const Result<Trace> trace = ReadTrace(path);
      ASSERT_TRUE(trace.ok()) << trace.status().ToString();
      EXPECT_EQ(trace->header, h);
    }
  }
}

TEST(TraceRoundTrip, EveryOpKindWithEveryFieldItUses) {
  TraceHeader h;
  h.kind = TraceKind::kOps;
  Trace written{h, {}};
  for (const Op& op : EveryOpKind()) written.events.emplace_back(op);
  const std::string path = (TestDir() / "ops.jsonl").string();
  ASSERT_TRUE(WriteTrace(path, written).ok());
  const Result<Trace> read = ReadTrace(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->events.size(), written.events.size());
  std::string text = HeaderToJson(h) + "\n";
  for (size_t i = 0; i < written.events.size(); ++i) {
    const Op& want = std::get<Op>(written.events[i]);
    EXPECT_EQ(Tie(std::get<Op>(read->events[i])), Tie(want)) << want.ToString();
    text += EventToJson(written.events[i]) + "\n";
  }
  EXPECT_EQ(ReadFile(path), text);
}

TEST(TraceRoundTrip, RequestsWithEveryOptionalField) {
  Trace written{TraceHeader{}, {}};
  for (const RequestPlan& plan : EveryRequestField()) written.events.emplace_back(plan);
  const std::string path = (TestDir() / "requests.jsonl").string();
  ASSERT_TRUE(WriteTrace(path, written).ok());
  const Result<Trace> read = ReadTrace(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->events.size(), written.events.size());
  for (size_t i = 0; i < written.events.size(); ++i) {
    const RequestPlan& want = std::get<RequestPlan>(written.events[i]);
    EXPECT_EQ(Tie(std::get<RequestPlan>(read->events[i])), Tie(want)) << want.ToString();
  }
  EXPECT_EQ(EventToJson(written.events[0]),
            R"({"budget_pct":250,"conversation":3,"dropped":2,"inputs":[1,2,3,4,5,6],)"
            R"("outputs":[7,8,9,10],"request_kind":"extend","schedule":false,)"
            R"("speculation":[{"accepted":0,"rejected":[13],"step":0},)"
            R"({"accepted":2,"probe":true,"rejected":[11,12],"step":1}],"user_points":[2,5]})");
  EXPECT_EQ(EventToJson(written.events[1]),
            R"({"cancel_after":0,"inputs":[0,2147483647],"request_kind":"retry"})");
  const Json last = Json::parse(EventToJson(written.events[5]))["speculation"][2];
  EXPECT_EQ(last.dump(),
            R"({"abandoned":true,"accepted":0,"probe":true,"rejected":[6,6],"step":4})");
}

TEST(TraceBlocks, BlocksAndOutputLenExpandThroughTheTokenFunctions) {
  const std::string path = WriteFile(Lines({
      kRequestsHeader,
      R"({"inputs":[1],"outputs":[2]})",
      R"({"blocks":[7,8],"block_len":16,"conversation":0,"output_len":3,"prompt_len":20})",
      R"({"blocks":[9],"block_len":5,"outputs":[1,2],"prompt_len":5})",
  }));
  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  ASSERT_EQ(trace->events.size(), 3u);
  const auto& blocks = std::get<RequestPlan>(trace->events[1]);
  std::vector<int32_t> inputs = BlockTokens(7, 16);
  const std::vector<int32_t> last = BlockTokens(8, 4);  // 20 - 16: the last block is cut
  inputs.insert(inputs.end(), last.begin(), last.end());
  EXPECT_EQ(blocks.index, 1);
  EXPECT_EQ(blocks.inputs, inputs);
  EXPECT_EQ(blocks.outputs, GeneratedTokens(1, 3));  // of the request's index, not the line's
  const auto& whole = std::get<RequestPlan>(trace->events[2]);
  EXPECT_EQ(whole.inputs, BlockTokens(9, 5));
  EXPECT_EQ(whole.outputs, (std::vector<int32_t>{1, 2}));
}

TEST(TraceBlocks, PromptLenMustFitTheBlocks) {
  const std::string too_short = R"({"blocks":[1,2],"block_len":16,"outputs":[1],"prompt_len":16})";
  EXPECT_EQ(ErrorOf({kRequestsHeader, too_short}),
            "FILE:2: /prompt_len: 2 blocks of 16 tokens hold 17..32 tokens, not 16");
  const std::string too_long = R"({"blocks":[1,2],"block_len":16,"outputs":[1],"prompt_len":33})";
  EXPECT_EQ(ErrorOf({kRequestsHeader, too_long}),
            "FILE:2: /prompt_len: 2 blocks of 16 tokens hold 17..32 tokens, not 33");
  EXPECT_EQ(ErrorOf({kRequestsHeader, R"({"blocks":[1],"outputs":[1],"prompt_len":3})"}),
            "FILE:2: /block_len: missing required field");
  EXPECT_EQ(ErrorOf({kRequestsHeader, R"({"blocks":[],"block_len":1,"outputs":[1],)"
                                      R"("prompt_len":1})"}),
            "FILE:2: /blocks: must not be empty");
  EXPECT_EQ(ErrorOf({kRequestsHeader, R"({"blocks":[-1],"block_len":1,"outputs":[1],)"
                                      R"("prompt_len":1})"}),
            "FILE:2: /blocks/0: must be >= 0, got -1");
  EXPECT_EQ(ErrorOf({kRequestsHeader, R"({"inputs":[1],"output_len":16777217})"}),
            "FILE:2: /output_len: too long: 16777217 (at most 16777216)");
}

TEST(TraceReaderErrors, FileLevelProblems) {
  EXPECT_EQ(ErrorOfText(""), "FILE:1: /: empty trace (no header)");
  EXPECT_EQ(ErrorOfText("\n"), "FILE:1: /: empty trace (no header)");
  EXPECT_EQ(ErrorOfText("\n" + kRequestsHeader + "\n"), "FILE:1: /: empty line");
  const std::string event = R"({"inputs":[1],"outputs":[2]})";
  EXPECT_EQ(ErrorOf({kRequestsHeader, event, "", event}), "FILE:3: /: empty line");
  EXPECT_EQ(ErrorOf({kRequestsHeader, event, "", ""}), "FILE:3: /: empty line");
  const std::string missing = (TestDir() / "no-such.jsonl").string();
  const Result<Trace> none = ReadTrace(missing);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kIo);
  EXPECT_EQ(none.status().message(), missing + ": cannot open: No such file or directory");
}

TEST(TraceReaderErrors, NotJson) {
  const std::string bad_header = ErrorOf({R"({"format":)"});
  EXPECT_EQ(bad_header.rfind("FILE:1: /: not JSON: ", 0), 0u) << bad_header;
  const std::string bad_event = ErrorOf({kRequestsHeader, R"({"inputs":[1],"outputs":[2]})", "{"});
  EXPECT_EQ(bad_event.rfind("FILE:3: /: not JSON: ", 0), 0u) << bad_event;
  EXPECT_EQ(ErrorOf({kRequestsHeader, "[1,2]"}), "FILE:2: /: expected an object, got array");
  EXPECT_EQ(ErrorOf({"42"}), "FILE:1: /: expected an object, got 42");
  // A number beyond a double: nlohmann throws even when asked not to (a fuzz finding).
  EXPECT_EQ(ErrorOf({kRequestsHeader, R"({"inputs":[1e99940],"outputs":[2]})"}),
            "FILE:2: /: not JSON: [json.exception.out_of_range.406] number overflow parsing "
            "'1e99940'");
}

TEST(TraceReaderErrors, HeaderFormatAndVersionComeFirst) {
  EXPECT_EQ(ErrorOf({Header([](Json& j) { j["format"] = "other"; })}),
            "FILE:1: /format: not a kvtwin trace");
  // A Mooncake line has no "format" at all.
  EXPECT_EQ(ErrorOf({R"({"hash_ids":[1],"input_length":5,"output_length":1,"timestamp":0})"}),
            "FILE:1: /format: not a kvtwin trace");
  EXPECT_EQ(ErrorOf({Header([](Json& j) {
              j["version"] = 2;
              j["new_field"] = true;  // the version is what the reader must report
            })}),
            "FILE:1: /version: unsupported version 2 (this kvtwin reads version 1)");
  EXPECT_EQ(ErrorOf({Header([](Json& j) { j["version"] = "1"; })}),
            "FILE:1: /version: expected an integer, got string");
  EXPECT_EQ(ErrorOf({Header([](Json& j) { j.erase("version"); })}),
            "FILE:1: /version: missing required field");
}

TEST(TraceReaderErrors, HeaderFields) {
  const std::vector<std::pair<std::function<void(Json&)>, std::string>> cases = {
      {[](Json& j) { j["kind"] = "events"; },
       R"(/kind: unknown trace kind "events" (expected "requests", "ops" or "multiseq"))"},
      {[](Json& j) { j["extra"] = 1; }, "/extra: unknown field"},
      {[](Json& j) { j["a/b~"] = 1; }, "/a~1b~0: unknown field"},
      // Found by trace_reader_fuzz: a newline in a key broke the one-line error.
      {[](Json& j) { j["co\nver\\sation\x01"] = 1; }, R"(/co\nver\\sation\u0001: unknown field)"},
      {[](Json& j) { j["seed"] = -1; }, "/seed: must be >= 0, got -1"},
      {[](Json& j) { j["seed"] = 1.5; }, "/seed: expected an integer, got 1.5"},
      {[](Json& j) { j.erase("model"); }, "/model: missing required field"},
      {[](Json& j) { j["model"] = "mixed"; }, "/model: expected an object, got string"},
      {[](Json& j) { j["model"]["heads"] = 2; }, "/model/heads: unknown field"},
      {[](Json& j) { j["model"]["layers"] = 0; }, "/model/layers: must be >= 1, got 0"},
      {[](Json& j) { j["model"]["layers"] = 128; }, "/model/layers: must be <= 127, got 128"},
      {[](Json& j) { j["model"]["window"] = "4"; },
       "/model/window: expected an integer, got string"},
      {[](Json& j) { j["model"]["window"] = 0; }, "/model/window: must be >= 1, got 0"},
      {[](Json& j) { j["model"]["preset"] = "huge"; },
       R"(/model/preset: unknown preset "huge" (expected one of dense, sliding, recurrent, mixed, rotating, holey, staggered))"},
      {[](Json& j) {
         j["model"]["preset"] = "holey";
         j["model"]["layers"] = 1;
       },
       "/model: preset 'holey' needs >= 2 layers (its layer 0 is stateless), got 1"},
      {[](Json& j) { j["model"]["dtype"] = "f64"; },
       "/model/dtype: unknown dtype 'f64' (f32, bf16)"},
      {[](Json& j) { j["model"]["dtype"] = "bf16/f64"; },
       "/model/dtype: unknown dtype 'bf16/f64' (f32, bf16, or K/V such as bf16/f32)"},
      {[](Json& j) { j["model"]["dtype"] = "bf16/"; },
       "/model/dtype: unknown dtype 'bf16/' (f32, bf16, or K/V such as bf16/f32)"},
      {[](Json& j) { j["model"]["dtype"] = "f32/bf16/f32"; },
       "/model/dtype: unknown dtype 'f32/bf16/f32' (f32, bf16, or K/V such as bf16/f32)"},
      {[](Json& j) { j["model"]["kv"] = 4; }, "/model/kv: expected an object, got 4"},
      {[](Json& j) {
         j["model"]["kv"] = {{"heads", 2}, {"head_dim", 4}};
       },
       "/model/kv/value_dim: missing required field"},
      {[](Json& j) {
         j["model"]["kv"] = KvDims(2, 4, 5);
         j["model"]["kv"]["x"] = 1;
       },
       "/model/kv/x: unknown field"},
      {[](Json& j) { j["model"]["kv"] = KvDims(65, 4, 5); },
       "/model/kv/heads: must be <= 64, got 65"},
      {[](Json& j) { j["model"]["kv"] = KvDims(2, 0, 5); },
       "/model/kv/head_dim: must be >= 1, got 0"},
      {[](Json& j) { j["model"]["kv"] = KvDims(2, 4, 513); },
       "/model/kv/value_dim: must be <= 512, got 513"},
      {[](Json& j) { j["model"]["kv"] = KvDims(1, 6, 7); },
       "/model/kv: kv heads x head_dim = 6 and kv heads x value_dim = 7 must be >= 7 so K and V "
       "rows carry their provenance (value_dim 0: an MLA layer)"},
      {[](Json& j) { j["model"]["kv"] = KvDims(2, 4, -1); },
       "/model/kv/value_dim: must be >= 0, got -1"},
      {[](Json& j) { j["model"]["kv"] = KvDims(2, 4, 3); },
       "/model/kv: kv heads x head_dim = 8 and kv heads x value_dim = 6 must be >= 7 so K and V "
       "rows carry their provenance (value_dim 0: an MLA layer)"},
      {[](Json& j) { j["model"]["recurrent"] = RecurrentDimsJson(17, 1, 1, 1, 1); },
       "/model/recurrent/conv_tail: must be <= 16, got 17"},
      {[](Json& j) { j["model"]["recurrent"] = RecurrentDimsJson(-1, 1, 1, 1, 1); },
       "/model/recurrent/conv_tail: must be >= 0, got -1"},
      {[](Json& j) {
         j["model"]["recurrent"] = RecurrentDimsJson(1, 1, 1, 1, 1);
         j["model"]["recurrent"].erase("head_v_dim");
       },
       "/model/recurrent/head_v_dim: missing required field"},
      {[](Json& j) { j["model"]["recurrent"] = RecurrentDimsJson(1, 2, 3, 1, 1); },
       "/model/recurrent: recurrent num_v_heads (3) must be a multiple of num_k_heads (2)"},
      {[](Json& j) { j["source"] = 3; }, "/source: expected a string, got 3"},
      {[](Json& j) { j.erase("chunk"); }, "/chunk: missing required field"},
      {[](Json& j) { j["chunk"] = 0; }, "/chunk: must be >= 1, got 0"},
      {[](Json& j) { j["budget"] = -5; }, "/budget: must be >= 0, got -5"},
      {[](Json& j) { j["pre_thinking"] = true; },
       "/pre_thinking: expected an integer, got boolean"},
      {[](Json& j) {
         j["kind"] = "ops";  // an ops trace has no request driver options
       },
       R"(/budget: only allowed in a "requests" trace)"},
      {[](Json& j) {
         // Stateless layers are a request-level notion: the layer drivers have no holes.
         j["kind"] = "ops";
         for (const char* key : {"budget", "chunk", "capture_interval", "pre_thinking"}) {
           j.erase(key);
         }
         j["model"]["preset"] = "holey";
       },
       R"(/model/preset: unknown preset "holey" (expected one of dense, sliding, recurrent, mixed, rotating, staggered))"},
      {[](Json& j) { j["expect"] = 3; }, "/expect: expected a string, got 3"},
      {[](Json& j) { j["expect"] = "fail"; },
       R"(/expect: expected "pass" or "divergence: KIND", got "fail")"},
      {[](Json& j) { j["expect"] = "Pass"; },
       R"(/expect: expected "pass" or "divergence: KIND", got "Pass")"},
      {[](Json& j) { j["expect"] = "divergence"; },
       R"(/expect: expected "pass" or "divergence: KIND", got "divergence")"},
      {[](Json& j) { j["expect"] = "divergence: "; },  // the kind is missing
       R"(/expect: expected "pass" or "divergence: KIND", got "divergence: ")"},
      {[](Json& j) { j["expect"] = "divergence: " + std::string(989, 'k'); },
       "/expect: too long: 1001 characters (at most 1000)"},
      {[](Json& j) { j["expect"] = "divergence: " + std::string(987, 'k') + "§§"; },
       "/expect: too long: 1001 characters (at most 1000)"},
  };
  for (const auto& [edit, want] : cases) EXPECT_EQ(ErrorOf({Header(edit)}), "FILE:1: " + want);
  // "" is the default spelled out: no expectation.
  EXPECT_EQ(ErrorOf({Header([](Json& j) { j["expect"] = ""; })}), "(read without error)");
}

TEST(TraceReaderErrors, RequestFields) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"inputs":[1],"outputs":[2],"colour":1})", "/colour: unknown field"},
      {R"({"op":"free","layer":0})", R"(/op: an op event in a "requests" trace)"},
      {R"({"outputs":[2]})", R"(/inputs: missing required field (or "blocks"))"},
      {R"({"inputs":[1]})", R"(/outputs: missing required field (or "output_len"))"},
      {R"({"inputs":[],"outputs":[2]})", "/inputs: must not be empty"},
      {R"({"inputs":[1],"outputs":[]})",
       R"(/outputs: must not be empty (only a request with "cancel_after" may have no outputs))"},
      {R"({"inputs":1,"outputs":[2]})", "/inputs: expected an array, got 1"},
      // A negative prompt id is a media fold value; one past int32 is not a token.
      {R"({"inputs":[1,-2147483649],"outputs":[2]})",
       "/inputs/1: must be >= -2147483648, got -2147483649"},
      {R"({"inputs":[1,-2],"outputs":[-2]})", "/outputs/0: must be >= 0, got -2"},
      {R"({"inputs":[1.5],"outputs":[2]})", "/inputs/0: expected an integer, got 1.5"},
      {R"({"inputs":["1"],"outputs":[2]})", "/inputs/0: expected an integer, got string"},
      {R"({"inputs":[1],"outputs":[2147483648]})",
       "/outputs/0: must be <= 2147483647, got 2147483648"},
      {R"({"inputs":[1],"outputs":[2],"blocks":[3]})", R"(/blocks: not allowed with "inputs")"},
      {R"({"inputs":[1],"outputs":[2],"output_len":1})",
       R"(/output_len: not allowed with "outputs")"},
      {R"({"inputs":[1],"output_len":0})", "/output_len: must be >= 1, got 0"},
      {R"({"conversation":-1,"inputs":[1],"outputs":[2]})", "/conversation: must be >= 0, got -1"},
      {R"({"inputs":[1],"outputs":[2],"schedule":1})", "/schedule: expected true or false, got 1"},
      {R"({"inputs":[1],"outputs":[2],"user_points":[1,0.5]})",
       "/user_points/1: expected an integer, got 0.5"},
      {R"({"cancel_after":-1,"inputs":[1],"outputs":[2]})", "/cancel_after: must be >= 0, got -1"},
      {R"({"budget_pct":-1,"inputs":[1],"outputs":[2]})", "/budget_pct: must be >= 0, got -1"},
      {R"({"budget_pct_after_prefill":10001,"inputs":[1],"outputs":[2]})",
       "/budget_pct_after_prefill: must be <= 10000, got 10001"},
      {R"({"dropped":-3,"inputs":[1],"outputs":[2]})", "/dropped: must be >= 0, got -3"},
      {R"({"inputs":[1],"outputs":[2],"request_kind":"resume"})",
       R"(/request_kind: unknown request kind "resume" (expected new, extend, diverge, repeat or retry))"},
  };
  for (const auto& [event, want] : cases) {
    EXPECT_EQ(ErrorOf({kRequestsHeader, event}), "FILE:2: " + want) << event;
  }
}

TEST(TraceReaderErrors, SpeculationMustFitTheDecode) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"cancel_after":2,"inputs":[1],"outputs":[2,3],)"
       R"("speculation":[{"accepted":0,"rejected":[4],"step":0}]})",
       R"(/speculation: not allowed with "cancel_after" (a cancelled request has no decode))"},
      {R"({"inputs":[1],"outputs":[2,3,4],"speculation":[{"accepted":2,"rejected":[],"step":1}]})",
       "/speculation/0/accepted: step 1 + accepted 2 + 1 exceeds the 3 outputs"},
      {R"({"inputs":[1],"outputs":[2,3],"unforwarded":3})",
       "/unforwarded: 3 exceeds the 2 outputs"},
      {R"({"inputs":[1],"outputs":[2,3],"unforwarded":-1})", "/unforwarded: must be >= 0, got -1"},
      {R"({"cancel_after":0,"inputs":[1],"unforwarded":1})",
       R"(/unforwarded: not allowed with "cancel_after" (a cancelled request has no decode))"},
      {R"({"inputs":[1],"outputs":[2,3,4],"unforwarded":3,)"
       R"("speculation":[{"accepted":1,"rejected":[],"step":0}]})",
       R"(/speculation/0/accepted: step 0 + accepted 1 + 1 exceeds the 1 outputs the decode )"
       R"(samples ("unforwarded" is 3))"},
      {R"({"inputs":[1],"outputs":[2,3],"speculation":[{"accepted":0,"rejected":[],"step":2}]})",
       "/speculation/0/step: step 2 is past the last of the 2 outputs"},
      {R"({"inputs":[1],"outputs":[2,3],"speculation":[{"accepted":0,"step":0}]})",
       "/speculation/0/rejected: missing required field"},
      {R"({"inputs":[1],"outputs":[2,3],"speculation":[{"accepted":0,"rejected":[-1],"step":0}]})",
       "/speculation/0/rejected/0: must be >= 0, got -1"},
      {R"({"inputs":[1],"outputs":[2,3],"speculation":[{"accepted":-1,"rejected":[],"step":0}]})",
       "/speculation/0/accepted: must be >= 0, got -1"},
      {R"({"inputs":[1],"outputs":[2,3],"speculation":[{"rejected":[],"step":0,"x":1}]})",
       "/speculation/0/x: unknown field"},
      {R"({"inputs":[1],"outputs":[2,3],"speculation":{"accepted":0,"rejected":[],"step":0}})",
       "/speculation: expected an array, got object"},
      {R"({"inputs":[1],"outputs":[2,3],"speculation":[0]})",
       "/speculation/0: expected an object, got 0"},
  };
  for (const auto& [event, want] : cases) {
    EXPECT_EQ(ErrorOf({kRequestsHeader, event}), "FILE:2: " + want) << event;
  }
  // The last planned token can be the bonus of a step that accepts every draft.
  const std::string fits =
      R"({"inputs":[1],"outputs":[2,3,4],"speculation":[{"accepted":1,"rejected":[],"step":1}]})";
  EXPECT_EQ(ErrorOf({kRequestsHeader, fits}), "(read without error)");
}

// Each step samples outputs [step, step + accepted + 1): the next one starts after them.
TEST(TraceReaderErrors, SpeculativeStepsAreSortedApartAndWithinTheOutputs) {
  const std::string outputs = R"({"inputs":[1],"outputs":[2,3,4,5,6],"speculation":[)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"accepted":1,"rejected":[],"step":2},{"accepted":0,"rejected":[9],"step":0}]})",
       "/speculation/1/step: steps must be sorted: step 0 after step 2"},
      {R"({"accepted":0,"rejected":[9],"step":1},{"accepted":0,"rejected":[9],"step":1}]})",
       "/speculation/1/step: steps must be sorted: step 1 after step 1"},
      {R"({"accepted":1,"rejected":[],"step":1},{"accepted":0,"rejected":[9],"step":2}]})",
       "/speculation/1/step: step 2 overlaps the previous step, which samples up to "
       "step 1 + accepted 1 + 1 = 3"},
      {R"({"accepted":0,"rejected":[9],"step":0},{"accepted":2,"rejected":[],"step":3}]})",
       "/speculation/1/accepted: step 3 + accepted 2 + 1 exceeds the 5 outputs"},
      {R"({"accepted":0,"rejected":[9],"step":0},{"accepted":0,"rejected":[],"step":5}]})",
       "/speculation/1/step: step 5 is past the last of the 5 outputs"},
      {R"({"accepted":0,"rejected":[9],"step":0},{"accepted":0,"rejected":[],"step":1},)"
       R"({"accepted":0,"rejected":[],"step":1}]})",
       "/speculation/2/step: steps must be sorted: step 1 after step 1"},
  };
  for (const auto& [steps, want] : cases) {
    EXPECT_EQ(ErrorOf({kRequestsHeader, outputs + steps}), "FILE:2: " + want) << steps;
  }
  // An abandoned step ends the decode: it forwards the last sampled token (left unforwarded)
  // and its drafts, accepts nothing and nothing follows it.
  const std::vector<std::pair<std::string, std::string>> abandoned = {
      {R"({"abandoned":true,"accepted":0,"rejected":[9],"step":4}]})",
       "/speculation/0/step: an abandoned step comes at the forward of the last sampled token, "
       "step 5, got 4"},
      {R"({"abandoned":true,"accepted":1,"rejected":[],"step":5}]})",
       "/speculation/0/accepted: an abandoned step accepts nothing, got 1"},
      {R"({"abandoned":true,"accepted":0,"rejected":[],"step":5},)"
       R"({"accepted":0,"rejected":[9],"step":6}]})",
       "/speculation/1: a step after an abandoned one (the decode ends there)"},
      {R"({"abandoned":1,"accepted":0,"rejected":[],"step":5}]})",
       "/speculation/0/abandoned: expected true or false, got 1"},
      {R"({"probe":"yes","accepted":0,"rejected":[],"step":0}]})",
       "/speculation/0/probe: expected true or false, got string"},
  };
  for (const auto& [steps, want] : abandoned) {
    EXPECT_EQ(ErrorOf({kRequestsHeader, outputs + steps}), "FILE:2: " + want) << steps;
  }
  EXPECT_EQ(
      ErrorOf({kRequestsHeader, R"({"inputs":[1],"outputs":[2,3],"unforwarded":2,"speculation":[)"
                                R"({"abandoned":true,"accepted":0,"rejected":[],"step":1}]})"}),
      R"(FILE:2: /speculation/0/abandoned: needs "unforwarded" 1 (the last sampled token )"
      R"(left for the step to forward), got 2)");
  // Back to back up to the last output, and an empty list (no speculation, the default).
  const std::string whole = outputs + R"({"accepted":1,"rejected":[9],"step":0},)"
                                      R"({"accepted":0,"rejected":[9],"step":2},)"
                                      R"({"accepted":1,"rejected":[],"step":3}]})";
  const std::string path = WriteFile(Lines({kRequestsHeader, whole, outputs + "]}"}));
  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  const std::vector<SpeculativeStep> want = {{0, 1, {9}}, {2, 0, {9}}, {3, 1, {}}};
  EXPECT_EQ(std::get<RequestPlan>(trace->events.at(0)).speculation, want);
  EXPECT_TRUE(std::get<RequestPlan>(trace->events.at(1)).speculation.empty());
}

// A cancelled request never decodes: its outputs may be absent, empty or a count of 0.
TEST(TraceReader, ACancelledRequestMayHaveNoOutputs) {
  const std::string path = WriteFile(Lines({
      kRequestsHeader,
      R"({"cancel_after":2,"inputs":[1,2,3]})",
      R"({"cancel_after":0,"inputs":[1],"outputs":[]})",
      R"({"cancel_after":0,"inputs":[1],"output_len":0})",
      R"({"cancel_after":1,"inputs":[1,2],"outputs":[5]})",
      R"({"cancel_after":1,"inputs":[1,2],"speculation":[]})",
  }));
  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  ASSERT_EQ(trace->events.size(), 5u);
  for (const size_t i : {0u, 1u, 2u, 4u}) {
    EXPECT_TRUE(std::get<RequestPlan>(trace->events[i]).outputs.empty()) << i;
  }
  EXPECT_EQ(std::get<RequestPlan>(trace->events[0]).cancel_after_tokens, 2);
  EXPECT_EQ(std::get<RequestPlan>(trace->events[3]).outputs, std::vector<int32_t>{5});
  // Without "cancel_after" every form of "no outputs" is refused.
  EXPECT_EQ(ErrorOf({kRequestsHeader, R"({"inputs":[1],"speculation":[]})"}),
            R"(FILE:2: /outputs: missing required field (or "output_len"))");
  EXPECT_EQ(ErrorOf({kRequestsHeader, R"({"inputs":[1],"output_len":0})"}),
            "FILE:2: /output_len: must be >= 1, got 0");
}

// A write of padding alone (no tokens) is read only on a stack of recurrent layers only,
// and only with padding; a speculation always forwards tokens.
TEST(TraceReaderErrors, PaddingAloneNeedsRecurrentLayersAndPadding) {
  const std::string recurrent =
      R"({"format":"kvtwin-trace","kind":"ops",)"
      R"("model":{"dtype":"f32","layers":3,"preset":"recurrent","window":4},"seed":1,"version":1})";
  EXPECT_EQ(ErrorOf({recurrent, R"({"op":"write","pad":2,"tokens":[]})"}), "(read without error)");
  EXPECT_EQ(ErrorOf({recurrent, R"({"op":"write","tokens":[]})"}),
            R"(FILE:2: /tokens: empty with no "pad" (a write forwards at least one row))");
  EXPECT_EQ(ErrorOf({recurrent, R"({"accepted":0,"op":"speculate","pad":1,"tokens":[1]})"}),
            "FILE:2: /tokens: needs at least 2 entries, got 1");
  // Four layers of the recurrent preset hold a full KV layer.
  std::string four = recurrent;
  four.replace(four.find(R"("layers":3)"), 10, R"("layers":4)");
  EXPECT_EQ(ErrorOf({four, R"({"op":"write","pad":2,"tokens":[]})"}),
            "FILE:2: /tokens: must not be empty");
  EXPECT_EQ(ErrorOf({kOpsHeader, R"({"op":"write","pad":1,"tokens":[]})"}),
            "FILE:2: /tokens: must not be empty");
}

TEST(TraceReaderErrors, OpFields) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"inputs":[1],"outputs":[2]})", "/op: missing required field"},
      {R"({"op":"jump","layer":0})", R"(/op: unknown op "jump")"},
      {R"({"op":7})", "/op: expected a string, got 7"},
      {R"({"layer":4,"op":"free"})", "/layer: layer 4 out of range (the stack has 4 layers)"},
      {R"({"layer":-1,"op":"take"})", "/layer: must be >= 0, got -1"},
      {R"({"op":"take"})", "/layer: missing required field"},
      {R"({"layer":0,"op":"free","slot":1})", R"(/slot: unknown field for op "free")"},
      {R"({"layer":0,"op":"write","tokens":[1]})", R"(/layer: unknown field for op "write")"},
      {R"({"op":"write","tokens":[]})", "/tokens: must not be empty"},
      {R"({"op":"write","tokens":[-1]})", "/tokens/0: must be >= 0, got -1"},
      {R"({"op":"write","pad":-1,"tokens":[1]})", "/pad: must be >= 0, got -1"},
      {R"({"op":"write","segmented":"yes","tokens":[1]})",
       "/segmented: expected true or false, got string"},
      {R"({"mask":"full","op":"write","tokens":[1]})",
       R"(/mask: unknown mask "full" (expected causal, zero, relax, block, relax_block or array))"},
      {R"({"mask":"zero","op":"write","rect":[0,1,0,1],"tokens":[1]})",
       R"(/rect: only allowed with mask "relax", "block", "relax_block" or "array")"},
      {R"({"block":[0,1,0,1],"mask":"relax","op":"write","rect":[0,1,0,1],"tokens":[1]})",
       R"(/block: only allowed with mask "relax_block")"},
      {R"({"mask":"relax_block","op":"write","rect":[0,1,0,1],"tokens":[1]})",
       R"(/block: missing required field (mask "relax_block"))"},
      {R"({"block":[0,1,3,2],"mask":"relax_block","op":"write","rect":[0,1,0,1],"tokens":[1]})",
       "/block/3: 2 is below the lower bound 3"},
      {R"({"mask":"relax","op":"write","tokens":[1]})",
       R"(/rect: missing required field (mask "relax"))"},
      {R"({"mask":"block","op":"write","tokens":[1]})",
       R"(/rect: missing required field (mask "block"))"},
      {R"({"mask":"block","op":"write","rect":[2,1,0,1],"tokens":[1]})",
       "/rect/1: 1 is below the lower bound 2"},
      {R"({"mask":"relax","op":"write","rect":[0,1,0],"tokens":[1]})",
       "/rect: expected [q_lo, q_hi, k_lo, k_hi], got 3 entries"},
      {R"({"mask":"relax","op":"write","rect":[0,1,-1,1],"tokens":[1]})",
       "/rect/2: must be >= 0, got -1"},
      {R"({"mask":"relax","op":"write","rect":[3,2,0,1],"tokens":[1]})",
       "/rect/1: 2 is below the lower bound 3"},
      {R"({"mask":"relax","op":"write","rect":[0,1,5,4],"tokens":[1]})",
       "/rect/3: 4 is below the lower bound 5"},
      {R"({"accepted":0,"op":"speculate","tokens":[1]})",
       "/tokens: needs at least 2 entries, got 1"},
      {R"({"op":"speculate","tokens":[1,2]})", "/accepted: missing required field"},
      {R"({"accepted":1,"isolated":0,"op":"speculate","tokens":[1,2]})",
       "/isolated: expected true or false, got 0"},
      {R"({"abandon_after":5,"accepted":1,"op":"speculate","tokens":[1,2]})",
       "/abandon_after: must be <= 4, got 5"},
      {R"({"abandon_after":-1,"accepted":1,"op":"speculate","tokens":[1,2]})",
       "/abandon_after: must be >= 0, got -1"},
      {R"({"abandon_after":0,"op":"write","tokens":[1]})",
       R"(/abandon_after: unknown field for op "write")"},
      {R"({"layer":0,"op":"snapshot"})", "/from: missing required field"},
      {R"({"from":-1,"layer":0,"op":"snapshot"})", "/from: must be >= 0, got -1"},
      {R"({"layer":0,"op":"restore","slot":-2,"target":0})", "/slot: must be >= -1, got -2"},
      {R"({"layer":0,"op":"restore","slot":0})", "/target: missing required field"},
      {R"({"child":0,"layer":0,"op":"merge"})", "/parent: missing required field"},
      {R"({"at":1,"layer":0,"op":"split","slot":-3})", "/slot: must be >= -1, got -3"},
      {R"({"layer":0,"op":"close","slot":-1})", "/slot: must be >= 0, got -1"},
      {R"({"layer":0,"offsets":3,"op":"prepare"})", "/offsets: expected an array, got 3"},
      {R"({"layer":0,"op":"prepare"})", "/offsets: missing required field"},
  };
  for (const auto& [event, want] : cases) {
    EXPECT_EQ(ErrorOf({kOpsHeader, event}), "FILE:2: " + want) << event;
  }
}

TEST(TraceReader, AcceptsAHeaderOnlyFileAndOneTrailingEmptyLine) {
  const std::string path = WriteFile(kRequestsHeader);  // no newline at all
  const Result<Trace> empty = ReadTrace(path);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->events.empty());
  const std::string event = R"({"inputs":[1],"outputs":[2]})";
  EXPECT_EQ(ErrorOf({kRequestsHeader, event, ""}), "(read without error)");
  EXPECT_EQ(ErrorOfText(Lines({kRequestsHeader, event}) + "\r\n"), "(read without error)");
}

TEST(TraceReader, StreamsEventsWithTheirLinesAndRequestIndices) {
  const std::string path = WriteFile(Lines(
      {kRequestsHeader, R"({"inputs":[1],"outputs":[2]})", R"({"inputs":[3],"output_len":2})"}));
  Result<std::unique_ptr<TraceReader>> reader = TraceReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->path(), path);
  EXPECT_EQ((*reader)->header(), TraceHeader{});
  for (int64_t i = 0; i < 2; ++i) {
    Result<std::optional<TraceEvent>> event = (*reader)->Next();
    ASSERT_TRUE(event.ok()) << event.status().ToString();
    ASSERT_TRUE(event->has_value());
    EXPECT_EQ(std::get<RequestPlan>(**event).index, i);
    EXPECT_EQ((*reader)->line(), i + 2);
  }
  Result<std::optional<TraceEvent>> end = (*reader)->Next();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
}

TEST(TraceWriter, LeavesNoFileUnlessCommitted) {
  const fs::path dir = TestDir();
  const std::string path = (dir / "t.jsonl").string();
  {
    Result<std::unique_ptr<TraceWriter>> writer = TraceWriter::Create(path, TraceHeader{});
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    ASSERT_TRUE((*writer)->Write(EveryRequestField()[0]).ok());
    EXPECT_FALSE(fs::exists(path));
    EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(dir));  // no temporary file either
}

TEST(TraceWriter, CommitReplacesTheDestinationInOneRename) {
  const fs::path dir = TestDir();
  const std::string path = (dir / "t.jsonl").string();
  std::ofstream(path) << "old\n";
  Trace trace{TraceHeader{}, {}};
  for (const RequestPlan& plan : EveryRequestField()) trace.events.emplace_back(plan);
  Result<std::unique_ptr<TraceWriter>> writer = TraceWriter::Create(path, trace.header);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  for (const TraceEvent& e : trace.events) ASSERT_TRUE((*writer)->Write(e).ok());
  EXPECT_EQ(ReadFile(path), "old\n");  // a reader sees the old trace until the commit
  ASSERT_TRUE((*writer)->Commit().ok());
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"t.jsonl"});
  const Result<Trace> read = ReadTrace(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->events.size(), trace.events.size());
  writer->reset();  // destroying a committed writer keeps the file
  EXPECT_TRUE(fs::exists(path));
}

TEST(TraceWriter, ReportsADirectoryThatDoesNotExist) {
  const std::string path = (TestDir() / "missing" / "t.jsonl").string();
  Result<std::unique_ptr<TraceWriter>> writer = TraceWriter::Create(path, TraceHeader{});
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), StatusCode::kIo);
  EXPECT_EQ(writer.status().message().rfind(path + ": cannot create " + path + ".tmp.", 0), 0u)
      << writer.status().message();
}

TEST(TraceWriterDeathTest, AnEventOfTheWrongKindIsAProgrammerError) {
  const std::string path = (TestDir() / "t.jsonl").string();
  EXPECT_DEATH(
      {
        Result<std::unique_ptr<TraceWriter>> writer = TraceWriter::Create(path, TraceHeader{});
        (void)(*writer)->Write(MakeOp(OpKind::kFree, 0));
      },
      "wrong kind");
}

// ---- kind "multiseq" ----

const std::string kMultiSeqHeader =
    R"({"conv":"as-specified","format":"kvtwin-trace","kind":"multiseq","multiseq":)"
    R"({"capacity":32,"chunk":0,"d_conv":2,"dtype":"f32","hidden":4,"kv_cols":8,"max_batch":8,)"
    R"("max_seqs":4,"num_conv_layers":1,"padding":1,"permuted_v":false,"shift_supported":true},)"
    R"("seed":1,"version":1})";

// The multiseq header with one edit.
std::string MultiSeqHeader(const std::function<void(Json&)>& edit) {
  Json j = Json::parse(kMultiSeqHeader);
  edit(j);
  return j.dump();
}

// A forward with another request's edits between its StartForward and Put.
MsOp ForwardWithEdits() {
  MsOp op = MsOp::Forward({{1, 6, 2}});
  op.edits = {MsOp::Remove(1, 0, kvtwin::kUnbounded), MsOp::CopyPrefix(0, 1, 3),
              MsOp::Remove(2, 1, 4)};
  return op;
}

std::vector<MsOp> EveryMsOpKind() {
  return {MsOp::Forward({{0, 4, 17}, {0, 5, 3}, {1, 4, 9}, {1, 5, 2}}, {1, 3}, true),
          MsOp::Forward({{2, 0, 1}}),
          MsOp::CopyPrefix(0, 2, 5),
          MsOp::Remove(1, 3, 7),
          MsOp::Remove(3, 0, kvtwin::kUnbounded),
          MsOp::CanResume(1, 4),
          ForwardWithEdits()};
}

TEST(TraceJson, DefaultMultiSeqHeaderIsTheDocumentedLine) {
  TraceHeader h;
  h.kind = TraceKind::kMultiSeq;
  EXPECT_EQ(HeaderToJson(h), kMultiSeqHeader);
}

TEST(TraceJson, AForwardWritesItsBatchAsTriples) {
  EXPECT_EQ(EventToJson(EveryMsOpKind()[0]),
            R"({"batch":[[0,4,17],[0,5,3],[1,4,9],[1,5,2]],"causal_off":[1,3],"op":"forward",)"
            R"("reserve":true})");
  EXPECT_EQ(EventToJson(EveryMsOpKind()[1]), R"({"batch":[[2,0,1]],"op":"forward"})");
  EXPECT_EQ(EventToJson(EveryMsOpKind()[4]), R"({"begin":0,"op":"remove","seq":3})");
  EXPECT_EQ(EventToJson(ForwardWithEdits()),
            R"({"batch":[[1,6,2]],"edits":[{"begin":0,"op":"remove","seq":1},)"
            R"({"dst":1,"len":3,"op":"copy_prefix","src":0},)"
            R"({"begin":1,"end":4,"op":"remove","seq":2}],"op":"forward"})");
  EXPECT_EQ(ForwardWithEdits().ToString(),
            "forward [s1@6:2] edits=[remove s1 [0, inf); copy_prefix s0 -> s1 len=3; remove s2 "
            "[1, 4)]");
}

TEST(TraceRoundTrip, MultiSeqHeaderAndEveryMsOpKind) {
  TraceHeader h;
  h.kind = TraceKind::kMultiSeq;
  h.seed = 77;
  h.source = "kvtwin multiseq --seeds 77..77 --steps 9";
  h.expect = "pass";
  h.multiseq = MultiSeqConfig{.window = 3,
                              .memory = 5,
                              .chunk = 4,
                              .max_seqs = 5,
                              .capacity = 20,
                              .max_batch = 6,
                              .padding = 2,
                              .permuted_v = true,
                              .dtype = DType::kBFloat16,
                              .kv_cols = 9,
                              .num_conv_layers = 2,
                              .d_conv = 3,
                              .hidden = 5,
                              .shift_supported = false,
                              .conv = ConvExpectation::kIdeal};
  Trace written{h, {}};
  for (const MsOp& op : EveryMsOpKind()) written.events.emplace_back(op);
  const std::string path = (TestDir() / "multiseq.jsonl").string();
  ASSERT_TRUE(WriteTrace(path, written).ok());
  const Result<Trace> read = ReadTrace(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->header, h);
  ASSERT_EQ(read->events.size(), written.events.size());
  std::string text = HeaderToJson(h) + "\n";
  for (size_t i = 0; i < written.events.size(); ++i) {
    const MsOp& want = std::get<MsOp>(written.events[i]);
    EXPECT_EQ(std::get<MsOp>(read->events[i]), want) << want.ToString();
    text += EventToJson(written.events[i]) + "\n";
  }
  EXPECT_EQ(ReadFile(path), text);
}

TEST(TraceReader, MultiSeqWindowAndMemoryMayBeNullForUnbounded) {
  const std::string header = MultiSeqHeader([](Json& j) {
    j["multiseq"]["window"] = nullptr;
    j["multiseq"]["memory"] = nullptr;
  });
  const Result<Trace> read = ReadTrace(WriteFile(Lines({header})));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->header.multiseq.window, kvtwin::kUnbounded);
  EXPECT_EQ(read->header.multiseq.memory, kvtwin::kUnbounded);
}

TEST(TraceReaderErrors, MultiSeqHeaderFields) {
  const std::vector<std::pair<std::function<void(Json&)>, std::string>> cases = {
      {[](Json& j) { j["model"] = Json::parse(R"({"dtype":"f32","layers":4})"); },
       R"(/model: not allowed in a "multiseq" trace)"},
      {[](Json& j) { j["chunk"] = 5; }, R"(/chunk: not allowed in a "multiseq" trace)"},
      {[](Json& j) { j["conv"] = "perfect"; },
       R"(/conv: unknown conv expectation "perfect" (expected "as-specified" or "ideal"))"},
      {[](Json& j) { j.erase("conv"); }, "/conv: missing required field"},
      {[](Json& j) { j.erase("multiseq"); }, "/multiseq: missing required field"},
      {[](Json& j) { j["multiseq"]["heads"] = 1; }, "/multiseq/heads: unknown field"},
      {[](Json& j) { j["multiseq"].erase("capacity"); },
       "/multiseq/capacity: missing required field"},
      {[](Json& j) { j["multiseq"]["dtype"] = "f64"; },
       "/multiseq/dtype: unknown dtype 'f64' (f32, bf16)"},
      // One cache dtype: K and V apart is a layer stack's option only.
      {[](Json& j) { j["multiseq"]["dtype"] = "bf16/f32"; },
       "/multiseq/dtype: unknown dtype 'bf16/f32' (f32, bf16)"},
      {[](Json& j) { j["multiseq"]["window"] = 0; }, "/multiseq/window: must be >= 1, got 0"},
      {[](Json& j) { j["multiseq"]["max_seqs"] = 4097; },
       "/multiseq: multiseq: max_seqs (1..4096), capacity, max_batch, padding >= 1"},
      // A memory below the window is refused where spec §2.8's Init refuses it: with one
      // sequence (several raise it to window + 1, accepted below).
      {[](Json& j) {
         j["multiseq"]["max_seqs"] = 1;
         j["multiseq"]["window"] = 4;
         j["multiseq"]["memory"] = 2;
       },
       "/multiseq: multiseq: memory 2 below the window 4"},
      {[](Json& j) { j["multiseq"]["memory"] = 0; }, "/multiseq/memory: must be >= 1, got 0"},
      {[](Json& j) { j["multiseq"]["capacity"] = (1 << 24) + 1; },
       "/multiseq/capacity: must be <= 16777216, got 16777217"},
      // Without a window the cells are max_seqs x capacity: past the cache's 2^24.
      {[](Json& j) {
         j["multiseq"]["window"] = nullptr;
         j["multiseq"]["memory"] = nullptr;
         j["multiseq"]["capacity"] = 1 << 23;
       },
       "/multiseq: multiseq: 33554432 cells (max_seqs x capacity) beyond 2^24"},
  };
  for (const auto& [edit, want] : cases) {
    EXPECT_EQ(ErrorOf({MultiSeqHeader(edit)}), "FILE:1: " + want);
  }
  EXPECT_EQ(ErrorOf({MultiSeqHeader([](Json& j) {
              j["multiseq"]["window"] = 4;
              j["multiseq"]["memory"] = 2;
            })}),
            "(read without error)")
      << "four sequences raise a memory of 2 to the window + 1";
  // A windowed cache's cells follow its memory, whatever its capacity.
  EXPECT_EQ(ErrorOf({MultiSeqHeader([](Json& j) {
              j["multiseq"]["window"] = 4;
              j["multiseq"]["capacity"] = 1 << 24;
            })}),
            "(read without error)");
  EXPECT_EQ(ErrorOf({Header([](Json& j) { j["conv"] = "ideal"; })}),
            R"(FILE:1: /conv: only allowed in a "multiseq" trace)");
}

TEST(TraceReaderErrors, ReachClaims) {
  const std::vector<std::pair<std::function<void(Json&)>, std::string>> cases = {
      {[](Json& j) { j["reaches"] = 2; }, "/reaches: expected an object, got 2"},
      {[](Json& j) { j["reaches"] = Json::object(); },
       "/reaches: names no counter (leave it out instead)"},
      {[](Json& j) {
         j["reaches"] = {{"evictions", 0}};
       },
       "/reaches/evictions: must be >= 1, got 0"},
      {[](Json& j) {
         j["reaches"] = {{"evictions", -3}};
       },
       "/reaches/evictions: must be >= 1, got -3"},
      {[](Json& j) {
         j["reaches"] = {{"evictions", "many"}};
       },
       "/reaches/evictions: expected an integer, got string"},
      {[](Json& j) {
         j["reaches"] = {{"evictions", (int64_t{1} << 48) + 1}};
       },
       "/reaches/evictions: must be <= 281474976710656, got 281474976710657"},
      // The counters are checked in key order: "Evictions" sorts before "evictions".
      {[](Json& j) {
         j["reaches"] = {{"evictions", 1}, {"Evictions", 1}};
       },
       R"(/reaches/Evictions: unknown coverage counter of a "requests" trace (expected one of )"
       "completed, cancelled, cache_hits, extensions, dropped_tails, divergent, "
       "new_conversations, repeats, retries, user_offsets, unscheduled, speculative, "
       "isolated_probes, abandoned_steps, session_budgets, forwarded_last, past_stop, "
       "continuations, resumed_exactly, branch_points, free_all, kv_gaps, cut_pageins, "
       "kv_cut_pageins, whole_state_copies, "
       "splits, evictions, eviction_passes, largest_eviction_pass, calls, audited_calls, "
       "forwards, trusting_forwards)"},
      // A multiseq counter is not a request driver's.
      {[](Json& j) {
         j["reaches"] = {{"cow_copies", 1}};
       },
       R"(/reaches/cow_copies: unknown coverage counter of a "requests" trace)"},
      {[](Json& j) {
         j["reaches"] = {{"evictions", 1}};
         j["expect"] = "divergence: layer # history";
       },
       R"(/reaches: not allowed with a "divergence: ..." expectation)"},
      {[](Json& j) {
         j["kind"] = "ops";
         for (const char* key : {"budget", "chunk", "capture_interval", "pre_thinking"}) {
           j.erase(key);
         }
         j["reaches"] = {{"evictions", 1}};
       },
       R"(/reaches: only allowed in a "requests" or "multiseq" trace)"},
  };
  for (const auto& [edit, want] : cases) {
    // The unknown-counter cases give the start of their message only.
    const std::string got = ErrorOf({Header(edit)});
    EXPECT_TRUE(got.starts_with("FILE:1: " + want)) << got << "\nwant: " << want;
  }
  EXPECT_TRUE(ErrorOf({MultiSeqHeader([](Json& j) {
                j["reaches"] = {{"evictions", 1}};
              })})
                  .starts_with(R"(FILE:1: /reaches/evictions: unknown coverage counter of a )"
                               R"("multiseq" trace (expected one of forwards, reserves, )"));
  EXPECT_EQ(ErrorOf({MultiSeqHeader([](Json& j) {
              j["reaches"] = {{"cow_copies", 2}};
            })}),
            "(read without error)");
  EXPECT_EQ(ErrorOf({Header([](Json& j) {
              j["reaches"] = {{"evictions", 1}};
              j["expect"] = "pass";
            })}),
            "(read without error)");
}

TEST(TraceRoundTrip, ReachClaimsInCounterOrder) {
  TraceHeader h;
  h.expect = "pass";
  h.reaches = {{"evictions", 3}, {"kv_gaps", 1}, {"whole_state_copies", int64_t{1} << 48}};
  const std::string path = (TestDir() / "h.jsonl").string();
  ASSERT_TRUE(WriteTrace(path, Trace{h, {}}).ok());
  const Result<Trace> trace = ReadTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  EXPECT_EQ(trace->header, h);
  EXPECT_EQ(Json::parse(HeaderToJson(h))["reaches"].dump(),
            R"({"evictions":3,"kv_gaps":1,"whole_state_copies":281474976710656})");
  TraceHeader ms;
  ms.kind = TraceKind::kMultiSeq;
  ms.reaches = {{"forward_edits", 1}};
  ASSERT_TRUE(WriteTrace(path, Trace{ms, {}}).ok());
  const Result<Trace> back = ReadTrace(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->header, ms);
}

TEST(TraceReaderErrors, MsOpFields) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"layer":0,"op":"free"})", R"(/op: unknown multiseq op "free")"},
      {R"({"batch":[[4,0,1]],"op":"forward"})", "/batch/0/0: sequence 4 out of range (max_seqs 4)"},
      {R"({"batch":[[0,2147483648,1]],"op":"forward"})",
       "/batch/0/1: must be <= 2147483647, got 2147483648"},
      {R"({"batch":[[0,1]],"op":"forward"})",
       "/batch/0: expected [seq, pos, token], got 2 entries"},
      {R"({"batch":[[0,1,-1]],"op":"forward"})", "/batch/0/2: must be >= 0, got -1"},
      {R"({"op":"forward"})", "/batch: missing required field"},
      {R"({"batch":[[0,1,1]],"op":"forward","reserve":1})",
       "/reserve: expected true or false, got 1"},
      {R"({"dst":4,"len":1,"op":"copy_prefix","src":0})",
       "/dst: sequence 4 out of range (max_seqs 4)"},
      // Any int32 length, negative ones included (they copy nothing, spec §2.8).
      {R"({"dst":1,"len":-2147483649,"op":"copy_prefix","src":0})",
       "/len: must be >= -2147483648, got -2147483649"},
      {R"({"begin":0,"op":"remove","seq":-1})", "/seq: must be >= 0, got -1"},
      {R"({"begin":0,"op":"remove","pos":1,"seq":0})", R"(/pos: unknown field for op "remove")"},
      {R"({"op":"can_resume","pos":4294967297,"seq":0})",
       "/pos: must be <= 4294967296, got 4294967297"},
      // A forward's edits: copy_prefix / remove objects, checked as events are, at their
      // own pointers; none on a reserve pass, at most 16.
      {R"({"batch":[[0,1,1]],"edits":{},"op":"forward"})", "/edits: expected an array, got object"},
      {R"({"batch":[[0,1,1]],"edits":[3],"op":"forward"})", "/edits/0: expected an object, got 3"},
      {R"({"batch":[[0,1,1]],"edits":[{"begin":0,"op":"remove","seq":0},{"op":"can_resume","pos":1,"seq":0}],"op":"forward"})",
       R"(/edits/1/op: a forward's edits are copy_prefix or remove, got "can_resume")"},
      {R"({"batch":[[0,1,1]],"edits":[{"batch":[[0,1,1]],"op":"forward"}],"op":"forward"})",
       R"(/edits/0/op: a forward's edits are copy_prefix or remove, got "forward")"},
      {R"({"batch":[[0,1,1]],"edits":[{"begin":0,"op":"remove","seq":9}],"op":"forward"})",
       "/edits/0/seq: sequence 9 out of range (max_seqs 4)"},
      {R"({"batch":[[0,1,1]],"edits":[{"batch":[[0,1,1]],"edits":[{"batch":[[0,1,1]],"op":"forward"}],"op":"forward"}],"op":"forward"})",
       R"(/edits/0/op: a forward's edits are copy_prefix or remove, got "forward")"},
      {R"({"batch":[[0,1,1]],"edits":[{"op":"copy\nprefix"}],"op":"forward"})",
       R"(/edits/0/op: a forward's edits are copy_prefix or remove, got "copy\nprefix")"},
      {R"({"batch":[[0,1,1]],"edits":[{"seq":0}],"op":"forward"})",
       "/edits/0/op: missing required field"},
      {R"({"batch":[[0,1,1]],"edits":[{"dst":1,"len":1,"op":"copy_prefix","src":0,"x":1}],"op":"forward"})",
       R"(/edits/0/x: unknown field for op "copy_prefix")"},
      {R"({"batch":[[0,1,1]],"edits":[{"begin":0,"op":"remove","seq":0}],"op":"forward","reserve":true})",
       "/edits: a reserve pass places nothing, so it has no edits before its Put"},
      {R"({"batch":[[0,1,1]],"edits":[{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}],"op":"forward"})",
       "/edits: too long: 17 entries (at most 16)"},
  };
  for (const auto& [event, want] : cases) {
    EXPECT_EQ(ErrorOf({kMultiSeqHeader, event}), "FILE:2: " + want) << event;
  }
  EXPECT_EQ(ErrorOf({kMultiSeqHeader, R"({"dst":1,"len":-1,"op":"copy_prefix","src":0})"}),
            "(read without error)");
}

}  // namespace
}  // namespace kvtwin::sim
