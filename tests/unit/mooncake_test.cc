// Goal: pin the Mooncake importer (sim/mooncake.h) and the block token functions
// (sim/trace.h) to their contracts: token ranges and determinism, every validation error
// with its exact "FILE:LINE: /pointer: reason" message, the scaled block lengths, the plan
// of a request, streaming with limits and trailing blank lines, and the block-level reuse
// computation, both on a hand-made file (numbers worked out by hand below) and on the
// recorded trace (../shared/traces-external) against a second, differently built
// computation: each prompt against every earlier prompt, token-level common prefix.
// Method: small files under testing::TempDir(); the recorded trace is read in place.
#include "sim/mooncake.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace kvtwin::sim {
namespace {

constexpr int64_t kTwo30 = int64_t{1} << 30;
constexpr int64_t kTwo31 = int64_t{1} << 31;

// The recorded trace sits next to the repository (../shared), found from this file so the
// test does not depend on the working directory.
std::string RecordedTrace() {
  const std::filesystem::path here(__FILE__);
  return (here.parent_path() / "../../../shared/traces-external/mooncake_synthetic_trace.jsonl")
      .lexically_normal()
      .string();
}

std::string Line(int64_t timestamp, int64_t input, int64_t output, std::vector<int64_t> ids) {
  return fmt::format(
      R"({{"timestamp": {}, "input_length": {}, "output_length": {}, "hash_ids": [{}]}})",
      timestamp, input, output, fmt::join(ids, ", "));
}

// A file under the test temp dir, named after the running test (ctest runs tests in
// parallel processes).
std::string WriteFile(const std::string& text, const std::string& name = "in") {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string path =
      testing::TempDir() +
      fmt::format("mooncake_{}_{}_{}.jsonl", info->test_suite_name(), info->name(), name);
  std::ofstream(path) << text;
  return path;
}

std::string Join(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  return text;
}

// The hand-made trace of the reuse tests: shared prefixes (lines 2-4), a short last block
// that a later request extends (id 3: 176, then 376, then 512 recorded tokens), a prompt
// that is a prefix of an earlier one (line 5), an unrelated prompt (line 6) and a full
// repeat (line 7).
std::string HandMadeTrace() {
  return Join({
      Line(0, 1200, 5, {1, 2, 3}),     // 512 512 176
      Line(1, 1100, 0, {1, 2, 4}),     // 512 512 76
      Line(2, 1400, 7, {1, 2, 3}),     // 512 512 376
      Line(2, 1600, 1, {1, 2, 3, 5}),  // 512 512 512 64
      Line(3, 700, 2, {1, 2}),         // 512 188
      Line(5, 300, 9, {6}),            // 300
      Line(5, 1536, 3, {1, 2, 3}),     // 512 512 512
  });
}

// Ids that break the prefix-tree rule of real traces (id 7 follows both 2 and 3), the only
// way a block after a partly covered one can have been seen: id 3 is first a short last
// block, later a full block followed by id 7.
std::string NonTreeTrace() {
  return Join({
      Line(0, 600, 1, {1, 3}),      // 512 88
      Line(0, 1024, 1, {2, 7}),     // 512 512
      Line(0, 1536, 1, {1, 3, 7}),  // 512 512 512
  });
}

Result<MooncakeRequest> Parse(const std::string& text, TraceTime previous_timestamp = -1,
                              int64_t block_tokens = kMooncakeBlockTokens) {
  return ParseMooncakeLine(text, "t.jsonl", 7, previous_timestamp, block_tokens);
}

std::string ParseError(const std::string& text, TraceTime previous_timestamp = -1,
                       int64_t block_tokens = kMooncakeBlockTokens) {
  auto r = Parse(text, previous_timestamp, block_tokens);
  EXPECT_FALSE(r.ok()) << text;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

std::vector<MooncakeRequest> ParseAll(const std::string& path) {
  std::vector<MooncakeRequest> requests;
  std::ifstream in(path);
  std::string text;
  int64_t line = 0;
  TraceTime last = -1;
  while (std::getline(in, text)) {
    ++line;
    if (text.empty()) continue;
    auto r = ParseMooncakeLine(text, path, line, last);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return {};
    last = r->timestamp;
    requests.push_back(std::move(r).value());
  }
  return requests;
}

// The second computation of prefix reuse: each prompt is compared with every earlier
// prompt that starts with the same block (no other prompt shares even its first token),
// walking blocks while the ids agree; when two equal ids have different scaled lengths the
// shorter block ends the common prefix (BlockTokens of the shorter is a prefix of the
// longer, and the next block starts with a different first token). Reuse is the longest
// common prefix with any earlier prompt.
BlockReuse PairwiseReuse(const std::vector<MooncakeRequest>& requests, int64_t block_scale) {
  std::vector<std::vector<int64_t>> lengths;
  std::map<int64_t, std::vector<size_t>> by_first_block;
  BlockReuse reuse;
  for (size_t k = 0; k < requests.size(); ++k) {
    const MooncakeRequest& r = requests[k];
    std::vector<int64_t>& mine = lengths.emplace_back();
    for (size_t i = 0; i < r.hash_ids.size(); ++i) {
      mine.push_back(ScaledBlockLength(r, i, block_scale));
      reuse.prompt_tokens += mine.back();
    }
    std::vector<size_t>& earlier = by_first_block[r.hash_ids[0]];
    int64_t best = 0;
    for (size_t m : earlier) {
      int64_t common = 0;
      const size_t n = std::min(r.hash_ids.size(), requests[m].hash_ids.size());
      for (size_t i = 0; i < n && r.hash_ids[i] == requests[m].hash_ids[i]; ++i) {
        common += std::min(mine[i], lengths[m][i]);
        if (mine[i] != lengths[m][i]) break;
      }
      best = std::max(best, common);
    }
    earlier.push_back(k);
    reuse.matched_tokens += best;
    ++reuse.requests;
  }
  return reuse;
}

// Token-level reuse of the plans at `block_scale`: each prompt's longest common prefix
// with any earlier prompt, by comparing the token vectors (small files only).
BlockReuse TokenLevelReuse(const std::string& path, int64_t block_scale) {
  BlockReuse reuse;
  auto reader = MooncakeReader::Open(path, {.block_scale = block_scale}, {});
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  if (!reader.ok()) return reuse;
  std::vector<std::vector<int32_t>> prompts;
  while (auto event = (*reader)->Next().value()) {
    const std::vector<int32_t>& p = std::get<RequestPlan>(*event).inputs;
    int64_t best = 0;
    for (const auto& q : prompts) {
      const auto diff = std::mismatch(p.begin(), p.end(), q.begin(), q.end());
      best = std::max<int64_t>(best, diff.first - p.begin());
    }
    reuse.prompt_tokens += static_cast<int64_t>(p.size());
    reuse.matched_tokens += best;
    ++reuse.requests;
    prompts.push_back(p);
  }
  return reuse;
}

TEST(BlockTokens, AreAFunctionOfIdAndLengthOnly) {
  EXPECT_EQ(BlockTokens(42, 64), BlockTokens(42, 64));
  EXPECT_NE(BlockTokens(42, 64), BlockTokens(43, 64));
  EXPECT_TRUE(BlockTokens(9, 0).empty());
  // A short block is a prefix of a longer block of the same id (short last blocks).
  const std::vector<int32_t> full = BlockTokens(9, 512);
  const std::vector<int32_t> part = BlockTokens(9, 100);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), full.begin()));
}

TEST(BlockTokens, ValuesArePinnedBecauseTracesStoreBlockIds) {
  // Traces with "blocks" are expanded through BlockTokens: these values are the format.
  EXPECT_EQ(BlockTokens(7, 4), (std::vector<int32_t>{8, 279115545, 174353761, 160262993}));
  EXPECT_EQ(GeneratedTokens(3, 3), (std::vector<int32_t>{1819919001, 2051164231, 1661184756}));
}

TEST(BlockTokens, StayInOneToTwoPow30) {
  for (int64_t id : {int64_t{0}, int64_t{1}, int64_t{511}, kTwo30 - 2, kTwo30 - 1, kTwo30,
                     int64_t{1} << 40, std::numeric_limits<int64_t>::max()}) {
    for (int32_t t : BlockTokens(id, 256)) {
      EXPECT_GE(t, 1) << id;
      EXPECT_LT(t, kTwo30) << id;
    }
  }
}

TEST(BlockTokens, FirstTokenIsOnePlusIdSoDistinctIdsDiffer) {
  std::set<int32_t> firsts;
  for (int64_t id = 0; id < 50'000; ++id) {
    const std::vector<int32_t> t = BlockTokens(id, 1);
    EXPECT_EQ(t[0], 1 + id);
    firsts.insert(t[0]);
  }
  EXPECT_EQ(firsts.size(), 50'000u);
  EXPECT_EQ(BlockTokens(kTwo30 - 2, 1)[0], kTwo30 - 1);  // the largest unfolded id
  // Larger ids fold modulo 2^30 - 1 (documented in block_tokens.cc).
  EXPECT_EQ(BlockTokens(kTwo30 - 1, 1)[0], 1);
  EXPECT_EQ(BlockTokens(kTwo30 + 4, 1)[0], 6);
}

TEST(BlockTokens, NegativeIdOrLengthIsAProgrammerError) {
  EXPECT_DEATH((void)BlockTokens(-1, 4), "non-negative");
  EXPECT_DEATH((void)BlockTokens(1, -4), "non-negative");
  EXPECT_DEATH((void)GeneratedTokens(1, -1), "non-negative");
}

TEST(GeneratedTokens, StayAboveEveryBlockTokenAndDifferPerRequest) {
  for (int64_t index = 0; index < 200; ++index) {
    const std::vector<int32_t> t = GeneratedTokens(index, 64);
    ASSERT_EQ(t.size(), 64u);
    EXPECT_EQ(t, GeneratedTokens(index, 64));
    for (int32_t token : t) {
      EXPECT_GE(token, kTwo30);
      EXPECT_LT(token, kTwo31 - 1);
    }
    EXPECT_NE(t, GeneratedTokens(index + 1, 64));
  }
}

TEST(ParseMooncakeLine, ReadsTheFourFieldsAndIgnoresExtraOnes) {
  auto r = Parse(R"({"timestamp": 27, "input_length": 513, "output_length": 0,
                     "hash_ids": [4, 9], "session": {"id": "x", "turns": [1, [2]]}, "p": null})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->timestamp, 27);
  EXPECT_EQ(r->input_length, 513);
  EXPECT_EQ(r->output_length, 0);
  EXPECT_EQ(r->hash_ids, (std::vector<int64_t>{4, 9}));
  EXPECT_TRUE(Parse(Line(5, 512, 1, {0}), 5).ok());  // equal timestamps are fine
}

TEST(ParseMooncakeLine, ReportsMalformedJsonAndNonObjects) {
  EXPECT_EQ(ParseError(R"({"timestamp": 0,)"), "t.jsonl:7: /: not valid JSON");
  EXPECT_EQ(ParseError("[1, 2]"), "t.jsonl:7: /: expected a JSON object, got an array");
  EXPECT_EQ(ParseError("17"), "t.jsonl:7: /: expected a JSON object, got 17");
}

TEST(ParseMooncakeLine, ReportsMissingFields) {
  EXPECT_EQ(ParseError(R"({"input_length": 1, "output_length": 1, "hash_ids": [0]})"),
            "t.jsonl:7: /timestamp: missing");
  EXPECT_EQ(ParseError(R"({"timestamp": 0, "input_length": 1, "hash_ids": [0]})"),
            "t.jsonl:7: /output_length: missing");
  EXPECT_EQ(ParseError(R"({"timestamp": 0, "input_length": 1, "output_length": 1})"),
            "t.jsonl:7: /hash_ids: missing");
}

TEST(ParseMooncakeLine, ReportsNegativeAndNonIntegerNumbers) {
  EXPECT_EQ(ParseError(Line(-1, 1, 1, {0})), "t.jsonl:7: /timestamp: must be >= 0, got -1");
  EXPECT_EQ(ParseError(Line(0, 0, 1, {})), "t.jsonl:7: /input_length: must be >= 1, got 0");
  EXPECT_EQ(ParseError(Line(0, 1, -3, {0})), "t.jsonl:7: /output_length: must be >= 0, got -3");
  EXPECT_EQ(ParseError(Line(0, 1, kTwo31, {0})),
            "t.jsonl:7: /output_length: must be <= 2147483647, got 2147483648");
  EXPECT_EQ(
      ParseError(R"({"timestamp": 0, "input_length": 2.5, "output_length": 1, "hash_ids": [0]})"),
      "t.jsonl:7: /input_length: expected an integer, got 2.5");
  EXPECT_EQ(
      ParseError(R"({"timestamp": "0", "input_length": 1, "output_length": 1, "hash_ids": [0]})"),
      "t.jsonl:7: /timestamp: expected a number, got a string");
  EXPECT_EQ(ParseError(R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": 3})"),
            "t.jsonl:7: /hash_ids: expected an array, got 3");
}

TEST(ParseMooncakeLine, ReportsBadHashIdsByIndex) {
  EXPECT_EQ(ParseError(R"({"timestamp": 0, "input_length": 1100, "output_length": 1,
                           "hash_ids": [0, 1.5, 2]})"),
            "t.jsonl:7: /hash_ids/1: expected an integer, got 1.5");
  EXPECT_EQ(ParseError(R"({"timestamp": 0, "input_length": 1100, "output_length": 1,
                           "hash_ids": [0, 1, null]})"),
            "t.jsonl:7: /hash_ids/2: expected an integer, got null");
  EXPECT_EQ(ParseError(Line(0, 1100, 1, {0, -4, 2})),
            "t.jsonl:7: /hash_ids/1: must be >= 0, got -4");
  EXPECT_EQ(ParseError(R"({"timestamp": 0, "input_length": 1, "output_length": 1,
                           "hash_ids": [18446744073709551615]})"),
            "t.jsonl:7: /hash_ids/0: must be <= 9223372036854775807, got 18446744073709551615");
}

TEST(ParseMooncakeLine, ReportsHashIdCountsThatDisagreeWithInputLength) {
  // Ids for the full blocks only: said so (not answered with a block size that fits).
  EXPECT_EQ(ParseError(Line(0, 1025, 1, {0, 1})),
            "t.jsonl:7: /hash_ids: 2 ids, but input_length 1025 needs ceil(1025 / 512) = 3 "
            "(the ids name only the full 512-token blocks: the last 1 token has no id)");
  EXPECT_EQ(ParseError(Line(0, 1024, 1, {0, 1, 2})),
            "t.jsonl:7: /hash_ids: 3 ids, but input_length 1024 needs ceil(1024 / 512) = 2");
  EXPECT_TRUE(Parse(Line(0, 1024, 1, {0, 1})).ok());
  // A trace of 16-token blocks read at Mooncake's 512, and the other way round.
  EXPECT_EQ(ParseError(Line(0, 40, 1, {0, 1, 2})),
            "t.jsonl:7: /hash_ids: 3 ids, but input_length 40 needs ceil(40 / 512) = 1 "
            "(3 ids fit a trace of 16-token blocks: --trace-block 16)");
  EXPECT_EQ(ParseError(Line(0, 1100, 1, {0, 1, 2}), -1, 16),
            "t.jsonl:7: /hash_ids: 3 ids, but input_length 1100 needs ceil(1100 / 16) = 69 "
            "(3 ids fit a trace of 512-token blocks: --trace-block 512)");
  EXPECT_EQ(ParseError(Line(0, 2, 1, {0, 1, 2})),  // more ids than tokens: nothing fits
            "t.jsonl:7: /hash_ids: 3 ids, but input_length 2 needs ceil(2 / 512) = 1");
  EXPECT_TRUE(Parse(Line(0, 33, 1, {0, 1, 2}), -1, 16).ok());
  EXPECT_EQ(ParseError(Line(0, 40, 1, {0, 1}), -1, 16),
            "t.jsonl:7: /hash_ids: 2 ids, but input_length 40 needs ceil(40 / 16) = 3 (the ids "
            "name only the full 16-token blocks: the last 8 tokens have no id)");
  EXPECT_EQ(ParseError(Line(0, 32, 1, {0, 1, 2}), -1, 16),  // only 11..15 fit: no power of two
            "t.jsonl:7: /hash_ids: 3 ids, but input_length 32 needs ceil(32 / 16) = 2");
}

// Other production traces in this format (Alibaba's Bailian/Qwen traces): 16-token blocks,
// arrival times in seconds with a fraction, and fields of their own.
TEST(ParseMooncakeLine, ReadsFractionalTimestampsAndATraceOfSmallerBlocks) {
  auto r = Parse(R"({"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 40,
                     "output_length": 12, "type": "text", "turn": 2, "hash_ids": [7, 8, 1036]})",
                 61.0, 16);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->timestamp, static_cast<TraceTime>(61.114));
  EXPECT_EQ(r->block_tokens, 16);
  EXPECT_EQ(r->hash_ids, (std::vector<int64_t>{7, 8, 1036}));
  // Its blocks: 16, 16 and a short last one of 8, at scale 16 (the recorded lengths), 4
  // and 1; the outputs ceil(12 · 4 / 16) = 3.
  EXPECT_EQ(ScaledBlockLength(*r, 0, 16), 16);
  EXPECT_EQ(ScaledBlockLength(*r, 2, 16), 8);
  EXPECT_EQ(ScaledBlockLength(*r, 1, 4), 4);
  EXPECT_EQ(ScaledBlockLength(*r, 2, 4), 2);
  EXPECT_EQ(ScaledBlockLength(*r, 2, 1), 1);
  EXPECT_EQ(MooncakePlan(*r, 0, 4).inputs.size(), 10u);
  EXPECT_EQ(MooncakePlan(*r, 0, 4).outputs, GeneratedTokens(0, 3));
  EXPECT_DEATH((void)ScaledBlockLength(*r, 0, 17), "scale");

  EXPECT_EQ(ParseError(Line(0, 40, 1, {7, 8, 1036}), 0.5, 16),
            "t.jsonl:7: /timestamp: 0 is before the previous request's 0.5 (timestamps never "
            "decrease)");
  EXPECT_EQ(ParseError(R"({"timestamp": 1.25, "input_length": 1, "output_length": 1,
                           "hash_ids": [0]})",
                       1.5),
            "t.jsonl:7: /timestamp: 1.25 is before the previous request's 1.5 (timestamps never "
            "decrease)");
  EXPECT_EQ(ParseError(R"({"timestamp": -0.5, "input_length": 1, "output_length": 1,
                           "hash_ids": [0]})"),
            "t.jsonl:7: /timestamp: must be >= 0, got -0.5");
  EXPECT_EQ(ParseError(R"({"timestamp": 1e400, "input_length": 1, "output_length": 1,
                           "hash_ids": [0]})"),
            "t.jsonl:7: /: not valid JSON");  // nlohmann's lexer: beyond double's range
  // Integer timestamps compare exactly at any size: epoch nanoseconds one apart.
  EXPECT_EQ(ParseError(Line(1'700'000'000'000'000'001, 1, 1, {0}), 1'700'000'000'000'000'002),
            "t.jsonl:7: /timestamp: 1700000000000000001 is before the previous request's "
            "1700000000000000002 (timestamps never decrease)");
  EXPECT_TRUE(Parse(Line(1'700'000'000'000'000'002, 1, 1, {0}), 1'700'000'000'000'000'001).ok());
}

TEST(ParseMooncakeLine, ReportsADecreasingTimestamp) {
  EXPECT_EQ(ParseError(Line(5, 1, 1, {0}), 10),
            "t.jsonl:7: /timestamp: 5 is before the previous request's 10 (timestamps never "
            "decrease)");
}

TEST(ScaledBlockLength, KeepsFullBlocksAtTheScaleAndShrinksTheShortLastBlock) {
  MooncakeRequest r;
  r.input_length = 1100;  // 512 + 512 + 76
  r.hash_ids = {1, 2, 3};
  // Scale 1: every block is one token, the short one too (at least 1).
  EXPECT_EQ(ScaledBlockLength(r, 0, 1), 1);
  EXPECT_EQ(ScaledBlockLength(r, 2, 1), 1);
  // Scale 16: ceil(76 · 16 / 512) = ceil(2.375) = 3.
  EXPECT_EQ(ScaledBlockLength(r, 1, 16), 16);
  EXPECT_EQ(ScaledBlockLength(r, 2, 16), 3);
  // Scale 512: the recorded lengths.
  EXPECT_EQ(ScaledBlockLength(r, 1, 512), 512);
  EXPECT_EQ(ScaledBlockLength(r, 2, 512), 76);
  r.input_length = 1024;  // a full last block is a full block
  EXPECT_EQ(ScaledBlockLength(r, 1, 16), 16);
  r.input_length = 1023;  // ceil(511 · 16 / 512) = 16
  EXPECT_EQ(ScaledBlockLength(r, 1, 16), 16);
  EXPECT_EQ(ScaledBlockLength(r, 1, 512), 511);
  r.input_length = 1;
  r.hash_ids = {8};
  EXPECT_EQ(ScaledBlockLength(r, 0, 16), 1);
  EXPECT_DEATH((void)ScaledBlockLength(r, 1, 16), "past");
  EXPECT_DEATH((void)ScaledBlockLength(r, 0, 513), "scale");
}

TEST(MooncakePlan, ConcatenatesScaledBlocksAndGeneratesScaledOutputs) {
  MooncakeRequest r;
  r.timestamp = 4;
  r.input_length = 600;  // 512 + 88
  r.output_length = 40;
  r.hash_ids = {5, 9};
  const RequestPlan plan = MooncakePlan(r, 3, 16);
  EXPECT_EQ(plan.index, 3);
  EXPECT_EQ(plan.kind, RequestKind::kNew);
  EXPECT_EQ(plan.conversation, 5);
  // 16 tokens of block 5, then ceil(88 · 16 / 512) = ceil(2.75) = 3 tokens of block 9.
  std::vector<int32_t> inputs = BlockTokens(5, 16);
  const std::vector<int32_t> last = BlockTokens(9, 3);
  inputs.insert(inputs.end(), last.begin(), last.end());
  EXPECT_EQ(plan.inputs, inputs);
  // ceil(40 · 16 / 512) = ceil(1.25) = 2 outputs.
  EXPECT_EQ(plan.outputs, GeneratedTokens(3, 2));
  EXPECT_EQ(plan.cancel_after_tokens, -1);
  EXPECT_TRUE(plan.schedule);

  r.output_length = 0;  // one token is always generated
  EXPECT_EQ(MooncakePlan(r, 3, 1).outputs, GeneratedTokens(3, 1));
  EXPECT_EQ(MooncakePlan(r, 3, 512).inputs.size(), 600u);
  r.hash_ids = {kTwo31 + 7, 9};  // the conversation label folds modulo 2^31
  EXPECT_EQ(MooncakePlan(r, 0, 1).conversation, 7);
}

TEST(MooncakeReader, StreamsRequestsWithIndexLineAndLimit) {
  const std::string path = WriteFile(HandMadeTrace() + "\n\n");  // blank lines at the end
  EXPECT_TRUE(LooksLikeMooncake(path));
  auto reader = MooncakeReader::Open(path, {.block_scale = 16, .limit = 0}, TraceHeader{});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->header().source, fmt::format("mooncake {} block_scale 16", path));
  EXPECT_EQ((*reader)->header().kind, TraceKind::kRequests);
  int64_t events = 0;
  while (true) {
    auto event = (*reader)->Next();
    ASSERT_TRUE(event.ok()) << event.status().ToString();
    if (!event->has_value()) break;
    const auto& plan = std::get<RequestPlan>(**event);
    EXPECT_EQ(plan.index, events);
    EXPECT_EQ((*reader)->line(), events + 1);
    ++events;
  }
  EXPECT_EQ(events, 7);

  auto limited = MooncakeReader::Open(path, {.block_scale = 1, .limit = 2}, TraceHeader{});
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ((*limited)->header().source, fmt::format("mooncake {} block_scale 1 limit 2", path));
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*limited)->Next().value().has_value());
  EXPECT_FALSE((*limited)->Next().value().has_value());

  // A later window: requests 3 and 4 (indices keep their place in the file).
  auto window = MooncakeReader::Open(path, {.block_scale = 1, .skip = 3, .limit = 2}, {});
  ASSERT_TRUE(window.ok());
  EXPECT_EQ((*window)->header().source,
            fmt::format("mooncake {} block_scale 1 skip 3 limit 2", path));
  for (const int64_t index : {3, 4}) {
    auto event = (*window)->Next();
    ASSERT_TRUE(event.ok() && event->has_value());
    EXPECT_EQ(std::get<RequestPlan>(**event).index, index);
  }
  EXPECT_FALSE((*window)->Next().value().has_value());
  EXPECT_EQ(MooncakeReader::Open(path, {.block_scale = 1, .skip = -1}, {}).status().message(),
            "mooncake request skip must be >= 0, got -1");
}

TEST(MooncakeBlockReuse, ASkippedWindowStartsCold) {
  const std::string path = WriteFile(HandMadeTrace());
  const Result<BlockReuse> all = MooncakeBlockReuse(path, {.block_scale = 1});
  const Result<BlockReuse> late = MooncakeBlockReuse(path, {.block_scale = 1, .skip = 3});
  ASSERT_TRUE(all.ok() && late.ok());
  EXPECT_EQ(all->requests, 7);
  EXPECT_EQ(late->requests, 4);
  // The window never saw the first three requests' blocks: it reuses no more than all did.
  EXPECT_LT(late->prompt_tokens, all->prompt_tokens);
  EXPECT_LE(late->matched_tokens, all->matched_tokens);
}

TEST(MooncakeReader, ReportsBadOptionsMissingFilesAndMidFileProblems) {
  const std::string path = WriteFile(Join({Line(0, 1, 1, {0}), "", Line(1, 1, 1, {1})}));
  EXPECT_EQ(MooncakeReader::Open(path, {.block_scale = 0}, {}).status().message(),
            "mooncake block scale must be in 1..512 (the trace block), got 0");
  EXPECT_EQ(
      MooncakeReader::Open(path, {.trace_block = 16, .block_scale = 32}, {}).status().message(),
      "mooncake block scale must be in 1..16 (the trace block), got 32");
  EXPECT_EQ(MooncakeReader::Open(path, {.trace_block = 0, .block_scale = 1}, {}).status().message(),
            "mooncake trace block must be in 1..1048576, got 0");
  EXPECT_EQ(MooncakeReader::Open(path, {.block_scale = 8, .limit = -1}, {}).status().message(),
            "mooncake request limit must be >= 0, got -1");
  EXPECT_EQ(MooncakeReader::Open(path + ".missing", {}, {}).status().code(), StatusCode::kIo);
  EXPECT_FALSE(LooksLikeMooncake(path + ".missing"));

  auto reader = MooncakeReader::Open(path, {}, {});
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)->Next().value().has_value());
  EXPECT_EQ((*reader)->Next().status().message(), path + ":2: /: blank line before a request");

  const std::string bad = WriteFile(Join({Line(3, 1, 1, {0}), Line(2, 1, 1, {1})}), "decreasing");
  auto decreasing = MooncakeReader::Open(bad, {}, {});
  ASSERT_TRUE(decreasing.ok());
  ASSERT_TRUE((*decreasing)->Next().ok());
  EXPECT_EQ(
      (*decreasing)->Next().status().message(),
      bad + ":2: /timestamp: 2 is before the previous request's 3 (timestamps never decrease)");
}

TEST(LooksLikeMooncake, WantsAnObjectWithHashIdsAndNoFormat) {
  EXPECT_TRUE(LooksLikeMooncake(WriteFile(Line(0, 1, 1, {0}) + "\n")));
  EXPECT_FALSE(LooksLikeMooncake(WriteFile(R"({"format":"kvtwin-trace","hash_ids":[]})", "trace")));
  EXPECT_FALSE(LooksLikeMooncake(WriteFile("not json\n", "text")));
  EXPECT_FALSE(LooksLikeMooncake(WriteFile("", "empty")));
}

TEST(MooncakeBlockReuse, MatchesHandComputedNumbers) {
  const std::string path = WriteFile(HandMadeTrace());
  // Scale 512 (recorded lengths). Matched per line: 0; 512 + 512 (id 4 unseen) = 1024;
  // 1024 + min(376, 176) = 1200 and stop (id 3 only partly computed); 1024 + 376 = 1400
  // and stop; 512 + min(188, 512) = 700 (a prefix of line 1); 0; 1536 (id 3 is 512 now).
  // Prompts: 1200 + 1100 + 1400 + 1600 + 700 + 300 + 1536 = 7836.
  auto r512 = MooncakeBlockReuse(path, {.block_scale = 512});
  ASSERT_TRUE(r512.ok()) << r512.status().ToString();
  EXPECT_EQ(r512->requests, 7);
  EXPECT_EQ(r512->prompt_tokens, 7836);
  EXPECT_EQ(r512->matched_tokens, 0 + 1024 + 1200 + 1400 + 700 + 0 + 1536);
  // Scale 16: full blocks 16, short ones ceil(r / 32): 176 -> 6, 76 -> 3, 376 -> 12,
  // 64 -> 2, 188 -> 6, 300 -> 10. Prompts 38 + 35 + 44 + 50 + 22 + 10 + 48 = 247;
  // matched 0 + 32 + (32 + 6) + (32 + 12) + (16 + 6) + 0 + 48 = 184.
  auto r16 = MooncakeBlockReuse(path, {.block_scale = 16});
  ASSERT_TRUE(r16.ok());
  EXPECT_EQ(r16->prompt_tokens, 247);
  EXPECT_EQ(r16->matched_tokens, 184);
  // Scale 1: every block is one token. Prompts 3 + 3 + 3 + 4 + 2 + 1 + 3 = 19;
  // matched 0 + 2 + 3 + 3 + 2 + 0 + 3 = 13.
  auto r1 = MooncakeBlockReuse(path, {.block_scale = 1});
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->prompt_tokens, 19);
  EXPECT_EQ(r1->matched_tokens, 13);
  EXPECT_DOUBLE_EQ(r1->ratio(), 13.0 / 19.0);
  // The first three lines only.
  auto limited = MooncakeBlockReuse(path, {.block_scale = 512, .limit = 3});
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->requests, 3);
  EXPECT_EQ(limited->prompt_tokens, 1200 + 1100 + 1400);
  EXPECT_EQ(limited->matched_tokens, 0 + 1024 + 1200);
}

TEST(MooncakeBlockReuse, StopsAtAPartlyCoveredBlockEvenWhenLaterIdsWereSeen) {
  // Line 3 reuses 512 + 88 tokens of line 1; that id 7 was seen (line 2) must not count,
  // since the token prefix already ended inside block 3. The token-level reuse agrees.
  const std::string path = WriteFile(NonTreeTrace());
  auto reuse = MooncakeBlockReuse(path, {.block_scale = 512});
  ASSERT_TRUE(reuse.ok()) << reuse.status().ToString();
  EXPECT_EQ(reuse->prompt_tokens, 600 + 1024 + 1536);
  EXPECT_EQ(reuse->matched_tokens, 512 + 88);
  EXPECT_EQ(TokenLevelReuse(path, 512).matched_tokens, 512 + 88);
}

TEST(MooncakeBlockReuse, EqualsTokenLevelPrefixReuseOfThePlans) {
  // The plans' token prompts, each against every earlier one: where ids form a prefix
  // tree (as in real traces) the block computation is exactly the token-level longest
  // common prefix (BlockTokens' contract).
  const std::string path = WriteFile(HandMadeTrace());
  for (int64_t scale : {1, 16, 100, 512}) {
    auto reuse = MooncakeBlockReuse(path, {.block_scale = scale});
    ASSERT_TRUE(reuse.ok());
    const BlockReuse expected = TokenLevelReuse(path, scale);
    EXPECT_EQ(reuse->prompt_tokens, expected.prompt_tokens) << scale;
    EXPECT_EQ(reuse->matched_tokens, expected.matched_tokens) << scale;
  }
}

TEST(MooncakeBlockReuse, OnTheRecordedTraceAgreesWithThePairwiseComputation) {
  const std::string path = RecordedTrace();
  // A clone outside the workspace has no ../shared: nothing recorded to compare against.
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no recorded trace at " << path;
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const std::vector<MooncakeRequest> requests = ParseAll(path);
  ASSERT_EQ(requests.size(), 3993u);
  for (int64_t scale : {1, 16, 512}) {
    auto reuse = MooncakeBlockReuse(path, {.block_scale = scale});
    ASSERT_TRUE(reuse.ok()) << reuse.status().ToString();
    const BlockReuse expected = PairwiseReuse(requests, scale);
    EXPECT_EQ(reuse->requests, 3993) << scale;
    EXPECT_EQ(reuse->prompt_tokens, expected.prompt_tokens) << scale;
    EXPECT_EQ(reuse->matched_tokens, expected.matched_tokens) << scale;
    // The README's totals: one token per block reference at scale 1, the recorded
    // input_length at 512.
    if (scale == 1) {
      EXPECT_EQ(reuse->prompt_tokens, 121'877);
    }
    if (scale == 512) {
      EXPECT_EQ(reuse->prompt_tokens, 61'194'628);
    }
  }
}

TEST(MooncakeReader, StreamsTheRecordedTraceAtScaleOne) {
  const std::string path = RecordedTrace();
  // A clone outside the workspace has no ../shared: nothing recorded to compare against.
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no recorded trace at " << path;
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  EXPECT_TRUE(LooksLikeMooncake(path));
  const std::vector<MooncakeRequest> requests = ParseAll(path);
  ASSERT_EQ(requests.size(), 3993u);
  auto reader = MooncakeReader::Open(path, {.block_scale = 1}, TraceHeader{});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  size_t events = 0;
  while (true) {
    auto event = (*reader)->Next();
    ASSERT_TRUE(event.ok()) << event.status().ToString();
    if (!event->has_value()) break;
    ASSERT_LT(events, requests.size());
    const MooncakeRequest& r = requests[events];
    const auto& plan = std::get<RequestPlan>(**event);
    int64_t expected = 0;
    for (size_t i = 0; i < r.hash_ids.size(); ++i) expected += ScaledBlockLength(r, i, 1);
    EXPECT_EQ(static_cast<int64_t>(plan.inputs.size()), expected) << "request " << events;
    EXPECT_EQ(plan.index, static_cast<int64_t>(events));
    EXPECT_GE(plan.outputs.size(), 1u);
    ++events;
  }
  EXPECT_EQ(events, 3993u);
}

TEST(ImportMooncake, WritesATraceThatReadsBackAsTheSamePlans) {
  const std::string in = WriteFile(HandMadeTrace());
  const std::string out = in + ".trace.jsonl";
  TraceHeader setup;
  setup.budget_bytes = 4096;
  auto written = ImportMooncake(in, out, {.block_scale = 16}, setup);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_EQ(*written, 7);
  auto trace = ReadTrace(out);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  EXPECT_EQ(trace->header.budget_bytes, 4096);
  EXPECT_EQ(trace->header.source, fmt::format("mooncake {} block_scale 16", in));
  auto reader = MooncakeReader::Open(in, {.block_scale = 16}, setup);
  ASSERT_TRUE(reader.ok());
  ASSERT_EQ(trace->events.size(), 7u);
  for (const TraceEvent& event : trace->events) {
    const auto expected = (*reader)->Next().value();
    ASSERT_TRUE(expected.has_value());
    const auto& a = std::get<RequestPlan>(event);
    const auto& b = std::get<RequestPlan>(*expected);
    EXPECT_EQ(a.index, b.index);
    EXPECT_EQ(a.conversation, b.conversation);
    EXPECT_EQ(a.inputs, b.inputs);
    EXPECT_EQ(a.outputs, b.outputs);
  }
}

TEST(ImportMooncake, LeavesNoOutputBehindOnAMalformedLine) {
  const std::string in = WriteFile(Join({Line(0, 1, 1, {0}), Line(1, 1, 1, {})}));
  const std::string out = in + ".trace.jsonl";
  std::filesystem::remove(out);
  auto written = ImportMooncake(in, out, {}, TraceHeader{});
  EXPECT_EQ(written.status().message(),
            in + ":2: /hash_ids: 0 ids, but input_length 1 needs ceil(1 / 512) = 1");
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace kvtwin::sim
