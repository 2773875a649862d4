// Goal: pin CausalCache (spec §2.8) to the historical ggml `kvcache/causal_test.go`
// conformance scenarios (spec §6.13) with their exact views and masks, and to the edges
// the spec states but the Go tests do not reach: Init derivations, the non-transactional
// errors (spec §8 quirk 6), SetCausal's lifetime, shift grouping, malformed calls.
// Method: every test runs with V stored row-major and transposed (permuted V); the
// observable results must be identical. A token's K/V row is derived from its value t
// (column c holds t + 1000 c, so a transposed read or a swapped row shows); Store uses the
// Go test's six-column data. Masks are strings per batch token, '0' visible, 'x' masked,
// read in cell order. Deterministic; no randomness.
#include "src/causal_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvtwin {
namespace {

using RowFn = std::function<std::vector<float>(float)>;

constexpr int64_t kCols = 3;

std::vector<float> TokenRow(float t) { return {t, t + 1000.0f, t + 2000.0f}; }

// The Go TestStore rows: token t holds 1{h}{t}, 2{h}{t} for heads h = 1..3.
std::vector<float> StoreRow(float t) {
  return {110 + t, 210 + t, 120 + t, 220 + t, 130 + t, 230 + t};
}

Tensor RowsOf(const std::vector<float>& tokens, const RowFn& row) {
  const auto cols = static_cast<int64_t>(row(0).size());
  Tensor t(DType::kFloat32, static_cast<int64_t>(tokens.size()), cols);
  for (size_t r = 0; r < tokens.size(); ++r) {
    const std::vector<float> values = row(tokens[r]);
    for (int64_t c = 0; c < cols; ++c) {
      t.Set(static_cast<int64_t>(r), c, values[static_cast<size_t>(c)]);
    }
  }
  return t;
}

std::vector<std::vector<float>> AsRows(const Tensor& t) {
  std::vector<std::vector<float>> rows(static_cast<size_t>(t.rows()));
  for (int64_t r = 0; r < t.rows(); ++r) {
    for (int64_t c = 0; c < t.cols(); ++c) rows[static_cast<size_t>(r)].push_back(t.At(r, c));
  }
  return rows;
}

std::vector<std::string> MaskStrings(const CausalCache::View& view) {
  std::vector<std::string> out;
  for (const std::vector<bool>& row : view.visible) {
    std::string s;
    for (bool v : row) s += v ? '0' : 'x';
    out.push_back(s);
  }
  return out;
}

std::vector<BatchToken> Batch(const std::vector<int32_t>& seqs, const std::vector<int64_t>& pos) {
  std::vector<BatchToken> batch;
  for (size_t i = 0; i < seqs.size(); ++i) batch.push_back({seqs[i], pos[i]});
  return batch;
}

struct Step {
  std::vector<int32_t> seqs;
  std::vector<int64_t> pos;
  std::vector<float> in;               // token values written by Put (K and V alike)
  std::vector<float> expected;         // K view, cell order
  std::vector<std::string> mask;       // per batch token
  std::vector<float> expected_v = {};  // V view when it differs from K
};

// StartForward, Put(in, in), Get, then the exact K and V views and mask; V is also read
// cell by cell through VRow.
void RunStep(CausalCache& cache, const Step& s, const RowFn& row = TokenRow) {
  const std::vector<BatchToken> batch = Batch(s.seqs, s.pos);
  ASSERT_TRUE(cache.StartForward(batch).ok());
  const Tensor in = RowsOf(s.in, row);
  ASSERT_TRUE(cache.Put(in, in).ok());
  const CausalCache::View view = cache.Get();
  EXPECT_EQ(AsRows(view.k), AsRows(RowsOf(s.expected, row)));
  const std::vector<float>& want_v = s.expected_v.empty() ? s.expected : s.expected_v;
  EXPECT_EQ(AsRows(view.v), AsRows(RowsOf(want_v, row)));
  Tensor reused;  // VRowInto shapes it once, then overwrites it in place
  const void* shaped = nullptr;
  for (int64_t cell = view.range_begin; cell < view.range_end; ++cell) {
    EXPECT_EQ(AsRows(cache.VRow(cell)), AsRows(view.v.Rows(cell - view.range_begin, 1)));
    cache.VRowInto(cell, reused);
    EXPECT_TRUE(reused.Equals(cache.VRow(cell))) << "cell " << cell;
    // Once shaped, the buffer is written in place: a row per cell would allocate per check.
    if (cell == view.range_begin) shaped = TensorView(reused).data();
    EXPECT_EQ(TensorView(reused).data(), shaped) << "cell " << cell << " reallocated the buffer";
    // A buffer of another shape or dtype is reshaped, never written at its own shape.
    const CausalConfig& c = cache.config();
    const DType other = c.dtype == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
    for (Tensor wrong : {Tensor(c.dtype, 1, c.kv_cols + 1), Tensor(c.dtype, 2, c.kv_cols),
                         Tensor(other, 1, c.kv_cols)}) {
      cache.VRowInto(cell, wrong);
      EXPECT_TRUE(wrong.Equals(cache.VRow(cell))) << "cell " << cell;
    }
  }
  EXPECT_EQ(MaskStrings(view), s.mask);
}

// The Go tests' RoPE stand-in: adds the offset to every K element of the listed cells.
Status AddShift(CausalCache& cache, std::span<const int64_t> cells, int64_t delta) {
  Tensor& k = cache.mutable_k();
  for (int64_t cell : cells) {
    for (int64_t c = 0; c < k.cols(); ++c) {
      k.Set(cell, c, k.At(cell, c) + static_cast<float>(delta));
    }
  }
  return Status::Ok();
}

class CausalCacheTest : public ::testing::TestWithParam<bool> {
 protected:
  // Go's Init(backend, dtype, maxSequences, capacity, maxBatch).
  CausalConfig Config(int32_t max_seqs, int64_t capacity, int64_t max_batch) const {
    CausalConfig c;
    c.max_seqs = max_seqs;
    c.capacity = capacity;
    c.max_batch = max_batch;
    c.kv_cols = kCols;
    c.permuted_v = GetParam();
    return c;
  }
};

INSTANTIATE_TEST_SUITE_P(VLayouts, CausalCacheTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param_info) {
                           return param_info.param ? std::string("PermutedV") : std::string("RowV");
                         });

TEST_P(CausalCacheTest, Store) {
  CausalConfig config = Config(1, 16, 16);
  config.kv_cols = 6;
  auto made = CausalCache::Create(config);
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  RunStep(
      cache,
      {{0, 0, 0, 0}, {0, 1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 4}, {"0xxx", "00xx", "000x", "0000"}},
      StoreRow);
  RunStep(cache, {{0}, {4}, {5}, {1, 2, 3, 4, 5}, {"00000"}}, StoreRow);
}

// One-column rows (every size may be 1): a reused V row buffer of the right width but
// another row count must still be reshaped, which a width test alone cannot tell.
TEST_P(CausalCacheTest, OneColumnRows) {
  CausalConfig config = Config(1, 8, 4);
  config.kv_cols = 1;
  auto made = CausalCache::Create(config);
  ASSERT_TRUE(made.ok());
  const RowFn one_column = [](float t) { return std::vector<float>{t}; };
  RunStep(*made, {{0, 0, 0}, {0, 1, 2}, {1, 2, 3}, {1, 2, 3}, {"0xx", "00x", "000"}}, one_column);
  RunStep(*made, {{0}, {3}, {4}, {1, 2, 3, 4}, {"0000"}}, one_column);
  // With a window the current range leaves cell 0 (SWASeparateBatches' first steps): a
  // one-column V view must still start at the range, not at the buffer's first cell.
  CausalConfig swa = Config(2, 16, 2);
  swa.kv_cols = 1;
  swa.window = 1;
  auto windowed = CausalCache::Create(swa);
  ASSERT_TRUE(windowed.ok());
  RunStep(*windowed, {{0, 0}, {0, 1}, {1, 2}, {1, 2}, {"0x", "00"}}, one_column);
  RunStep(*windowed, {{0, 0}, {2, 3}, {3, 4}, {2, 3, 4}, {"00x", "x00"}}, one_column);
}

// The largest accepted positions (2^31 - 1 is int32's maximum) keep their window and
// memory exactly as small ones do: the window arithmetic must not overflow near the bound.
TEST_P(CausalCacheTest, PositionsUpToTheInt32BoundKeepTheirWindow) {
  CausalConfig config = Config(2, 16, 2);
  config.window = 1;
  auto made = CausalCache::Create(config);
  ASSERT_TRUE(made.ok());
  const int64_t top = std::numeric_limits<int32_t>::max();
  RunStep(*made, {{0, 0}, {top - 3, top - 2}, {1, 2}, {1, 2}, {"0x", "00"}});
  RunStep(*made, {{0, 0}, {top - 1, top}, {3, 4}, {2, 3, 4}, {"00x", "x00"}});
}

// Window maintenance of an idle sequence whose last position is the int32 bound: its
// lowest is that position + 1 = 2^31 (spec §2.8), one past what int32 holds, so the oldest
// of its cells leaves memory. The drivers' positions stop at 2^24 (the provenance tag).
TEST_P(CausalCacheTest, AnIdleSequenceAtTheInt32BoundIsPrunedPastIt) {
  CausalConfig config = Config(2, 16, 2);
  config.window = 1;  // memory 2 with parallel sequences
  auto made = CausalCache::Create(config);
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  const int64_t top = std::numeric_limits<int32_t>::max();
  const auto forward = [&cache](const std::vector<int32_t>& seqs, const std::vector<int64_t>& pos) {
    ASSERT_TRUE(cache.StartForward(Batch(seqs, pos)).ok());
    const Tensor in = RowsOf(std::vector<float>(seqs.size(), 1.0f), TokenRow);
    ASSERT_TRUE(cache.Put(in, in).ok());
  };
  forward({0, 0}, {top - 2, top - 1});
  forward({0}, {top});  // in the batch: lowest = top keeps top - 2
  forward({1}, {0});    // idle: lowest = top + 1 drops top - 2
  std::vector<int64_t> held;
  for (const CausalCache::Cell& cell : cache.cells()) {
    if (cell.seqs.count(0) != 0) held.push_back(cell.pos);
  }
  std::sort(held.begin(), held.end());
  EXPECT_EQ(held, (std::vector<int64_t>{top - 1, top}));
}

TEST_P(CausalCacheTest, SWA) {
  CausalConfig config = Config(1, 16, 16);
  config.window = 1;
  auto made = CausalCache::Create(config);
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  EXPECT_EQ(cache.num_cells(), 17);  // memory 1 + max_batch 16
  RunStep(
      cache,
      {{0, 0, 0, 0}, {0, 1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 4}, {"0xxx", "00xx", "x00x", "xx00"}});
  // Positions 0..2 fall out of memory; the freed cells 0 and 1 are reused.
  RunStep(cache, {{0, 0}, {4, 5}, {5, 6}, {5, 6, 3, 4}, {"0xx0", "00xx"}});
}

TEST_P(CausalCacheTest, SWASeparateBatches) {
  CausalConfig config = Config(2, 16, 2);
  config.window = 1;
  auto made = CausalCache::Create(config);
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  EXPECT_EQ(cache.config().memory, 2);  // window + 1 with parallel sequences
  EXPECT_EQ(cache.num_cells(), 6);
  RunStep(cache, {{0, 0}, {0, 1}, {1, 2}, {1, 2}, {"0x", "00"}});
  RunStep(cache, {{0, 0}, {2, 3}, {3, 4}, {2, 3, 4}, {"00x", "x00"}});
  RunStep(cache, {{1, 1}, {0, 1}, {5, 6}, {5, 6}, {"0x", "00"}});
  RunStep(cache, {{1, 1}, {2, 3}, {7, 8}, {6, 3, 4, 7, 8}, {"0xx0x", "xxx00"}});
  RunStep(cache, {{0, 0}, {4, 5}, {9, 10}, {9, 10, 3, 4}, {"0xx0", "00xx"}});
}

TEST_P(CausalCacheTest, SWAMem) {
  CausalConfig config = Config(1, 16, 16);
  config.window = 1;
  config.memory = 3;
  auto made = CausalCache::Create(config);
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  RunStep(
      cache,
      {{0, 0, 0, 0}, {0, 1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 4}, {"0xxx", "00xx", "x00x", "xx00"}});
  // Memory keeps positions 1..3 (masked by the window where too old); only cell 0 is freed.
  RunStep(cache, {{0, 0}, {4, 5}, {5, 6}, {5, 2, 3, 4, 6}, {"0xx0x", "0xxx0"}});
}

TEST_P(CausalCacheTest, ChunkedAttention) {
  CausalConfig config = Config(1, 16, 16);
  config.chunk = 2;
  auto made = CausalCache::Create(config);
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  RunStep(
      cache,
      {{0, 0, 0, 0}, {0, 1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 4}, {"0xxx", "00xx", "xx0x", "xx00"}});
  RunStep(
      cache,
      {{0, 0, 0}, {4, 5, 6}, {5, 6, 7}, {1, 2, 3, 4, 5, 6, 7}, {"xxxx0xx", "xxxx00x", "xxxxxx0"}});
  RunStep(cache, {{0, 0}, {7, 8}, {8, 9}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {"xxxxxx00x", "xxxxxxxx0"}});
}

// The Go tests use sequence 1 with maxSequences 1 (ggml does not check ids); two sequences
// of capacity 8 keep the Go cell count of 16 (plain causal: max_seqs * capacity).
TEST_P(CausalCacheTest, Sequences) {
  auto made = CausalCache::Create(Config(2, 8, 16));
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  RunStep(
      cache,
      {{0, 0, 1, 1}, {0, 1, 0, 1}, {1, 2, 3, 4}, {1, 2, 3, 4}, {"0xxx", "00xx", "xx0x", "xx00"}});
  RunStep(cache, {{0, 1}, {2, 2}, {5, 6}, {1, 2, 3, 4, 5, 6}, {"00xx0x", "xx00x0"}});
}

TEST_P(CausalCacheTest, Remove) {
  auto made = CausalCache::Create(Config(2, 8, 16));
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  cache.set_shift(AddShift);
  RunStep(
      cache,
      {{0, 0, 1, 1}, {0, 1, 0, 1}, {1, 2, 3, 4}, {1, 2, 3, 4}, {"0xxx", "00xx", "xx0x", "xx00"}});
  ASSERT_TRUE(cache.Remove(0, 1, kUnbounded).ok());
  // The freed cell 1 takes the first new token.
  RunStep(cache, {{0, 1}, {1, 2}, {5, 6}, {1, 5, 3, 4, 6}, {"00xxx", "xx000"}});
  ASSERT_TRUE(cache.Remove(0, 0, 1).ok());
  // Cell 1 (token 5) is renumbered to position 0 and its key shifted by -1; V is not.
  RunStep(cache,
          {{0, 0}, {1, 2}, {7, 8}, {7, 4, 3, 4, 6, 8}, {"00xxxx", "00xxx0"}, {7, 5, 3, 4, 6, 8}});
}

TEST_P(CausalCacheTest, Copy) {
  auto made = CausalCache::Create(Config(2, 8, 16));
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  cache.set_shift([](CausalCache&, std::span<const int64_t>, int64_t) { return Status::Ok(); });
  RunStep(
      cache,
      {{0, 0, 0, 0}, {0, 1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 4}, {"0xxx", "00xx", "000x", "0000"}});
  ASSERT_TRUE(cache.CopyPrefix(0, 1, 2).ok());
  EXPECT_EQ(cache.cells()[1].seqs, (std::set<int32_t>{0, 1}));
  EXPECT_EQ(cache.cells()[2].seqs, (std::set<int32_t>{0}));
  RunStep(cache, {{1, 1}, {3, 4}, {5, 6}, {1, 2, 3, 4, 5, 6}, {"00xx0x", "00xx00"}});
}

TEST_P(CausalCacheTest, CanResume) {
  CausalConfig config = Config(1, 16, 16);
  config.window = 4;
  auto made = CausalCache::Create(config);
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  RunStep(cache, {{0, 0, 0, 0, 0},
                  {0, 1, 2, 3, 4},
                  {1, 2, 3, 4, 5},
                  {1, 2, 3, 4, 5},
                  {"0xxxx", "00xxx", "000xx", "0000x", "00000"}});
  // Nothing has slid out of the window yet.
  for (int64_t p = 0; p <= 5; ++p) EXPECT_TRUE(cache.CanResume(0, p)) << p;
  EXPECT_FALSE(cache.CanResume(0, 6));  // beyond last + 1
  EXPECT_FALSE(cache.CanResume(1, 0));  // no cells
  RunStep(cache, {{0}, {5}, {6}, {6, 2, 3, 4, 5}, {"00000"}});
  for (int64_t p = 0; p <= 4; ++p) EXPECT_FALSE(cache.CanResume(0, p)) << p;
  EXPECT_TRUE(cache.CanResume(0, 5));
  EXPECT_TRUE(cache.CanResume(0, 6));
}

TEST_P(CausalCacheTest, CanResumeSWAMem) {
  CausalConfig config = Config(1, 16, 16);
  config.window = 4;
  config.memory = 5;
  auto made = CausalCache::Create(config);
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  const std::vector<BatchToken> first = Batch({0, 0, 0, 0, 0, 0, 0}, {0, 1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(cache.StartForward(first).ok());
  const Tensor rows = RowsOf({1, 2, 3, 4, 5, 6, 7}, TokenRow);
  ASSERT_TRUE(cache.Put(rows, rows).ok());
  // Position 7 prunes positions 0 and 1 (below 7 - 5); position 2 stays in memory but is
  // outside the window.
  RunStep(cache, {{0}, {7}, {8}, {8, 2, 3, 4, 5, 6, 7}, {"0xx0000"}});
  for (int64_t p = 0; p <= 5; ++p) EXPECT_FALSE(cache.CanResume(0, p)) << p;
  EXPECT_TRUE(cache.CanResume(0, 6));
  EXPECT_TRUE(cache.CanResume(0, 7));
}

// Spec §2.8 Init: memory default, the parallel-sequence bump, unbounded at capacity, the
// window check after both, cell count and padding.
int64_t CellsOf(const CausalConfig& config, int64_t* memory = nullptr) {
  auto made = CausalCache::Create(config);
  if (!made.ok()) return -static_cast<int64_t>(made.status().code());
  if (memory != nullptr) *memory = made->config().memory;
  return made->num_cells();
}

CausalConfig InitConfig(int32_t max_seqs, int64_t capacity, int64_t max_batch, int64_t window,
                        int64_t memory = kUnbounded, int64_t padding = 1) {
  CausalConfig c;
  c.max_seqs = max_seqs;
  c.capacity = capacity;
  c.max_batch = max_batch;
  c.window = window;
  c.memory = memory;
  c.padding = padding;
  return c;
}

TEST(CausalCacheInit, DerivesMemoryAndCellCount) {
  const int64_t invalid = -static_cast<int64_t>(StatusCode::kInvalidArgument);
  int64_t memory = 0;
  EXPECT_EQ(CellsOf(InitConfig(2, 16, 8, kUnbounded), &memory), 32);  // plain causal
  EXPECT_EQ(memory, kUnbounded);
  EXPECT_EQ(CellsOf(InitConfig(1, 16, 8, 4), &memory), 12);  // memory = window
  EXPECT_EQ(memory, 4);
  EXPECT_EQ(CellsOf(InitConfig(2, 16, 8, 4), &memory), 18);  // window + 1 per sequence
  EXPECT_EQ(memory, 5);
  EXPECT_EQ(CellsOf(InitConfig(2, 16, 8, 4, 7), &memory), 22);
  EXPECT_EQ(memory, 7);
  // The bump runs before the window check, so it rescues a too-small memory.
  EXPECT_EQ(CellsOf(InitConfig(2, 16, 8, 4, 3), &memory), 18);
  EXPECT_EQ(memory, 5);
  EXPECT_EQ(CellsOf(InitConfig(1, 16, 8, 4, 3)), invalid);       // memory < window
  EXPECT_EQ(CellsOf(InitConfig(1, 16, 8, 4, 16), &memory), 16);  // memory >= capacity
  EXPECT_EQ(memory, kUnbounded);
  EXPECT_EQ(CellsOf(InitConfig(2, 16, 8, 15), &memory), 32);  // the bump reaches capacity
  EXPECT_EQ(memory, kUnbounded);
  EXPECT_EQ(CellsOf(InitConfig(1, 16, 8, kUnbounded, 20)), 16);
  EXPECT_EQ(CellsOf(InitConfig(1, 16, 8, kUnbounded, 10)), invalid);
  EXPECT_EQ(CellsOf(InitConfig(1, 16, 3, 4, kUnbounded, 8)), 8);  // 4 + 3 rounded up
  EXPECT_EQ(CellsOf(InitConfig(1, 10, 3, kUnbounded, kUnbounded, 4)), 12);
  EXPECT_EQ(CellsOf(InitConfig(1, 0, 3, kUnbounded)), invalid);
  EXPECT_EQ(CellsOf(InitConfig(1, 16, 0, kUnbounded)), invalid);
  EXPECT_EQ(CellsOf(InitConfig(1, 16, 3, 0)), invalid);
  // The smallest cache: every size 1 (each bound is inclusive), one cell.
  CausalConfig smallest = InitConfig(1, 1, 1, kUnbounded);
  smallest.kv_cols = 1;
  EXPECT_EQ(CellsOf(smallest), 1);
  // Every size must be positive, each on its own (padding 0 would divide by zero later).
  EXPECT_EQ(CellsOf(InitConfig(0, 16, 3, kUnbounded)), invalid);
  EXPECT_EQ(CellsOf(InitConfig(1, 16, 3, kUnbounded, kUnbounded, 0)), invalid);
  CausalConfig no_cols = InitConfig(1, 16, 3, kUnbounded);
  no_cols.kv_cols = 0;
  EXPECT_EQ(CellsOf(no_cols), invalid);
  // A memory of 0 is refused before the parallel-sequence bump could raise it to the
  // window; a negative chunk likewise.
  EXPECT_EQ(CellsOf(InitConfig(2, 16, 8, 4, 0)), invalid);
  CausalConfig negative_chunk = InitConfig(1, 16, 3, kUnbounded);
  negative_chunk.chunk = -1;
  EXPECT_EQ(CellsOf(negative_chunk), invalid);
}

// The cell table is bounded (2^24 cells): a size past it, or sizes each within it whose cell
// count is not, are refused before anything is allocated, each by its own check.
TEST(CausalCacheInit, RefusesMoreCellsThanTheBound) {
  constexpr int64_t kBound = int64_t{1} << 24;
  const auto refusal = [](const CausalConfig& c) {
    auto made = CausalCache::Create(c);
    EXPECT_FALSE(made.ok());
    if (made.ok()) return std::string();
    EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
    return made.status().message();
  };
  const std::string beyond = "sizes beyond 16777216";
  EXPECT_NE(refusal(InitConfig(1, kBound + 1, 8, kUnbounded)).find(beyond), std::string::npos);
  EXPECT_NE(refusal(InitConfig(1, 16, kBound + 1, kUnbounded)).find(beyond), std::string::npos);
  EXPECT_NE(refusal(InitConfig(kBound + 1, 1, 8, kUnbounded)).find(beyond), std::string::npos);
  // 2^12 sequences of 2^13 cells: each size fits, their product does not.
  EXPECT_NE(refusal(InitConfig(1 << 12, 1 << 13, 8, kUnbounded)).find("33554432 cells exceed"),
            std::string::npos);
  // Products at or past 2^32, which a 32-bit cell count (ggml's kv_size) wraps to a small
  // number: 2^8 x 2^24 (to 0), 2^16 x 2^16 (to 0), and with bounded memory 2^16 sequences x
  // (2^16 + 1) cells + 8 (to 65,544). Each is refused with its true count.
  EXPECT_NE(refusal(InitConfig(1 << 8, kBound, 8, kUnbounded)).find("4294967296 cells exceed"),
            std::string::npos);
  EXPECT_NE(refusal(InitConfig(1 << 16, 1 << 16, 8, kUnbounded)).find("4294967296 cells exceed"),
            std::string::npos);
  EXPECT_NE(refusal(InitConfig(1 << 16, (1 << 16) + 2, 8, 1 << 16)).find("4295032840 cells exceed"),
            std::string::npos);
  // 2^24 - 1 cells fit; padded to a multiple of 11 they do not (2^24 + 6).
  EXPECT_NE(refusal(InitConfig(1, kBound - 1, 8, kUnbounded, kUnbounded, 11))
                .find("16777222 cells exceed"),
            std::string::npos);
  // Exactly 2^24 is the largest cache, whether the sizes or the padding reach it. Asked of
  // DeriveCells, which allocates nothing: the cache itself would take about a gigabyte.
  for (const int64_t padding : {1, 2}) {
    CausalConfig at = InitConfig(1, kBound - padding + 1, 8, kUnbounded, kUnbounded, padding);
    const Result<int64_t> fits = CausalCache::DeriveCells(at);
    ASSERT_TRUE(fits.ok()) << fits.status().ToString();
    EXPECT_EQ(*fits, kBound);
  }
  CausalConfig seqs_at = InitConfig(static_cast<int32_t>(kBound), 1, 8, kUnbounded);
  EXPECT_TRUE(CausalCache::DeriveCells(seqs_at).ok());
  CausalConfig batch_at = InitConfig(1, 16, kBound, kUnbounded);
  EXPECT_TRUE(CausalCache::DeriveCells(batch_at).ok());
}

// Zero stands for a cell never written.
std::vector<float> PaddedRow(float t) {
  return t == 0 ? std::vector<float>(kCols, 0.0f) : TokenRow(t);
}

TEST_P(CausalCacheTest, GetWidensRangeToPadding) {
  CausalConfig config = Config(2, 16, 2);
  config.window = 1;
  config.padding = 4;
  auto made = CausalCache::Create(config);
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  EXPECT_EQ(cache.num_cells(), 8);  // 2 * 2 + 2 rounded up to 4
  RunStep(cache, {{1, 1}, {0, 1}, {1, 2}, {1, 2, 0, 0}, {"0xxx", "00xx"}}, PaddedRow);
  RunStep(cache, {{0, 0}, {0, 1}, {3, 4}, {1, 2, 3, 4}, {"xx0x", "xx00"}}, PaddedRow);
  // Current range [3, 5] widens to [0, 8).
  RunStep(cache, {{0, 0}, {2, 3}, {5, 6}, {1, 2, 3, 4, 5, 6, 0, 0}, {"xxx00xxx", "xxxx00xx"}},
          PaddedRow);
  EXPECT_EQ(cache.Get().range_begin, 0);
  EXPECT_EQ(cache.Get().range_end, 8);
}

TEST_P(CausalCacheTest, CacheFullLeavesPrunedMetadata) {
  CausalConfig config = Config(2, 16, 2);
  config.window = 1;
  auto made = CausalCache::Create(config);
  ASSERT_TRUE(made.ok());
  CausalCache& cache = *made;
  ASSERT_EQ(cache.num_cells(), 6);
  RunStep(cache, {{0, 0}, {0, 1}, {1, 2}, {1, 2}, {"0x", "00"}});
  RunStep(cache, {{1, 1}, {5, 6}, {3, 4}, {3, 4}, {"0x", "00"}});
  // Re-sent positions (no Remove first) keep all of sequence 0 and fill the cache.
  RunStep(cache, {{0, 0}, {0, 1}, {5, 6}, {1, 2, 3, 4, 5, 6}, {"0xxx0x", "00xx00"}});
  // Position 8 prunes position 5 of sequence 1 (cell 2), one free cell for two tokens.
  const Status full = cache.StartForward(Batch({1, 1}, {8, 9}));
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(cache.cells()[2].seqs.empty());
  EXPECT_EQ(cache.ranges().at(1), std::make_pair(int64_t{3}, int64_t{3}));
  EXPECT_EQ(cache.ranges().at(0), std::make_pair(int64_t{0}, int64_t{5}));
  EXPECT_TRUE(cache.locations().empty());
  const Tensor rows = RowsOf({7, 8}, TokenRow);
  EXPECT_EQ(cache.Put(rows, rows).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(cache.StartForward(Batch({1}, {8})).ok());
  EXPECT_EQ(cache.locations(), std::vector<int64_t>{2});
}

TEST_P(CausalCacheTest, RemoveSharedCellIsUnsupportedAfterPartialChanges) {
  CausalCache cache = std::move(CausalCache::Create(Config(2, 16, 8))).value();
  int shifts = 0;
  cache.set_shift([&shifts](CausalCache&, std::span<const int64_t>, int64_t) {
    ++shifts;
    return Status::Ok();
  });
  RunStep(cache, {{0, 0}, {0, 1}, {1, 2}, {1, 2}, {"0x", "00"}});
  RunStep(
      cache,
      {{1, 1, 1, 1}, {0, 1, 2, 3}, {3, 4, 5, 6}, {3, 4, 5, 6}, {"0xxx", "00xx", "000x", "0000"}});
  ASSERT_TRUE(cache.CopyPrefix(1, 0, 4).ok());  // sequence 0 now shares cells 2..5
  RunStep(cache, {{0}, {4}, {7}, {7, 2, 3, 4, 5, 6}, {"0x0000"}});
  const Status status = cache.Remove(0, 1, 2);
  EXPECT_EQ(status.code(), StatusCode::kUnsupported);
  EXPECT_EQ(cache.cells()[0].pos, 3);  // renumbered before the error
  EXPECT_EQ(cache.cells()[3].seqs, (std::set<int32_t>{1}));
  EXPECT_EQ(cache.cells()[4].pos, 2);  // the shared cell: untouched, and all after it
  EXPECT_EQ(cache.cells()[4].seqs, (std::set<int32_t>{0, 1}));
  EXPECT_EQ(cache.cells()[5].pos, 3);
  EXPECT_EQ(cache.ranges().at(0), std::make_pair(int64_t{0}, int64_t{5}));
  EXPECT_EQ(shifts, 0);
}

TEST_P(CausalCacheTest, RemoveWithGapWithoutShiftIsUnsupportedAfterRenumbering) {
  CausalCache cache = std::move(CausalCache::Create(Config(1, 16, 8))).value();
  RunStep(
      cache,
      {{0, 0, 0, 0}, {0, 1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 4}, {"0xxx", "00xx", "000x", "0000"}});
  EXPECT_EQ(cache.Remove(0, 1, 2).code(), StatusCode::kUnsupported);
  EXPECT_TRUE(cache.cells()[1].seqs.empty());
  EXPECT_EQ(cache.cells()[2].pos, 1);
  EXPECT_EQ(cache.cells()[3].pos, 2);
  EXPECT_EQ(cache.ranges().at(0), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(cache.k().At(2, 0), 3.0f);  // key not shifted
  // A tail removal needs no shift; removing everything returns before the shift.
  EXPECT_TRUE(cache.Remove(0, 2, kUnbounded).ok());
  EXPECT_TRUE(cache.cells()[3].seqs.empty());
  EXPECT_EQ(cache.ranges().at(0), std::make_pair(int64_t{0}, int64_t{2}));
  EXPECT_TRUE(cache.Remove(0, 0, 5).ok());
  EXPECT_FALSE(cache.ranges().contains(0));
}

// set_shift with an empty function unsets the callback (a runner whose model has no RoPE
// after a reload): a later Remove with a gap is Unsupported again and the old callback is
// never called.
TEST_P(CausalCacheTest, AnEmptyShiftCallbackUnsetsTheOldOne) {
  CausalCache cache = std::move(CausalCache::Create(Config(1, 16, 8))).value();
  RunStep(
      cache,
      {{0, 0, 0, 0}, {0, 1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 4}, {"0xxx", "00xx", "000x", "0000"}});
  int calls = 0;
  cache.set_shift([&calls](CausalCache&, std::span<const int64_t>, int64_t) {
    ++calls;
    return Status::Ok();
  });
  cache.set_shift(CausalCache::ShiftFn{});
  EXPECT_EQ(cache.Remove(0, 1, 2).code(), StatusCode::kUnsupported);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(cache.cells()[2].pos, 1);  // renumbered all the same, as without a callback
}

// Put scatters every row into the cell StartForward chose for it (spec §2.8), whatever the
// metadata says by then: a Remove or CopyPrefix between StartForward and Put takes the
// batch's sequence out of its cells, and the rows still land there.
TEST_P(CausalCacheTest, PutWritesTheChosenCellsEvenAfterTheirSequenceLeftThem) {
  CausalCache cache = std::move(CausalCache::Create(Config(2, 8, 4))).value();
  ASSERT_TRUE(cache.StartForward(Batch({0, 0, 1}, {0, 1, 0})).ok());
  ASSERT_TRUE(cache.Remove(0, 1, kUnbounded).ok());  // cell 1 is free again
  ASSERT_TRUE(cache.CopyPrefix(0, 1, 1).ok());       // cell 2 loses sequence 1
  ASSERT_TRUE(cache.cells()[1].seqs.empty());
  ASSERT_FALSE(cache.cells()[2].seqs.contains(1));
  ASSERT_TRUE(cache.Put(RowsOf({7, 8, 9}, TokenRow), RowsOf({7, 8, 9}, TokenRow)).ok());
  for (int64_t cell = 0; cell < 3; ++cell) {
    EXPECT_EQ(cache.k().At(cell, 0), 7.0f + static_cast<float>(cell)) << "cell " << cell;
    EXPECT_EQ(cache.VRow(cell).At(0, 2), 2007.0f + static_cast<float>(cell)) << "cell " << cell;
  }
}

TEST_P(CausalCacheTest, ShiftGroupsAreMaxBatchWindowsFromTheRangeStart) {
  CausalCache cache = std::move(CausalCache::Create(Config(1, 16, 2))).value();
  std::vector<std::vector<int64_t>> calls;
  cache.set_shift([&calls](CausalCache& c, std::span<const int64_t> cells, int64_t delta) {
    calls.emplace_back(cells.begin(), cells.end());
    return AddShift(c, cells, delta);
  });
  RunStep(cache, {{0, 0}, {0, 1}, {1, 2}, {1, 2}, {"0x", "00"}});
  RunStep(cache, {{0, 0}, {2, 3}, {3, 4}, {1, 2, 3, 4}, {"000x", "0000"}});
  RunStep(cache, {{0, 0}, {4, 5}, {5, 6}, {1, 2, 3, 4, 5, 6}, {"00000x", "000000"}});
  ASSERT_TRUE(cache.Remove(0, 0, 1).ok());  // range [1, 5]
  EXPECT_EQ(calls, (std::vector<std::vector<int64_t>>{{1, 2}, {3, 4}, {5}}));
  calls.clear();
  ASSERT_TRUE(cache.Remove(0, 2, 3).ok());  // cells 4, 5 move; windows [1,3) [3,5) [5,6)
  EXPECT_EQ(calls, (std::vector<std::vector<int64_t>>{{4}, {5}}));
  EXPECT_EQ(cache.k().At(4, 0), 3.0f);  // token 5 shifted twice
  EXPECT_EQ(cache.k().At(5, 1), 1004.0f);
  cache.set_shift([](CausalCache&, std::span<const int64_t>, int64_t) {
    return InvalidArgument("rope failed");
  });
  EXPECT_EQ(cache.Remove(0, 0, 1).code(), StatusCode::kInvalidArgument);
}

TEST_P(CausalCacheTest, SetCausalLastsOneForward) {
  CausalCache cache = std::move(CausalCache::Create(Config(1, 16, 8))).value();
  RunStep(cache, {{0, 0, 0}, {0, 1, 2}, {1, 2, 3}, {1, 2, 3}, {"0xx", "00x", "000"}});
  const std::vector<int64_t> first = {0};
  ASSERT_TRUE(cache.SetCausal(first).ok());
  EXPECT_EQ(MaskStrings(cache.Get()), (std::vector<std::string>{"000", "00x", "000"}));
  const std::vector<int64_t> outside = {3};
  EXPECT_EQ(cache.SetCausal(outside).code(), StatusCode::kInvalidArgument);
  const std::vector<int64_t> negative = {0, -1};  // one index below the batch, after a valid one
  EXPECT_EQ(cache.SetCausal(negative).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MaskStrings(cache.Get()), (std::vector<std::string>{"000", "00x", "000"}));
  RunStep(cache, {{0, 0}, {3, 4}, {4, 5}, {1, 2, 3, 4, 5}, {"0000x", "00000"}});
  ASSERT_TRUE(cache.SetCausal(first).ok());
  ASSERT_TRUE(cache.SetCausal({}).ok());  // the list replaces the previous one
  EXPECT_EQ(MaskStrings(cache.Get()), (std::vector<std::string>{"0000x", "00000"}));
}

// As in Go, the mask is built by StartForward and rebuilt by a SetCausal that changes the
// exception list; edits in between show in Get only after such a rebuild.
TEST_P(CausalCacheTest, MaskIsBuiltAtStartForwardAndSetCausal) {
  CausalCache cache = std::move(CausalCache::Create(Config(1, 16, 8))).value();
  RunStep(cache, {{0, 0}, {0, 1}, {1, 2}, {1, 2}, {"0x", "00"}});
  ASSERT_TRUE(cache.Remove(0, 0, kUnbounded).ok());
  EXPECT_TRUE(cache.cells()[0].seqs.empty());
  EXPECT_EQ(MaskStrings(cache.Get()), (std::vector<std::string>{"0x", "00"}));
  ASSERT_TRUE(cache.SetCausal({}).ok());  // unchanged list: no rebuild
  EXPECT_EQ(MaskStrings(cache.Get()), (std::vector<std::string>{"0x", "00"}));
  const std::vector<int64_t> second = {1};
  ASSERT_TRUE(cache.SetCausal(second).ok());
  EXPECT_EQ(MaskStrings(cache.Get()), (std::vector<std::string>{"xx", "xx"}));
}

// The same before the forward's first Get: the mask is StartForward's, not one built from
// the metadata at the first Get (a lazy build would let a fork or a Remove issued by another
// request while a forward is being set up reach the forward's visibility).
TEST_P(CausalCacheTest, AnEditBeforeTheFirstGetLeavesTheMaskOfStartForward) {
  CausalCache cache = std::move(CausalCache::Create(Config(2, 16, 8))).value();
  RunStep(cache, {{0, 0}, {0, 1}, {1, 2}, {1, 2}, {"0x", "00"}});
  ASSERT_TRUE(cache.StartForward(Batch({0}, {2})).ok());  // cell 2
  ASSERT_TRUE(cache.CopyPrefix(0, 1, 2).ok());            // seq 1 shares cells 0 and 1
  ASSERT_TRUE(cache.Remove(0, 1, kUnbounded).ok());       // seq 0 leaves cells 1 and 2
  ASSERT_FALSE(cache.cells()[1].seqs.contains(0));
  ASSERT_TRUE(cache.cells()[2].seqs.empty());
  const Tensor in = RowsOf({3}, TokenRow);
  ASSERT_TRUE(cache.Put(in, in).ok());
  EXPECT_EQ(MaskStrings(cache.Get()), (std::vector<std::string>{"000"}));
}

TEST_P(CausalCacheTest, MalformedCallsAreInvalidWithoutChanges) {
  CausalCache cache = std::move(CausalCache::Create(Config(1, 16, 2))).value();
  EXPECT_EQ(cache.StartForward(Batch({0, 0, 0}, {0, 1, 2})).code(),
            StatusCode::kInvalidArgument);  // larger than max_batch
  EXPECT_EQ(cache.StartForward(Batch({1}, {0})).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.StartForward(Batch({-1}, {0})).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.StartForward(Batch({0}, {-1})).code(), StatusCode::kInvalidArgument);
  // ggml positions are int32: 2^31 is refused, even after a valid token of the batch.
  EXPECT_EQ(cache.StartForward(Batch({0, 0}, {0, int64_t{1} << 31})).code(),
            StatusCode::kInvalidArgument);
  // A refused StartForward starts no forward (the order family found the batch kept).
  const Tensor one = RowsOf({1}, TokenRow);
  EXPECT_EQ(cache.Put(one, one).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache.StartForward({}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(cache.ranges().empty());
  EXPECT_TRUE(cache.cells()[0].seqs.empty());
  ASSERT_TRUE(cache.StartForward(Batch({0, 0}, {0, 1})).ok());
  const Tensor three = RowsOf({1, 2, 3}, TokenRow);
  const Tensor two = RowsOf({1, 2}, TokenRow);
  EXPECT_EQ(cache.Put(three, three).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Put(two, three).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Put(three, two).code(), StatusCode::kInvalidArgument);
  // A width other than the cache's on either side (the guard family found only both tried).
  const Tensor narrow(DType::kFloat32, 2, kCols - 1);
  EXPECT_EQ(cache.Put(narrow, narrow).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Put(narrow, two).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Put(two, narrow).code(), StatusCode::kInvalidArgument);
  // The cache's dtype is f32: rows in another dtype are refused on either side.
  const Tensor bf16(DType::kBFloat16, 2, kCols);
  EXPECT_EQ(cache.Put(bf16, two).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Put(two, bf16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.k().At(0, 0), 0.0f);  // nothing written
  EXPECT_EQ(cache.Remove(0, 3, 2).code(), StatusCode::kInvalidArgument);
  // A negative begin, finite or not (the guard-family operator mutants found no test of it).
  EXPECT_EQ(cache.Remove(0, -1, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Remove(0, -1, kUnbounded).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.CopyPrefix(0, 1, 2).code(), StatusCode::kInvalidArgument);
  // Negative sequence ids, as source, destination or the edited sequence.
  EXPECT_EQ(cache.CopyPrefix(-1, 0, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.CopyPrefix(0, -1, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Remove(-1, 0, 2).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(cache.Put(two, two).ok());
  EXPECT_EQ(cache.k().At(1, 1), 1002.0f);
}

TEST_P(CausalCacheTest, ReserveUsesTheWholeCacheWithoutMetadata) {
  CausalCache cache = std::move(CausalCache::Create(Config(1, 8, 4))).value();
  RunStep(cache, {{0, 0}, {0, 1}, {1, 2}, {1, 2}, {"0x", "00"}});
  ASSERT_TRUE(cache.StartForward(Batch({0, 0}, {2, 3}), /*reserve=*/true).ok());
  EXPECT_EQ(cache.locations(), (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(cache.cells()[2].seqs.empty());
  EXPECT_EQ(cache.ranges().at(0), std::make_pair(int64_t{0}, int64_t{1}));
  const CausalCache::View view = cache.Get();
  EXPECT_EQ(view.range_begin, 0);
  EXPECT_EQ(view.range_end, 8);
  EXPECT_EQ(MaskStrings(view), (std::vector<std::string>{"00xxxxxx", "00xxxxxx"}));
}

// A reserve larger than the cache is "cache full", and, like the other full forward, leaves
// no forward started: the metadata is untouched and Put is refused.
TEST_P(CausalCacheTest, ReservingMoreTokensThanCellsStartsNoForward) {
  CausalCache cache = std::move(CausalCache::Create(Config(1, 2, 4))).value();
  ASSERT_EQ(cache.num_cells(), 2);
  RunStep(cache, {{0}, {0}, {0}, {0}, {"0"}});
  const Status full = cache.StartForward(Batch({0, 0, 0}, {1, 2, 3}), /*reserve=*/true);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(cache.locations().empty());
  EXPECT_EQ(cache.ranges().at(0), std::make_pair(int64_t{0}, int64_t{0}));
  const Tensor rows = RowsOf({1, 2, 3}, TokenRow);
  EXPECT_EQ(cache.Put(rows, rows).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvtwin
