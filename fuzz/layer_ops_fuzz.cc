// Goal: coverage-guided search for divergences between the production layer caches and the
// reference. Method: the first bytes pick a stack (preset, window, dtype); the rest decode
// into ops through FuzzedDataProvider, with every index and offset taken relative to the
// reference state so most inputs are valid ops; the LockstepDriver checks after each op and
// a divergence aborts with its report. No logic beyond decoding lives here.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdio>
#include <cstdlib>

#include "sim/lockstep.h"

namespace {

using kvtwin::sim::LockstepDriver;
using kvtwin::sim::Op;
using kvtwin::sim::OpKind;

Op DecodeOp(FuzzedDataProvider& in, const LockstepDriver& d) {
  Op op;
  op.kind = static_cast<OpKind>(in.ConsumeIntegralInRange<int>(0, 9));
  op.layer = in.ConsumeIntegralInRange<int32_t>(0, d.num_layers() - 1);
  const int64_t offset = d.ref(op.layer).Offset();
  const int32_t pool = d.pool_size(op.layer);
  op.slot = pool == 0 ? -1 : in.ConsumeIntegralInRange<int32_t>(-1, pool - 1);
  op.slot2 = pool == 0 ? -1 : in.ConsumeIntegralInRange<int32_t>(-1, pool - 1);
  op.value = offset + in.ConsumeIntegralInRange<int64_t>(-4, 3);
  if (op.kind == OpKind::kSplit && op.slot >= 0) {
    op.value = d.pool_ref(op.layer, op.slot)->from + in.ConsumeIntegralInRange<int64_t>(-1, 12);
  }
  if (op.kind == OpKind::kWrite || op.kind == OpKind::kSpeculate) {
    // A speculation forwards current + D drafts and accepts value drafts (clamped).
    op.isolated = op.kind == OpKind::kSpeculate && in.ConsumeIntegralInRange<int>(0, 5) == 0;
    op.value = in.ConsumeIntegralInRange<int64_t>(-2, 12);
    const auto n = in.ConsumeIntegralInRange<size_t>(1, 20);
    for (size_t i = 0; i < n; ++i) op.tokens.push_back(in.ConsumeIntegralInRange<int32_t>(0, 5));
    op.pad = in.ConsumeIntegralInRange<int64_t>(0, 2);
    op.segmented = in.ConsumeBool();
  }
  if (op.kind == OpKind::kPrepare) {
    const auto n = in.ConsumeIntegralInRange<size_t>(0, 4);
    for (size_t i = 0; i < n; ++i)
      op.offsets.push_back(offset + in.ConsumeIntegralInRange<int64_t>(-1, 10));
  }
  return op;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const auto& presets = kvtwin::sim::PresetNames();
  const std::string preset = presets[in.ConsumeIntegralInRange<size_t>(0, presets.size() - 1)];
  const int64_t window = in.ConsumeIntegralInRange<int64_t>(1, 9);
  const auto dtype = in.ConsumeBool() ? kvtwin::DType::kBFloat16 : kvtwin::DType::kFloat32;
  const int32_t layers = in.ConsumeIntegralInRange<int32_t>(1, 3);
  auto config = kvtwin::sim::StackFromPreset(preset, layers, window, dtype);
  if (!config.ok()) return 0;
  LockstepDriver driver(*config, in.ConsumeIntegral<uint64_t>());
  for (int step = 0; step < 64 && in.remaining_bytes() > 0; ++step) {
    const Op op = DecodeOp(in, driver);
    if (!driver.Valid(op)) continue;
    if (auto d = driver.Apply(op)) {
      std::fprintf(stderr, "%s\n", d->ToString().c_str());
      std::abort();
    }
  }
  return 0;
}
