// Goal: pin HybridCache (spec §2.9.1, the original LFM2 cache) to its contract: the slot
// tests of ollama's model/models/lfm2/cache_test.go (spec §6.14, first bullet), then what
// those tests could not reach without a backend: copy-on-write of conv rows, its remembered
// failure, the non-transactional unequal-batch refusal, bf16 rounding, and the two
// documented weaknesses (CopyPrefix ignores len, Remove resets conv state).
// Method: the Go tests poke the allocator's fields; here the same states are reached
// through CopyPrefix / Remove / StartForward, and the raw AllocSlot / FreeSlot where only
// they can (a full allocator). Conv rows are tagged per layer (value + 10·layer + col/8),
// so every comparison is exact and names the forward and layer a row came from.
#include "src/hybrid_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvtwin {
namespace {

constexpr int32_t kLayers = 2;
constexpr int64_t kCols = 6;  // d_conv 2 x hidden 3

HybridCache Make(int32_t max_seqs, DType dtype = DType::kFloat32) {
  HybridConfig config;
  config.kv.max_seqs = max_seqs;
  config.kv.capacity = 16;
  config.kv.max_batch = 8;
  config.kv.kv_cols = 2;
  config.kv.dtype = dtype;
  config.num_conv_layers = kLayers;
  config.d_conv = 2;
  config.hidden = 3;
  Result<HybridCache> cache = HybridCache::Create(config);
  KV_CHECK(cache.ok(), cache.status().ToString());
  return std::move(cache).value();
}

// Conv rows for the current sequences: row i is values[i] + 10·layer + col/8.
MatF TaggedF(const std::vector<float>& values, int32_t layer) {
  MatF m(static_cast<int64_t>(values.size()), kCols);
  for (int64_t r = 0; r < m.rows(); ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      m(r, c) = values[static_cast<size_t>(r)] + 10.0f * static_cast<float>(layer) +
                static_cast<float>(c) / 8.0f;
    }
  }
  return m;
}

std::vector<float> Flat(const MatF& m) { return {m.data(), m.data() + m.size()}; }
std::vector<float> Flat(const Tensor& t) { return Flat(t.ToFloat()); }
std::vector<float> Tagged(float value, int32_t layer) { return Flat(TaggedF({value}, layer)); }
std::vector<float> Zeros() { return std::vector<float>(kCols, 0.0f); }

std::vector<float> Row(const HybridCache& cache, int32_t layer, int32_t slot) {
  return Flat(cache.SlotRow(layer, slot));
}

// One forward: every layer reads its conv states, then stores values[i] (tagged) for the
// i-th current sequence. Returns the states read, per layer.
std::vector<std::vector<float>> Forward(HybridCache& cache, std::vector<BatchToken> batch,
                                        const std::vector<float>& values) {
  const Status started = cache.StartForward(batch);
  KV_CHECK(started.ok(), started.ToString());
  std::vector<std::vector<float>> read;
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    Result<Tensor> state = cache.ConvState(layer);
    KV_CHECK(state.ok(), state.status().ToString());
    read.push_back(Flat(*state));
    cache.UpdateConvState(layer, Tensor::FromFloat(DType::kFloat32, TaggedF(values, layer)));
  }
  return read;
}

using Slots = std::vector<int32_t>;

// --- The ollama slot tests (cache_test.go) -------------------------------------------------

TEST(HybridCacheSlots, AllocatingPastTheLastSlotIsCacheFull) {
  HybridCache cache = Make(4);
  EXPECT_EQ(cache.free_slots(), (Slots{3, 2, 1, 0}));
  for (int32_t want = 0; want < 4; ++want) EXPECT_EQ(*cache.AllocSlot(), want);
  EXPECT_TRUE(cache.free_slots().empty());
  const Result<int32_t> more = cache.AllocSlot();
  EXPECT_EQ(more.status(), ResourceExhausted("cache full"));
}

TEST(HybridCacheSlots, FreedSlotIsHandedOutFirst) {
  HybridCache cache = Make(4);
  EXPECT_EQ(*cache.AllocSlot(), 0);
  EXPECT_EQ(*cache.AllocSlot(), 1);
  cache.FreeSlot(0);
  EXPECT_EQ(*cache.AllocSlot(), 0);  // LIFO: not 2
  cache.FreeSlot(1);
  cache.FreeSlot(0);
  EXPECT_EQ(*cache.AllocSlot(), 0);
  EXPECT_EQ(*cache.AllocSlot(), 1);
}

TEST(HybridCacheSlots, CopyPrefixSharesTheSlotAndIncrementsItsRefcount) {
  HybridCache cache = Make(4);
  Forward(cache, {{1, 0}}, {1});
  ASSERT_TRUE(cache.CopyPrefix(1, 2, 1).ok());
  EXPECT_EQ(cache.slot_of(2), 0);
  EXPECT_EQ(cache.ref_count(0), 2);
  EXPECT_EQ(cache.free_slots(), (Slots{3, 2, 1}));
}

TEST(HybridCacheSlots, UnsharingDecrementsTheRefcount) {
  HybridCache cache = Make(4);
  Forward(cache, {{1, 0}}, {1});
  ASSERT_TRUE(cache.CopyPrefix(1, 2, 1).ok());
  ASSERT_TRUE(cache.Remove(2, 0, kUnbounded).ok());
  EXPECT_EQ(cache.ref_count(0), 1);
  EXPECT_EQ(cache.slot_of(2), std::nullopt);
  EXPECT_EQ(cache.slot_of(1), 0);
  EXPECT_EQ(cache.free_slots(), (Slots{3, 2, 1}));
}

TEST(HybridCacheSlots, SlotIsFreedWhenItsRefcountReachesZero) {
  HybridCache cache = Make(4);
  Forward(cache, {{1, 0}}, {1});
  ASSERT_TRUE(cache.Remove(1, 0, kUnbounded).ok());
  EXPECT_EQ(cache.ref_count(0), 0);
  EXPECT_EQ(cache.slot_of(1), std::nullopt);
  EXPECT_EQ(cache.free_slots(), (Slots{3, 2, 1, 0}));
}

TEST(HybridCacheSlots, CopyPrefixOverAnOwnedSlotFreesTheOldSlot) {
  HybridCache cache = Make(4);
  Forward(cache, {{1, 0}, {2, 0}}, {1, 2});
  ASSERT_EQ(cache.slot_of(2), 1);
  ASSERT_TRUE(cache.CopyPrefix(1, 2, 1).ok());
  EXPECT_EQ(cache.slot_of(2), 0);
  EXPECT_EQ(cache.ref_count(0), 2);
  EXPECT_EQ(cache.ref_count(1), 0);
  EXPECT_EQ(cache.free_slots(), (Slots{3, 2, 1}));
}

TEST(HybridCacheSlots, FreeingAnOutOfRangeSlotIsIgnored) {
  HybridCache cache = Make(4);
  cache.FreeSlot(-1);
  cache.FreeSlot(4);
  cache.FreeSlot(100);
  EXPECT_EQ(cache.free_slots(), (Slots{3, 2, 1, 0}));
}

TEST(HybridCacheSlots, FourWayForkCountsEveryReference) {
  HybridCache cache = Make(8);
  Forward(cache, {{1, 0}}, {1});
  for (int32_t seq : {2, 3, 4}) ASSERT_TRUE(cache.CopyPrefix(1, seq, 1).ok());
  EXPECT_EQ(cache.ref_count(0), 4);
  for (int32_t seq : {2, 3}) ASSERT_TRUE(cache.Remove(seq, 0, kUnbounded).ok());
  EXPECT_EQ(cache.ref_count(0), 2);
  const Slots free_mid = cache.free_slots();
  EXPECT_EQ(std::count(free_mid.begin(), free_mid.end(), 0), 0);
  for (int32_t seq : {1, 4}) ASSERT_TRUE(cache.Remove(seq, 0, kUnbounded).ok());
  EXPECT_EQ(cache.ref_count(0), 0);
  EXPECT_EQ(cache.free_slots().back(), 0);
}

TEST(HybridCacheSlots, ChainedSharingKeepsOneSlot) {
  HybridCache cache = Make(8);
  Forward(cache, {{1, 0}}, {1});
  ASSERT_TRUE(cache.CopyPrefix(1, 2, 1).ok());
  ASSERT_TRUE(cache.CopyPrefix(2, 3, 1).ok());
  for (int32_t seq : {1, 2, 3}) EXPECT_EQ(cache.slot_of(seq), 0) << "seq " << seq;
  EXPECT_EQ(cache.ref_count(0), 3);
}

// A server fans one prompt out to hundreds of sequences (parallel sampling, a shared system
// prompt): every reference is counted at every count, past 2^8 (a byte counter wraps at
// 256 sharers, a 16-bit one would wrap later but a 300-sequence cache is already enough to
// show a narrower one), a sharer's forward copies the slot instead of writing through, and
// the slot is freed exactly when its last sharer goes.
TEST(HybridCacheSlots, HundredsOfSharersCountEveryReference) {
  constexpr int32_t kSeqs = 300;
  HybridCache cache = Make(kSeqs);
  Forward(cache, {{0, 0}}, {1});
  for (int32_t seq = 1; seq < kSeqs; ++seq) {
    ASSERT_TRUE(cache.CopyPrefix(0, seq, 1).ok()) << "seq " << seq;
    ASSERT_EQ(cache.ref_count(0), seq + 1) << "after sharing with seq " << seq;
  }
  // Every sharer but seq 0 writes once, one forward each: each takes a slot of its own and
  // leaves the shared row as it was, whatever the count stood at.
  for (int32_t seq = kSeqs - 1; seq >= 1; --seq) {
    const std::vector<std::vector<float>> read = Forward(cache, {{seq, 1}}, {2});
    ASSERT_EQ(read[0], Tagged(1, 0)) << "seq " << seq << " reads the shared state";
    ASSERT_NE(cache.slot_of(seq), std::optional<int32_t>(0)) << "seq " << seq;
    ASSERT_EQ(cache.ref_count(0), seq) << "after seq " << seq << " unshared";
    ASSERT_EQ(Row(cache, 0, 0), Tagged(1, 0)) << "the shared row after seq " << seq;
  }
  // The other way round: share again up to every sequence, then drop them one by one.
  for (int32_t seq = 1; seq < kSeqs; ++seq) ASSERT_TRUE(cache.CopyPrefix(0, seq, 1).ok());
  ASSERT_EQ(cache.ref_count(0), kSeqs);
  for (int32_t seq = kSeqs - 1; seq >= 0; --seq) {
    ASSERT_TRUE(cache.Remove(seq, 0, kUnbounded).ok()) << "seq " << seq;
    ASSERT_EQ(cache.ref_count(0), seq) << "after removing seq " << seq;
    const Slots free_now = cache.free_slots();
    ASSERT_EQ(std::count(free_now.begin(), free_now.end(), 0), seq == 0 ? 1 : 0)
        << "slot 0 free after removing seq " << seq;
  }
}

TEST(HybridCacheSlots, ParamsShapeTheConvState) {
  HybridConfig config;
  config.kv.max_seqs = 2;
  config.d_conv = 5;
  config.hidden = 512;
  Result<HybridCache> cache = HybridCache::Create(config);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(cache->config().d_conv, 5);
  EXPECT_EQ(cache->config().hidden, 512);
  ASSERT_TRUE(cache->StartForward(std::vector<BatchToken>{{0, 0}, {1, 0}}).ok());
  EXPECT_EQ(cache->ConvState(0)->ShapeString(), "f32[2x2560]");
  // Each size on both sides of its bound: 0 refused, 1 (the smallest conv state) accepted.
  config.d_conv = 0;
  EXPECT_EQ(HybridCache::Create(config).status().code(), StatusCode::kInvalidArgument);
  config.d_conv = 1;
  config.hidden = 0;
  EXPECT_EQ(HybridCache::Create(config).status().code(), StatusCode::kInvalidArgument);
  config.hidden = 1;
  EXPECT_TRUE(HybridCache::Create(config).ok());
  config.num_conv_layers = -1;
  EXPECT_EQ(HybridCache::Create(config).status().code(), StatusCode::kInvalidArgument);
  config.num_conv_layers = 0;
  EXPECT_TRUE(HybridCache::Create(config).ok());
  // The attention side's refusal comes back unchanged (Create builds it first).
  config.kv.max_seqs = 0;
  const Status kv = CausalCache::Create(config.kv).status();
  ASSERT_EQ(kv.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(HybridCache::Create(config).status().message(), kv.message());
}

TEST(HybridCacheSlots, NumSeqsAndSeqTokensDescribeTheForward) {
  HybridCache cache = Make(4);
  EXPECT_EQ(cache.num_seqs(), 0);
  EXPECT_EQ(cache.seq_tokens(), 0);
  // Interleaved: the current sequences are in first-appearance order.
  Forward(cache, {{2, 0}, {1, 0}, {2, 1}, {3, 0}, {1, 1}, {3, 1}}, {1, 2, 3});
  EXPECT_EQ(cache.num_seqs(), 3);
  EXPECT_EQ(cache.seq_tokens(), 2);
  EXPECT_EQ(cache.seqs(), (Slots{2, 1, 3}));
  EXPECT_EQ(cache.slots(), (Slots{0, 1, 2}));
}

TEST(HybridCacheSlots, SeqsReturnsACopy) {
  static_assert(!std::is_reference_v<decltype(std::declval<HybridCache&>().seqs())>);
  HybridCache cache = Make(4);
  Forward(cache, {{1, 0}, {2, 0}, {3, 0}}, {1, 2, 3});
  std::vector<int32_t> seqs = cache.seqs();
  seqs[0] = 999;
  EXPECT_EQ(cache.seqs(), (Slots{1, 2, 3}));
}

TEST(HybridCacheSlots, SupportedForBatchNeedsSequencesAndTokens) {
  HybridCache cache = Make(4);
  EXPECT_FALSE(cache.supported_for_batch());
  Forward(cache, {{1, 0}}, {1});
  EXPECT_TRUE(cache.supported_for_batch());
}

TEST(HybridCacheSlots, ZeroingWithNothingNewIsANoOp) {
  HybridCache cache = Make(4);
  // New slots before any layer buffer exists: nothing to zero, nothing allocated.
  ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{1, 0}, {2, 0}}).ok());
  EXPECT_FALSE(cache.layer_allocated(0));
  EXPECT_FALSE(cache.layer_allocated(1));
  // No new slot in the second forward: the stored rows survive untouched.
  Forward(cache, {{1, 1}, {2, 1}}, {5, 6});
  const std::vector<std::vector<float>> read = Forward(cache, {{1, 2}, {2, 2}}, {7, 8});
  EXPECT_EQ(read[1], Flat(TaggedF({5, 6}, 1)));
}

// SlotRow is [1 x d_conv * hidden] in the cache's dtype whether or not the layer's buffer
// exists yet: before, the zeros it stands for; after, the stored row. A flattened compare
// (as Row does) cannot tell [1 x C] from [C x 1], so the shape is held here.
TEST(HybridCacheSlots, SlotRowIsOneRowOfTheLayerWidthBeforeAndAfterTheBufferExists) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    HybridCache cache = Make(4, dtype);
    ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{1, 0}}).ok());
    ASSERT_FALSE(cache.layer_allocated(1));
    for (int pass = 0; pass < 2; ++pass) {
      const Tensor row = cache.SlotRow(1, 0);
      EXPECT_EQ(row.rows(), 1) << "pass " << pass;
      EXPECT_EQ(row.cols(), kCols) << "pass " << pass;
      EXPECT_EQ(row.dtype(), dtype) << "pass " << pass;
      EXPECT_EQ(Flat(row), Zeros()) << "pass " << pass;
      ASSERT_TRUE(cache.ConvState(1).ok());  // allocates layer 1's buffer, zeroed
      ASSERT_TRUE(cache.layer_allocated(1));
    }
  }
}

TEST(HybridCacheSlots, RecycledSlotIsReturnedZeroed) {
  HybridCache cache = Make(4);
  Forward(cache, {{1, 0}}, {9});
  ASSERT_TRUE(cache.Remove(1, 0, kUnbounded).ok());
  EXPECT_EQ(Row(cache, 0, 0), Tagged(9, 0));  // freeing keeps the stale row...
  ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{2, 0}}).ok());
  EXPECT_EQ(cache.slot_of(2), 0);  // ...the recycled slot comes back first...
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    EXPECT_EQ(Row(cache, layer, 0), Zeros()) << "layer " << layer;  // ...zeroed
  }
}

// Buffers exist per layer, lazily: a forward that reads only a later layer (a model whose
// first hybrid layer is skipped for this batch, or a caller probing one layer) allocates
// that one alone, and a recycled slot is still zeroed in it.
TEST(HybridCacheSlots, RecycledSlotIsZeroedInALayerAllocatedOutOfOrder) {
  ASSERT_GE(kLayers, 2);
  const int32_t last = kLayers - 1;
  HybridCache cache = Make(4);
  ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{1, 0}}).ok());
  ASSERT_TRUE(cache.ConvState(last).ok());
  cache.UpdateConvState(last, Tensor::FromFloat(DType::kFloat32, TaggedF({9}, last)));
  ASSERT_FALSE(cache.layer_allocated(0));
  ASSERT_TRUE(cache.layer_allocated(last));
  ASSERT_TRUE(cache.Remove(1, 0, kUnbounded).ok());
  EXPECT_EQ(Row(cache, last, 0), Tagged(9, last));  // the stale row stays until reuse
  ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{2, 0}}).ok());
  EXPECT_EQ(cache.slot_of(2), 0);
  EXPECT_EQ(Row(cache, last, 0), Zeros());
}

TEST(HybridCacheSlots, OnlyNewlyAllocatedSlotsAreZeroed) {
  HybridCache cache = Make(4);
  Forward(cache, {{1, 0}, {2, 0}}, {3, 4});
  ASSERT_TRUE(cache.Remove(2, 0, kUnbounded).ok());
  // Seq 1 keeps slot 0; seq 3 gets seq 2's dirty slot 1.
  const std::vector<std::vector<float>> read = Forward(cache, {{1, 1}, {3, 0}}, {5, 6});
  EXPECT_EQ(cache.slots(), (Slots{0, 1}));
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    std::vector<float> want = Tagged(3, layer);
    const std::vector<float> zeros = Zeros();
    want.insert(want.end(), zeros.begin(), zeros.end());
    EXPECT_EQ(read[static_cast<size_t>(layer)], want) << "layer " << layer;
  }
}

// --- Copy-on-write, errors, dtype and the documented weaknesses ----------------------------

TEST(HybridCache, FirstConvStateOfAForwardCopiesASharedSlot) {
  HybridCache cache = Make(4);
  Forward(cache, {{0, 0}}, {1});
  ASSERT_TRUE(cache.CopyPrefix(0, 1, 1).ok());
  ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{1, 1}}).ok());
  EXPECT_EQ(cache.slot_of(1), 0);  // still shared: the copy waits for ConvState
  EXPECT_EQ(cache.ref_count(0), 2);
  EXPECT_EQ(Flat(*cache.ConvState(0)), Tagged(1, 0));
  EXPECT_EQ(cache.slot_of(1), 1);
  EXPECT_EQ(cache.ref_count(0), 1);
  EXPECT_EQ(cache.ref_count(1), 1);
  EXPECT_EQ(Row(cache, 1, 1), Tagged(1, 1));  // every allocated layer was copied
  EXPECT_EQ(Flat(*cache.ConvState(1)), Tagged(1, 1));
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    cache.UpdateConvState(layer, Tensor::FromFloat(DType::kFloat32, TaggedF({7}, layer)));
  }
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    EXPECT_EQ(Row(cache, layer, 0), Tagged(1, layer)) << "seq 0 untouched, layer " << layer;
    EXPECT_EQ(Row(cache, layer, 1), Tagged(7, layer)) << "layer " << layer;
  }
}

TEST(HybridCache, CopyOnWriteFailureIsRememberedUntilTheNextForward) {
  HybridCache cache = Make(2);
  Forward(cache, {{0, 0}}, {1});
  ASSERT_TRUE(cache.CopyPrefix(0, 1, 1).ok());
  ASSERT_EQ(*cache.AllocSlot(), 1);  // the only free slot, taken behind the cache's back
  ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{1, 1}}).ok());
  EXPECT_EQ(cache.ConvState(0).status(), ResourceExhausted("cache full"));
  EXPECT_EQ(cache.ConvState(1).status(), ResourceExhausted("cache full"));
  cache.FreeSlot(1);  // a slot is free again, but the failure belongs to this forward
  EXPECT_EQ(cache.ConvState(0).status(), ResourceExhausted("cache full"));
  EXPECT_EQ(cache.slot_of(1), 0);
  EXPECT_EQ(cache.ref_count(0), 2);

  // A reserve forward copies nothing, so it has no copy-on-write to fail: the failure of
  // the forward before must not leak into it.
  ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{1, 2}}, true).ok());
  const Result<Tensor> reserved = cache.ConvState(0);
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  EXPECT_EQ(cache.slot_of(1), 0);

  ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{1, 2}}).ok());
  const Result<Tensor> state = cache.ConvState(0);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(Flat(*state), Tagged(1, 0));
  EXPECT_EQ(cache.slot_of(1), 1);
}

TEST(HybridCache, UnequalTokensPerSequenceIsUnsupportedAfterTheKvUpdate) {
  HybridCache cache = Make(4);
  const Status status = cache.StartForward(std::vector<BatchToken>{{0, 0}, {0, 1}, {1, 0}});
  EXPECT_EQ(status.code(), StatusCode::kUnsupported);
  // The KV side took the batch (first-fit cells 0, 1, 2) before the refusal.
  const std::vector<CausalCache::Cell>& cells = cache.kv().cells();
  ASSERT_GE(cells.size(), 3u);
  EXPECT_EQ(cells[0].pos, 0);
  EXPECT_EQ(cells[0].seqs, (std::set<int32_t>{0}));
  EXPECT_EQ(cells[1].pos, 1);
  EXPECT_EQ(cells[1].seqs, (std::set<int32_t>{0}));
  EXPECT_EQ(cells[2].pos, 0);
  EXPECT_EQ(cells[2].seqs, (std::set<int32_t>{1}));
  // ...but no slot was allocated and there is no forward to read conv state from.
  EXPECT_EQ(cache.slot_of(0), std::nullopt);
  EXPECT_EQ(cache.slot_of(1), std::nullopt);
  EXPECT_EQ(cache.free_slots(), (Slots{3, 2, 1, 0}));
  EXPECT_EQ(cache.num_seqs(), 0);
}

// Spec §2.9.1 (and the header's contract): "cache full" while slots are handed out returns
// at once, so a new sequence that got a slot before the failure stays mapped to it with the
// rows of the slot's earlier owner, not zeroed (ZeroSlots runs only after every allocation).
// Unreachable through the model's own calls (as many slots as sequences); the two other
// slots are taken behind the cache's back. Mutant 153 zeroes them first.
TEST(HybridCache, SlotsTakenBeforeAFailedAllocationKeepTheirOldRows) {
  HybridCache cache = Make(3);
  Forward(cache, {{0, 0}}, {1});  // seq 0 in slot 0
  ASSERT_EQ(*cache.AllocSlot(), 1);
  ASSERT_EQ(*cache.AllocSlot(), 2);
  ASSERT_TRUE(cache.Remove(0, 0, kUnbounded).ok());  // slot 0 free again, its rows kept
  ASSERT_EQ(cache.slot_of(0), std::nullopt);
  const Status started = cache.StartForward(std::vector<BatchToken>{{1, 0}, {2, 0}});
  EXPECT_EQ(started, ResourceExhausted("cache full"));
  EXPECT_EQ(cache.slot_of(1), 0);  // popped and mapped before seq 2 found nothing
  EXPECT_EQ(cache.ref_count(0), 1);
  EXPECT_EQ(cache.slot_of(2), std::nullopt);
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    EXPECT_EQ(Row(cache, layer, 0), Tagged(1, layer)) << "layer " << layer;
  }
}

TEST(HybridCache, RemoveResetsConvStateAtTheNextForward) {
  HybridCache cache = Make(4);
  Forward(cache, {{0, 0}}, {1});
  Forward(cache, {{0, 1}}, {2});
  ASSERT_TRUE(cache.Remove(0, 1, kUnbounded).ok());  // drops only position 1 from the KV
  EXPECT_EQ(cache.slot_of(0), std::nullopt);
  EXPECT_TRUE(cache.CanResume(0, 1));
  const std::vector<std::vector<float>> read = Forward(cache, {{0, 1}}, {3});
  // The right state is the one after position 0 (Tagged(1)); this version starts from 0.
  EXPECT_EQ(read[0], Zeros());
  EXPECT_EQ(read[1], Zeros());
}

TEST(HybridCache, RemoveRefusedByTheKvSideKeepsTheSlot) {
  HybridCache cache = Make(4);
  Forward(cache, {{0, 0}, {0, 1}}, {1});
  // A finite end shifts the keys after it, and this cache has no shift callback.
  EXPECT_EQ(cache.Remove(0, 0, 1).code(), StatusCode::kUnsupported);
  EXPECT_EQ(cache.slot_of(0), 0);
  EXPECT_EQ(cache.ref_count(0), 1);
  EXPECT_EQ(Row(cache, 0, 0), Tagged(1, 0));
}

TEST(HybridCache, CopyPrefixSharesTheCurrentStateWhateverTheLength) {
  HybridCache cache = Make(4);
  for (int64_t pos = 0; pos < 3; ++pos) {
    Forward(cache, {{0, pos}}, {static_cast<float>(pos + 1)});
  }
  ASSERT_TRUE(cache.CopyPrefix(0, 1, 1).ok());  // only position 0 is shared in the KV
  const std::vector<std::vector<float>> read = Forward(cache, {{1, 1}}, {9});
  // The state after position 0 would be Tagged(1); seq 1 gets seq 0's latest, Tagged(3).
  EXPECT_EQ(read[0], Tagged(3, 0));
  EXPECT_EQ(read[1], Tagged(3, 1));
}

// Rounded once to nearest even: values whose dropped low 16 bits round down, round up
// (where truncation would lose an ulp), and exact ties both ways (to the even neighbour,
// whichever side it is on).
TEST(HybridCache, Bf16CacheRoundsStoredValues) {
  HybridCache cache = Make(2, DType::kBFloat16);
  ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{0, 0}}).ok());
  EXPECT_EQ(cache.ConvState(0)->dtype(), DType::kBFloat16);
  MatF values = MatF::Zero(1, kCols);
  values(0, 0) = 3.14159274f;    // 0x40490FDB: low half 0x0FDB rounds down to 3.140625
  values(0, 1) = 1.0009765625f;  // 1 + 2^-10 rounds to 1
  values(0, 2) = -2.5f;          // exact
  values(0, 3) = 0.1f;           // 0x3DCCCCCD: low half 0xCCCD rounds up (truncation: 0.0996)
  values(0, 4) = std::bit_cast<float>(0x3F818000u);  // tie, 0x3F81 odd: up to 0x3F82
  values(0, 5) = std::bit_cast<float>(0xBF808000u);  // tie, 0xBF80 even: down to -1
  cache.UpdateConvState(0, Tensor::FromFloat(DType::kFloat32, values));
  EXPECT_EQ(Row(cache, 0, 0),
            (std::vector<float>{3.140625f, 1.0f, -2.5f, 0.10009765625f, 1.015625f, -1.0f}));
  EXPECT_EQ(cache.SlotRow(0, 0).dtype(), DType::kBFloat16);
}

// K/V rows reach the cells as they arrive, unlike the conv writes: rows in another dtype
// than the cache's are refused on either side with nothing written, and the cache's own
// rows are stored bit for bit (in bf16, a NaN keeps its payload and an infinity its sign).
TEST(HybridCache, PutStoresTheCacheDtypeBitExactlyAndRefusesAnother) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    HybridCache cache = Make(2, dtype);
    ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{0, 0}, {0, 1}}).ok());
    const int64_t cols = cache.config().kv.kv_cols;
    Tensor own;
    if (dtype == DType::kBFloat16) {
      // A signalling NaN with a payload, a negative quiet NaN, -inf, a subnormal.
      const std::vector<uint16_t> bits = {0x7F81, 0xFFC3, 0xFF80, 0x0001};
      ASSERT_EQ(static_cast<int64_t>(bits.size()), 2 * cols);
      own = Tensor(TensorView(dtype, bits.data(), 2, cols));
    } else {
      const std::vector<uint32_t> bits = {0x7F800001u, 0xFFC00003u, 0xFF800000u, 0x00000001u};
      ASSERT_EQ(static_cast<int64_t>(bits.size()), 2 * cols);
      own = Tensor(TensorView(dtype, bits.data(), 2, cols));
    }
    const DType other = dtype == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
    const Tensor foreign = Tensor::FromFloat(other, MatF::Constant(2, cols, 1.5f));
    EXPECT_EQ(cache.Put(foreign, own).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(cache.Put(own, foreign).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(cache.Put(foreign, foreign).code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(cache.kv().k().Rows(0, 2).Equals(Tensor(dtype, 2, cols)));  // nothing written
    ASSERT_TRUE(cache.Put(own, own).ok());
    const CausalCache::View view = cache.Get();
    ASSERT_EQ(view.range_end - view.range_begin, 2);
    EXPECT_TRUE(view.k.Equals(own)) << view.k.ShapeString();
    EXPECT_TRUE(view.v.Equals(own)) << view.v.ShapeString();
  }
}

TEST(HybridCache, ReserveUsesFakeSlotsAndMapsNothing) {
  HybridCache cache = Make(4);
  Forward(cache, {{0, 0}}, {5});
  ASSERT_TRUE(cache.CopyPrefix(0, 2, 1).ok());
  ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{2, 0}, {3, 0}}, true).ok());
  EXPECT_EQ(cache.slots(), (Slots{0, 1}));
  std::vector<float> want = Tagged(5, 0);
  const std::vector<float> zeros = Zeros();
  want.insert(want.end(), zeros.begin(), zeros.end());
  EXPECT_EQ(Flat(*cache.ConvState(0)), want);
  // No copy-on-write for the shared seq 2, no slot for seq 3.
  EXPECT_EQ(cache.slot_of(2), 0);
  EXPECT_EQ(cache.ref_count(0), 2);
  EXPECT_EQ(cache.slot_of(3), std::nullopt);
  EXPECT_EQ(cache.free_slots(), (Slots{3, 2, 1}));
}

TEST(HybridCacheDeathTest, UpdateBeforeConvStateAborts) {
  HybridCache cache = Make(4);
  ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{0, 0}}).ok());
  const Tensor rows = Tensor::FromFloat(DType::kFloat32, TaggedF({1}, 0));
  EXPECT_DEATH(cache.UpdateConvState(0, rows), "before a successful ConvState");
  EXPECT_DEATH((void)cache.ConvState(kLayers), "conv layer [0-9]+ out of range");
}

// A failed StartForward ends the forward before it: its conv state is gone, not readable.
TEST(HybridCacheDeathTest, ConvStateAfterAFailedStartForwardAborts) {
  HybridCache cache = Make(2);
  Forward(cache, {{0, 0}}, {1});
  ASSERT_EQ(*cache.AllocSlot(), 1);  // the only free slot, taken behind the cache's back
  ASSERT_EQ(cache.StartForward(std::vector<BatchToken>{{1, 0}}), ResourceExhausted("cache full"));
  EXPECT_DEATH((void)cache.ConvState(0), "without a successful StartForward");
}

// A fresh cache has had no forward at all.
TEST(HybridCacheDeathTest, ConvStateBeforeAnyStartForwardAborts) {
  HybridCache cache = Make(2);
  EXPECT_DEATH((void)cache.ConvState(0), "without a successful StartForward");
}

// A current sequence keeps its slot from StartForward to the forward's last conv call: a
// Remove or a CopyPrefix onto it in between remaps it, and the forward would read and write
// a row the sequence no longer owns (a freed slot, or one shared with the copy's source).
TEST(HybridCacheDeathTest, ASlotChangedInsideAForwardAborts) {
  const std::vector<std::pair<const char*, std::function<Status(HybridCache&)>>> remaps = {
      {"Remove", [](HybridCache& c) { return c.Remove(0, 0, kUnbounded); }},
      {"CopyPrefix", [](HybridCache& c) { return c.CopyPrefix(1, 0, 1); }}};
  for (const auto& [name, remap] : remaps) {
    for (const bool after_read : {false, true}) {
      HybridCache cache = Make(4);
      Forward(cache, {{0, 0}, {1, 0}}, {5, 6});
      ASSERT_TRUE(cache.StartForward(std::vector<BatchToken>{{0, 1}}).ok()) << name;
      const Tensor rows = Tensor::FromFloat(DType::kFloat32, TaggedF({7}, 0));
      if (after_read) {
        ASSERT_TRUE(cache.ConvState(0).ok()) << name;
      }
      const std::optional<int32_t> before = cache.slot_of(0);
      const Status st = remap(cache);
      ASSERT_TRUE(st.ok()) << name << ": " << st.ToString();
      ASSERT_NE(cache.slot_of(0), before) << name;
      // Both conv calls check: ConvState before the first read, UpdateConvState after it.
      const auto next_call = [&] {
        if (after_read) {
          cache.UpdateConvState(0, rows);
        } else {
          (void)cache.ConvState(0);
        }
      };
      EXPECT_DEATH(next_call(), "sequence 0 changed slot inside a forward") << name;
    }
  }
}

}  // namespace
}  // namespace kvtwin
