// A layer handed another layer's snapshot is a manager bug: Restore, Merge and Split (spec
// §1.1) take snapshots of the cache's own kind (each cache's REQUIRES). Every cache must
// abort on another kind at every entry point that takes a snapshot, rather than read a
// foreign layout as its own and serve another layer's state.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "src/kv_cache.h"
#include "src/recurrent_cache.h"
#include "src/rotating_cache.h"

namespace kvtwin {
namespace {

constexpr CacheKind kKinds[] = {CacheKind::kFullKv, CacheKind::kRotating, CacheKind::kRecurrent};

// A snapshot of `kind`, valid for a cache of that kind: one position, [0, 1).
SnapshotPtr SnapshotOf(CacheKind kind) {
  const Tensor row(DType::kFloat32, 1, 4);
  const RecurrentDims d;
  switch (kind) {
    case CacheKind::kFullKv:
      return KvSnapshot::Make(0, 1, {row}, {row});
    case CacheKind::kRotating:
      return std::make_unique<RotatingSnapshot>(0, 1, 1, row, row);
    case CacheKind::kRecurrent:
      return std::make_unique<RecurrentSnapshot>(1,
                                                 Tensor(DType::kFloat32, d.conv_tail, d.conv_dim()),
                                                 MatF::Zero(d.delta_rows(), d.head_k_dim));
  }
  return nullptr;
}

std::unique_ptr<LayerCache> CacheOf(CacheKind kind) {
  switch (kind) {
    case CacheKind::kFullKv:
      return std::make_unique<KvCache>();
    case CacheKind::kRotating:
      return std::make_unique<RotatingCache>(4);
    case CacheKind::kRecurrent:
      return std::make_unique<RecurrentCache>(RecurrentDims{});
  }
  return nullptr;
}

// The start of each cache's refusal: "<its kind> cache given a <the other kind> snapshot".
std::string Refusal(CacheKind cache) {
  switch (cache) {
    case CacheKind::kFullKv:
      return "KV cache given a ";
    case CacheKind::kRotating:
      return "rotating cache given a ";
    case CacheKind::kRecurrent:
      return "recurrent cache given a ";
  }
  return "";
}

TEST(SnapshotKindDeathTest, EveryCacheAbortsOnAnotherKindsSnapshotAtEveryEntry) {
  for (const CacheKind mine : kKinds) {
    for (const CacheKind other : kKinds) {
      if (mine == other) continue;
      SCOPED_TRACE(std::string(CacheKindName(mine)) + " cache, " + CacheKindName(other) +
                   " snapshot");
      const std::string refusal = Refusal(mine);
      std::unique_ptr<LayerCache> cache = CacheOf(mine);
      // Restore checks the kind before any outcome, even a refusal for the target.
      EXPECT_DEATH(static_cast<void>(cache->Restore(SnapshotOf(other).get(), 1)), refusal);
      EXPECT_DEATH(static_cast<void>(cache->Restore(SnapshotOf(other).get(), -1)), refusal);
      // Merge on either side, the other side the cache's own.
      EXPECT_DEATH(cache->Merge(SnapshotOf(other), SnapshotOf(mine)), refusal);
      EXPECT_DEATH(cache->Merge(SnapshotOf(mine), SnapshotOf(other)), refusal);
      EXPECT_DEATH(cache->Split(SnapshotOf(other), 1), refusal);
    }
  }
}

}  // namespace
}  // namespace kvtwin
