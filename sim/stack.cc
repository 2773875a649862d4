#include "sim/stack.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <iterator>
#include <limits>
#include <string_view>

#include "sim/synthetic.h"
#include "src/core/check.h"
#include "src/kv_cache.h"
#include "src/rotating_cache.h"

namespace kvtwin::sim {

namespace {

Status DimInRange(const char* name, int64_t value, int64_t hi, int64_t lo = 1) {
  if (value >= lo && value <= hi) return Status::Ok();
  return InvalidArgument(fmt::format("{} must be in {}..{}, got {}", name, lo, hi, value));
}

// `text` as exactly `n` comma-separated decimal integers.
Status ParseInts(const char* flag, const char* form, const std::string& text, size_t n,
                 int64_t* out) {
  const auto bad = [&] {
    return InvalidArgument(fmt::format("{} must be {}, got '{}'", flag, form, text));
  };
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t end = i + 1 < n ? text.find(',', at) : text.size();
    if (end == std::string::npos) return bad();
    const std::string_view part = std::string_view(text).substr(at, end - at);
    const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), out[i]);
    if (part.empty() || ec != std::errc() || ptr != part.data() + part.size()) return bad();
    at = end + 1;
  }
  return Status::Ok();
}

}  // namespace

Status ModelDims::Validate() const {
  KV_RETURN_IF_ERROR(ValidateKv());
  return ValidateRecurrent();
}

Status ModelDims::ValidateKv() const {
  KV_RETURN_IF_ERROR(DimInRange("kv heads", kv_heads, kMaxHeads));
  KV_RETURN_IF_ERROR(DimInRange("kv head_dim", head_dim, kMaxHeadWidth));
  KV_RETURN_IF_ERROR(DimInRange("kv value_dim", value_dim, kMaxHeadWidth, 0));
  // value_dim 0 is an MLA layer (spec §2.5, "MLA variant"): the cache stores K alone and a
  // zero-width V, so only K has to carry the provenance tag.
  if (k_cols() < kTagElements || (v_cols() != 0 && v_cols() < kTagElements)) {
    return InvalidArgument(
        fmt::format("kv heads x head_dim = {} and kv heads x value_dim = {} must be >= {} so "
                    "K and V rows carry their provenance (value_dim 0: an MLA layer)",
                    k_cols(), v_cols(), kTagElements));
  }
  return Status::Ok();
}

Status ModelDims::ValidateRecurrent() const {
  const RecurrentDims& r = recurrent;
  KV_RETURN_IF_ERROR(DimInRange("recurrent conv_tail", r.conv_tail, kMaxConvTail, 0));
  KV_RETURN_IF_ERROR(DimInRange("recurrent num_k_heads", r.num_k_heads, kMaxHeads));
  KV_RETURN_IF_ERROR(DimInRange("recurrent num_v_heads", r.num_v_heads, kMaxHeads));
  KV_RETURN_IF_ERROR(DimInRange("recurrent head_k_dim", r.head_k_dim, kMaxHeadWidth));
  KV_RETURN_IF_ERROR(DimInRange("recurrent head_v_dim", r.head_v_dim, kMaxHeadWidth));
  if (r.num_v_heads % r.num_k_heads != 0) {
    return InvalidArgument(
        fmt::format("recurrent num_v_heads ({}) must be a multiple of num_k_heads ({})",
                    r.num_v_heads, r.num_k_heads));
  }
  return Status::Ok();
}

std::string ModelDims::Describe() const {
  const RecurrentDims& r = recurrent;
  return fmt::format("kv={}x{}/{} rec=tail{} hk{} hv{} dk{} dv{}", kv_heads, head_dim, value_dim,
                     r.conv_tail, r.num_k_heads, r.num_v_heads, r.head_k_dim, r.head_v_dim);
}

bool ModelDims::KvAtDefault() const {
  const ModelDims d;
  return kv_heads == d.kv_heads && head_dim == d.head_dim && value_dim == d.value_dim;
}

std::string ModelDims::KvFlag() const {
  return fmt::format("{},{},{}", kv_heads, head_dim, value_dim);
}

std::string ModelDims::RecurrentFlag() const {
  const RecurrentDims& r = recurrent;
  return fmt::format("{},{},{},{},{}", r.conv_tail, r.num_k_heads, r.num_v_heads, r.head_k_dim,
                     r.head_v_dim);
}

Status ParseKvDims(const std::string& text, ModelDims* dims) {
  int64_t v[3];
  KV_RETURN_IF_ERROR(ParseInts("--kv-dims", "HEADS,DK,DV", text, 3, v));
  dims->kv_heads = v[0];
  dims->head_dim = v[1];
  dims->value_dim = v[2];
  return Status::Ok();
}

Status ParseRecurrentDims(const std::string& text, ModelDims* dims) {
  int64_t v[5];
  KV_RETURN_IF_ERROR(ParseInts("--recurrent-dims", "TAIL,HK,HV,DK,DV", text, 5, v));
  dims->recurrent = {.conv_tail = v[0],
                     .num_k_heads = v[1],
                     .num_v_heads = v[2],
                     .head_k_dim = v[3],
                     .head_v_dim = v[4]};
  return Status::Ok();
}

std::string DimsFlags(const ModelDims& dims) {
  std::string flags;
  if (!dims.KvAtDefault()) flags += " --kv-dims " + dims.KvFlag();
  if (!dims.RecurrentAtDefault()) flags += " --recurrent-dims " + dims.RecurrentFlag();
  return flags;
}

Status ValidateDimsFlags(const ModelDims& dims) {
  if (const Status kv = dims.ValidateKv(); !kv.ok()) {
    return InvalidArgument("--kv-dims: " + kv.message());
  }
  const Status rec = dims.ValidateRecurrent();
  return rec.ok() ? rec : InvalidArgument("--recurrent-dims: " + rec.message());
}

ModelDims DrawModelDims(Rng& rng) {
  ModelDims d;
  d.kv_heads = rng.Range(1, 3);
  const int64_t min_width = (kTagElements + d.kv_heads - 1) / d.kv_heads;
  d.head_dim = rng.Range(min_width, min_width + 3);
  d.value_dim = rng.Range(min_width, min_width + 3);
  RecurrentDims& r = d.recurrent;
  r.num_k_heads = rng.Range(1, 3);
  r.num_v_heads = r.num_k_heads * rng.Range(1, 2);
  r.head_k_dim = rng.Range(1, 4);
  r.head_v_dim = rng.Range(1, 4);
  r.conv_tail = rng.Range(1, 4);
  if (rng.Chance(1, 6)) r.conv_tail = 0;
  // Value-head groups of 3 or 4 key heads' worth in one draw in four (drawn last, so every
  // draw above is what it was): a group that is not a power of two (Hv = 3 Hk) is where a
  // value-to-key head mapping by shift or mask instead of division goes wrong.
  if (rng.Chance(1, 4)) r.num_v_heads = r.num_k_heads * rng.Range(3, 4);
  // An MLA layer in one draw in eight (last, as above): K alone, a V of no columns, whose rows
  // a cache still keeps one per slot and attention still returns as L x 0.
  if (rng.Chance(1, 8)) d.value_dim = 0;
  KV_CHECK(d.Validate().ok(), d.Describe());
  return d;
}

ModelDims SwarmDims(uint64_t seed) {
  Rng rng = Rng::Derive(seed, "swarm-dims");
  return rng.Chance(1, 2) ? DrawModelDims(rng) : ModelDims{};
}

std::string SwarmDTypes(uint64_t seed, DType activation) {
  Rng rng = Rng::Derive(seed, "swarm-v-dtype");
  if (!rng.Chance(1, 6)) return DTypeName(activation);
  const DType other = activation == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
  return StackDTypesName(StackDTypes(activation, other));
}

int64_t SwarmWindow(uint64_t seed, const ModelDims& dims, int64_t window) {
  // Growth or ring arithmetic keyed to a large window (Phi-3's 2047, Mistral's and Gemma-2's
  // 4096) shows only there. Only over narrow rows: a ring of 8192 rows of 64 heads of 512
  // columns, and the snapshots that clone it, would take gigabytes.
  Rng big = Rng::Derive(seed, "swarm-big-window");
  const int64_t row = dims.kv_heads * (dims.head_dim + dims.value_dim);
  if (!big.Chance(1, 16) || row > 32) return window;
  const int64_t bigs[] = {2047, 4096, 4097, 8192};
  return bigs[big.Below(std::size(bigs))];
}

Status StackConfig::Validate() const {
  if (layers.empty()) return InvalidArgument("the stack has no layers");
  if (layers.size() > 127) return InvalidArgument("at most 127 layers (the provenance tag)");
  KV_RETURN_IF_ERROR(dims.Validate());
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

bool StackConfig::TakesPaddingAlone() const {
  return !layers.empty() && std::ranges::all_of(layers, [](const LayerSpec& l) {
    return l.kind == CacheKind::kRecurrent;
  });
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
  return fmt::format("{} x{} [{}] {} {}", preset, layers.size(), kinds,
                     StackDTypesName(StackDTypes(dtype, v_dtype)), dims.Describe());
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

std::vector<std::string> AcceptedPresetNames(bool requests) {
  std::vector<std::string> names = requests ? RequestPresetNames() : PresetNames();
  names.emplace_back(kStaggeredPreset);
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
                                    StackDTypes dtypes, const ModelDims& dims) {
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
  config.dtype = dtypes.dtype;
  config.v_dtype = dtypes.v;
  config.dims = dims;
  for (int32_t i = 0; i < num_layers; ++i) {
    LayerSpec spec;
    if (preset == kStaggeredPreset) {
      // Past half the int64 range a window is unbounded in effect; it is not doubled.
      const int64_t wide =
          window > (std::numeric_limits<int64_t>::max() - 1) / 2 ? window : 2 * window + 1;
      const int64_t windows[4] = {window, wide, 0, (window + 1) / 2};
      spec.kind = i % 4 == 2 ? CacheKind::kFullKv : CacheKind::kRotating;
      spec.window = windows[i % 4];
      config.layers.push_back(spec);
      continue;
    }
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
          "unknown preset '{}' (dense, rotating, sliding, recurrent, mixed, holey, staggered)",
          preset));
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

Result<StackDTypes> ParseStackDTypes(const std::string& name) {
  const size_t slash = name.find('/');
  if (slash == std::string::npos) {
    Result<DType> one = ParseDType(name);
    if (!one.ok()) return one.status();
    return StackDTypes(*one);
  }
  Result<DType> k = ParseDType(name.substr(0, slash));
  Result<DType> v = ParseDType(name.substr(slash + 1));
  if (!k.ok() || !v.ok()) {
    return InvalidArgument(
        fmt::format("unknown dtype '{}' (f32, bf16, or K/V such as bf16/f32)", name));
  }
  return StackDTypes(*k, *v);
}

std::string StackDTypesName(const StackDTypes& dtypes) {
  if (!dtypes.v.has_value()) return DTypeName(dtypes.dtype);
  return fmt::format("{}/{}", DTypeName(dtypes.dtype), DTypeName(*dtypes.v));
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
        caches.push_back(std::make_unique<RecurrentCache>(config.dims.recurrent));
        break;
    }
  }
  return caches;
}

}  // namespace kvtwin::sim
