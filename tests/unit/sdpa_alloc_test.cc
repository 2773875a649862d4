// Sdpa over a mask without an additive array allocates nothing once its scratch has grown:
// causal, relaxed and zero masks, over a plain history and a rotating prefill's, resolve
// their rows in place (src/attention_mask.cc, SdpaInto). Before, every such forward built
// an L x K bias, and a rotating prefill also its window array and their intersection.
// Counted by interposing the C allocator (tests/unit/malloc_counter.h), so this test is an
// executable of its own; sanitizer builds own the allocator and skip it.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "src/attention_mask.h"
#include "tests/unit/malloc_counter.h"

namespace kvtwin {
namespace {

struct Case {
  std::string name;
  AttentionMask mask;
  int64_t window;  // > 0: a rotating prefill's history
};

TEST(SdpaAllocations, ArrayFreeMasksAllocateNothingOnceTheScratchHasGrown) {
  if (!KVTWIN_COUNTS_MALLOC) GTEST_SKIP() << "the sanitizer owns the allocator";
  constexpr int64_t kQueries = 6, kOld = 3, kKeys = kOld + kQueries, kOffset = 10;
  const Result<AttentionMask> relaxed = AttentionMask::Causal().Relax(
      {{kOffset, kOffset + 2, kOffset + 2, kOffset + 5}, {kOffset + 4, kOffset + 6, 0, kOffset}});
  ASSERT_TRUE(relaxed.ok());
  const std::vector<Case> cases = {
      {"causal", AttentionMask::Causal(), 0}, {"relaxed", *relaxed, 0},
      {"zero", AttentionMask::Zero(), 0},     {"rotating causal", AttentionMask::Causal(), 4},
      {"rotating relaxed", *relaxed, 4},      {"rotating zero", AttentionMask::Zero(), 4},
  };
  Tensor k(DType::kFloat32, kKeys, 2), v(DType::kFloat32, kKeys, 3);
  for (int64_t r = 0; r < kKeys; ++r) {
    k.Set(r, 0, static_cast<float>(r) / 10.0f);
    k.Set(r, 1, 0.5f);
    for (int64_t c = 0; c < 3; ++c) v.Set(r, c, static_cast<float>(r + c));
  }
  const MatF q = MatF::Constant(kQueries, 2, 0.25f);
  for (const Case& c : cases) {
    const History h{&k, &v, kKeys, c.window > 0, {kKeys, kQueries, c.window, 0}};
    SdpaScratch scratch;
    MatF out;
    ASSERT_TRUE(SdpaInto(q, h, c.mask, kOffset, 1.0f, scratch, out).ok()) << c.name;
    const alloc_count::AllocCounts counts = alloc_count::CountAllocations(
        [&] { EXPECT_TRUE(SdpaInto(q, h, c.mask, kOffset, 1.0f, scratch, out).ok()) << c.name; });
    EXPECT_EQ(counts.mallocs, 0) << c.name;
  }
  // The counter itself: a mask with an array is materialized, so this call must count.
  const AttentionMask array = AttentionMask::Array(MatF::Zero(kQueries, kKeys));
  const History plain{&k, &v, kKeys, false, {}};
  SdpaScratch scratch;
  MatF out;
  ASSERT_TRUE(SdpaInto(q, plain, array, kOffset, 1.0f, scratch, out).ok());
  const alloc_count::AllocCounts counted = alloc_count::CountAllocations(
      [&] { EXPECT_TRUE(SdpaInto(q, plain, array, kOffset, 1.0f, scratch, out).ok()); });
  EXPECT_GT(counted.mallocs, 0) << "the allocator is not interposed: nothing was counted";
}

}  // namespace
}  // namespace kvtwin
