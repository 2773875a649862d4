// Goal: every cache kind behaves like its reference under arbitrary operation sequences,
// speculative decoding included.
// Method: rapidcheck state machines (rc::state) over a one-layer stack, one property per
// kind. The model is the reference (model::RefCache plus the pool of reference snapshots
// the driver holds, prop/stack_model.h); the system under test is a LockstepDriver, which
// applies each op to the production cache and to its own reference and checks offsets,
// contents, snapshot contents and outcomes after every step. Commands (prop/stack_gen.h)
// are writes of random length (with padding and mask forms), speculations (committed with
// in-range and clamped acceptance counts, or isolated), snapshots, restores to reachable
// and unreachable targets, merges, splits, frees, capture schedules (valid and malformed),
// takes and closes. Seeds and case counts are pinned (kPinnedParams; an RC_PARAMS set by
// the caller wins); a failure prints the shrunk command sequence. Mixed stacks:
// mixed_stack_state_machine_test.cc.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "prop/stack_command.h"

namespace kvtwin::sim::prop {
namespace {

// `window` is drawn by the caller before the dtype (the pinned cases depend on the order).
void CheckKind(CacheKind kind, int64_t window) {
  ASSERT_TRUE(kPinnedParams);
  StackConfig config;
  config.preset = "single";
  config.dtype = *rc::gen::element(DType::kFloat32, DType::kBFloat16);
  config.layers = {LayerSpec{kind, kind == CacheKind::kRotating ? window : 0}};
  CheckStack(config, window);
}

// Drawn for every kind: without a rotating layer it still steers draft counts.
int64_t NarrowWindow() { return *rc::gen::element<int64_t>(1, 2, 3, 4, 8); }

RC_GTEST_PROP(LayerStateMachine, FullKvCacheMatchesReference, ()) {
  CheckKind(CacheKind::kFullKv, NarrowWindow());
}
RC_GTEST_PROP(LayerStateMachine, RotatingCacheMatchesReference, ()) {
  CheckKind(CacheKind::kRotating, NarrowWindow());
}
// Windows wider than the ring's 256-slot growth step: a fresh ring grows by the step, not to
// W, so the buffer holds 256 rows before it holds W; a batch cuts that padding, a decode
// grows again by min(256, W - offset). Windows of at most 256 never reach those branches.
RC_GTEST_PROP(LayerStateMachine, WideRotatingCacheMatchesReference, ()) {
  CheckKind(CacheKind::kRotating, *rc::gen::element<int64_t>(257, 300, 520));
}
RC_GTEST_PROP(LayerStateMachine, RecurrentCacheMatchesReference, ()) {
  CheckKind(CacheKind::kRecurrent, NarrowWindow());
}

// The recurrent layer under drawn dims (GenRecurrentDims says why).
RC_GTEST_PROP(LayerStateMachine, RecurrentCacheOfAnyDimsMatchesReference, ()) {
  ASSERT_TRUE(kPinnedParams);
  StackConfig config;
  config.preset = "single";
  config.dtype = *rc::gen::element(DType::kFloat32, DType::kBFloat16);
  config.layers = {LayerSpec{CacheKind::kRecurrent, 0}};
  config.dims.recurrent = GenRecurrentDims();
  CheckStack(config, NarrowWindow());
}

// The K/V layers under drawn widths (GenKvDims says why).
RC_GTEST_PROP(LayerStateMachine, KvCachesOfAnyWidthsMatchReference, ()) {
  ASSERT_TRUE(kPinnedParams);
  const int64_t window = NarrowWindow();
  StackConfig config;
  config.preset = "single";
  config.dtype = *rc::gen::element(DType::kFloat32, DType::kBFloat16);
  const CacheKind kind = *rc::gen::element(CacheKind::kFullKv, CacheKind::kRotating);
  config.layers = {LayerSpec{kind, kind == CacheKind::kRotating ? window : 0}};
  GenKvDims(config.dims);
  CheckStack(config, window);
}

// K and V in two dtypes (spec §2.1 and §2.2: each buffer takes its own first write's), at
// the default widths or drawn ones: growth, rewinds, snapshots and restores must keep V's
// dtype apart from K's.
RC_GTEST_PROP(LayerStateMachine, KvCachesWithVInAnotherDtypeMatchReference, ()) {
  ASSERT_TRUE(kPinnedParams);
  const int64_t window = NarrowWindow();
  StackConfig config;
  config.preset = "single";
  config.dtype = *rc::gen::element(DType::kFloat32, DType::kBFloat16);
  config.v_dtype = config.dtype == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
  const CacheKind kind = *rc::gen::element(CacheKind::kFullKv, CacheKind::kRotating);
  config.layers = {LayerSpec{kind, kind == CacheKind::kRotating ? window : 0}};
  if (*rc::gen::arbitrary<bool>()) GenKvDims(config.dims);
  CheckStack(config, window);
}

}  // namespace
}  // namespace kvtwin::sim::prop
