// Goal: `kvtwin multiseq --huge` reaches the sizes it exists for, and the multi-sequence
// reports stay readable at those sizes.
// Method: pinned huge seeds must pass, draw caches of thousands of cells and windows of 1,024
// and more, run forwards over 4,096 cells in use and positions past 4,096 (the coverage
// counters only these runs move), replay to the same digest, and name --huge in their
// reproduce command. Then the report text, exactly: IntRuns, a long batch's op text, and a
// mismatch of two lists of thousands of cells, which names the first differing index and
// writes both as runs.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/ref_multi_seq.h"
#include "sim/multi_seq_driver.h"
#include "sim/multi_seq_generator.h"
#include "sim/multi_seq_run.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

TEST(MultiSeqHuge, SeedsReachThousandsOfCellsAndPositions) {
  MultiSeqRunOptions options;
  options.huge = true;
  MsCoverage total;
  int64_t wide_windows = 0, big_caches = 0;
  for (uint64_t seed = 9; seed <= 14; ++seed) {
    const MultiSeqRunResult r = RunMultiSeq(options, seed);
    ASSERT_FALSE(r.divergence.has_value()) << r.config << "\n"
                                           << r.divergence->ToString() << "\n"
                                           << r.reproduce;
    EXPECT_EQ(r.reproduce, "kvtwin multiseq --seeds " + std::to_string(seed) + ".." +
                               std::to_string(seed) + " --steps 400 --huge");
    total += r.coverage;
    const MultiSeqConfig c = MultiSeqConfigForSeed(options, seed);
    wide_windows += c.window != kvtwin::kUnbounded && c.window >= 1024;
    const Result<model::MultiSeqConfig> m = model::ResolveMultiSeqConfig(c.ToModelInit());
    ASSERT_TRUE(m.ok()) << c.Describe();
    big_caches += m->cells >= kBigCells;
  }
  EXPECT_GE(wide_windows, 2);
  EXPECT_GE(big_caches, 3);
  EXPECT_GE(total.big_cache_forwards, 100);
  EXPECT_GE(total.deep_batches, 50);
  // The default runs never get there (the floors of multi_seq_test.cc exempt both counters).
  const MultiSeqRunResult small = RunMultiSeq(MultiSeqRunOptions{}, 2);
  EXPECT_EQ(small.coverage.big_cache_forwards, 0);
  EXPECT_EQ(small.coverage.deep_batches, 0);
  const MultiSeqRunResult again = RunMultiSeq(options, 3);
  EXPECT_EQ(again.digest, RunMultiSeq(options, 3).digest);
  EXPECT_NE(again.digest, RunMultiSeq(MultiSeqRunOptions{}, 3).digest);
}

TEST(MultiSeqHuge, HugeShapesValidateAndDrawProductionSizes) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Rng rng = Rng::Derive(seed, "huge-shape-test");
    const MultiSeqConfig c = DrawHugeMultiSeqConfig(rng);
    ASSERT_TRUE(c.Validate().ok()) << c.Describe();
    EXPECT_GE(c.max_batch, 64);
    EXPECT_GE(c.capacity, 4096);
  }
}

TEST(MultiSeqReportText, IntRunsWritesRunsOfThreeOrMoreFirstToLast) {
  EXPECT_EQ(IntRuns({}), "[]");
  EXPECT_EQ(IntRuns({7}), "[7]");
  EXPECT_EQ(IntRuns({0, 1}), "[0, 1]");
  EXPECT_EQ(IntRuns({0, 1, 2, 5, 4, 5, 6, 7, 9}), "[0..2, 5, 4..7, 9]");
  EXPECT_EQ(IntRuns({3, 2, 1}), "[3, 2, 1]");
}

TEST(MultiSeqReportText, ALongRunOfOneSequenceShowsItsEndsAndCount) {
  std::vector<MsBatchToken> batch;
  for (int64_t p = 100; p < 100 + 512; ++p) batch.push_back({1, p, static_cast<int32_t>(p % 7)});
  batch.push_back({2, 5, 9});
  for (int64_t p = 0; p < static_cast<int64_t>(kRunShown); ++p) batch.push_back({3, p, 1});
  const std::string text = MsOp::Forward(batch).ToString();
  EXPECT_EQ(text,
            "forward [s1@100:2 s1@101:3 ... s1@610:1 s1@611:2 (512 tokens) | s2@5:9 | s3@0:1 "
            "s3@1:1 s3@2:1 s3@3:1 s3@4:1 s3@5:1 s3@6:1 s3@7:1]");
  // A short descending run shows whole, a long one (a scrambled batch) by its ends.
  const std::string down = MsOp::Forward({{0, 9, 1}, {0, 8, 1}, {0, 7, 1}}).ToString();
  EXPECT_EQ(down, "forward [s0@9:1 s0@8:1 s0@7:1]");
  std::vector<MsBatchToken> reversed;
  for (int64_t p = 99; p >= 0; --p) reversed.push_back({4, p, 2});
  reversed.push_back({4, 200, 3});
  EXPECT_EQ(MsOp::Forward(reversed).ToString(),
            "forward [s4@99:2 s4@98:2 ... s4@1:2 s4@0:2 (100 tokens) s4@200:3]");
}

TEST(MultiSeqReportText, AListMismatchNamesTheFirstDifferenceAndKeepsBothListsShort) {
  std::vector<int64_t> want, got;
  for (int64_t i = 0; i < 4096; ++i) want.push_back(i);
  for (int64_t i = 0; i < 100; ++i) got.push_back(i);
  for (int64_t i = 5000; i < 8996; ++i) got.push_back(i);
  const Mismatch m = ListMismatch("cells the batch was placed in", want, got);
  EXPECT_EQ(m.what,
            "cells the batch was placed in (first difference at index 100: 4096 expected, 4096 "
            "actual)");
  EXPECT_EQ(m.expected, "[0..4095]");
  EXPECT_EQ(m.actual, "[0..99, 5000..8995]");
  // A list that is a prefix of the other differs where the shorter one ends.
  EXPECT_EQ(ListMismatch("positions held by s0", {4, 5}, {4, 5, 6}).what,
            "positions held by s0 (first difference at index 2: 2 expected, 3 actual)");
}

}  // namespace
}  // namespace kvtwin::sim
