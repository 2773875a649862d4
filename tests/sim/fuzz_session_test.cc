// Goal: a FuzzSession's run of an input is exactly RunFuzzInput's, whatever the session ran
// before: the driver that the libFuzzer targets Reset between executions keeps nothing but
// buffer capacity, so a crash found by the fuzzer replays with `kvtwin replay --fuzz-input`.
// Method: for every structured target, a sequence of inputs (seed-corpus entries, and
// mutants of them whose headers change the stack shape, window, dtype and seed from one run
// to the next) through one session, alternating whether the trace is recorded, each compared
// with a fresh RunFuzzInput of the same bytes: report, divergence kind, digest, event count,
// and the recorded trace event by event.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "sim/fuzz_input.h"
#include "sim/trace.h"
#include "src/core/rng.h"
#include "tests/sim/fuzz_corpus.h"

namespace kvtwin::sim {
namespace {

// The entries interleaved with copies whose header bytes are random, so consecutive runs
// differ in shape and seed and each copy's records run on a state another header built.
std::vector<Bytes> Sequence(FuzzTarget target, Rng& rng) {
  const FuzzLayout layout = LayoutOf(target);
  std::vector<Bytes> out;
  for (const Bytes& entry : CorpusEntries(target, 24)) {
    out.push_back(entry);
    Bytes copy = entry;
    for (size_t i = 0; i < std::min(copy.size(), layout.header_bytes); ++i)
      copy[i] = static_cast<uint8_t>(rng.Below(256));
    out.push_back(std::move(copy));
  }
  return out;
}

void ExpectSameRun(const FuzzRun& fresh, const FuzzRun& reused, bool recorded,
                   const std::string& where) {
  EXPECT_EQ(reused.divergence, fresh.divergence) << where;
  EXPECT_EQ(reused.divergence_kind, fresh.divergence_kind) << where;
  EXPECT_EQ(reused.digest, fresh.digest) << where;
  EXPECT_EQ(reused.events, fresh.events) << where;
  if (!recorded) {
    EXPECT_TRUE(reused.trace.events.empty()) << where << ": events kept without recording";
    return;
  }
  EXPECT_EQ(HeaderToJson(reused.trace.header), HeaderToJson(fresh.trace.header)) << where;
  ASSERT_EQ(reused.trace.events.size(), fresh.trace.events.size()) << where;
  for (size_t i = 0; i < fresh.trace.events.size(); ++i) {
    ASSERT_EQ(EventToJson(reused.trace.events[i]), EventToJson(fresh.trace.events[i]))
        << where << ", event " << i;
  }
}

TEST(FuzzSession, EveryRunIsAFreshRun) {
  Rng rng(11);
  for (const FuzzTarget target : AllFuzzTargets()) {
    if (target == FuzzTarget::kTraceReader) continue;
    FuzzSession session(target);
    const std::vector<Bytes> inputs = Sequence(target, rng);
    ASSERT_GE(inputs.size(), 8u) << FuzzTargetName(target) << ": too few corpus entries";
    int64_t events = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Bytes& in = inputs[i];
      const bool record = i % 2 == 0;
      const FuzzRun fresh = RunFuzzInput(target, in.data(), in.size());
      const FuzzRun reused = session.Run(in.data(), in.size(), record);
      ExpectSameRun(fresh, reused, record,
                    std::string(FuzzTargetName(target)) + " input " + std::to_string(i));
      // The one difference a session may make: fewer attention re-checks (never more).
      EXPECT_LE(reused.attention_checks, fresh.attention_checks)
          << FuzzTargetName(target) << " input " << i;
      events += fresh.events;
    }
    // The comparison means something only if the runs did apply ops.
    EXPECT_GT(events, static_cast<int64_t>(inputs.size())) << FuzzTargetName(target);
  }
}

// One input over and over through one session: each run meets the same shapes, each for
// the first time in that run, so the session checks their zero or causal forwards in the
// runs after 0, 1, 2, 4 and 8 earlier runs (the 1st, 2nd, 3rd, 5th and 9th) and none in the
// others, and a fresh run checks them every time.
TEST(FuzzSession, RechecksAttentionAfterDoublingRunsOfAShape) {
  for (const FuzzTarget target :
       {FuzzTarget::kKv, FuzzTarget::kRotating, FuzzTarget::kSpeculation, FuzzTarget::kPrefix}) {
    const std::vector<Bytes> entries = CorpusEntries(target, 24);
    const auto checks = [&](const Bytes& in) {
      return RunFuzzInput(target, in.data(), in.size()).attention_checks;
    };
    // The entry whose fresh run checks the most forwards, each entry run once.
    std::vector<int64_t> counts;
    for (const Bytes& in : entries) counts.push_back(checks(in));
    ASSERT_FALSE(counts.empty());
    const size_t at =
        static_cast<size_t>(std::max_element(counts.begin(), counts.end()) - counts.begin());
    const Bytes* most = &entries[at];
    const int64_t fresh = counts[at];
    ASSERT_GT(fresh, 0) << FuzzTargetName(target) << ": no corpus entry checks attention";
    FuzzSession session(target);
    std::vector<int64_t> got;
    for (int run = 0; run < 10; ++run) {
      got.push_back(session.Run(most->data(), most->size(), false).attention_checks);
      EXPECT_EQ(checks(*most), fresh) << FuzzTargetName(target) << ": a fresh run, run " << run;
    }
    // Forwards with a rectangle or an array mask are checked every time: `always` of them.
    const int64_t always = got[3];
    EXPECT_LT(always, fresh) << FuzzTargetName(target) << ": nothing was skipped";
    const std::vector<int64_t> want = {fresh,  fresh,  fresh,  always, fresh,
                                       always, always, always, fresh,  always};
    EXPECT_EQ(got, want) << FuzzTargetName(target);
  }
}

}  // namespace
}  // namespace kvtwin::sim
