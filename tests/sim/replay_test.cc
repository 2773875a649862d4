// Goal: replay, shrinking and reports do what the CLI promises: a recorded run replays to
// the same digest as the run itself, from memory and from a file (ops, requests and
// multi-sequence runs); an event naming state
// that does not exist is an input error naming the event; the Mooncake replay's prefix
// reuse at an unlimited budget equals the independent block-level computation; the
// shrinker finds a known minimum; divergence kinds ignore node names and numbers; reports
// are exact and escape what they echo; a header's reach claims are floors on the coverage
// of a replay that passes.
#include "sim/replay.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "sim/mooncake.h"
#include "sim/multi_seq_run.h"
#include "sim/report.h"
#include "sim/requests.h"
#include "sim/run.h"
#include "sim/shrink.h"

namespace kvtwin::sim {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(testing::TempDir()) /
          (std::string(testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" + name))
      .string();
}

// Widths off every default, so a replay that built its stack without the header's dims
// would reach another digest.
ModelDims OffDefaultDims() {
  ModelDims d;
  d.kv_heads = 3;
  d.head_dim = 3;
  d.value_dim = 4;
  d.recurrent = {
      .conv_tail = 2, .num_k_heads = 1, .num_v_heads = 2, .head_k_dim = 4, .head_v_dim = 1};
  return d;
}

TEST(Replay, ARecordedOpRunReplaysToItsDigestFromMemoryAndFromAFile) {
  for (const char* preset : {"dense", "sliding", "recurrent", "mixed", "mixed-dims"}) {
    RunOptions o;
    o.preset = std::string(preset).substr(0, 5) == "mixed" ? "mixed" : preset;
    if (std::string(preset) == "mixed-dims") o.dims = OffDefaultDims();
    o.steps = 400;
    Trace trace;
    const RunResult run = RunSeed(o, 11, &trace);
    ASSERT_FALSE(run.divergence) << run.divergence->ToString();
    const ReplayResult mem = ReplayTrace(trace);
    EXPECT_TRUE(mem.passed()) << mem.verdict();
    EXPECT_EQ(mem.digest, run.digest) << preset;
    EXPECT_EQ(mem.events, 400);
    const std::string path = TempPath(std::string(preset) + ".jsonl");
    ASSERT_TRUE(WriteTrace(path, trace).ok());
    const ReplayResult file = ReplayFile(path, {});
    EXPECT_EQ(file.digest, run.digest) << preset;
  }
}

TEST(Replay, ARecordedRequestRunReplaysToItsDigest) {
  for (const bool dims : {false, true}) {
    RequestOptions o;
    o.seed = 4;
    o.requests = 40;
    o.budget_bytes = 3000;
    if (dims) o.dims = OffDefaultDims();
    Trace trace;
    const RequestResult run = RunRequests(o, &trace);
    ASSERT_FALSE(run.divergence);
    EXPECT_EQ(trace.header.dims, o.dims);
    const ReplayResult r = ReplayTrace(trace);
    EXPECT_TRUE(r.passed());
    EXPECT_EQ(r.digest, run.digest) << "dims " << dims;
    EXPECT_GT(r.prompt_tokens, 0);
    EXPECT_LE(r.cached_tokens, r.matched_tokens);
    const std::string path = TempPath(dims ? "dims.jsonl" : "default.jsonl");
    ASSERT_TRUE(WriteTrace(path, trace).ok());
    EXPECT_EQ(ReplayFile(path, {}).digest, run.digest) << "dims " << dims;
  }
}

TEST(Replay, ARecordedMultiSeqRunReplaysToItsDigestFromMemoryAndFromAFile) {
  // Seed 3 runs 129 sequences; 14 starts them just below 2^24; 99 and 269 near int32's
  // last position with a chunk boundary at its second-to-last or last position.
  for (const uint64_t seed : {1, 2, 3, 14, 99, 269}) {
    MultiSeqRunOptions o;
    o.steps = 300;
    Trace trace;
    const MultiSeqRunResult run = RunMultiSeq(o, seed, &trace);
    ASSERT_FALSE(run.divergence) << run.divergence->ToString();
    EXPECT_EQ(trace.header.kind, TraceKind::kMultiSeq);
    EXPECT_EQ(trace.header.multiseq, MultiSeqConfigForSeed(o, seed));
    EXPECT_EQ(trace.header.source, run.reproduce);
    const ReplayResult mem = ReplayTrace(trace);
    EXPECT_TRUE(mem.passed()) << mem.verdict()
                              << (mem.input_error ? mem.input_error->message() : "");
    EXPECT_EQ(mem.digest, run.digest) << seed;
    EXPECT_EQ(mem.events, 300);
    const std::string path = TempPath(fmt::format("multiseq{}.jsonl", seed));
    ASSERT_TRUE(WriteTrace(path, trace).ok());
    const ReplayResult file = ReplayFile(path, {});
    EXPECT_TRUE(file.passed()) << file.verdict();
    EXPECT_EQ(file.digest, run.digest) << seed;
  }
}

// The benchmark's clock stops in before_teardown: once per replay, after the last event,
// for every kind of trace.
TEST(Replay, BeforeTeardownRunsOnceAfterTheLastEventOfEveryKind) {
  std::vector<std::pair<std::string, Trace>> traces(3);
  RunOptions ops;
  ops.steps = 60;
  ASSERT_FALSE(RunSeed(ops, 3, &traces[0].second).divergence);
  RequestOptions requests;
  requests.seed = 2;
  requests.requests = 12;
  ASSERT_FALSE(RunRequests(requests, &traces[1].second).divergence);
  MultiSeqRunOptions multiseq;
  multiseq.steps = 40;
  ASSERT_FALSE(RunMultiSeq(multiseq, 1, &traces[2].second).divergence);
  traces[0].first = "ops";
  traces[1].first = "requests";
  traces[2].first = "multiseq";
  for (const auto& [kind, trace] : traces) {
    int64_t events = 0, calls = 0, events_at_call = -1;
    ReplayOptions options;
    options.on_event = [&](int64_t n) { events = n; };
    options.before_teardown = [&] {
      ++calls;
      events_at_call = events;
    };
    const ReplayResult r = ReplayTrace(trace, options);
    ASSERT_TRUE(r.passed()) << kind << ": " << r.verdict();
    EXPECT_EQ(calls, 1) << kind;
    EXPECT_EQ(events_at_call, r.events) << kind;
    EXPECT_GT(r.events, 0) << kind;
  }
}

TEST(Replay, AMultiSeqOpARunnerWouldNotIssueIsAnInputErrorAtThatEvent) {
  Trace t;
  t.header.kind = TraceKind::kMultiSeq;
  t.events = {MsOp::Forward({{0, 0, 5}}), MsOp::CanResume(0, -1)};
  const ReplayResult r = ReplayTrace(t);
  ASSERT_TRUE(r.input_error);
  EXPECT_EQ(r.input_error->message(),
            "event 1: /: can_resume s0 pos=-1 names a sequence, position, batch or edit inside a "
            "forward (those need conv \"as-specified\") that a correct runner would not issue at "
            "this point");
}

// Edits inside a forward bypass the hybrid's slots: an ideal run refuses them, at that event.
TEST(Replay, AForwardsEditsInAnIdealRunAreAnInputErrorAtThatEvent) {
  Trace t;
  t.header.kind = TraceKind::kMultiSeq;
  t.header.multiseq.conv = ConvExpectation::kIdeal;
  MsOp op = MsOp::Forward({{0, 1, 5}});
  op.edits = {MsOp::Remove(0, 0, kvtwin::kUnbounded)};
  t.events = {MsOp::Forward({{0, 0, 5}}), op};
  const ReplayResult r = ReplayTrace(t);
  ASSERT_TRUE(r.input_error);
  EXPECT_EQ(r.input_error->message(),
            "event 1: /: forward [s0@1:5] edits=[remove s0 [0, inf)] names a sequence, position, "
            "batch or edit inside a forward (those need conv \"as-specified\") that a correct "
            "runner would not issue at this point");
  t.header.multiseq.conv = ConvExpectation::kAsSpecified;
  EXPECT_TRUE(ReplayTrace(t).passed());
}

TEST(Replay, AnEventNamingAMissingSnapshotIsAnInputErrorAtThatEvent) {
  Trace t;
  t.header.kind = TraceKind::kOps;
  t.header.preset = "dense";
  t.header.layers = 1;
  Op write;
  write.tokens = {1, 2};
  Op restore;
  restore.kind = OpKind::kRestore;
  restore.slot = 3;  // nothing was pooled
  t.events = {write, restore};
  const ReplayResult r = ReplayTrace(t);
  ASSERT_TRUE(r.input_error);
  EXPECT_EQ(r.input_error->message(),
            "event 1: /: restore layer=0 snap=#3 target=0 names a layer or snapshot slot that "
            "does not exist at this point");
  EXPECT_STREQ(r.verdict(), "input error");
}

TEST(Replay, StopAfterReplaysAPrefix) {
  RunOptions o;
  o.steps = 50;
  Trace trace;
  RunSeed(o, 3, &trace);
  ReplayOptions options;
  options.stop_after = 9;
  const ReplayResult r = ReplayTrace(trace, options);
  EXPECT_EQ(r.events, 10);
  EXPECT_NE(r.state.find("layer 0 "), std::string::npos);
}

// A "reaches" claim is a floor on a passing replay's coverage: met at the count reached,
// short one above it (verdict "unreached", a line per claim naming the header and the
// counter), and not checked on a replay stopped early, whose coverage is partial.
TEST(Replay, ReachClaimsAreFloorsOnAPassingReplaysCoverage) {
  RequestOptions o;
  o.seed = 4;
  o.requests = 40;
  o.budget_bytes = 3000;
  Trace trace;
  ASSERT_FALSE(RunRequests(o, &trace).divergence);
  const ReplayResult plain = ReplayTrace(trace);
  ASSERT_TRUE(plain.passed());
  const int64_t evictions = plain.coverage.evictions;
  ASSERT_GT(evictions, 0);
  trace.header.reaches = {{"completed", plain.coverage.completed}, {"evictions", evictions}};
  EXPECT_TRUE(ReplayTrace(trace).passed());
  trace.header.reaches = {{"completed", 1}, {"evictions", evictions + 1}};
  const ReplayResult short_of = ReplayTrace(trace);
  EXPECT_FALSE(short_of.passed());
  EXPECT_STREQ(short_of.verdict(), "unreached");
  EXPECT_FALSE(short_of.divergence);
  EXPECT_EQ(short_of.digest, plain.digest);
  EXPECT_EQ(short_of.detail(),
            fmt::format("header: /reaches/evictions: reached {} time(s), the trace claims at "
                        "least {}",
                        evictions, evictions + 1));
  trace.header.reaches.push_back({"whole_state_copies", 1000});
  const std::string path = TempPath("short.jsonl");
  ASSERT_TRUE(WriteTrace(path, trace).ok());
  const ReplayResult file = ReplayFile(path, {});
  EXPECT_EQ(file.unreached.value_or(""),
            fmt::format("{0}:1: /reaches/evictions: reached {1} time(s), the trace claims at least "
                        "{2}; {0}:1: /reaches/whole_state_copies: reached {3} time(s), the trace "
                        "claims at least 1000",
                        path, evictions, evictions + 1, plain.coverage.whole_state_copies));
  ReplayOptions prefix;
  prefix.stop_after = 5;
  EXPECT_TRUE(ReplayTrace(trace, prefix).passed());

  MultiSeqRunOptions m;
  m.steps = 300;
  Trace ms;
  ASSERT_FALSE(RunMultiSeq(m, 1, &ms).divergence);
  const ReplayResult ms_plain = ReplayTrace(ms);
  ASSERT_TRUE(ms_plain.passed());
  const int64_t forwards = ms_plain.ms_coverage.forwards;
  ASSERT_GT(forwards, 0);
  ms.header.reaches = {{"forwards", forwards}};
  EXPECT_TRUE(ReplayTrace(ms).passed());
  ms.header.reaches = {{"forwards", forwards + 1}};
  EXPECT_EQ(ReplayTrace(ms).unreached.value_or(""),
            fmt::format("header: /reaches/forwards: reached {} time(s), the trace claims at least "
                        "{}",
                        forwards, forwards + 1));
}

// The localizing re-run audits every call and must replay the very workload the amortized
// run did (else a divergence could move or vanish under it): every bundled request workload,
// large tries and budgets included, gives the same digest, steps, prefix reuse and eviction
// passes both ways. (The squeeze's clock edits once followed the audit schedule: the Mooncake
// workload under a budget matched 418 tokens audited and 290 amortized.)
TEST(Replay, AnEveryCallAuditReplaysTheSameWorkload) {
  int64_t large = 0;
  for (const auto& e : std::filesystem::directory_iterator("traces/workloads")) {
    const std::string path = e.path().string();
    if (e.path().extension() != ".jsonl") continue;
    const ReplayResult amortized = ReplayFile(path, {});
    if (amortized.header.kind != TraceKind::kRequests) continue;
    ASSERT_TRUE(amortized.passed()) << path << ": " << amortized.detail();
    ReplayOptions every;
    every.audit_every_call = true;
    const ReplayResult audited = ReplayFile(path, every);
    ASSERT_TRUE(audited.passed()) << path << ": " << audited.detail();
    EXPECT_EQ(audited.digest, amortized.digest) << path;
    EXPECT_EQ(audited.steps, amortized.steps) << path;
    EXPECT_EQ(audited.matched_tokens, amortized.matched_tokens) << path;
    EXPECT_EQ(audited.cached_tokens, amortized.cached_tokens) << path;
    EXPECT_EQ(audited.coverage.eviction_passes, amortized.coverage.eviction_passes) << path;
    EXPECT_EQ(audited.coverage.audited_calls, audited.coverage.calls) << path;
    large += amortized.coverage.audited_calls < amortized.coverage.calls;
  }
  EXPECT_GE(large, 2) << "workloads whose trie outgrows the every-call audit";
}

// The acceptance check of the Mooncake import: at an unlimited budget the manager matches
// exactly the tokens the block ids say are shared (dense stack: every restore succeeds).
TEST(Replay, MooncakePrefixReuseEqualsTheBlockLevelComputation) {
  const std::string path = TempPath("mooncake.jsonl");
  {
    std::ofstream out(path);
    int64_t t = 0;
    for (int i = 0; i < 40; ++i) {
      // Shared first blocks, a branch every few requests, a short last block.
      // Ids form a prefix tree, as in Mooncake: the same id always has the same parent.
      const int64_t a = i % 3, b = 10 + i % 5, c = 1000 + i;
      out << "{\"timestamp\": " << t++ << ", \"input_length\": " << (i % 2 == 0 ? 1400 : 1536)
          << ", \"output_length\": 3, \"hash_ids\": [" << a << ", " << (a * 100 + b) << ", " << c
          << "]}\n";
    }
  }
  for (const int64_t scale : {1, 4, 32}) {
    ReplayOptions options;
    options.mooncake.block_scale = scale;
    options.mooncake.skip = scale == 4 ? 5 : 0;  // a later window starts cold in both
    options.mooncake_setup.preset = "dense";
    options.mooncake_setup.layers = 2;
    const ReplayResult r = ReplayFile(path, options);
    ASSERT_TRUE(r.passed()) << r.verdict() << r.divergence.value_or("");
    const Result<BlockReuse> want = MooncakeBlockReuse(path, options.mooncake);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(r.prompt_tokens, want->prompt_tokens) << "scale " << scale;
    EXPECT_EQ(r.matched_tokens, want->matched_tokens) << "scale " << scale;
    EXPECT_GT(want->matched_tokens, 0);
  }
}

// A production trace of another shape (Alibaba's Bailian/Qwen traces): 16-token blocks,
// fractional arrival times in seconds, chat and turn fields (ignored), and conversations
// whose every turn extends the last turn's ids. The manager still matches exactly what the
// ids share, at the recorded lengths and scaled down.
TEST(Replay, TraceOfSixteenTokenBlocksReusesWhatItsIdsShare) {
  const std::string path = TempPath("qwen-style.jsonl");
  {
    std::ofstream out(path);
    int64_t next_id = 100;
    std::vector<std::vector<int64_t>> chats(6);
    for (int turn = 0; turn < 4; ++turn) {
      for (size_t chat = 0; chat < chats.size(); ++chat) {
        std::vector<int64_t>& ids = chats[chat];
        if (ids.empty())
          ids = {static_cast<int64_t>(chat % 2), 10 + static_cast<int64_t>(chat % 2)};
        for (int k = 0; k <= turn % 3; ++k) ids.push_back(next_id++);
        // The last block is short in odd chats.
        const int64_t input = 16 * static_cast<int64_t>(ids.size()) - (chat % 2 == 1 ? 9 : 0);
        out << fmt::format(
            "{{\"chat_id\": {}, \"parent_chat_id\": {}, \"timestamp\": {:.3f}, \"input_length\": "
            "{}, \"output_length\": {}, \"type\": \"text\", \"turn\": {}, \"hash_ids\": [{}]}}\n",
            chat * 10 + turn, turn == 0 ? -1 : static_cast<int64_t>(chat * 10 + turn - 1),
            turn * 3.5 + static_cast<double>(chat) * 0.125, input, 5 + turn, turn + 1,
            fmt::join(ids, ", "));
      }
    }
  }
  for (const int64_t scale : {16, 4, 1}) {
    ReplayOptions options;
    options.mooncake.trace_block = 16;
    options.mooncake.block_scale = scale;
    options.mooncake_setup.preset = "dense";
    options.mooncake_setup.layers = 2;
    const ReplayResult r = ReplayFile(path, options);
    ASSERT_TRUE(r.passed()) << r.verdict() << r.divergence.value_or("");
    EXPECT_EQ(r.events, 24);
    const Result<BlockReuse> want = MooncakeBlockReuse(path, options.mooncake);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    EXPECT_EQ(r.prompt_tokens, want->prompt_tokens) << "scale " << scale;
    EXPECT_EQ(r.matched_tokens, want->matched_tokens) << "scale " << scale;
    EXPECT_GT(want->matched_tokens, want->prompt_tokens / 2) << "scale " << scale;
  }
  // Read as Mooncake's 512-token blocks, the first line is refused and names the fit.
  const ReplayResult wrong = ReplayFile(path, ReplayOptions{});
  ASSERT_TRUE(wrong.input_error.has_value());
  EXPECT_NE(wrong.input_error->message().find(
                ":1: /hash_ids: 3 ids, but input_length 48 needs ceil(48 / 512) = 1 "
                "(3 ids fit a trace of 16-token blocks: --trace-block 16)"),
            std::string::npos)
      << wrong.input_error->message();
}

TEST(DivergenceKind, KeepsTheCheckAndDropsNodeNamesAndNumbers) {
  EXPECT_EQ(DivergenceKind("layer 2 history: row 3 holds token 7"), "layer # history");
  EXPECT_EQ(DivergenceKind("node [0,8) keys 1 2 1 2 ...: layer 1 rotating snapshot range"),
            "layer # rotating snapshot range");
  EXPECT_EQ(DivergenceKind("root: snapshots"), "snapshots");
  EXPECT_EQ(DivergenceKind("Restore outcome"), "Restore outcome");
  EXPECT_EQ(DivergenceKind("trie after eviction pass #12 under budget 300 B, line 4: x"),
            "trie after eviction pass # under budget # B, line #");
}

// What the oracles below report: a divergence of `kind` at event `i`.
ReplayResult DivergesAt(const char* kind, size_t i) {
  ReplayResult r;
  r.divergence = r.divergence_kind = kind;
  r.failing_event = static_cast<int64_t>(i);
  return r;
}

// An oracle with a known minimum: the trace "diverges" (kind K) while it still holds a
// write containing token 7 after a write containing token 3, on at least one layer.
ReplayResult Oracle(const Trace& t) {
  bool three = false;
  for (size_t i = 0; i < t.events.size(); ++i) {
    const Op& op = std::get<Op>(t.events[i]);
    if (op.kind != OpKind::kWrite) continue;
    const bool has7 = std::find(op.tokens.begin(), op.tokens.end(), 7) != op.tokens.end();
    if (three && has7) return DivergesAt("K", i);
    three = three || std::find(op.tokens.begin(), op.tokens.end(), 3) != op.tokens.end();
  }
  return ReplayResult{};
}

TEST(Shrink, FindsTheKnownMinimumAndKeepsTheKind) {
  Trace t;
  t.header.kind = TraceKind::kOps;
  t.header.layers = 4;
  t.header.window = 8;
  for (int i = 0; i < 60; ++i) {
    Op op;
    op.tokens = {i % 11, 5, i % 13, 9};
    op.pad = i % 3;
    if (i % 7 == 2) {
      op.kind = OpKind::kFree;
      op.tokens.clear();
      op.pad = 0;
    }
    t.events.emplace_back(op);
  }
  ShrinkOptions options;
  options.replay = Oracle;
  const ShrinkResult r = Shrink(t, options);
  EXPECT_EQ(r.kind, "K");
  ASSERT_EQ(r.trace.events.size(), 2u);
  EXPECT_EQ(std::get<Op>(r.trace.events[0]).tokens, std::vector<int32_t>{3});
  EXPECT_EQ(std::get<Op>(r.trace.events[1]).tokens, std::vector<int32_t>{7});
  EXPECT_EQ(std::get<Op>(r.trace.events[1]).pad, 0);
  EXPECT_EQ(r.trace.header.layers, 1);
  EXPECT_EQ(r.trace.header.window, 1);
  EXPECT_EQ(r.original_events, 60);
}

// A request oracle: diverges (kind R) at the first request whose prompt holds token 7, its
// coverage's kv_gaps the number of conversation-2 requests before it.
ReplayResult RequestOracle(const Trace& t) {
  int64_t gaps = 0;
  for (size_t i = 0; i < t.events.size(); ++i) {
    const RequestPlan& p = std::get<RequestPlan>(t.events[i]);
    if (std::find(p.inputs.begin(), p.inputs.end(), 7) != p.inputs.end()) {
      ReplayResult r = DivergesAt("R", i);
      r.header = t.header;
      r.coverage.kv_gaps = gaps;
      return r;
    }
    gaps += p.conversation == 2;
  }
  return ReplayResult{};
}

// Kept reach claims bound the minimum from below: without them the failing request alone
// is left; keeping kv_gaps=2 keeps two conversation-2 requests before it (and no other).
TEST(Shrink, KeptReachClaimsHoldOfTheMinimum) {
  Trace t;
  for (int i = 0; i < 40; ++i) {
    RequestPlan p;
    p.conversation = i % 3;
    p.inputs = {1, 2, i == 33 ? 7 : 3};
    p.outputs = {4};
    t.events.emplace_back(p);
  }
  ShrinkOptions options;
  options.replay = RequestOracle;
  const ShrinkResult plain = Shrink(t, options);
  ASSERT_EQ(plain.trace.events.size(), 1u);
  options.keep_reaches = {{"kv_gaps", 2}};
  const ShrinkResult kept = Shrink(t, options);
  EXPECT_EQ(kept.kind, "R");
  ASSERT_EQ(kept.trace.events.size(), 3u);
  EXPECT_EQ(std::get<RequestPlan>(kept.trace.events[0]).conversation, 2);
  EXPECT_EQ(std::get<RequestPlan>(kept.trace.events[1]).conversation, 2);
  EXPECT_EQ(kept.last.coverage.kv_gaps, 2);
}

// Diverges on a write whose mask blocks key position 2 (a block's rect, a relax_block's
// block), wherever the mask also relaxes.
ReplayResult BlockOracle(const Trace& t) {
  for (size_t i = 0; i < t.events.size(); ++i) {
    const Op& op = std::get<Op>(t.events[i]);
    const bool blocks2 =
        (op.mask == MaskForm::kBlock && op.rect.k_lo <= 2 && 2 < op.rect.k_hi) ||
        (op.mask == MaskForm::kRelaxBlock && op.block.k_lo <= 2 && 2 < op.block.k_hi);
    if (blocks2) return DivergesAt("B", i);
  }
  return ReplayResult{};
}

// A mask holding a relaxation and a block is cut down to the side the failure needs: the
// block, as a block mask with the blocked rectangle.
TEST(Shrink, RelaxBlockMaskKeepsOnlyTheBlockThatMatters) {
  Trace t;
  t.header.kind = TraceKind::kOps;
  t.header.layers = 2;
  t.header.window = 4;
  Op op;
  op.tokens = {1, 2, 3, 4};
  for (int i = 0; i < 3; ++i) t.events.emplace_back(op);
  op.mask = MaskForm::kRelaxBlock;
  op.rect = MaskRect{12, 13, 13, 15};
  op.block = MaskRect{12, 16, 1, 3};
  t.events.emplace_back(op);
  ShrinkOptions options;
  options.replay = BlockOracle;
  const ShrinkResult r = Shrink(t, options);
  ASSERT_EQ(r.kind, "B");
  ASSERT_EQ(r.trace.events.size(), 1u);
  const Op& left = std::get<Op>(r.trace.events[0]);
  EXPECT_EQ(left.mask, MaskForm::kBlock) << left.ToString();
  EXPECT_EQ(left.rect, (MaskRect{12, 16, 1, 3}));
  EXPECT_EQ(left.block, MaskRect{});
}

// Multi-sequence oracle: diverges once sequence 2 has been forwarded at position 3 after a
// copy into it, and only when the forward carries at least two tokens of sequence 2.
ReplayResult MultiSeqOracle(const Trace& t) {
  bool copied = false;
  for (size_t i = 0; i < t.events.size(); ++i) {
    const MsOp& op = std::get<MsOp>(t.events[i]);
    if (op.kind == MsOpKind::kCopyPrefix && op.dst == 2) copied = true;
    if (op.kind != MsOpKind::kForward || !copied) continue;
    int64_t mine = 0;
    bool at3 = false;
    for (const MsBatchToken& b : op.batch) {
      mine += b.seq == 2;
      at3 = at3 || (b.seq == 2 && b.pos == 3);
    }
    if (at3 && mine >= 2) return DivergesAt("M", i);
  }
  return ReplayResult{};
}

// The multi-sequence passes: other sequences leave every batch, batches lose each
// sequence's last token while equal counts hold, and the cache shape shrinks.
TEST(Shrink, MultiSeqDropsUninvolvedSequencesAndShortensBatches) {
  Trace t;
  t.header.kind = TraceKind::kMultiSeq;
  t.header.multiseq.max_seqs = 4;
  t.header.multiseq.kv_cols = 8;
  t.header.multiseq.num_conv_layers = 2;
  t.events.emplace_back(MsOp::CopyPrefix(0, 2, 2));
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<MsBatchToken> batch;
    for (int32_t seq : {0, 1, 2, 3})
      for (int64_t k = 0; k < 4; ++k) batch.push_back({seq, step * 4 + k, seq + 1});
    t.events.emplace_back(MsOp::Forward(batch));
  }
  ShrinkOptions options;
  options.replay = MultiSeqOracle;
  const ShrinkResult r = Shrink(t, options);
  ASSERT_EQ(r.kind, "M");
  ASSERT_EQ(r.trace.events.size(), 2u);
  const MsOp& forward = std::get<MsOp>(r.trace.events[1]);
  for (const MsBatchToken& b : forward.batch) EXPECT_EQ(b.seq, 2) << forward.ToString();
  EXPECT_EQ(forward.batch.size(), 4u) << forward.ToString();  // positions 0..3: 3 is the last
  EXPECT_EQ(r.trace.header.multiseq.kv_cols, 1);
  EXPECT_EQ(r.trace.header.multiseq.num_conv_layers, 0);
}

// Diverges at a forward whose edits include a Remove of sequence 1.
ReplayResult EditOracle(const Trace& t) {
  for (size_t i = 0; i < t.events.size(); ++i) {
    const MsOp& op = std::get<MsOp>(t.events[i]);
    for (const MsOp& e : op.edits) {
      if (e.kind == MsOpKind::kRemove && e.seq == 1) return DivergesAt("E", i);
    }
  }
  return ReplayResult{};
}

// A forward's edits go one at a time: the one the divergence needs stays.
TEST(Shrink, MultiSeqDropsTheEditsADivergenceDoesNotNeed) {
  Trace t;
  t.header.kind = TraceKind::kMultiSeq;
  t.header.multiseq.max_seqs = 4;
  MsOp op = MsOp::Forward({{1, 0, 5}});
  op.edits = {MsOp::CopyPrefix(0, 1, 2), MsOp::Remove(1, 0, kvtwin::kUnbounded),
              MsOp::Remove(2, 0, kvtwin::kUnbounded)};
  t.events.emplace_back(op);
  ShrinkOptions options;
  options.replay = EditOracle;
  const ShrinkResult r = Shrink(t, options);
  ASSERT_EQ(r.kind, "E");
  ASSERT_EQ(r.trace.events.size(), 1u);
  EXPECT_EQ(std::get<MsOp>(r.trace.events[0]).edits,
            (std::vector<MsOp>{MsOp::Remove(1, 0, kvtwin::kUnbounded)}));
}

TEST(Report, JsonAndJunitAreExactAndEscaped) {
  CaseReport pass{"a.jsonl", "pass", "", "", "", 3, 7, 0x1234, 10, 6, 5};
  CaseReport fail{
      "b<&>.jsonl", "divergence", "layer # history", "row \"3\"", "kvtwin replay b", 2, 4, 0xff};
  const std::string json = SummaryJson("replay", {pass, fail});
  EXPECT_TRUE(json.starts_with(R"({"cases":[{"cached_tokens":5,"digest":"0000000000001234","eve)"));
  EXPECT_NE(json.find(R"("verdict":"fail")"), std::string::npos);
  EXPECT_NE(json.find(R"("detail":"row \"3\"")"), std::string::npos);
  EXPECT_EQ(SummaryJson("replay", {pass, fail}), json);  // byte-identical
  const std::string xml = JunitXml("kvtwin replay", {pass, fail});
  EXPECT_NE(xml.find(R"(<testsuite name="kvtwin replay" tests="2" failures="1" errors="0">)"),
            std::string::npos);
  EXPECT_NE(xml.find(R"(name="b&lt;&amp;&gt;.jsonl")"), std::string::npos);
  EXPECT_NE(xml.find(R"(<failure message="layer # history" type="divergence">row &quot;3&quot;)"),
            std::string::npos);
  EXPECT_NE(RunDigest({pass, fail}), RunDigest({fail, pass}));
}

}  // namespace
}  // namespace kvtwin::sim
