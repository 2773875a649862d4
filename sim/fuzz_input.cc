// RunFuzzInput's dispatch, the shared pieces of the input format (names, value modes, the
// header/record cut) and the kTraceReader family. The contract is sim/fuzz_input.h.
#include "sim/fuzz_input.h"

#include <algorithm>
#include <array>
#include <utility>

#include "sim/fuzz_families.h"
#include "src/core/check.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

// In FuzzTarget order (RunFuzzInput indexes its layouts by the enum value).
constexpr std::array<std::pair<FuzzTarget, const char*>, 7> kNames = {{
    {FuzzTarget::kKv, "kv"},
    {FuzzTarget::kRotating, "rotating"},
    {FuzzTarget::kRecurrent, "recurrent"},
    {FuzzTarget::kSpeculation, "speculation"},
    {FuzzTarget::kPrefix, "prefix"},
    {FuzzTarget::kHybrid, "hybrid"},
    {FuzzTarget::kTraceReader, "trace_reader"},
}};

constexpr bool InEnumOrder() {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (static_cast<size_t>(kNames[i].first) != i) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "kNames must list the targets in FuzzTarget order");

}  // namespace

const char* FuzzTargetName(FuzzTarget target) {
  for (const auto& [t, name] : kNames)
    if (t == target) return name;
  KV_CHECK(false, "unknown fuzz target");
  return "";
}

std::optional<FuzzTarget> ParseFuzzTarget(std::string_view name) {
  for (const auto& [t, n] : kNames)
    if (name == n) return t;
  return std::nullopt;
}

ModelDims FuzzDimsOf(uint8_t dtype_byte) {
  if ((dtype_byte & 2) == 0) return ModelDims{};
  Rng rng = Rng::Derive(dtype_byte >> 2, "fuzz-dims");
  return DrawModelDims(rng);
}

StackDTypes FuzzDTypesOf(uint8_t dtype_byte) {
  const DType activation = dtype_byte % 2 == 1 ? DType::kBFloat16 : DType::kFloat32;
  if ((dtype_byte & 0x0C) != 0x0C) return StackDTypes(activation);
  return StackDTypes(activation,
                     activation == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32);
}

const std::vector<FuzzTarget>& AllFuzzTargets() {
  static const std::vector<FuzzTarget> all = [] {
    std::vector<FuzzTarget> v;
    for (const auto& entry : kNames) v.push_back(entry.first);
    return v;
  }();
  return all;
}

int64_t ResolveValue(uint8_t mode, uint8_t arg, const ValueContext& c) {
  const auto a = static_cast<int64_t>(arg);
  switch (static_cast<ValueMode>(mode % kValueModes)) {
    case ValueMode::kRelative:
      return c.anchor + a % 16 - 8;
    case ValueMode::kAbsolute:
      return a;
    case ValueMode::kWindow:
      return c.window - 1 + a % 3;
    case ValueMode::kBehindWindow:
      return c.anchor - c.window - 1 + a % 3;
    case ValueMode::kSnapshotEnd:
      if (!c.from || !c.to) return c.anchor + a % 16 - 8;
      return (a % 2 == 1 ? *c.to : *c.from) + (a / 2) % 3 - 1;
  }
  return c.anchor;
}

void SplitFuzzInputInto(const FuzzLayout& layout, const uint8_t* data, size_t size,
                        FuzzParts& parts) {
  KV_CHECK(layout.record_bytes > 0, "unstructured layouts have no records");
  parts.header.assign(layout.header_bytes, 0);
  std::copy_n(data, std::min(size, layout.header_bytes), parts.header.begin());
  parts.records.clear();
  if (size <= layout.header_bytes) return;
  const size_t whole = (size - layout.header_bytes) / layout.record_bytes;
  const size_t n = std::min(whole, layout.max_records);
  parts.records.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* r = data + layout.header_bytes + i * layout.record_bytes;
    parts.records.emplace_back(r, layout.record_bytes);
  }
}

FuzzParts SplitFuzzInput(const FuzzLayout& layout, const uint8_t* data, size_t size) {
  FuzzParts parts;
  SplitFuzzInputInto(layout, data, size, parts);
  return parts;
}

FuzzLayout LayoutOf(FuzzTarget target) {
  switch (target) {
    case FuzzTarget::kKv:
    case FuzzTarget::kRotating:
    case FuzzTarget::kRecurrent:
    case FuzzTarget::kSpeculation:
      return LayerFuzzLayout(target);
    case FuzzTarget::kPrefix:
      return PrefixFuzzLayout();
    case FuzzTarget::kHybrid:
      return HybridFuzzLayout();
    case FuzzTarget::kTraceReader:
      return FuzzLayout{};
  }
  return FuzzLayout{};
}

const FuzzLayout& CachedLayout(FuzzTarget target) {
  static const std::array<FuzzLayout, kNames.size()> layouts = [] {
    std::array<FuzzLayout, kNames.size()> all;
    for (size_t i = 0; i < kNames.size(); ++i) all[i] = LayoutOf(kNames[i].first);
    return all;
  }();
  return layouts[static_cast<size_t>(target)];
}

FuzzRun RunFuzzInput(FuzzTarget target, const uint8_t* data, size_t size) {
  return FuzzSession(target).Run(data, size, /*record_trace=*/true);
}

FuzzSession::FuzzSession(FuzzTarget target)
    : target_(target),
      layers_(std::make_unique<LayerFuzzState>()),
      parts_(std::make_unique<FuzzParts>()),
      shape_runs_(std::make_unique<ShapeRunCounts>()) {}

FuzzSession::~FuzzSession() = default;

FuzzRun FuzzSession::Run(const uint8_t* data, size_t size, bool record_trace) {
  const auto parts = [&]() -> const FuzzParts& {
    SplitFuzzInputInto(CachedLayout(target_), data, size, *parts_);
    return *parts_;
  };
  switch (target_) {
    case FuzzTarget::kKv:
    case FuzzTarget::kRotating:
    case FuzzTarget::kRecurrent:
    case FuzzTarget::kSpeculation:
      return RunLayerFuzz(target_, parts(), *layers_, *shape_runs_, record_trace);
    case FuzzTarget::kPrefix:
      return RunPrefixFuzz(parts(), *shape_runs_, record_trace);
    case FuzzTarget::kHybrid:
      return RunHybridFuzz(parts(), record_trace);
    case FuzzTarget::kTraceReader:
      return RunTraceReaderFuzz(data, size);
  }
  KV_CHECK(false, "unknown fuzz target");
  return {};
}

}  // namespace kvtwin::sim
