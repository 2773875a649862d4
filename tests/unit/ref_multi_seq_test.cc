// Goal: pin the multi-sequence references (model/ref_multi_seq.h) to spec §2.8, §2.9.1,
// §5.2 and §6.13-§6.14, since the production ggml causal and LFM2 hybrid caches are checked
// against them in lock step.
// Method: the §6.13 scenarios of the original causal_test.go, run with the same Init
// arguments: views (the token value each cell of the current range holds, in cell order)
// and mask rows exactly as the spec lists them, plus visible positions in cell order,
// retention, placement (first-fit into freed cells), the padding-widened current range,
// cell counts and CanResume worked out by hand from the window maintenance rule;
// Remove/CopyPrefix lineage (the shared-cell refusal edits the cells before the shared one
// in index order and leaves the range stale, shifts, missing shift callback); conv state in
// both modes against hand-computed rows where the input row of a token is {id, written
// position}; slots through forks, lazy copy-on-write, the LIFO free stack and failures.
#include "model/ref_multi_seq.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvtwin::model {
namespace {

using Positions = std::vector<int64_t>;
using Rows = std::vector<Positions>;

SeqId S(int32_t seq) { return static_cast<SeqId>(seq); }

// SplitMix64 finalizer: a stand-in for the driver's provenance hash.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Token Tok(int32_t id) { return Token{id, Mix(static_cast<uint64_t>(id))}; }

// Token values as in causal_test.go: the k-th token of a test carries value `first + k`.
MsBatch Batch(const std::vector<int32_t>& seqs, const Positions& positions, int32_t first) {
  MsBatch batch;
  for (size_t k = 0; k < seqs.size(); ++k) {
    batch.push_back(MsToken{S(seqs[k]), positions[k], Tok(first + static_cast<int32_t>(k))});
  }
  return batch;
}
MsBatch OneSeq(int32_t seq, const Positions& positions, int32_t first) {
  return Batch(std::vector<int32_t>(positions.size(), seq), positions, first);
}

// Forward, then the visible positions of every batch token.
Rows ForwardRows(RefMultiSeqCache& cache, const MsBatch& batch) {
  Status status = cache.Forward(batch);
  if (!status.ok()) {
    ADD_FAILURE() << status.ToString();
    return {};
  }
  Rows rows;
  for (size_t i = 0; i < batch.size(); ++i) rows.push_back(cache.VisiblePositions(batch, i, false));
  return rows;
}

// The view of the last forward as §6.13 lists it: the token value each cell of the current
// range holds (0: never written), in cell order.
std::vector<int32_t> View(const RefMultiSeqCache& cache) {
  const auto [begin, end] = cache.CurrentRange();
  const std::vector<MsCell> cells = cache.Cells();
  std::vector<int32_t> out;
  for (int64_t j = begin; j < end; ++j) {
    const MsCell& cell = cells[static_cast<size_t>(j)];
    out.push_back(cell.rows ? cell.rows->token.id : 0);
  }
  return out;
}

// Mask rows over the current range as §6.13 writes them: '0' visible, 'x' masked.
std::vector<std::string> Masks(const RefMultiSeqCache& cache, const MsBatch& batch) {
  const auto [begin, end] = cache.CurrentRange();
  std::vector<std::string> out;
  for (size_t i = 0; i < batch.size(); ++i) {
    std::string row(static_cast<size_t>(end - begin), 'x');
    for (const MsEntry& e : cache.Visible(batch, i, false)) {
      row[static_cast<size_t>(e.index - begin)] = '0';
    }
    out.push_back(row);
  }
  return out;
}

using Strings = std::vector<std::string>;
using Ids32 = std::vector<int32_t>;

std::vector<int32_t> Ids(const std::vector<MsEntry>& entries) {
  std::vector<int32_t> out;
  for (const MsEntry& e : entries) out.push_back(e.token.id);
  return out;
}

MultiSeqConfig Resolved(const MultiSeqInit& init) {
  Result<MultiSeqConfig> config = ResolveMultiSeqConfig(init);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return *config;
}
// Init(maxSeqs, capacity = 16, maxBatch) of the original tests.
MultiSeqConfig Ggml(int64_t window, int64_t memory, int32_t max_seqs, int64_t max_batch,
                    int64_t chunk = kUnbounded) {
  return Resolved(MultiSeqInit{window, memory, chunk, max_seqs, 16, max_batch, 1, true});
}

TEST(RefMultiSeqConfig, InitRulesResolveMemoryAndCellCount) {
  const MultiSeqConfig plain = Ggml(kUnbounded, 0, 1, 16);
  EXPECT_EQ(plain.memory, kUnbounded);
  EXPECT_EQ(plain.cells, 16);
  EXPECT_EQ(Ggml(kUnbounded, 0, 3, 4).cells, 48);
  const MultiSeqConfig swa = Ggml(1, 0, 1, 16);
  EXPECT_EQ(swa.memory, 1);
  EXPECT_EQ(swa.cells, 1 + 16);
  const MultiSeqConfig two = Ggml(1, 0, 2, 2);  // the stop token: memory window + 1
  EXPECT_EQ(two.memory, 2);
  EXPECT_EQ(two.cells, 2 * 2 + 2);
  EXPECT_EQ(Ggml(1, 3, 1, 16).memory, 3);
  EXPECT_EQ(Ggml(4, 20, 1, 16).memory, kUnbounded);  // memory >= capacity
  EXPECT_EQ(Ggml(4, 20, 1, 16).cells, 16);
  EXPECT_EQ(Resolved(MultiSeqInit{1, 0, kUnbounded, 2, 16, 2, 4, true}).cells, 8);  // padding
  Result<MultiSeqConfig> bad = ResolveMultiSeqConfig(MultiSeqInit{4, 3, kUnbounded, 1, 16, 4});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(RefMultiSeqCache, StoreSeesTheCausalPrefix) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 1, 16));
  EXPECT_EQ(ForwardRows(cache, OneSeq(0, {0, 1, 2, 3}, 1)),
            (Rows{{0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}}));
  const MsBatch second = OneSeq(0, {4}, 5);
  EXPECT_EQ(ForwardRows(cache, second), (Rows{{0, 1, 2, 3, 4}}));
  const std::vector<MsEntry> seen = cache.Visible(second, 0, false);
  EXPECT_EQ(Ids(seen), (std::vector<int32_t>{1, 2, 3, 4, 5}));
  for (const MsEntry& e : seen) {
    EXPECT_EQ(e.written_pos, e.pos);
    EXPECT_TRUE(e.shifts.empty());
    EXPECT_TRUE(e.has_data);
  }
  EXPECT_EQ(cache.UsedCells(), 5);
}

TEST(RefMultiSeqCache, SlidingWindowOfOneReusesPrunedCells) {
  RefMultiSeqCache cache(Ggml(1, 0, 1, 16));
  const MsBatch first = OneSeq(0, {0, 1, 2, 3}, 1);
  ASSERT_TRUE(cache.Forward(first).ok());
  EXPECT_EQ(Masks(cache, first), (Strings{"0xxx", "00xx", "x00x", "xx00"}));
  EXPECT_EQ(cache.RetainedPositions(S(0)), (Positions{0, 1, 2, 3}));  // pruning is lazy
  // lowest 4, memory 1: cells below 3 are freed and taken first-fit; cell 2 keeps its rows.
  const MsBatch second = OneSeq(0, {4, 5}, 5);
  ASSERT_TRUE(cache.Forward(second).ok());
  EXPECT_EQ(cache.Locations(), (Positions{0, 1}));
  EXPECT_EQ(View(cache), (Ids32{5, 6, 3, 4}));
  EXPECT_EQ(Masks(cache, second), (Strings{"0xx0", "00xx"}));
  EXPECT_EQ(cache.VisiblePositions(second, 0, false), (Positions{4, 3}));  // cell order
  EXPECT_EQ(cache.RetainedPositions(S(0)), (Positions{3, 4, 5}));
  EXPECT_EQ(cache.UsedCells(), 3);
  EXPECT_EQ(cache.History(S(0)).size(), 6u);  // the ideal log keeps the pruned entries
}

TEST(RefMultiSeqCache, SeparateBatchesPruneTheIdleSequence) {
  RefMultiSeqCache cache(Ggml(1, 2, 2, 2));  // memory 2, 6 cells
  const MsBatch b1 = OneSeq(0, {0, 1}, 1);
  ASSERT_TRUE(cache.Forward(b1).ok());
  EXPECT_EQ(View(cache), (Ids32{1, 2}));
  EXPECT_EQ(Masks(cache, b1), (Strings{"0x", "00"}));
  const MsBatch b2 = OneSeq(0, {2, 3}, 3);
  ASSERT_TRUE(cache.Forward(b2).ok());
  EXPECT_EQ(View(cache), (Ids32{2, 3, 4}));
  EXPECT_EQ(Masks(cache, b2), (Strings{"00x", "x00"}));
  // seq 0 is idle: lowest = 3 + 1, so its cells below 2 are freed for seq 1.
  const MsBatch b3 = OneSeq(1, {0, 1}, 5);
  ASSERT_TRUE(cache.Forward(b3).ok());
  EXPECT_EQ(View(cache), (Ids32{5, 6}));
  EXPECT_EQ(cache.RetainedPositions(S(0)), (Positions{2, 3}));
  const MsBatch b4 = OneSeq(1, {2, 3}, 7);
  ASSERT_TRUE(cache.Forward(b4).ok());
  EXPECT_EQ(View(cache), (Ids32{6, 3, 4, 7, 8}));
  EXPECT_EQ(Masks(cache, b4), (Strings{"0xx0x", "xxx00"}));
  EXPECT_EQ(cache.UsedCells(), 6);
  const MsBatch b5 = OneSeq(0, {4, 5}, 9);
  ASSERT_TRUE(cache.Forward(b5).ok());
  EXPECT_EQ(View(cache), (Ids32{9, 10, 3, 4}));
  EXPECT_EQ(Masks(cache, b5), (Strings{"0xx0", "00xx"}));
  EXPECT_EQ(Ids(cache.Visible(b5, 0, false)), (std::vector<int32_t>{9, 4}));
  EXPECT_EQ(cache.RetainedPositions(S(1)), (Positions{2, 3}));
  EXPECT_EQ(cache.UsedCells(), 6);
}

TEST(RefMultiSeqCache, MemoryKeepsCellsTheWindowMasks) {
  RefMultiSeqCache cache(Ggml(1, 3, 1, 16));
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1, 2, 3}, 1)).ok());
  // View [5 2 3 4 6]: positions 1 and 2 are kept by memory but masked by the window.
  const MsBatch second = OneSeq(0, {4, 5}, 5);
  ASSERT_TRUE(cache.Forward(second).ok());
  EXPECT_EQ(View(cache), (Ids32{5, 2, 3, 4, 6}));
  EXPECT_EQ(Masks(cache, second), (Strings{"0xx0x", "0xxx0"}));
  EXPECT_EQ(cache.RetainedPositions(S(0)), (Positions{1, 2, 3, 4, 5}));
  EXPECT_EQ(cache.RetainedAtLeast(S(0)), (Positions{5}));  // what a resume at 6 attends
}

TEST(RefMultiSeqCache, CurrentRangeIsWidenedToThePaddingMultiple) {
  // 2 x 16 cells, padding 4.
  RefMultiSeqCache cache(Resolved(MultiSeqInit{kUnbounded, 0, kUnbounded, 2, 16, 4, 4, true}));
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1, 2, 3, 4}, 1)).ok());
  EXPECT_EQ(cache.CurrentRange(), (MsSpan{0, 8}));
  ASSERT_TRUE(cache.Forward(OneSeq(1, {0}, 6)).ok());  // cell 5 alone: [4, 8)
  EXPECT_EQ(cache.Locations(), (Positions{5}));
  EXPECT_EQ(cache.CurrentRange(), (MsSpan{4, 8}));
  EXPECT_EQ(View(cache), (Ids32{5, 6, 0, 0}));  // cells 6 and 7 never written
}

TEST(RefMultiSeqCache, UnboundedMemoryRangeIsTheUnionOfTheBatchSequencesRanges) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 3, 16));
  ASSERT_TRUE(cache.Forward(Batch({0, 0, 1, 1, 2, 2}, {0, 1, 0, 1, 0, 1}, 1)).ok());
  const MsBatch next = Batch({0, 2}, {2, 2}, 7);  // seq 1's cells 2, 3 lie in between
  ASSERT_TRUE(cache.Forward(next).ok());
  EXPECT_EQ(cache.Locations(), (Positions{6, 7}));
  EXPECT_EQ(cache.CurrentRange(), (MsSpan{0, 8}));
  EXPECT_EQ(Masks(cache, next), (Strings{"00xxxx0x", "xxxx00x0"}));
  EXPECT_EQ(cache.Ranges().at(S(2)), (MsSpan{4, 7}));
}

TEST(RefMultiSeqCache, LowestIsTheSmallestBatchPositionNotTheFirst) {
  RefMultiSeqCache cache(Ggml(1, 2, 1, 16));  // memory 2
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1, 2, 3, 4, 5}, 1)).ok());
  // Positions 7 then 6: lowest 6, so cells below 4 go and position 4 stays.
  const MsBatch descending = OneSeq(0, {7, 6}, 7);
  ASSERT_TRUE(cache.Forward(descending).ok());
  EXPECT_EQ(cache.RetainedPositions(S(0)), (Positions{4, 5, 6, 7}));
  EXPECT_EQ(cache.Locations(), (Positions{0, 1}));
  // The current range starts at the cells with pos >= 6 - 1: cell 5, and the new cells 0, 1.
  EXPECT_EQ(cache.CurrentRange(), (MsSpan{0, 6}));
  EXPECT_EQ(cache.VisiblePositions(descending, 0, false), (Positions{7, 6}));
  EXPECT_EQ(cache.VisiblePositions(descending, 1, false), (Positions{6, 5}));
}

TEST(RefMultiSeqCache, RemovedTailCellsAreRefilledFirst) {
  // §6.13 Remove: the next tokens fill the freed cells, lowest index first.
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 2, 16));
  ASSERT_TRUE(cache.Forward(Batch({0, 0, 1, 1}, {0, 1, 0, 1}, 1)).ok());
  ASSERT_TRUE(cache.Remove(S(0), 1, kUnbounded).ok());
  EXPECT_TRUE(cache.Cells()[1].seqs.empty());
  const MsBatch next = Batch({0, 1}, {1, 2}, 5);
  ASSERT_TRUE(cache.Forward(next).ok());
  EXPECT_EQ(cache.Locations(), (Positions{1, 4}));
  EXPECT_EQ(View(cache), (Ids32{1, 5, 3, 4, 6}));
  EXPECT_EQ(Masks(cache, next), (Strings{"00xxx", "xx000"}));
}

TEST(RefMultiSeqCache, ChunkedAttentionSeesOnlyTheCurrentChunk) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 1, 16, /*chunk=*/2));
  EXPECT_EQ(ForwardRows(cache, OneSeq(0, {0, 1, 2, 3}, 1)), (Rows{{0}, {0, 1}, {2}, {2, 3}}));
  EXPECT_EQ(ForwardRows(cache, OneSeq(0, {4, 5, 6}, 5)), (Rows{{4}, {4, 5}, {6}}));
  EXPECT_EQ(ForwardRows(cache, OneSeq(0, {7, 8}, 8)), (Rows{{6, 7}, {8}}));
}

TEST(RefMultiSeqCache, SequencesInOneBatchAreMutuallyInvisible) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 1, 16));
  const MsBatch first = Batch({0, 0, 1, 1}, {0, 1, 0, 1}, 1);
  EXPECT_EQ(ForwardRows(cache, first), (Rows{{0}, {0, 1}, {0}, {0, 1}}));
  EXPECT_EQ(Ids(cache.Visible(first, 3, false)), (std::vector<int32_t>{3, 4}));
  const MsBatch second = Batch({0, 1}, {2, 2}, 5);
  EXPECT_EQ(ForwardRows(cache, second), (Rows{{0, 1, 2}, {0, 1, 2}}));
  EXPECT_EQ(Ids(cache.Visible(second, 0, false)), (std::vector<int32_t>{1, 2, 5}));
  EXPECT_EQ(Ids(cache.Visible(second, 1, false)), (std::vector<int32_t>{3, 4, 6}));
}

TEST(RefMultiSeqCache, CausalDisabledSeesLaterPositionsInsideWindowAndChunk) {
  RefMultiSeqCache plain(Ggml(kUnbounded, 0, 1, 16));
  const MsBatch batch = OneSeq(0, {0, 1, 2, 3, 4}, 1);
  ASSERT_TRUE(plain.Forward(batch).ok());
  EXPECT_EQ(plain.VisiblePositions(batch, 2, true), (Positions{0, 1, 2, 3, 4}));
  EXPECT_EQ(plain.VisiblePositions(batch, 2, false), (Positions{0, 1, 2}));
  RefMultiSeqCache windowed(Ggml(1, 0, 1, 16));
  ASSERT_TRUE(windowed.Forward(batch).ok());
  EXPECT_EQ(windowed.VisiblePositions(batch, 2, true), (Positions{1, 2, 3, 4}));
  RefMultiSeqCache chunked(Ggml(kUnbounded, 0, 1, 16, 2));
  ASSERT_TRUE(chunked.Forward(batch).ok());
  EXPECT_EQ(chunked.VisiblePositions(batch, 2, true), (Positions{2, 3, 4}));
}

TEST(RefMultiSeqCache, RemoveTailThenMiddleShiftsTheLaterKey) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 1, 16));
  ForwardRows(cache, Batch({0, 0, 1, 1}, {0, 1, 0, 1}, 1));
  ASSERT_TRUE(cache.Remove(S(0), 1, kUnbounded).ok());
  EXPECT_EQ(cache.RetainedPositions(S(0)), (Positions{0}));
  EXPECT_EQ(ForwardRows(cache, Batch({0, 1}, {1, 2}, 5)), (Rows{{0, 1}, {0, 1, 2}}));
  ASSERT_TRUE(cache.Remove(S(0), 0, 1).ok());
  EXPECT_EQ(cache.Cells()[1].rows->shifts, (std::vector<int64_t>{-1}));  // the cell's key moved
  // The token written at 1 now sits at 0 with its key shifted by -1 (view value 5 - 1).
  const std::vector<MsEntry> held = cache.Retained(S(0));
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].pos, 0);
  EXPECT_EQ(held[0].token.id, 5);
  EXPECT_EQ(held[0].written_pos, 1);
  EXPECT_EQ(held[0].shifts, (std::vector<int64_t>{-1}));
  EXPECT_EQ(held[0].Shift(), -1);
  // Cells 0 and 5 are free: position 1 lands before the cell now holding position 0.
  const MsBatch next = OneSeq(0, {1, 2}, 7);
  EXPECT_EQ(ForwardRows(cache, next), (Rows{{1, 0}, {1, 0, 2}}));
  EXPECT_EQ(cache.Locations(), (Positions{0, 5}));
  EXPECT_EQ(Ids(cache.Visible(next, 1, false)), (std::vector<int32_t>{7, 5, 8}));
  EXPECT_EQ(cache.RetainedPositions(S(1)), (Positions{0, 1, 2}));  // untouched
}

TEST(RefMultiSeqCache, CopyPrefixSharesTheFirstLenCells) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 1, 16));
  ForwardRows(cache, OneSeq(0, {0, 1, 2, 3}, 1));
  cache.CopyPrefix(S(0), S(1), 2);
  EXPECT_EQ(cache.UsedCells(), 4);  // shared, not copied
  const MsBatch batch = OneSeq(1, {3, 4}, 5);
  EXPECT_EQ(ForwardRows(cache, batch), (Rows{{0, 1, 3}, {0, 1, 3, 4}}));
  EXPECT_EQ(Ids(cache.Visible(batch, 1, false)), (std::vector<int32_t>{1, 2, 5, 6}));
  EXPECT_EQ(cache.Retained(S(1))[1].cell, cache.Retained(S(0))[1].cell);
  EXPECT_EQ(cache.UsedCells(), 6);
  EXPECT_EQ(cache.Sequences(), (std::vector<SeqId>{S(0), S(1)}));
}

TEST(RefMultiSeqCache, CopyPrefixAfterPruningCopiesOnlyRetainedCells) {
  RefMultiSeqCache cache(MultiSeqConfig{1, 1, kUnbounded, 2, kUnbounded, true});
  ForwardRows(cache, OneSeq(0, {0, 1, 2, 3}, 1));
  ForwardRows(cache, OneSeq(0, {4}, 5));  // prunes below 3
  cache.CopyPrefix(S(0), S(1), 4);
  EXPECT_EQ(cache.RetainedPositions(S(1)), (Positions{3}));
  EXPECT_EQ(cache.History(S(1)).size(), 4u);
  EXPECT_TRUE(cache.CanResume(S(1), 4));
  EXPECT_FALSE(cache.CanResume(S(1), 3));                            // 3 - 1 = 2 was pruned
  EXPECT_EQ(ForwardRows(cache, OneSeq(1, {4}, 9)), (Rows{{4, 3}}));  // cell 1, then cell 3
}

TEST(RefMultiSeqCache, CopyPrefixOntoItselfEmptiesTheSequence) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 1, 16));
  ForwardRows(cache, OneSeq(0, {0, 1, 2}, 1));
  cache.CopyPrefix(S(0), S(0), 2);
  EXPECT_TRUE(cache.RetainedPositions(S(0)).empty());
  EXPECT_EQ(cache.UsedCells(), 0);
}

TEST(RefMultiSeqCache, CanResumeFollowsTheWindowAfterPruning) {
  RefMultiSeqCache cache(Ggml(4, 0, 1, 16));
  ForwardRows(cache, OneSeq(0, {0, 1, 2, 3, 4}, 1));
  for (int64_t pos = 0; pos <= 5; ++pos) EXPECT_TRUE(cache.CanResume(S(0), pos)) << pos;
  EXPECT_FALSE(cache.CanResume(S(0), 6));
  ForwardRows(cache, OneSeq(0, {5}, 6));  // prunes position 0
  for (int64_t pos = 0; pos <= 4; ++pos) EXPECT_FALSE(cache.CanResume(S(0), pos)) << pos;
  EXPECT_TRUE(cache.CanResume(S(0), 5));
  EXPECT_TRUE(cache.CanResume(S(0), 6));
  EXPECT_FALSE(cache.CanResume(S(1), 0));  // no cells
}

TEST(RefMultiSeqCache, CanResumeWithExtraMemoryKeepsTheLastTwo) {
  RefMultiSeqCache cache(Ggml(4, 5, 1, 16));
  ForwardRows(cache, OneSeq(0, {0, 1, 2, 3, 4, 5, 6}, 1));
  ForwardRows(cache, OneSeq(0, {7}, 8));  // prunes below 2
  for (int64_t pos = 0; pos <= 5; ++pos) EXPECT_FALSE(cache.CanResume(S(0), pos)) << pos;
  EXPECT_TRUE(cache.CanResume(S(0), 6));
  EXPECT_TRUE(cache.CanResume(S(0), 7));
}

TEST(RefMultiSeqCache, CanResumeIsAlwaysTrueWithUnboundedMemory) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 1, 16));
  EXPECT_TRUE(cache.CanResume(S(3), 100));
  RefMultiSeqCache windowed(Ggml(4, 0, 1, 16));
  EXPECT_FALSE(windowed.CanResume(S(3), 0));
}

TEST(RefMultiSeqCache, RefusedRemoveEditsTheCellsBeforeTheSharedOneInIndexOrder) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 3, 16));
  ASSERT_TRUE(cache.Forward(OneSeq(2, {0, 1}, 1)).ok());  // cells 0, 1
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1}, 3)).ok());  // cells 2, 3
  ASSERT_TRUE(cache.Remove(S(2), 0, kUnbounded).ok());
  cache.CopyPrefix(S(0), S(1), 2);                        // seq 1 shares cells 2, 3
  ASSERT_TRUE(cache.Forward(OneSeq(1, {2, 3}, 5)).ok());  // its own cells: 0, 1
  // Cell order 0, 1, 2, 3: positions 2 and 3 move to 1 and 2 (no key shift yet), position 0
  // leaves cell 2, and cell 3 (position 1, shared with seq 0) stops the loop.
  const Status refused = cache.Remove(S(1), 0, 1);
  EXPECT_EQ(refused.code(), StatusCode::kUnsupported);
  EXPECT_NE(refused.message().find("shared"), std::string::npos);
  const std::vector<MsCell> cells = cache.Cells();
  EXPECT_EQ(cells[0].pos, 1);
  EXPECT_EQ(cells[1].pos, 2);
  EXPECT_EQ(cells[2].seqs, (std::vector<SeqId>{S(0)}));
  EXPECT_EQ(cells[3].seqs, (std::vector<SeqId>{S(0), S(1)}));
  EXPECT_EQ(cells[3].pos, 1);
  EXPECT_TRUE(cells[0].rows->shifts.empty());
  EXPECT_EQ(cache.RetainedPositions(S(1)), (Positions{1, 1, 2}));
  EXPECT_EQ(cache.RetainedPositions(S(0)), (Positions{0, 1}));
  EXPECT_EQ(cache.UsedCells(), 4);
  // The half-edited sequence goes on: both cells at position 1 are visible.
  const MsBatch next = OneSeq(1, {3}, 7);
  ASSERT_TRUE(cache.Forward(next).ok());
  EXPECT_EQ(cache.Locations(), (Positions{4}));
  EXPECT_EQ(cache.VisiblePositions(next, 0, false), (Positions{1, 2, 1, 3}));
  EXPECT_EQ(Ids(cache.Visible(next, 0, false)), (std::vector<int32_t>{5, 6, 4, 7}));
  ASSERT_TRUE(cache.Remove(S(1), 0, kUnbounded).ok());
  EXPECT_EQ(cache.UsedCells(), 2);
}

TEST(RefMultiSeqCache, RefusedRemoveLeavesTheRangeStale) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 2, 16));
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1}, 1)).ok());  // cells 0, 1
  cache.CopyPrefix(S(0), S(1), 2);
  // Cell 0 leaves seq 1, then cell 1 (shared) refuses the shift: the range is not recomputed.
  EXPECT_EQ(cache.Remove(S(1), 0, 1).code(), StatusCode::kUnsupported);
  EXPECT_EQ(cache.RetainedPositions(S(1)), (Positions{1}));
  EXPECT_EQ(cache.Ranges().at(S(1)), (MsSpan{0, 1}));
  // The stale range still widens the next forward's current range to cell 0.
  const MsBatch next = OneSeq(1, {2}, 3);
  ASSERT_TRUE(cache.Forward(next).ok());
  EXPECT_EQ(cache.CurrentRange(), (MsSpan{0, 3}));
  EXPECT_EQ(Masks(cache, next), (Strings{"x00"}));
  // A Remove that gets through its loop recomputes it.
  ASSERT_TRUE(cache.Remove(S(1), 9, kUnbounded).ok());
  EXPECT_EQ(cache.Ranges().at(S(1)), (MsSpan{1, 2}));
}

TEST(RefMultiSeqCache, SharingEndsWhenOneSideDropsTheCell) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 2, 16));
  ForwardRows(cache, OneSeq(0, {0, 1, 2, 3}, 1));
  cache.CopyPrefix(S(0), S(1), 2);
  ForwardRows(cache, OneSeq(1, {2, 3}, 5));
  // Later cells are seq 1's own: the shift is allowed.
  ASSERT_TRUE(cache.Remove(S(1), 2, 3).ok());
  EXPECT_EQ(cache.RetainedPositions(S(1)), (Positions{0, 1, 2}));
  EXPECT_EQ(cache.Retained(S(1))[2].written_pos, 3);
  EXPECT_EQ(cache.Retained(S(1))[2].shifts, (std::vector<int64_t>{-1}));
  // Position 1 is still shared with seq 0.
  EXPECT_EQ(cache.Remove(S(1), 0, 1).code(), StatusCode::kUnsupported);
  ASSERT_TRUE(cache.Remove(S(1), 0, kUnbounded).ok());
  cache.CopyPrefix(S(0), S(1), 2);
  ASSERT_TRUE(cache.Remove(S(0), 1, kUnbounded).ok());  // seq 0 lets go of cell 1
  ASSERT_TRUE(cache.Remove(S(1), 0, 1).ok());
  EXPECT_EQ(cache.Retained(S(1))[0].token.id, 2);
  EXPECT_EQ(cache.UsedCells(), 2);
}

// Six cells of seq 0 at 0..5, max_batch 2: Remove [0, 1) frees cell 0 and moves cells 1..5,
// in the shift calls of the windows from the sequence's first cell: {1, 2}, {3, 4}, {5}. A
// failure on call 1 keeps the shifts of cells 1 and 2 only, with every position moved; a
// call past the last never fails.
TEST(RefMultiSeqCache, AFailingShiftCallStopsTheShiftAtItsGroup) {
  MultiSeqConfig config{kUnbounded, kUnbounded, kUnbounded, 1, 16, true};
  config.max_batch = 2;
  RefMultiSeqCache cache(config);
  ForwardRows(cache, OneSeq(0, {0, 1, 2, 3, 4, 5}, 1));
  const Status failed = cache.Remove(S(0), 0, 1, /*failing_shift_call=*/1);
  EXPECT_EQ(failed.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(failed.message(), kShiftFailure);
  EXPECT_EQ(cache.RetainedPositions(S(0)), (Positions{0, 1, 2, 3, 4}));
  std::vector<std::vector<int64_t>> shifts;
  for (const MsEntry& e : cache.Retained(S(0))) shifts.push_back(e.shifts);
  EXPECT_EQ(shifts, (std::vector<std::vector<int64_t>>{{-1}, {-1}, {}, {}, {}}));
  RefMultiSeqCache past(config);
  ForwardRows(past, OneSeq(0, {0, 1, 2, 3, 4, 5}, 1));
  EXPECT_TRUE(past.Remove(S(0), 0, 1, /*failing_shift_call=*/3).ok());
  for (const MsEntry& e : past.Retained(S(0))) EXPECT_EQ(e.shifts, (std::vector<int64_t>{-1}));
}

TEST(RefMultiSeqCache, RemoveWithoutShiftCallbackMovesPositionsButNotKeys) {
  RefMultiSeqCache cache(MultiSeqConfig{kUnbounded, kUnbounded, kUnbounded, 1, 16, false});
  ForwardRows(cache, OneSeq(0, {0, 1, 2, 3}, 1));
  EXPECT_TRUE(cache.Remove(S(0), 3, kUnbounded).ok());  // no shift needed
  EXPECT_EQ(cache.Remove(S(0), 1, 2).code(), StatusCode::kUnsupported);
  const std::vector<MsEntry> held = cache.Retained(S(0));
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[1].pos, 1);
  EXPECT_EQ(held[1].written_pos, 2);
  EXPECT_TRUE(held[1].shifts.empty());
  EXPECT_TRUE(cache.Remove(S(0), 0, 10).ok());  // no cell left: returns before the shift
  EXPECT_TRUE(cache.Sequences().empty());
}

TEST(RefMultiSeqCache, CacheFullIsPredictedAfterPruning) {
  RefMultiSeqCache cache(MultiSeqConfig{1, 1, kUnbounded, 2, 3, true});
  ForwardRows(cache, OneSeq(0, {0, 1}, 1));
  ForwardRows(cache, OneSeq(0, {2, 3}, 3));  // prunes 0: 1 + 2 cells
  EXPECT_EQ(cache.UsedCells(), 3);
  EXPECT_EQ(cache.Locations(), (Positions{0, 2}));
  const Status full = cache.Forward(OneSeq(1, {0, 1, 2}, 5));
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  // The idle sequence was pruned before the failure (lowest 4: below 3 dropped).
  EXPECT_EQ(cache.RetainedPositions(S(0)), (Positions{3}));
  EXPECT_TRUE(cache.RetainedPositions(S(1)).empty());
  EXPECT_EQ(ForwardRows(cache, OneSeq(1, {0, 1}, 8)), (Rows{{0}, {0, 1}}));
  EXPECT_EQ(cache.Locations(), (Positions{0, 1}));
  EXPECT_EQ(cache.UsedCells(), 3);
}

TEST(RefMultiSeqCache, RewritesFillTheCellsUntilPruningCannotHelp) {
  RefMultiSeqCache cache(MultiSeqConfig{1, 1, kUnbounded, 1, 4, true});
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1, 2, 3}, 1)).ok());
  // Rewriting 2, 3: lowest 2 prunes position 0, one cell short all the same.
  EXPECT_EQ(cache.Forward(OneSeq(0, {2, 3}, 5)).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.RetainedPositions(S(0)), (Positions{1, 2, 3}));
  // Rewriting 3 prunes position 1 as well: the freed cells 0 and 1, first-fit.
  ASSERT_TRUE(cache.Forward(OneSeq(0, {3}, 7)).ok());
  EXPECT_EQ(cache.Locations(), (Positions{0}));
  EXPECT_EQ(cache.RetainedPositions(S(0)), (Positions{2, 3, 3}));
}

TEST(RefMultiSeqCache, RewritingAPositionKeepsTheOldCellVisible) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 1, 16));
  ForwardRows(cache, OneSeq(0, {0, 1, 2}, 1));
  const MsBatch rewrite = OneSeq(0, {1}, 9);
  EXPECT_EQ(ForwardRows(cache, rewrite), (Rows{{0, 1, 1}}));
  EXPECT_EQ(Ids(cache.Visible(rewrite, 0, false)), (std::vector<int32_t>{1, 2, 9}));
  EXPECT_EQ(Ids(cache.History(S(0))), (std::vector<int32_t>{1, 9, 3}));
  EXPECT_EQ(cache.UsedCells(), 4);
}

TEST(RefMultiSeqCache, VisibleAnswersOnlyForTheLastForward) {
  RefMultiSeqCache cache(Ggml(kUnbounded, 0, 1, 16));
  const MsBatch batch = OneSeq(0, {0, 1}, 1);
  ForwardRows(cache, batch);
  ASSERT_TRUE(cache.Remove(S(0), 1, kUnbounded).ok());
  EXPECT_DEATH(cache.Visible(batch, 0, false), "last operation");
}

// The Into accessors fill a caller's buffer that the driver reuses after every op: whatever
// the buffer held before (here the answers for other sequences and earlier states), they
// must answer exactly as the value-returning accessors.
void ExpectIntoEqualsValue(const RefMultiSeqCache& cache, std::vector<MsCell>& cells,
                           std::vector<MsEntry>& entries, Positions& positions) {
  cache.CellsInto(cells);
  const std::vector<MsCell> fresh = cache.Cells();
  ASSERT_EQ(cells.size(), fresh.size());
  for (size_t i = 0; i < cells.size(); ++i) {
    EXPECT_EQ(cells[i].seqs, fresh[i].seqs) << "cell " << i;
    EXPECT_EQ(cells[i].rows, fresh[i].rows) << "cell " << i;
    if (!fresh[i].seqs.empty()) {
      EXPECT_EQ(cells[i].pos, fresh[i].pos) << "cell " << i;
    }
  }
  for (int32_t s = 0; s < 3; ++s) {
    cache.HistoryInto(S(s), entries);
    EXPECT_EQ(entries, cache.History(S(s))) << "s" << s;
    cache.RetainedPositionsInto(S(s), positions);
    EXPECT_EQ(positions, cache.RetainedPositions(S(s))) << "s" << s;
  }
}

TEST(RefMultiSeqCache, IntoAccessorsAnswerAsTheValueAccessors) {
  RefMultiSeqCache cache(Ggml(2, 3, 3, 4));  // a window with extra memory: pruning runs
  std::vector<MsCell> cells;
  std::vector<MsEntry> entries;
  Positions positions;
  const std::vector<MsBatch> forwards = {OneSeq(0, {0, 1, 2, 3}, 1), OneSeq(1, {0, 1}, 5),
                                         OneSeq(0, {4, 5}, 7), OneSeq(0, {5}, 9)};  // a rewrite
  for (const MsBatch& batch : forwards) {
    ASSERT_TRUE(cache.StartForward(batch).ok());
    for (size_t i = 0; i < batch.size(); ++i) {
      for (bool off : {false, true}) {
        cache.VisibleInto(batch, i, off, entries);
        EXPECT_EQ(entries, cache.Visible(batch, i, off));
      }
    }
    ExpectIntoEqualsValue(cache, cells, entries, positions);  // entries without data
    cache.Put();
    ExpectIntoEqualsValue(cache, cells, entries, positions);
  }
  cache.CopyPrefix(S(0), S(2), 5);
  ExpectIntoEqualsValue(cache, cells, entries, positions);
  ASSERT_TRUE(cache.Remove(S(1), 0, 1).ok());  // shifts: rows with a non-empty shift list
  ExpectIntoEqualsValue(cache, cells, entries, positions);
  ASSERT_FALSE(cache.Remove(S(0), 0, 1).ok());  // refused half-way on a shared cell
  ExpectIntoEqualsValue(cache, cells, entries, positions);
  ASSERT_TRUE(cache.Remove(S(2), 0, kUnbounded).ok());
  ExpectIntoEqualsValue(cache, cells, entries, positions);
  ASSERT_TRUE(cache.Remove(S(0), 0, kUnbounded).ok());
  ASSERT_TRUE(cache.Remove(S(1), 0, kUnbounded).ok());
  ExpectIntoEqualsValue(cache, cells, entries, positions);  // an empty cache
  EXPECT_EQ(cache.UsedCells(), 0);
}

// ---- LFM2 hybrid (§2.9.1) ------------------------------------------------------------

constexpr int64_t kDConv = 2;

// The conv input of a token: {id, written position}.
ConvRow Input(int64_t written_pos, const Token& token) {
  return {static_cast<float>(token.id), static_cast<float>(written_pos)};
}

RefHybridCache Hybrid(int32_t max_seqs) {
  return RefHybridCache(
      MultiSeqConfig{kUnbounded, kUnbounded, kUnbounded, max_seqs, kUnbounded, true}, kDConv, 2,
      Input);
}

ConvRows Conv(const RefHybridCache& cache, int32_t seq, ConvMode mode) {
  std::optional<ConvRows> rows = cache.ExpectedConv(S(seq), mode);
  EXPECT_TRUE(rows.has_value());
  return rows.value_or(ConvRows{});
}

using Groups = std::vector<std::vector<SeqId>>;

TEST(RefHybridCache, AppendsKeepIdealAndSpecifiedConvEqual) {
  RefHybridCache cache = Hybrid(4);
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1, 2}, 1)).ok());
  EXPECT_EQ(Conv(cache, 0, ConvMode::kIdeal), (ConvRows{{2, 1}, {3, 2}}));
  EXPECT_EQ(Conv(cache, 0, ConvMode::kAsSpecified), (ConvRows{{2, 1}, {3, 2}}));
  ASSERT_TRUE(cache.Forward(OneSeq(0, {3}, 4)).ok());
  EXPECT_EQ(Conv(cache, 0, ConvMode::kAsSpecified), (ConvRows{{3, 2}, {4, 3}}));
  EXPECT_FALSE(cache.ConvDivergesFromIdeal(S(0)));
  ASSERT_TRUE(cache.Forward(OneSeq(1, {0}, 7)).ok());  // fewer tokens than rows: zeros first
  EXPECT_EQ(Conv(cache, 1, ConvMode::kIdeal), (ConvRows{{0, 0}, {7, 0}}));
  EXPECT_FALSE(cache.ConvDivergesFromIdeal(S(1)));
  EXPECT_EQ(cache.SlotGroups(), (Groups{{S(0)}, {S(1)}}));
}

TEST(RefHybridCache, CopyPrefixShorterThanSourceDivergesFromIdeal) {
  RefHybridCache cache = Hybrid(4);
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1, 2, 3}, 1)).ok());
  cache.CopyPrefix(S(0), S(1), 2);
  EXPECT_EQ(Conv(cache, 1, ConvMode::kIdeal), (ConvRows{{1, 0}, {2, 1}}));
  EXPECT_EQ(Conv(cache, 1, ConvMode::kAsSpecified), (ConvRows{{3, 2}, {4, 3}}));  // src's
  EXPECT_TRUE(cache.ConvDivergesFromIdeal(S(1)));
  EXPECT_FALSE(cache.ConvDivergesFromIdeal(S(0)));
  cache.CopyPrefix(S(0), S(2), 4);  // the whole source: sharing is exact
  EXPECT_FALSE(cache.ConvDivergesFromIdeal(S(2)));
  EXPECT_EQ(cache.SlotGroups(), (Groups{{S(0), S(1), S(2)}}));
  // The forward of seq 1 copies the (wrong) shared state, then shifts its token in.
  ASSERT_TRUE(cache.Forward(OneSeq(1, {2}, 9)).ok());
  EXPECT_EQ(Conv(cache, 1, ConvMode::kAsSpecified), (ConvRows{{4, 3}, {9, 2}}));
  EXPECT_EQ(Conv(cache, 1, ConvMode::kIdeal), (ConvRows{{2, 1}, {9, 2}}));
  EXPECT_EQ(cache.SlotGroups(), (Groups{{S(0), S(2)}, {S(1)}}));
  // The lowest sequence of a shared slot copies too; its partner keeps the old rows.
  ASSERT_TRUE(cache.Forward(OneSeq(0, {4}, 10)).ok());
  EXPECT_EQ(cache.SlotGroups(), (Groups{{S(0)}, {S(1)}, {S(2)}}));
  EXPECT_EQ(Conv(cache, 0, ConvMode::kAsSpecified), (ConvRows{{4, 3}, {10, 4}}));
  EXPECT_EQ(Conv(cache, 2, ConvMode::kAsSpecified), (ConvRows{{3, 2}, {4, 3}}));
}

TEST(RefHybridCache, RemoveResetsSpecifiedConvToZero) {
  RefHybridCache cache = Hybrid(4);
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1, 2, 3}, 1)).ok());
  ASSERT_TRUE(cache.Remove(S(0), 2, kUnbounded).ok());
  EXPECT_EQ(Conv(cache, 0, ConvMode::kIdeal), (ConvRows{{1, 0}, {2, 1}}));
  EXPECT_EQ(Conv(cache, 0, ConvMode::kAsSpecified), (ConvRows{{0, 0}, {0, 0}}));
  EXPECT_TRUE(cache.ConvDivergesFromIdeal(S(0)));
  EXPECT_EQ(cache.LiveSlots(), 0);
  ASSERT_TRUE(cache.Forward(OneSeq(0, {2}, 9)).ok());  // a fresh zeroed slot
  EXPECT_EQ(Conv(cache, 0, ConvMode::kAsSpecified), (ConvRows{{0, 0}, {9, 2}}));
  EXPECT_EQ(Conv(cache, 0, ConvMode::kIdeal), (ConvRows{{2, 1}, {9, 2}}));
  ASSERT_TRUE(cache.Remove(S(0), 0, 1).ok());  // shifted entries keep their written inputs
  EXPECT_EQ(Conv(cache, 0, ConvMode::kIdeal), (ConvRows{{2, 1}, {9, 2}}));
  EXPECT_EQ(cache.kv().RetainedPositions(S(0)), (Positions{0, 1}));
  ASSERT_TRUE(cache.Forward(OneSeq(1, {0, 1}, 11)).ok());
  ASSERT_TRUE(cache.Remove(S(1), 5, kUnbounded).ok());  // removes nothing, still resets
  EXPECT_EQ(cache.kv().RetainedPositions(S(1)), (Positions{0, 1}));
  EXPECT_TRUE(cache.ConvDivergesFromIdeal(S(1)));
}

TEST(RefHybridCache, SlotGroupsFollowForksAndCopyOnWrite) {
  RefHybridCache cache = Hybrid(4);
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1}, 1)).ok());
  for (int32_t dst : {1, 2, 3}) cache.CopyPrefix(S(0), S(dst), 2);  // 4-way fork
  EXPECT_EQ(cache.SlotGroups(), (Groups{{S(0), S(1), S(2), S(3)}}));
  EXPECT_EQ(cache.LiveSlots(), 1);
  ASSERT_TRUE(cache.Forward(Batch({1, 2}, {2, 2}, 3)).ok());  // both leave by copy-on-write
  EXPECT_EQ(cache.SlotGroups(), (Groups{{S(0), S(3)}, {S(1)}, {S(2)}}));
  EXPECT_EQ(Conv(cache, 2, ConvMode::kAsSpecified), (ConvRows{{2, 1}, {4, 2}}));
  ASSERT_TRUE(cache.Forward(Batch({0, 3}, {2, 2}, 5)).ok());  // one copies, one keeps
  EXPECT_EQ(cache.SlotGroups(), (Groups{{S(0)}, {S(1)}, {S(2)}, {S(3)}}));
  EXPECT_EQ(cache.LiveSlots(), 4);
  cache.CopyPrefix(S(1), S(3), 3);  // overwrite frees 3's slot; chained sharing follows
  cache.CopyPrefix(S(3), S(2), 3);
  EXPECT_EQ(cache.SlotGroups(), (Groups{{S(0)}, {S(1), S(2), S(3)}}));
  EXPECT_EQ(cache.LiveSlots(), 2);
  EXPECT_EQ(Conv(cache, 2, ConvMode::kAsSpecified), (ConvRows{{2, 1}, {3, 2}}));
  for (int32_t seq : {1, 2, 3}) EXPECT_FALSE(cache.ConvDivergesFromIdeal(S(seq))) << seq;
}

TEST(RefHybridCache, UnequalBatchIsUnsupportedAfterTheKvUpdate) {
  RefHybridCache cache = Hybrid(4);
  const Status status = cache.Forward(Batch({0, 0, 1}, {0, 1, 0}, 1));
  EXPECT_EQ(status.code(), StatusCode::kUnsupported);
  EXPECT_EQ(cache.kv().RetainedPositions(S(0)), (Positions{0, 1}));
  for (const MsEntry& e : cache.kv().Retained(S(0))) EXPECT_FALSE(e.has_data);
  EXPECT_EQ(cache.LiveSlots(), 0);
  EXPECT_TRUE(cache.ConvDivergesFromIdeal(S(0)));  // the KV log has tokens conv never saw
}

TEST(RefHybridCache, MoreSequencesThanSlotsIsCacheFull) {
  RefHybridCache cache = Hybrid(2);
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0}, 1)).ok());
  const Status full = cache.Forward(Batch({1, 2}, {0, 0}, 2));
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.SlotGroups(), (Groups{{S(0)}, {S(1)}}));  // seq 1 got its slot first
  EXPECT_EQ(cache.SlotOf(S(1)), 1);
  // Not zeroed, but slot 1 was never written: zeros all the same.
  EXPECT_EQ(Conv(cache, 1, ConvMode::kAsSpecified), (ConvRows{{0, 0}, {0, 0}}));
  EXPECT_TRUE(cache.ConvDivergesFromIdeal(S(1)));
  EXPECT_FALSE(cache.kv().Retained(S(2))[0].has_data);
}

TEST(RefHybridCache, CopyOnWriteWithoutAFreeSlotIsCacheFull) {
  RefHybridCache cache = Hybrid(2);
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0}, 1)).ok());
  cache.CopyPrefix(S(0), S(1), 1);
  ASSERT_TRUE(cache.Forward(OneSeq(2, {0}, 2)).ok());
  EXPECT_EQ(cache.Forward(OneSeq(1, {1}, 3)).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.SlotGroups(), (Groups{{S(0), S(1)}, {S(2)}}));
  EXPECT_EQ(Conv(cache, 1, ConvMode::kAsSpecified), (ConvRows{{0, 0}, {1, 0}}));
}

TEST(RefHybridCache, RemoveRefusedByTheKvSideKeepsTheSlot) {
  RefHybridCache cache = Hybrid(4);
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1, 2, 3}, 1)).ok());
  cache.CopyPrefix(S(0), S(1), 4);
  EXPECT_EQ(cache.Remove(S(1), 0, 1).code(), StatusCode::kUnsupported);
  EXPECT_EQ(cache.SlotGroups(), (Groups{{S(0), S(1)}}));
  ASSERT_TRUE(cache.Remove(S(1), 0, kUnbounded).ok());
  EXPECT_EQ(cache.SlotGroups(), (Groups{{S(0)}}));
  EXPECT_TRUE(cache.CanResume(S(1), 0));
}

TEST(RefHybridCache, SlotsComeFromALifoStack) {
  RefHybridCache cache = Hybrid(4);
  EXPECT_EQ(cache.FreeSlots(), (std::vector<int32_t>{3, 2, 1, 0}));  // 0 is handed out first
  for (int32_t seq : {0, 1, 2}) ASSERT_TRUE(cache.Forward(OneSeq(seq, {0}, seq + 1)).ok());
  EXPECT_EQ(cache.SlotOf(S(2)), 2);
  ASSERT_TRUE(cache.Remove(S(0), 0, kUnbounded).ok());
  ASSERT_TRUE(cache.Remove(S(2), 0, kUnbounded).ok());
  EXPECT_EQ(cache.FreeSlots(), (std::vector<int32_t>{3, 0, 2}));
  ASSERT_TRUE(cache.Forward(OneSeq(3, {0}, 9)).ok());  // the last freed comes back first
  EXPECT_EQ(cache.SlotOf(S(3)), 2);
  // A recycled slot is zeroed on allocation, whatever it held.
  EXPECT_EQ(Conv(cache, 3, ConvMode::kAsSpecified), (ConvRows{{0, 0}, {9, 0}}));
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0}, 10)).ok());
  EXPECT_EQ(cache.SlotOf(S(0)), 0);
  EXPECT_EQ(cache.FreeSlots(), (std::vector<int32_t>{3}));
}

// A reserve pass whose graph runs writes the fake slots 0..n-1: slot i takes the i-th
// sequence of the batch over whatever rows it held, so the sequence that owns slot 0 here
// (seq 1, first to allocate) is overwritten with seq 0's inputs, and seq 0's own slot is not.
TEST(RefHybridCache, AReserveConvWriteOverwritesTheFakeSlots) {
  RefHybridCache cache = Hybrid(4);
  ASSERT_TRUE(cache.Forward(OneSeq(1, {0, 1}, 1)).ok());  // slot 0
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1}, 5)).ok());  // slot 1
  ASSERT_EQ(cache.SlotOf(S(1)), 0);
  const std::vector<int32_t> free_before = cache.FreeSlots();
  cache.ReserveConvWrite(OneSeq(0, {7}, 9));
  EXPECT_EQ(Conv(cache, 1, ConvMode::kAsSpecified), (ConvRows{{2, 1}, {9, 7}}));
  EXPECT_EQ(Conv(cache, 1, ConvMode::kIdeal), (ConvRows{{1, 0}, {2, 1}}));
  EXPECT_TRUE(cache.ConvDivergesFromIdeal(S(1)));
  EXPECT_EQ(Conv(cache, 0, ConvMode::kAsSpecified), (ConvRows{{5, 0}, {6, 1}}));
  EXPECT_FALSE(cache.ConvDivergesFromIdeal(S(0)));
  // Nothing is mapped or moved: slots, refcounts and the free stack stay.
  EXPECT_EQ(cache.SlotOf(S(0)), 1);
  EXPECT_EQ(cache.FreeSlots(), free_before);
  EXPECT_EQ(cache.kv().RetainedPositions(S(0)), (Positions{0, 1}));
}

TEST(RefHybridCache, CopyOnWriteWaitsForTheFirstConvState) {
  RefHybridCache cache = Hybrid(4);
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1}, 1)).ok());
  cache.CopyPrefix(S(0), S(1), 2);
  ASSERT_TRUE(cache.StartForward(OneSeq(1, {2}, 3)).ok());
  EXPECT_EQ(cache.SlotOf(S(1)), 0);  // still shared after StartForward
  EXPECT_EQ(cache.RefCount(0), 2);
  EXPECT_EQ(cache.CurrentSlots(), (std::vector<int32_t>{0}));
  ASSERT_TRUE(cache.ConvState().ok());
  EXPECT_EQ(cache.SlotOf(S(1)), 1);
  EXPECT_EQ(cache.RefCount(0), 1);
  EXPECT_EQ(cache.CurrentSlots(), (std::vector<int32_t>{1}));
  ASSERT_TRUE(cache.ConvState().ok());  // once per forward
  EXPECT_EQ(cache.FreeSlots(), (std::vector<int32_t>{3, 2}));
  cache.FinishForward();
  EXPECT_EQ(Conv(cache, 1, ConvMode::kAsSpecified), (ConvRows{{2, 1}, {3, 2}}));
  // Without conv layers nothing reads the state, so nothing is ever unshared.
  cache.CopyPrefix(S(0), S(2), 2);
  ASSERT_TRUE(cache.Forward(OneSeq(2, {2}, 4), /*reads_conv=*/false).ok());
  EXPECT_EQ(cache.SlotOf(S(2)), 0);
  EXPECT_EQ(cache.RefCount(0), 2);
}

TEST(RefHybridCache, SlotsTakenBeforeAFailedAllocationKeepTheirRows) {
  RefHybridCache cache = Hybrid(2);
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1}, 1)).ok());  // slot 0
  ASSERT_TRUE(cache.Forward(OneSeq(1, {0}, 3)).ok());     // slot 1
  ASSERT_TRUE(cache.Remove(S(0), 0, kUnbounded).ok());    // slot 0 free, rows kept
  EXPECT_EQ(cache.Forward(Batch({2, 3}, {0, 0}, 4)).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.SlotOf(S(2)), 0);  // popped, mapped, never zeroed
  EXPECT_EQ(Conv(cache, 2, ConvMode::kAsSpecified), (ConvRows{{1, 0}, {2, 1}}));
  EXPECT_EQ(cache.SlotOf(S(3)), std::nullopt);
  EXPECT_TRUE(cache.FreeSlots().empty());
}

// ExpectedConvInto into one reused buffer answers as ExpectedConv in both modes, unknown
// rows included (a failed forward took the slot).
void ExpectConvIntoEqualsValue(const RefHybridCache& cache, ConvRows& rows) {
  for (int32_t s = 0; s < 4; ++s) {
    for (ConvMode mode : {ConvMode::kIdeal, ConvMode::kAsSpecified}) {
      const std::optional<ConvRows> fresh = cache.ExpectedConv(S(s), mode);
      const bool known = cache.ExpectedConvInto(S(s), mode, rows);
      EXPECT_EQ(known, fresh.has_value()) << "s" << s;
      if (known && fresh) {
        EXPECT_EQ(rows, *fresh) << "s" << s;
      }
    }
  }
}

TEST(RefHybridCache, ExpectedConvIntoAnswersAsExpectedConv) {
  RefHybridCache cache = Hybrid(3);
  ConvRows rows;
  ExpectConvIntoEqualsValue(cache, rows);  // nothing mapped: zero rows
  ASSERT_TRUE(cache.Forward(OneSeq(0, {0, 1, 2}, 1)).ok());
  ExpectConvIntoEqualsValue(cache, rows);
  cache.CopyPrefix(S(0), S(1), 2);  // shares the current state: diverges from the ideal
  ExpectConvIntoEqualsValue(cache, rows);
  EXPECT_TRUE(cache.ConvDivergesFromIdeal(S(1)));
  EXPECT_FALSE(cache.ConvDivergesFromIdeal(S(0)));
  ASSERT_TRUE(cache.Forward(OneSeq(2, {0}, 4)).ok());  // the last free slot but one
  // s3 takes the last slot, then s1's copy-on-write finds none: s3's rows are unknown.
  ASSERT_EQ(cache.Forward(Batch({1, 3}, {2, 0}, 5)).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.ExpectedConv(S(3), ConvMode::kAsSpecified), std::nullopt);
  ExpectConvIntoEqualsValue(cache, rows);
  EXPECT_TRUE(cache.ConvDivergesFromIdeal(S(3)));
}

}  // namespace
}  // namespace kvtwin::model
