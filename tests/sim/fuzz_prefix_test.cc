// Goal: the kPrefix fuzz family (sim/fuzz_prefix.cc) turns bytes into valid request plans
// that reach the prefix manager's mechanisms, records them as a trace that replays to the
// same verdict and digest, lays its input out as sim/fuzz_input.h promises, and is
// deterministic. Method: a few hundred inputs of pinned random bytes (kvtwin::Rng) through
// RunFuzzInput; every run must pass on the correct manager and replay (from memory, and a
// few through a trace file) to its digest; coverage is summed from the replays, page-ins
// counted by re-driving the plans; every plan is checked against RequestPlan's invariants;
// every listed value field is flipped between modes (m and m + 5 must decode alike, some
// modes must not); a hand-made header decodes to the documented stack.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "sim/fuzz_families.h"
#include "sim/fuzz_input.h"
#include "sim/replay.h"
#include "sim/request_driver.h"
#include "sim/stack.h"
#include "sim/trace.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

constexpr int kInputs = 300;
constexpr int32_t kVocab = 8;  // 1..4, and the rare tokens 5..8 (bytes 240..255)
constexpr size_t kConversations = 4;
constexpr size_t kPromptMax = 60;

using Bytes = std::vector<uint8_t>;

// A header and 1..max_records records, sometimes with a trailing partial record (ignored).
Bytes RandomInput(Rng& rng) {
  const FuzzLayout layout = LayoutOf(FuzzTarget::kPrefix);
  const auto records = static_cast<size_t>(rng.Range(1, static_cast<int64_t>(layout.max_records)));
  size_t size = layout.header_bytes + records * layout.record_bytes;
  if (rng.Chance(1, 8)) size += static_cast<size_t>(rng.Below(layout.record_bytes));
  Bytes bytes(size);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng.Below(256));
  return bytes;
}

std::vector<Bytes> RandomInputs(uint64_t seed, int count) {
  Rng rng = Rng::Derive(seed, "fuzz-prefix-test");
  std::vector<Bytes> inputs;
  for (int i = 0; i < count; ++i) inputs.push_back(RandomInput(rng));
  return inputs;
}

FuzzRun RunPrefix(const Bytes& bytes) {
  return RunFuzzInput(FuzzTarget::kPrefix, bytes.data(), bytes.size());
}

const RequestPlan& PlanAt(const Trace& trace, size_t i) {
  return std::get<RequestPlan>(trace.events[i]);
}

// The whole trace as text: equal plans <=> equal text (the writer keeps every field).
std::string TraceText(const Trace& trace) {
  std::string s = HeaderToJson(trace.header) + "\n";
  for (const TraceEvent& e : trace.events) s += EventToJson(e) + "\n";
  return s;
}

// Requests whose Begin restored more than the live caches could have kept: cached beyond
// the prefix the prompt shares with what the previous session stored, so some cache was
// paged in from a trie snapshot. Drives the plans as the replay does.
int64_t CountPageIns(const Trace& trace) {
  const TraceHeader& h = trace.header;
  RequestDriver driver(
      StackFromPreset(h.preset, h.layers, h.window, *ParseStackDTypes(h.dtype)).value(),
      TraceDriverOptions(h), TraceValueSeed(h));
  std::vector<int32_t> previous;
  int64_t page_ins = 0;
  for (size_t i = 0; i < trace.events.size(); ++i) {
    const RequestPlan& plan = PlanAt(trace, i);
    if (driver.Run(plan)) break;
    const auto shared = static_cast<int64_t>(
        std::mismatch(previous.begin(), previous.end(), plan.inputs.begin(), plan.inputs.end())
            .first -
        previous.begin());
    page_ins += driver.last_report().cached > shared;
    previous = plan.inputs;
    if (plan.cancel_after_tokens < 0) {
      previous.insert(previous.end(), plan.outputs.begin(), plan.outputs.end());
    }
  }
  return page_ins;
}

TEST(PrefixFuzz, RandomInputsPassAndReplayToTheSameDigest) {
  for (const Bytes& bytes : RandomInputs(1, kInputs)) {
    const FuzzRun run = RunPrefix(bytes);
    ASSERT_FALSE(run.divergence.has_value()) << *run.divergence << "\n" << TraceText(run.trace);
    EXPECT_TRUE(run.divergence_kind.empty());
    EXPECT_EQ(run.trace.header.kind, TraceKind::kRequests);
    EXPECT_EQ(run.trace.header.source, "fuzz target prefix");
    EXPECT_EQ(run.events, static_cast<int64_t>(run.trace.events.size()));
    // Every whole record (up to max_records) becomes one request.
    const FuzzLayout layout = LayoutOf(FuzzTarget::kPrefix);
    const size_t records = (bytes.size() - layout.header_bytes) / layout.record_bytes;
    EXPECT_EQ(run.events, static_cast<int64_t>(std::min(records, layout.max_records)));
    const ReplayResult replay = ReplayTrace(run.trace);
    ASSERT_TRUE(replay.passed()) << replay.verdict() << " " << replay.divergence.value_or("");
    EXPECT_EQ(replay.digest, run.digest);
    EXPECT_EQ(replay.events, run.events);
  }
}

TEST(PrefixFuzz, RecordedTracesRoundTripThroughAFile) {
  const std::string path =
      (std::filesystem::path(testing::TempDir()) / "fuzz_prefix_round_trip.jsonl").string();
  for (const Bytes& bytes : RandomInputs(2, 20)) {
    const FuzzRun run = RunPrefix(bytes);
    ASSERT_TRUE(WriteTrace(path, run.trace).ok());
    const Result<Trace> read = ReadTrace(path);
    ASSERT_TRUE(read.ok()) << read.status().ToString() << "\n" << TraceText(run.trace);
    EXPECT_EQ(TraceText(*read), TraceText(run.trace));
    const ReplayResult replay = ReplayFile(path, {});
    EXPECT_TRUE(replay.passed()) << replay.verdict();
    EXPECT_EQ(replay.digest, run.digest);
  }
  std::filesystem::remove(path);
}

TEST(PrefixFuzz, RandomInputsReachEvictionsSplitsCancelsSpeculationAndPageIns) {
  RequestCoverage c;
  int64_t page_ins = 0, unlimited = 0, rare_tokens = 0, media_tokens = 0, far_points = 0;
  for (const Bytes& bytes : RandomInputs(1, kInputs)) {
    const FuzzRun run = RunPrefix(bytes);
    c += ReplayTrace(run.trace).coverage;
    page_ins += CountPageIns(run.trace);
    unlimited += run.trace.header.budget_bytes == 0;
    for (size_t i = 0; i < run.trace.events.size(); ++i) {
      for (const int32_t t : PlanAt(run.trace, i).inputs) {
        rare_tokens += t > 4;
        media_tokens += t < 0;
      }
      for (const int64_t u : PlanAt(run.trace, i).user_offsets)
        far_points += u > static_cast<int64_t>(kPromptMax);
    }
  }
  SCOPED_TRACE(fmt::format("{}; page-ins {}; rare tokens {}; media tokens {}; far points {}",
                           c.ToString(), page_ins, rare_tokens, media_tokens, far_points));
  for (const int64_t counter : {c.evictions,       c.eviction_passes,   c.splits,
                                c.cancelled,       c.speculative,       c.cache_hits,
                                c.completed,       c.extensions,        c.dropped_tails,
                                c.divergent,       c.new_conversations, c.repeats,
                                c.retries,         c.user_offsets,      c.unscheduled,
                                c.continuations,   c.resumed_exactly,   c.branch_points,
                                page_ins,          unlimited,           rare_tokens,
                                c.forwarded_last,  c.past_stop,         c.isolated_probes,
                                c.abandoned_steps, c.session_budgets,   media_tokens,
                                far_points}) {
    EXPECT_GT(counter, 0);
  }
}

void ExpectValidPlan(const RequestPlan& p, size_t position) {
  SCOPED_TRACE(p.ToString());
  EXPECT_EQ(p.index, static_cast<int64_t>(position));
  EXPECT_LT(static_cast<size_t>(p.conversation), kConversations);
  EXPECT_FALSE(p.inputs.empty());
  EXPECT_LE(p.inputs.size(), kPromptMax);
  const bool cancelled = p.cancel_after_tokens >= 0;
  EXPECT_TRUE(cancelled || !p.outputs.empty());
  // Prompts may hold an image span's fold value (bit 31 set: INT32_MIN or -1); outputs are
  // text.
  for (const int32_t t : p.inputs) {
    EXPECT_TRUE((t >= 1 && t <= kVocab) ||
                std::ranges::find(kExtremeFolds, t) != kExtremeFolds.end())
        << t;
  }
  for (const int32_t t : p.outputs) EXPECT_TRUE(t >= 1 && t <= kVocab) << t;
  for (const int64_t u : p.user_offsets) EXPECT_GE(u, 1);
  EXPECT_TRUE(p.budget_pct >= 0 && p.budget_pct <= 10000);
  EXPECT_TRUE(p.speculation.empty() || !cancelled);
  EXPECT_TRUE(p.unforwarded == 1 || !cancelled);
  EXPECT_TRUE(cancelled || (p.unforwarded >= 0 && p.unforwarded <= std::ssize(p.outputs)))
      << p.unforwarded;
  int64_t from = 0;
  for (const SpeculativeStep& s : p.speculation) {
    EXPECT_GE(s.step, from);
    EXPECT_GE(s.accepted, 0);
    EXPECT_LE(s.end(), p.decoded_outputs());
    from = s.end();
    if (s.abandoned) {
      // The last step, at the forward of the last sampled token, which it leaves unforwarded.
      EXPECT_EQ(&s, &p.speculation.back());
      EXPECT_EQ(s.step, p.decoded_outputs());
      EXPECT_EQ(s.accepted, 0);
      EXPECT_EQ(p.unforwarded, 1);
      continue;
    }
    if (!s.rejected.empty() && s.end() <= static_cast<int64_t>(p.outputs.size())) {
      EXPECT_NE(s.rejected.front(), p.outputs[static_cast<size_t>(s.step + s.accepted)]);
    }
  }
}

TEST(PrefixFuzz, EveryPlanKeepsTheRequestPlanInvariants) {
  for (const Bytes& bytes : RandomInputs(3, kInputs)) {
    const FuzzRun run = RunPrefix(bytes);
    for (size_t i = 0; i < run.trace.events.size(); ++i) {
      ExpectValidPlan(PlanAt(run.trace, i), i);
    }
  }
}

// The plans `bytes` decodes to with field `field` of record `record` set to `value`.
std::string PlansWith(Bytes bytes, size_t record, size_t field, uint8_t value) {
  const FuzzLayout layout = LayoutOf(FuzzTarget::kPrefix);
  bytes[layout.header_bytes + (record + 1) * layout.record_bytes - 1 - field] = value;
  return TraceText(RunPrefix(bytes).trace);
}

// Honest value fields: the listed byte is read as a mode (m and m + 5 decode alike) and its
// mode matters for some inputs; its argument (the next field) matters too.
TEST(PrefixFuzz, ListedValueFieldsAreModeBytes) {
  const FuzzLayout layout = LayoutOf(FuzzTarget::kPrefix);
  ASSERT_FALSE(layout.value_fields.empty());
  std::vector<Bytes> inputs = RandomInputs(4, 40);
  for (const size_t field : layout.value_fields) {
    SCOPED_TRACE(fmt::format("value field {}", field));
    ASSERT_LT(field + 1, layout.record_bytes);
    int mode_matters = 0, arg_matters = 0;
    Rng rng = Rng::Derive(field, "fuzz-prefix-honesty");
    for (const Bytes& bytes : inputs) {
      const size_t records = (bytes.size() - layout.header_bytes) / layout.record_bytes;
      const auto record = static_cast<size_t>(rng.Below(std::min(records, layout.max_records)));
      std::vector<std::string> by_mode;
      for (uint8_t m = 0; m < kValueModes; ++m) {
        by_mode.push_back(PlansWith(bytes, record, field, m));
        EXPECT_TRUE(by_mode.back() == PlansWith(bytes, record, field, static_cast<uint8_t>(m + 5)))
            << "mode bytes " << int{m} << " and " << m + 5 << " of record " << record
            << " decode differently";
      }
      std::sort(by_mode.begin(), by_mode.end());
      mode_matters += std::unique(by_mode.begin(), by_mode.end()) - by_mode.begin() > 1;
      arg_matters +=
          PlansWith(bytes, record, field + 1, 1) != PlansWith(bytes, record, field + 1, 2);
    }
    EXPECT_GT(mode_matters, 0);
    EXPECT_GT(arg_matters, 0);
  }
}

// Byte 9 first (FuzzedDataProvider reads from the end): preset, layers, window, dtype,
// budget, chunk, interval, pre-thinking, then the 16-bit seed.
TEST(PrefixFuzz, HeaderBytesPickTheStackAndCadence) {
  const FuzzLayout layout = LayoutOf(FuzzTarget::kPrefix);
  ASSERT_EQ(layout.header_bytes, 10u);
  Bytes zeros(layout.header_bytes + layout.record_bytes, 0);
  const TraceHeader z = RunPrefix(zeros).trace.header;
  EXPECT_EQ(z.preset, PresetNames()[0]);
  EXPECT_EQ(z.layers, 1);
  EXPECT_EQ(z.window, 1);
  EXPECT_EQ(z.dtype, "f32");
  EXPECT_EQ(z.budget_bytes, 0);
  EXPECT_EQ(z.chunk, 1);
  EXPECT_EQ(z.capture_interval, 0);
  EXPECT_EQ(z.pre_thinking, 0);
  Bytes picked = zeros;
  const uint8_t header[] = {0x12, 0x34, 5, 7, 4, 1, 1, 7, 3, 3};
  std::copy(std::begin(header), std::end(header), picked.begin());
  const TraceHeader h = RunPrefix(picked).trace.header;
  EXPECT_EQ(h.preset, PresetNames()[3]);
  EXPECT_EQ(h.layers, 4);
  EXPECT_EQ(h.window, 8);
  EXPECT_EQ(h.dtype, "bf16");
  EXPECT_GT(h.budget_bytes, 0);
  EXPECT_EQ(h.chunk, 5);
  EXPECT_EQ(h.capture_interval, 7);
  EXPECT_EQ(h.pre_thinking, 5);
  EXPECT_NE(h.seed, z.seed);
  EXPECT_EQ(z.dims, ModelDims{});
  EXPECT_EQ(h.dims, ModelDims{});
  // Bit 1 of the dtype byte draws the widths; the run replays at them.
  picked[6] = 3;
  const FuzzRun wide = RunPrefix(picked);
  EXPECT_EQ(wide.trace.header.dtype, "bf16");
  EXPECT_EQ(wide.trace.header.dims, FuzzDimsOf(3));
  EXPECT_NE(wide.trace.header.dims, ModelDims{});
  EXPECT_EQ(ReplayTrace(wide.trace).digest, wide.digest);
}

TEST(PrefixFuzz, SameBytesGiveTheSameRun) {
  std::vector<uint64_t> digests;
  for (const Bytes& bytes : RandomInputs(5, 30)) {
    const FuzzRun a = RunPrefix(bytes);
    const FuzzRun b = RunPrefix(bytes);
    EXPECT_EQ(a.digest, b.digest);
    EXPECT_EQ(a.events, b.events);
    EXPECT_EQ(TraceText(a.trace), TraceText(b.trace));
    digests.push_back(a.digest);
  }
  std::sort(digests.begin(), digests.end());
  EXPECT_GT(std::unique(digests.begin(), digests.end()) - digests.begin(), 25);
}

}  // namespace
}  // namespace kvtwin::sim
