// StackConfig: the layer stack a lock-step run drives, like a real model's (spec README,
// "Model presets"): dense (all full KV), sliding (alternating rotating window and full
// KV, Gemma-like), recurrent (gated-delta layers with a full KV layer every fourth,
// Qwen3.5-like) and mixed (cycling full KV, rotating, recurrent). Tensor dimensions are
// tiny by default so millions of operations run per minute. Validate() turns an impossible
// configuration into an InvalidArgument naming the field. Value type.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/cache.h"
#include "src/core/rng.h"
#include "src/core/status.h"
#include "src/recurrent_cache.h"

namespace kvtwin::sim {

struct LayerSpec {
  CacheKind kind = CacheKind::kFullKv;
  int64_t window = 0;  // rotating only
  // A stateless layer: a null hole in the prefix manager's cache list (spec §3.1). Only the
  // request level models holes; the layer drivers refuse a stack with one (RequireStateful).
  bool stateless = false;
};

// The tensor widths a model's config gives its layers, shared by every layer of a stack:
// K/V heads with the K and V head widths, and the recurrent layers' dims. Tiny by default so
// millions of operations run per minute; a trace's model, --kv-dims / --recurrent-dims and
// swarm seeds (DrawModelDims) give others. Value type.
struct ModelDims {
  int64_t kv_heads = 2;
  // K and V head widths differ (Dk != Dv, as in spec §7's K[B,H,Cap,Dk], V[B,H,Cap,Dv]): a
  // cache that sizes, copies or counts V with K's width shows in every run (with equal
  // widths it would hide). Both rows must hold the provenance tag.
  int64_t head_dim = 4;   // Dk
  int64_t value_dim = 5;  // Dv
  // Two key heads shared by pairs of value heads, and Dk != Dv: a head mapping wrong only
  // for grouped heads, or a state stored transposed, shows in every run (with one key head
  // or square heads both would hide). conv_dim = 2*2*2 + 4*3 = 20; the state is 12 x 2.
  // Two pairs are equal (num_k_heads = head_k_dim, conv_tail = head_v_dim), so code taking
  // one of a pair for the other passes every run with these dims; swarm seeds and the
  // property tests draw others (DrawModelDims; tests/prop/stack_command.h).
  RecurrentDims recurrent = {
      .conv_tail = 3, .num_k_heads = 2, .num_v_heads = 4, .head_k_dim = 2, .head_v_dim = 3};

  int64_t k_cols() const { return kv_heads * head_dim; }
  int64_t v_cols() const { return kv_heads * value_dim; }
  // InvalidArgument naming the field: ValidateKv (widths in range, K and V rows wide enough
  // for the provenance tag), then ValidateRecurrent (widths in range, value heads a multiple
  // of key heads). The ranges: kMaxHeads, kMaxHeadWidth, kMaxConvTail.
  Status Validate() const;
  Status ValidateKv() const;
  Status ValidateRecurrent() const;
  // "kv=2x4/5 rec=tail3 hk2 hv4 dk2 dv3"
  std::string Describe() const;
  // Whether each part is at its default: traces and command lines leave those out.
  bool KvAtDefault() const;
  bool RecurrentAtDefault() const { return recurrent == ModelDims().recurrent; }
  // The flag values that give these dims: "2,4,5" and "3,2,4,2,3".
  std::string KvFlag() const;
  std::string RecurrentFlag() const;
  friend bool operator==(const ModelDims&, const ModelDims&) = default;
};

// Range limits of ModelDims (traces and flags): real models' widths fit (128-256 per head,
// dozens of heads, a kernel of 4), and a row stays small enough for millions of checks.
inline constexpr int64_t kMaxHeads = 64;
inline constexpr int64_t kMaxHeadWidth = 512;
inline constexpr int64_t kMaxConvTail = 16;

// --kv-dims "HEADS,DK,DV" and --recurrent-dims "TAIL,HK,HV,DK,DV" into `dims` (the other
// part unchanged). InvalidArgument on anything but that many comma-separated integers in
// range; ModelDims::Validate checks the combination.
Status ParseKvDims(const std::string& text, ModelDims* dims);
Status ParseRecurrentDims(const std::string& text, ModelDims* dims);
// What a command line adds for `dims`: " --kv-dims H,DK,DV" and " --recurrent-dims
// TAIL,HK,HV,DK,DV", each only when that part is not at its default ("" for ModelDims{}).
std::string DimsFlags(const ModelDims& dims);
// ModelDims::ValidateKv and ValidateRecurrent, their messages prefixed with the flag.
Status ValidateDimsFlags(const ModelDims& dims);
// Swarm seeds' dims: 1-3 K/V heads with head widths just wide enough for the provenance tag
// and up to 3 more (Dk and Dv drawn apart), 1-3 key heads with 1-2 value heads each, and
// recurrent head widths and conv tail 1-4. Always valid.
ModelDims DrawModelDims(Rng& rng);
// A swarm seed's dims: the defaults for half the seeds, DrawModelDims for the other half.
// Drawn from a stream of its own (Rng::Derive(seed, "swarm-dims")), so a seed's other
// choices are what they were before dims were drawn.
ModelDims SwarmDims(uint64_t seed);
// A swarm seed's dtype name: `activation`, or for one seed in six V in the other dtype
// ("bf16/f32", "f32/bf16"). A stream of its own (Rng::Derive(seed, "swarm-v-dtype")), so a
// seed's other choices are unchanged.
std::string SwarmDTypes(uint64_t seed, DType activation);
// A swarm seed's window: `window` (the seed's own draw), or for one seed in 16 a window of
// real models' size (2047, 4096, 4097 or 8192), when the K/V rows are narrow. A stream of its
// own (Rng::Derive(seed, "swarm-big-window")), so a seed's other choices are unchanged.
int64_t SwarmWindow(uint64_t seed, const ModelDims& dims, int64_t window);

// A stack's dtypes: the activation dtype (K rows, recurrent conv tails and inputs) and V's,
// which may differ, as llama.cpp's --cache-type-k / --cache-type-v allow: spec §2.1 and §2.2
// give each buffer the dtype of its own first write.
struct StackDTypes {
  DType dtype = DType::kFloat32;
  std::optional<DType> v;  // nullopt: V rows in `dtype` too
  StackDTypes(DType activation = DType::kFloat32, std::optional<DType> v_dtype = std::nullopt)
      : dtype(activation), v(v_dtype == activation ? std::nullopt : v_dtype) {}
};
// "f32" or "bf16" (also "float32", "bfloat16"): K and V in one dtype; "K/V" such as
// "bf16/f32": V in the second.
Result<StackDTypes> ParseStackDTypes(const std::string& name);
// The name ParseStackDTypes reads back: "bf16", or "bf16/f32" when V's differs.
std::string StackDTypesName(const StackDTypes& dtypes);

struct StackConfig {
  std::string preset = "mixed";
  std::vector<LayerSpec> layers;
  DType dtype = DType::kFloat32;  // activation / K dtype (and V's unless v_dtype is set)
  std::optional<DType> v_dtype;   // V's dtype where it differs from `dtype`
  ModelDims dims;

  DType value_dtype() const { return v_dtype.value_or(dtype); }

  int64_t k_cols() const { return dims.k_cols(); }
  int64_t v_cols() const { return dims.v_cols(); }
  Status Validate() const;
  // "mixed x3 [kv, rotating(W=4), recurrent] f32 kv=2x4/5 rec=tail3 hk2 hv4 dk2 dv3"
  // (the dtype "bf16/f32" when V's differs)
  std::string Describe() const;
  // Whether a write may forward padding alone (no tokens): only on recurrent layers, which
  // advance by the real length (spec §2.3 Put); attention caches advance by every row.
  bool TakesPaddingAlone() const;
};

// The preset names the layer drivers take (sweeps, ops traces, layer fuzz targets).
const std::vector<std::string>& PresetNames();
// The preset names a request run takes: PresetNames() and "holey", whose layers cycle
// through [stateless, kv, rotating, stateless, recurrent] (a leading, an inner and a
// trailing hole; at least 2 layers, so one is stateful).
const std::vector<std::string>& RequestPresetNames();
// "staggered": layers cycle through [rotating W, rotating 2W + 1, kv, rotating ceil(W / 2)],
// so the rotating layers of one stack hold different windows (per-layer sliding windows, as
// in models that mix window sizes). Accepted wherever a preset is, but in neither list above:
// the swarms draw from those lists, and a longer list would move every seed's stack. Drawn
// by the long-context request swarm from a stream of its own, and run as stages of their own.
inline constexpr const char* kStaggeredPreset = "staggered";
// What a trace or a command line may name: PresetNames(), or RequestPresetNames() with
// `requests`, then "staggered".
std::vector<std::string> AcceptedPresetNames(bool requests);
// InvalidArgument naming the preset when `config` has a stateless layer: only request runs
// model the manager's null holes.
Status RequireStateful(const StackConfig& config);
// Builds a stack; `window` is W for rotating layers. Errors name the bad value.
Result<StackConfig> StackFromPreset(const std::string& preset, int32_t num_layers, int64_t window,
                                    StackDTypes dtypes, const ModelDims& dims = {});
// One dtype (a multi-sequence cache's): "f32", "bf16", "float32" or "bfloat16".
Result<DType> ParseDType(const std::string& name);

// Fresh production caches for every layer of the stack.
std::vector<std::unique_ptr<LayerCache>> BuildCaches(const StackConfig& config);

}  // namespace kvtwin::sim
