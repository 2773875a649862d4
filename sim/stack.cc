#include "sim/stack.h"

#include <fmt/format.h>

#include "sim/synthetic.h"
#include "src/kv_cache.h"
#include "src/rotating_cache.h"

namespace kvtwin::sim {

Status StackConfig::Validate() const {
  if (layers.empty()) return InvalidArgument("the stack has no layers");
  if (layers.size() > 127) return InvalidArgument("at most 127 layers (the provenance tag)");
  if (kv_heads < 1 || head_dim < 1 || value_dim < 1 || k_cols() < kTagElements ||
      v_cols() < kTagElements) {
    return InvalidArgument(
        fmt::format("kv_heads x head_dim = {} and kv_heads x value_dim = {} must be >= {} so "
                    "K and V rows carry their provenance",
                    k_cols(), v_cols(), kTagElements));
  }
  const RecurrentDims& r = recurrent;
  if (r.conv_tail < 1 || r.num_k_heads < 1 || r.num_v_heads < 1 || r.head_k_dim < 1 ||
      r.head_v_dim < 1) {
    return InvalidArgument("recurrent dimensions must be >= 1");
  }
  if (r.num_v_heads % r.num_k_heads != 0) {
    return InvalidArgument("recurrent num_v_heads must be a multiple of num_k_heads");
  }
  bool stateful = false;
  for (size_t i = 0; i < layers.size(); ++i) {
    stateful = stateful || !layers[i].stateless;
    if (!layers[i].stateless && layers[i].kind == CacheKind::kRotating && layers[i].window < 1) {
      return InvalidArgument(fmt::format("layer {}: window must be >= 1", i));
    }
  }
  if (!stateful) return InvalidArgument("every layer is stateless: the manager has no cache");
  return Status::Ok();
}

std::string StackConfig::Describe() const {
  std::string kinds;
  for (size_t i = 0; i < layers.size() && i < 4; ++i) {
    if (i > 0) kinds += ", ";
    if (layers[i].stateless) {
      kinds += "none";
      continue;
    }
    kinds += CacheKindName(layers[i].kind);
    if (layers[i].kind == CacheKind::kRotating) kinds += fmt::format("(W={})", layers[i].window);
  }
  if (layers.size() > 4) kinds += ", ...";
  const RecurrentDims& r = recurrent;
  return fmt::format("{} x{} [{}] {} kv={}x{}/{} rec=tail{} hk{} hv{} dk{} dv{}", preset,
                     layers.size(), kinds, DTypeName(dtype), kv_heads, head_dim, value_dim,
                     r.conv_tail, r.num_k_heads, r.num_v_heads, r.head_k_dim, r.head_v_dim);
}

const std::vector<std::string>& PresetNames() {
  static const std::vector<std::string> names = {"dense", "sliding", "recurrent", "mixed",
                                                 "rotating"};
  return names;
}

const std::vector<std::string>& RequestPresetNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = PresetNames();
    all.push_back("holey");
    return all;
  }();
  return names;
}

Status RequireStateful(const StackConfig& config) {
  for (const LayerSpec& spec : config.layers) {
    if (spec.stateless) {
      return InvalidArgument(fmt::format(
          "preset '{}' has stateless layers, which only request runs model (kvtwin requests)",
          config.preset));
    }
  }
  return Status::Ok();
}

Result<StackConfig> StackFromPreset(const std::string& preset, int32_t num_layers, int64_t window,
                                    DType dtype) {
  if (num_layers < 1)
    return InvalidArgument(fmt::format("layers must be >= 1, got {}", num_layers));
  if (window < 1) return InvalidArgument(fmt::format("window must be >= 1, got {}", window));
  // Said here rather than as Validate's "every layer is stateless": it names the fix.
  if (preset == "holey" && num_layers < 2) {
    return InvalidArgument(fmt::format(
        "preset 'holey' needs >= 2 layers (its layer 0 is stateless), got {}", num_layers));
  }
  StackConfig config;
  config.preset = preset;
  config.dtype = dtype;
  for (int32_t i = 0; i < num_layers; ++i) {
    LayerSpec spec;
    if (preset == "dense") {
      spec.kind = CacheKind::kFullKv;
    } else if (preset == "rotating") {
      spec.kind = CacheKind::kRotating;
    } else if (preset == "sliding") {
      spec.kind = i % 2 == 0 ? CacheKind::kRotating : CacheKind::kFullKv;
    } else if (preset == "recurrent") {
      spec.kind = i % 4 == 3 ? CacheKind::kFullKv : CacheKind::kRecurrent;
    } else if (preset == "mixed") {
      const CacheKind cycle[3] = {CacheKind::kFullKv, CacheKind::kRotating, CacheKind::kRecurrent};
      spec.kind = cycle[i % 3];
    } else if (preset == "holey") {
      // Positions 0 and 3 of each cycle of 5 are holes; the kind of a hole is unused.
      const CacheKind cycle[5] = {CacheKind::kFullKv, CacheKind::kFullKv, CacheKind::kRotating,
                                  CacheKind::kFullKv, CacheKind::kRecurrent};
      spec.kind = cycle[i % 5];
      spec.stateless = i % 5 == 0 || i % 5 == 3;
    } else {
      return InvalidArgument(fmt::format(
          "unknown preset '{}' (dense, rotating, sliding, recurrent, mixed, holey)", preset));
    }
    if (spec.kind == CacheKind::kRotating) spec.window = window;
    config.layers.push_back(spec);
  }
  KV_RETURN_IF_ERROR(config.Validate());
  return config;
}

Result<DType> ParseDType(const std::string& name) {
  if (name == "f32" || name == "float32") return DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  return InvalidArgument(fmt::format("unknown dtype '{}' (f32, bf16)", name));
}

std::vector<std::unique_ptr<LayerCache>> BuildCaches(const StackConfig& config) {
  std::vector<std::unique_ptr<LayerCache>> caches;
  for (const LayerSpec& spec : config.layers) {
    if (spec.stateless) {
      caches.push_back(nullptr);  // a hole in the manager's list (spec §3.1)
      continue;
    }
    switch (spec.kind) {
      case CacheKind::kFullKv:
        caches.push_back(std::make_unique<KvCache>());
        break;
      case CacheKind::kRotating:
        caches.push_back(std::make_unique<RotatingCache>(spec.window));
        break;
      case CacheKind::kRecurrent:
        caches.push_back(std::make_unique<RecurrentCache>(config.recurrent));
        break;
    }
  }
  return caches;
}

}  // namespace kvtwin::sim
