// Goal: the scenarios of ollama's rotating_attention_test.go (spec §6.4): attention through
// a rotating cache's history (ring layout + mask applier) must attend exactly the positions
// of spec §5.2 and produce the same SDPA output as attention over the same positions laid
// out in logical order with the mask written by hand.
// Method: K/V rows are tagged by position (K row p starts with p + 1, the rest are sin/cos
// of p), so the attended positions can be read back from the history rows and a wrong row
// or mask-column gather changes the output. The reference is a plain History (no applier,
// no cache) over the logical rows. Outputs are compared exactly where both sides visit the
// rows in the same order, and to 1e-6 where only the summation order differs (ring order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "src/attention_mask.h"
#include "src/kv_cache.h"
#include "src/rotating_cache.h"

namespace kvtwin {
namespace {

using Positions = std::vector<std::vector<int64_t>>;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kScale = 0.5f;
constexpr double kRingTolerance = 1e-6;

// Key of position p: column 0 = p + 1 identifies the row; the others make scores differ.
std::vector<float> KeyOf(int64_t p, int64_t cols) {
  const float x = static_cast<float>(p);
  const std::vector<float> all = {x + 1.0f,          std::sin(x),        std::cos(x),
                                  0.1f * (x + 1.0f), std::sin(2.0f * x), std::cos(2.0f * x)};
  return std::vector<float>(all.begin(), all.begin() + cols);
}

std::vector<float> ValueOf(int64_t p) {
  const float x = static_cast<float>(p);
  return {std::sin(0.5f * x), std::cos(0.7f * x), -0.1f * (x + 1.0f), 0.05f * x};
}

// Rows for positions [from, to) in logical order.
Tensor KeyRows(int64_t from, int64_t to, int64_t cols = 4) {
  MatF m(to - from, cols);
  for (int64_t p = from; p < to; ++p) {
    const std::vector<float> row = KeyOf(p, cols);
    for (int64_t c = 0; c < cols; ++c) m(p - from, c) = row[static_cast<size_t>(c)];
  }
  return Tensor::FromFloat(DType::kFloat32, m);
}

Tensor ValueRows(int64_t from, int64_t to) {
  MatF m(to - from, 4);
  for (int64_t p = from; p < to; ++p) {
    const std::vector<float> row = ValueOf(p);
    for (int64_t c = 0; c < 4; ++c) m(p - from, c) = row[static_cast<size_t>(c)];
  }
  return Tensor::FromFloat(DType::kFloat32, m);
}

MatF Queries(int64_t count, int64_t cols = 4) {
  MatF q(count, cols);
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t d = 0; d < cols; ++d) {
      q(i, d) = 0.7f - 0.3f * static_cast<float>(d) + 0.15f * static_cast<float>(i);
    }
  }
  return q;
}

// The reference: positions [from, to) in logical order, no applier, no cache involved.
class LogicalHistory {
 public:
  LogicalHistory(int64_t from, int64_t to) : k_(KeyRows(from, to)), v_(ValueRows(from, to)) {
    history_.k = &k_;
    history_.v = &v_;
    history_.length = to - from;
  }
  LogicalHistory(const LogicalHistory&) = delete;
  LogicalHistory& operator=(const LogicalHistory&) = delete;
  const History& history() const { return history_; }

 private:
  Tensor k_;
  Tensor v_;
  History history_;
};

// Single-token writes of positions [from, to).
void WriteSingles(AttentionCache& cache, int64_t from, int64_t to) {
  for (int64_t p = from; p < to; ++p) (void)cache.Update(KeyRows(p, p + 1), ValueRows(p, p + 1));
}

MatF Attend(const MatF& q, const History& h, const AttentionMask& mask, int64_t offset) {
  Result<MatF> out = Sdpa(q, h, mask, offset, kScale);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? out.value() : MatF();
}

// The absolute positions each query attends, read back from the tag in K column 0.
Positions SeenPositions(const History& h, const AttentionMask& mask, int64_t offset,
                        int64_t query_len) {
  Result<Positions> rows = VisibleRows(h, mask, offset, query_len);
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  if (!rows.ok()) return {};
  Positions out;
  for (const std::vector<int64_t>& query_rows : *rows) {
    std::vector<int64_t> seen;
    for (int64_t r : query_rows) seen.push_back(std::lround(h.k->At(r, 0)) - 1);
    std::sort(seen.begin(), seen.end());
    out.push_back(seen);
  }
  return out;
}

void ExpectClose(const MatF& got, const MatF& want, double tolerance) {
  ASSERT_EQ(got.rows(), want.rows());
  ASSERT_EQ(got.cols(), want.cols());
  for (int64_t i = 0; i < want.rows(); ++i) {
    for (int64_t d = 0; d < want.cols(); ++d) {
      EXPECT_NEAR(got(i, d), want(i, d), tolerance) << "query " << i << ", dim " << d;
    }
  }
}

// Spec §6.4 RotatingKVCacheDecodeParity: W = 4, six single writes, then the decode of
// position 6 lands in ring slot 2, so the history rows are positions {4, 5, 6, 3}.
TEST(RotatingAttention, DecodeThroughTheRingMatchesTheLogicalWindow) {
  RotatingCache cache(4);
  WriteSingles(cache, 0, 6);
  const History ring = cache.Update(KeyRows(6, 7), ValueRows(6, 7));
  ASSERT_TRUE(ring.has_applier);
  ASSERT_EQ(ring.length, 4);
  ASSERT_EQ(ring.applier.query_len, 1);
  const LogicalHistory logical(3, 7);
  const MatF q = Queries(1);
  // Distinct finite values per logical column: a wrong column gather reweights the keys.
  const MatF bias = (MatF(1, 4) << 0.1f, -0.3f, 0.7f, -0.2f).finished();
  const MatF hole = (MatF(1, 4) << 0.0f, -kInf, 0.0f, 0.0f).finished();  // blocks position 4
  const struct {
    std::string name;
    AttentionMask mask;
    Positions seen;
  } cases[] = {
      {"zero", AttentionMask::Zero(), {{3, 4, 5, 6}}},
      {"causal", AttentionMask::Causal(), {{3, 4, 5, 6}}},
      {"array", AttentionMask::Array(bias), {{3, 4, 5, 6}}},
      {"blocking array", AttentionMask::Array(hole), {{3, 5, 6}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(SeenPositions(ring, c.mask, 6, 1), c.seen);
    EXPECT_EQ(SeenPositions(logical.history(), c.mask, 6, 1), c.seen);
    ExpectClose(Attend(q, ring, c.mask, 6), Attend(q, logical.history(), c.mask, 6),
                kRingTolerance);
  }
}

// Spec §6.4 AssistantSharedHistoryL1MasksMatchNoMask: a draft reading the target's caches
// through View() with a causal mask must attend like no mask at all, for a single query
// at the newest stored position.
TEST(RotatingAttention, SharedHistoryViewWithCausalMaskMatchesNoMask) {
  KvCache full;
  RotatingCache sliding(4);
  WriteSingles(full, 0, 7);
  WriteSingles(sliding, 0, 7);
  const History full_view = full.View();
  const History sliding_view = sliding.View();
  const MatF q = Queries(1);
  const struct {
    std::string name;
    const History& view;
    Positions seen;
  } cases[] = {
      {"full", full_view, {{0, 1, 2, 3, 4, 5, 6}}},
      {"sliding", sliding_view, {{3, 4, 5, 6}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(SeenPositions(c.view, AttentionMask::Causal(), 6, 1), c.seen);
    EXPECT_EQ(SeenPositions(c.view, AttentionMask::Zero(), 6, 1), c.seen);
    ExpectClose(Attend(q, c.view, AttentionMask::Causal(), 6),
                Attend(q, c.view, AttentionMask::Zero(), 6), 0.0);
  }
  const LogicalHistory logical(3, 7);
  ExpectClose(Attend(q, sliding_view, AttentionMask::Causal(), 6),
              Attend(q, logical.history(), AttentionMask::Zero(), 6), kRingTolerance);
}

// The reference mask of spec §6.4 for a prefill at offset 0 (positions == indices): causal
// blocks k > q, rectangles reopen, then the window blocks k < q - W + 1.
MatF ManualPrefillMask(int64_t len, bool causal, const std::vector<RelaxRect>& rects,
                       int64_t window) {
  MatF m = MatF::Zero(len, len);
  for (int64_t q = 0; q < len; ++q) {
    for (int64_t k = 0; k < len; ++k) {
      bool blocked = causal && k > q;
      for (const RelaxRect& r : rects) {
        if (q >= r.q_lo && q < r.q_hi && k >= r.k_lo && k < r.k_hi) blocked = false;
      }
      if (k < q - window + 1) blocked = true;
      if (blocked) m(q, k) = -kInf;
    }
  }
  return m;
}

struct PrefillCase {
  std::string name;
  AttentionMask mask;
  bool causal;  // for the manual mask
  std::vector<RelaxRect> rects;
  Positions seen;  // spec §5.2: max(0, p - W + 1) <= k <= p, reopened by the rectangle
};

std::vector<PrefillCase> PrefillCases() {
  const std::vector<RelaxRect> rect = {{1, 4, 2, 5}};
  const std::vector<int64_t> all = {0, 1, 2, 3, 4, 5};
  const Positions zero_seen = {all, all, all, all, {1, 2, 3, 4, 5}, {2, 3, 4, 5}};
  const Positions causal_seen = {{0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}, {1, 2, 3, 4}, {2, 3, 4, 5}};
  const std::vector<int64_t> reopened = {0, 1, 2, 3, 4};
  const Positions relax_seen = {{0}, reopened, reopened, reopened, {1, 2, 3, 4}, {2, 3, 4, 5}};
  return {
      {"zero", AttentionMask::Zero(), false, {}, zero_seen},
      {"causal", AttentionMask::Causal(), true, {}, causal_seen},
      {"causal+relax", AttentionMask::Causal().Relax(rect).value(), true, rect, relax_seen},
  };
}

// Spec §6.4 RotatingKVCachePrefillParity: L = 6 into an empty W = 4 cache.
TEST(RotatingAttention, PrefillMatchesTheManualCausalRelaxWindowMask) {
  const MatF q = Queries(6);
  const LogicalHistory logical(0, 6);
  for (const PrefillCase& c : PrefillCases()) {
    SCOPED_TRACE(c.name);
    RotatingCache cache(4);
    const History h = cache.Update(KeyRows(0, 6), ValueRows(0, 6));
    ASSERT_TRUE(h.has_applier);
    ASSERT_EQ(h.length, 6);
    const AttentionMask manual = AttentionMask::Array(ManualPrefillMask(6, c.causal, c.rects, 4));
    EXPECT_EQ(SeenPositions(h, c.mask, 0, 6), c.seen);
    EXPECT_EQ(SeenPositions(logical.history(), manual, 0, 6), c.seen);
    // Both sides walk the same logical-order rows: the outputs must match bit for bit.
    ExpectClose(Attend(q, h, c.mask, 0), Attend(q, logical.history(), manual, 0), 0.0);
  }
}

struct BatchedRun {
  MatF out;
  Positions seen;
};

// Five single writes wrap a W = 4 ring, then positions 5..8 arrive in one batched write.
BatchedRun BatchedWriteAfterWrap(bool schedule) {
  RotatingCache cache(4);
  WriteSingles(cache, 0, 5);
  if (schedule) {
    const Status prepared = cache.PrepareSnapshots({5, 6, 7, 8});
    EXPECT_TRUE(prepared.ok()) << prepared.ToString();
  }
  const History h = cache.Update(KeyRows(5, 9), ValueRows(5, 9));
  EXPECT_EQ(h.length, 7);  // the newest W - 1 = 3 older tokens plus the 4 new ones
  BatchedRun run{Attend(Queries(4), h, AttentionMask::Causal(), 5),
                 SeenPositions(h, AttentionMask::Causal(), 5, 4)};
  if (schedule) {
    EXPECT_EQ(cache.TakeSnapshots().size(), 4u);
  }
  return run;
}

// Spec §6.4 RotatingKVCacheScheduledSnapshotParity: per-token captures during a batched
// write after the wrap must not change what the write's attention sees.
TEST(RotatingAttention, ScheduledSnapshotsDoNotChangeBatchedAttention) {
  const BatchedRun plain = BatchedWriteAfterWrap(false);
  const BatchedRun scheduled = BatchedWriteAfterWrap(true);
  const Positions window = {{2, 3, 4, 5}, {3, 4, 5, 6}, {4, 5, 6, 7}, {5, 6, 7, 8}};
  EXPECT_EQ(plain.seen, window);
  EXPECT_EQ(scheduled.seen, window);
  ExpectClose(scheduled.out, plain.out, 0.0);
  // Positions 2..8 in logical order with causal (bottom-right) and the window by hand.
  const LogicalHistory logical(2, 9);
  MatF manual = MatF::Zero(4, 7);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t k = 0; k < 7; ++k) {
      if (k > i + 3 || k < i) manual(i, k) = -kInf;
    }
  }
  ExpectClose(plain.out, Attend(Queries(4), logical.history(), AttentionMask::Array(manual), 5),
              0.0);
}

// Spec §6.4 RotatingKVCacheMLAParity: the cache stores K = [latent | rope] (6 columns) and
// a zero-width V; attention uses V := the first 4 (latent) columns of K. History has no MLA
// mode, so the test builds that V tensor itself, as WithMLAHistory does. W = 8 >= L = 3,
// so the window blocks nothing and the result is plain causal attention.
TEST(RotatingAttention, MlaHistoryWithinTheWindowMatchesCausalAttention) {
  constexpr int64_t kLatentRope = 6;
  constexpr int64_t kValueDim = 4;
  RotatingCache cache(8);
  const Tensor k = KeyRows(0, 3, kLatentRope);
  const History h = cache.Update(k, Tensor(DType::kFloat32, 3, 0));
  ASSERT_EQ(h.length, 3);
  const Tensor mla_v =
      Tensor::FromFloat(DType::kFloat32, h.k->RowsToFloat(0, h.length).leftCols(kValueDim));
  History mla = h;
  mla.v = &mla_v;

  const Tensor ref_v = Tensor::FromFloat(DType::kFloat32, k.ToFloat().leftCols(kValueDim));
  History reference;
  reference.k = &k;
  reference.v = &ref_v;
  reference.length = 3;

  const MatF q = Queries(3, kLatentRope);
  EXPECT_EQ(SeenPositions(mla, AttentionMask::Causal(), 0, 3), (Positions{{0}, {0, 1}, {0, 1, 2}}));
  const MatF got = Attend(q, mla, AttentionMask::Causal(), 0);
  ExpectClose(got, Attend(q, reference, AttentionMask::Causal(), 0), 0.0);
  EXPECT_EQ(got.cols(), kValueDim);
}

}  // namespace
}  // namespace kvtwin
