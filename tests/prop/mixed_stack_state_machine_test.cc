// Goal: a stack that mixes full KV, rotating and recurrent layers behaves like its
// references under arbitrary operation sequences, in particular speculative decoding, whose
// forward and commit span every layer at once while each layer keeps its own offset,
// history and capture schedule.
// Method: a rapidcheck state machine (rc::state) whose model holds one RefCache and one
// snapshot pool per layer (prop/stack_model.h) and whose system under test is a
// LockstepDriver over the same stack, checking every layer and held snapshot after every
// step. Each case draws a stack of 2-5 layers: a random order of the three kinds (two of
// them when there are only two layers) plus duplicates at random places, a window per
// rotating layer from {1, 2, 3, 4, 8}, f32 or bf16. Writes and speculations go to every
// layer; snapshots, restores, merges, splits, frees, schedules, takes and closes to one
// random layer, so layers drift apart in offset and history. Speculations draw D from
// {1, 2, 3, 10, W-1, W, W+1} for a rotating layer's W, so forwards longer than a window
// and rings that already wrapped are common (prop/stack_gen.h). 500 pinned cases
// (kPinnedParams); a failure prints the stack and the shrunk op sequence.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <utility>
#include <vector>

#include "prop/stack_command.h"

namespace kvtwin::sim::prop {
namespace {

// Every kind at least once (when there is room), in any order, duplicates anywhere.
std::vector<CacheKind> GenKinds() {
  std::vector<CacheKind> kinds = {CacheKind::kFullKv, CacheKind::kRotating, CacheKind::kRecurrent};
  for (size_t i = kinds.size() - 1; i > 0; --i) {
    std::swap(kinds[i], kinds[*rc::gen::inRange<size_t>(0, i + 1)]);
  }
  const int32_t layers = *rc::gen::inRange(2, 6);
  if (layers == 2) kinds.pop_back();
  while (static_cast<int32_t>(kinds.size()) < layers) {
    const auto at = *rc::gen::inRange<size_t>(0, kinds.size() + 1);
    kinds.insert(
        kinds.begin() + static_cast<std::ptrdiff_t>(at),
        *rc::gen::element(CacheKind::kFullKv, CacheKind::kRotating, CacheKind::kRecurrent));
  }
  return kinds;
}

StackConfig GenMixedStack() {
  StackConfig config;
  config.preset = "prop-mixed";
  config.dtype = *rc::gen::element(DType::kFloat32, DType::kBFloat16);
  for (CacheKind kind : GenKinds()) {
    // Windows differ per layer: speculation and restores must not assume one W.
    const int64_t window =
        kind == CacheKind::kRotating ? *rc::gen::element<int64_t>(1, 2, 3, 4, 8) : 0;
    config.layers.push_back(LayerSpec{kind, window});
  }
  // Half the stacks: every layer under other widths, so a speculation or a restore across
  // kinds meets them too.
  if (*rc::gen::arbitrary<bool>()) {
    config.dims.recurrent = GenRecurrentDims();
    GenKvDims(config.dims);
  }
  return config;
}

RC_GTEST_PROP(MixedStackStateMachine, MixedStackWithSpeculationMatchesReferences, ()) {
  ASSERT_TRUE(kPinnedParams);
  // One pick, so a counterexample shows the stack as one labelled value.
  CheckStack(*rc::gen::exec(GenMixedStack), /*fallback_window=*/4);
}

// V rows stored in the other dtype than K's (llama.cpp's --cache-type-v): a speculation
// wrapper, a snapshot or a restore that takes V's dtype, width or price from K's shows here.
// A property of its own, so the one above keeps its pinned cases.
RC_GTEST_PROP(MixedStackStateMachine, MixedStackWithVInAnotherDtypeMatchesReferences, ()) {
  ASSERT_TRUE(kPinnedParams);
  CheckStack(*rc::gen::exec([] {
    StackConfig config = GenMixedStack();
    config.v_dtype = config.dtype == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
    return config;
  }),
             /*fallback_window=*/4);
}

}  // namespace
}  // namespace kvtwin::sim::prop
