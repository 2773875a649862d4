// One layer of a preset's stack, its production cache and its oracle, for the tests that
// drive a cache by hand and hold LayerOracle to what it reports (history_trust_test,
// mla_test). Test scaffolding only.
#pragma once

#include <memory>
#include <utility>

#include "sim/checks.h"
#include "sim/forward.h"
#include "sim/stack.h"

namespace kvtwin::sim {

struct OneLayer {
  StackConfig config;
  SyntheticForward synth{5};
  std::unique_ptr<LayerCache> cache;
  std::unique_ptr<LayerOracle> oracle;

  // Layer 0 of `preset` at W = 4, f32, with the model widths `dims`.
  explicit OneLayer(const char* preset, const ModelDims& dims = ModelDims{}) {
    config = StackFromPreset(preset, 1, 4, DType::kFloat32).value();
    config.dims = dims;
    cache = std::move(BuildCaches(config)[0]);
    oracle = std::make_unique<LayerOracle>(synth, config, 0);
  }
  // Writes `log` in one forward from offset 0 and returns its history.
  History WriteAll(const model::TokenLog& log) {
    return ForwardSynthetic(*cache, config, synth, 0, 0, log);
  }
};

}  // namespace kvtwin::sim
