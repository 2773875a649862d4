// Goal: the kHybrid fuzz decoder (sim/fuzz_hybrid.cc) turns almost any byte string into a
// valid multi-sequence run that passes on correct caches, reaches every mechanism the
// MultiSeqDriver counts, records a trace that replays to the same digest and verdict, keeps
// the layout it advertises, and leaves a run in which planted production faults are seen.
// Method: a thousand inputs of pinned-seed random bytes through RunFuzzInput (the path
// the libFuzzer target takes), each replayed with ReplayTrace and re-driven through a
// MultiSeqDriver for its coverage; hand-built records whose fields are set by the layout's
// rule (field k = byte record_bytes - 1 - k) to check the value fields and the header
// decoding; and runs whose production state the test corrupts through mutable_cache().
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "sim/fuzz_input.h"
#include "sim/multi_seq_driver.h"
#include "sim/replay.h"
#include "sim/synthetic.h"
#include "sim/trace.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

const FuzzLayout& Layout() {
  static const FuzzLayout layout = LayoutOf(FuzzTarget::kHybrid);
  return layout;
}

std::vector<uint8_t> RandomInput(Rng& rng, size_t records) {
  std::vector<uint8_t> bytes(Layout().header_bytes + records * Layout().record_bytes);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng.Below(256));
  return bytes;
}

FuzzRun RunHybrid(const std::vector<uint8_t>& bytes) {
  return RunFuzzInput(FuzzTarget::kHybrid, bytes.data(), bytes.size());
}

// Drives the recorded events through a fresh driver, as the replay does, for the coverage
// the replay does not report for multiseq traces.
MultiSeqDriver Redrive(const Trace& trace) {
  MultiSeqDriver driver(trace.header.multiseq, TraceValueSeed(trace.header));
  for (const TraceEvent& e : trace.events) {
    if (driver.Apply(std::get<MsOp>(e))) break;
  }
  return driver;
}

// A record with every field zero but those given (field k is byte record_bytes - 1 - k).
std::vector<uint8_t> Record(const std::vector<std::pair<size_t, uint8_t>>& fields) {
  std::vector<uint8_t> r(Layout().record_bytes, 0);
  for (const auto& [k, value] : fields) r[Layout().record_bytes - 1 - k] = value;
  return r;
}

// Header: unbounded window, 8 sequences, capacity 16, max_batch 16, one conv layer. Header
// fields are read like record fields: field k is byte header_bytes - 1 - k.
std::vector<uint8_t> WideHeader() {
  std::vector<uint8_t> h(Layout().header_bytes, 0);
  auto field = [&h](size_t k) -> uint8_t& { return h[Layout().header_bytes - 1 - k]; };
  field(3) = 7;   // max_seqs 8
  field(4) = 4;   // capacity 16
  field(5) = 5;   // max_batch 16
  field(6) = 1;   // padding 1
  field(9) = 1;   // one conv layer
  field(12) = 1;  // shift callback installed
  return h;
}

// A forward over every sequence id (bitmask 0xFF), one token each, no reserve, no unequal
// counts, positions from the value fields; value field `value_field` set to (mode, arg).
std::vector<uint8_t> ForwardAllRecord(size_t value_field, uint8_t mode, uint8_t arg) {
  return Record({{0, 0},
                 {1, 0xFF},
                 {2, 1},
                 {4, 1},
                 {5, 1},
                 {11, 1},
                 {value_field, mode},
                 {value_field + 1, arg}});
}

std::vector<uint8_t> Concat(std::vector<uint8_t> a, const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string EventsJson(const Trace& trace) {
  std::string out;
  for (const TraceEvent& e : trace.events) out += EventToJson(e) + "\n";
  return out;
}

TEST(HybridFuzz, RandomInputsPassReplayAndCoverEveryMechanism) {
  Rng rng = Rng::Derive(20240611, "fuzz-hybrid-test");
  MsCoverage total;
  int64_t records = 0, events = 0;
  for (int i = 0; i < 1000; ++i) {
    const size_t n = static_cast<size_t>(rng.Range(0, static_cast<int64_t>(Layout().max_records)));
    const std::vector<uint8_t> bytes = RandomInput(rng, n);
    const FuzzRun run = RunHybrid(bytes);
    ASSERT_FALSE(run.divergence.has_value()) << "input " << i << ": " << *run.divergence;
    EXPECT_EQ(run.trace.header.source, "fuzz target hybrid");
    EXPECT_EQ(run.events, static_cast<int64_t>(run.trace.events.size()));
    const ReplayResult replay = ReplayTrace(run.trace);
    ASSERT_TRUE(replay.passed()) << "input " << i << ": " << replay.verdict();
    EXPECT_EQ(replay.digest, run.digest) << "input " << i;
    EXPECT_EQ(replay.events, run.events) << "input " << i;
    total += Redrive(run.trace).coverage();
    records += static_cast<int64_t>(n);
    events += run.events;
  }
  // Every record resolves to a valid op (clamped values, indices into the sequences that
  // exist): a skipped record is a byte string the fuzzer mutates for nothing.
  EXPECT_EQ(events, records);
  // Far positions and ids past 64 are the seeded runs' (MultiSeqConfigForSeed): the fuzz
  // records resolve positions up to 2^24 and draw at most kMaxSeqs sequences. Caches and
  // positions of kBigCells are `multiseq --huge`'s: a fuzz header draws caches of a few dozen
  // cells, where an execution stays fast.
  const std::set<std::string_view> seeded_only = {"far_batches", "last_position_batches",
                                                  "high_id_batches", "big_cache_forwards",
                                                  "deep_batches"};
  for (const auto& [name, member] : MsCoverage::Fields()) {
    if (seeded_only.contains(name)) {
      EXPECT_EQ(total.*member, 0) << name << ": the fuzz records reach it now; drop the exemption";
    } else {
      EXPECT_GT(total.*member, 0) << name;
    }
  }
  RecordProperty("coverage", total.ToString());
}

TEST(HybridFuzz, SameBytesGiveTheSameRun) {
  Rng rng = Rng::Derive(7, "fuzz-hybrid-determinism");
  for (int i = 0; i < 20; ++i) {
    const std::vector<uint8_t> bytes = RandomInput(rng, Layout().max_records);
    const FuzzRun a = RunHybrid(bytes), b = RunHybrid(bytes);
    EXPECT_EQ(a.digest, b.digest);
    EXPECT_EQ(a.events, b.events);
    EXPECT_EQ(a.trace.header, b.trace.header);
    EXPECT_EQ(EventsJson(a.trace), EventsJson(b.trace));
    std::vector<uint8_t> other = bytes;
    other[Layout().header_bytes - 1 - 14] ^= 1;  // header field 14: the run seed
    EXPECT_NE(RunHybrid(other).digest, a.digest);
  }
}

TEST(HybridFuzz, EveryHeaderByteValueGivesALegalShape) {
  Rng rng = Rng::Derive(3, "fuzz-hybrid-headers");
  for (size_t byte = 0; byte < Layout().header_bytes; ++byte) {
    std::vector<uint8_t> header = RandomInput(rng, 0);
    for (int value = 0; value < 256; ++value) {
      header[byte] = static_cast<uint8_t>(value);
      const FuzzRun run = RunHybrid(header);  // decoding aborts on an illegal shape
      EXPECT_TRUE(run.trace.header.multiseq.Validate().ok());
      EXPECT_EQ(run.trace.header.multiseq.conv, ConvExpectation::kAsSpecified);
      EXPECT_FALSE(run.divergence.has_value()) << *run.divergence;
    }
  }
}

// The spare bits of the header reach the shapes at Init's rare branches (spec §2.8), which
// the table values alone never meet; each is a separate way for the derived memory or cell
// count to go wrong.
TEST(HybridFuzz, HeadersReachTheRareBranchesOfInit) {
  Rng rng = Rng::Derive(5, "fuzz-hybrid-init-corners");
  std::map<std::string, int> seen;
  for (int i = 0; i < 4000; ++i) {
    const MultiSeqConfig c = RunHybrid(RandomInput(rng, 0)).trace.header.multiseq;
    const bool windowed = c.window != kvtwin::kUnbounded;
    const bool stated = c.memory != kvtwin::kUnbounded;
    if (windowed && c.max_seqs > 1 && c.capacity == c.window + 1 &&
        (stated ? c.memory : c.window) < c.capacity) {
      ++seen["stop-token cell reaches the capacity"];
    }
    if (windowed && stated && c.memory < c.window) {
      ++seen[c.max_seqs > 1 ? "memory below the window, raised"
                            : "memory below the window, rescued"];
    }
    if (!windowed && stated) ++seen["unbounded window with a memory"];
    if (c.capacity <= 3) ++seen["capacity below 4"];
    if (c.max_batch == 3 || c.max_batch == 5) ++seen["max_batch no power of two"];
    if (c.padding == 2 || c.padding == 3) ++seen["padding 2 or 3"];
  }
  for (const char* corner :
       {"stop-token cell reaches the capacity", "memory below the window, raised",
        "memory below the window, rescued", "unbounded window with a memory", "capacity below 4",
        "max_batch no power of two", "padding 2 or 3"}) {
    EXPECT_GT(seen[corner], 0) << corner;
  }
}

TEST(HybridFuzz, ValueFieldsSetTheirSequencesPositions) {
  ASSERT_EQ(Layout().value_fields.size(), 8u);
  for (size_t s = 0; s < Layout().value_fields.size(); ++s) {
    const size_t k = Layout().value_fields[s];
    std::set<int64_t> positions;
    for (uint8_t mode = 0; mode < kValueModes; ++mode) {
      const FuzzRun run = RunHybrid(Concat(WideHeader(), ForwardAllRecord(k, mode, 20)));
      ASSERT_EQ(run.events, 1) << "field " << k;
      const MsOp& op = std::get<MsOp>(run.trace.events[0]);
      ASSERT_EQ(op.kind, MsOpKind::kForward);
      ASSERT_EQ(op.batch.size(), 8u);
      // Sequence s is batch token s (ascending ids, no rotation); no sequence holds
      // anything, so every anchor is 0 and the window is the unbounded stand-in 4.
      const int64_t expected = std::max<int64_t>(0, ResolveValue(mode, 20, {0, 4, {}, {}}));
      EXPECT_EQ(op.batch[s].seq, static_cast<int32_t>(s));
      EXPECT_EQ(op.batch[s].pos, expected) << "field " << k << " mode " << int{mode};
      positions.insert(op.batch[s].pos);
    }
    EXPECT_GE(positions.size(), 3u) << "mode byte of field " << k << " barely matters";
  }
}

TEST(HybridFuzz, RemoveValueFieldsAimAtTheRetainedRange) {
  // s0 prefills positions 0..7, then Remove(s0, begin, end) with both ends in kSnapshotEnd
  // mode: begin = first retained (0) + 1, end = last retained (7) + 1 - 1.
  const std::vector<uint8_t> prefill = Record({{0, 0}, {2, 1}, {3, 6}, {4, 1}, {5, 1}});
  const size_t begin = Layout().value_fields[0], end = Layout().value_fields[1];
  const std::vector<uint8_t> remove =
      Record({{0, 11}, {2, 2}, {begin, 4}, {begin + 1, 4}, {end, 4}, {end + 1, 3}});
  const FuzzRun run = RunHybrid(Concat(Concat(WideHeader(), prefill), remove));
  ASSERT_EQ(run.events, 2);
  EXPECT_EQ(std::get<MsOp>(run.trace.events[0]).batch.size(), 8u);
  EXPECT_EQ(std::get<MsOp>(run.trace.events[1]), MsOp::Remove(0, 1, 7));
}

TEST(HybridFuzz, ARefusedRemoveLeavesAHalfEditedSequenceLaterRecordsReach) {
  const size_t v0 = Layout().value_fields[0], v1 = Layout().value_fields[1];
  const std::vector<uint8_t> records[] = {
      Record({{0, 0}, {2, 1}, {3, 5}, {4, 1}, {5, 1}, {12, 1}}),              // s0 writes 0..3
      Record({{0, 9}, {2, 1}, {v0, 0}, {v0 + 1, 8}}),                         // s1 forks all of s0
      Record({{0, 11}, {2, 2}, {v0, 1}, {v0 + 1, 1}, {v1, 1}, {v1 + 1, 2}}),  // cut [1, 2)
      Record({{0, 14}, {v0, 1}, {v0 + 1, 2}}),                                // CanResume(s0, 2)
  };
  std::vector<uint8_t> bytes = WideHeader();
  for (const std::vector<uint8_t>& r : records) bytes = Concat(bytes, r);
  const FuzzRun run = RunHybrid(bytes);
  ASSERT_FALSE(run.divergence.has_value()) << *run.divergence;
  ASSERT_EQ(run.events, 4);
  const MsOp& prefill = std::get<MsOp>(run.trace.events[0]);
  ASSERT_EQ(prefill.batch.size(), 4u);
  EXPECT_EQ(prefill.batch.front().pos, 0);
  EXPECT_EQ(prefill.batch.back().pos, 3);
  EXPECT_EQ(std::get<MsOp>(run.trace.events[1]), MsOp::CopyPrefix(0, 1, 4));
  // Positions 2 and 3 of s0 are shared with s1: the shift is refused half-way, and the
  // probe after it addresses the half-edited sequence.
  EXPECT_EQ(std::get<MsOp>(run.trace.events[2]), MsOp::Remove(0, 1, 2));
  EXPECT_EQ(std::get<MsOp>(run.trace.events[3]), MsOp::CanResume(0, 2));
  const MsCoverage coverage = Redrive(run.trace).coverage();
  EXPECT_EQ(coverage.removes_refused_shared, 1);
  EXPECT_EQ(coverage.half_edited_ops, 1);
}

TEST(HybridFuzz, TheContinueFieldDecodesAtEachSequencesNextPosition) {
  const size_t v0 = Layout().value_fields[0];
  const std::vector<uint8_t> prefill = Record({{0, 0}, {2, 1}, {3, 5}, {4, 1}, {5, 1}, {12, 1}});
  for (const uint8_t next : {uint8_t{0}, uint8_t{1}}) {
    // One token for s0, its value field saying absolute position 20.
    const std::vector<uint8_t> step =
        Record({{0, 0}, {4, 1}, {5, 1}, {11, next}, {12, 1}, {v0, 1}, {v0 + 1, 20}});
    const FuzzRun run = RunHybrid(Concat(Concat(WideHeader(), prefill), step));
    ASSERT_EQ(run.events, 2);
    const MsOp& op = std::get<MsOp>(run.trace.events[1]);
    ASSERT_EQ(op.batch.size(), 1u);
    EXPECT_EQ(op.batch[0].seq, 0);
    EXPECT_EQ(op.batch[0].pos, next == 0 ? 4 : 20);
  }
}

TEST(HybridFuzz, TheDescendFieldWritesEachRunHighToLow) {
  const std::vector<uint8_t> forward = Record({{0, 0}, {2, 1}, {3, 5}, {4, 1}, {5, 1}});
  const FuzzRun run = RunHybrid(Concat(WideHeader(), forward));
  ASSERT_EQ(run.events, 1);
  const MsOp& op = std::get<MsOp>(run.trace.events[0]);
  ASSERT_EQ(op.batch.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(op.batch[i].pos, static_cast<int64_t>(3 - i));
  EXPECT_EQ(Redrive(run.trace).coverage().unordered_batches, 1);
}

// A random run that left cells held and slots mapped, re-driven to its end.
MultiSeqDriver BusyDriver() {
  Rng rng = Rng::Derive(11, "fuzz-hybrid-busy");
  for (int i = 0; i < 200; ++i) {
    const FuzzRun run = RunHybrid(RandomInput(rng, Layout().max_records));
    MultiSeqDriver driver = Redrive(run.trace);
    if (driver.cache().kv().cells()[0].seqs.empty()) continue;
    if (!driver.cache().slot_of(*driver.cache().kv().cells()[0].seqs.begin())) continue;
    return driver;
  }
  ADD_FAILURE() << "no busy run among 200 random inputs";
  return MultiSeqDriver(MultiSeqConfig{}, 1);
}

TEST(HybridFuzz, APlantedWrongKeyRowInAFuzzedRunIsReported) {
  MultiSeqDriver driver = BusyDriver();
  ASSERT_FALSE(driver.CheckNow().has_value());
  ShiftPositionTag(driver.mutable_cache().mutable_kv().mutable_k(), 0, +1);
  const std::optional<MsDivergence> d = driver.CheckNow();
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->mismatch.what.find("cell 0"), std::string::npos) << d->ToString();
}

TEST(HybridFuzz, APlantedFreedSlotInAFuzzedRunIsReported) {
  MultiSeqDriver driver = BusyDriver();
  const int32_t seq = *driver.cache().kv().cells()[0].seqs.begin();
  driver.mutable_cache().FreeSlot(*driver.cache().slot_of(seq));  // still mapped
  const std::optional<MsDivergence> d = driver.CheckNow();
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->mismatch.what.find("free-list entries of slot"), std::string::npos) << d->ToString();
}

}  // namespace
}  // namespace kvtwin::sim
