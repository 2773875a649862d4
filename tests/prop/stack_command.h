// The rapidcheck command and runner shared by the stack state machines: every command is
// one sim::Op, generated from the StackModel, applied to the model and to a LockstepDriver
// (the system under test), which checks every layer and held snapshot after each step. A
// divergence fails the case with the driver's report, and rapidcheck prints the shrunk op
// list through Op::ToString. A KV_CHECK abort cannot be shrunk (the process dies), so the
// running case's stack and ops are kept where a SIGABRT handler can print them.
// Single-threaded.
#pragma once

#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <cstdlib>
#include <ostream>
#include <sstream>
#include <string>

#include "prop/abort_log.h"
#include "prop/stack_gen.h"
#include "sim/lockstep.h"

namespace kvtwin {
// Lets rapidcheck print the dtype of a counterexample by name.
inline void showValue(DType dtype, std::ostream& os) { os << DTypeName(dtype); }
}  // namespace kvtwin

namespace kvtwin::sim::prop {

// The default tier is deterministic: a pinned seed and 500 cases per property, set before
// rapidcheck reads its configuration on first use. An RC_PARAMS from the caller wins, so
// longer or reproducing campaigns need no rebuild.
inline const bool kPinnedParams = [] {
  return setenv("RC_PARAMS", "seed=20261121 max_success=500", /*overwrite=*/0) == 0;
}();

// "[kv, rotating(W=3), recurrent] bf16" ("bf16/f32" with V apart): every layer, unlike
// StackConfig::Describe.
inline std::string StackLabel(const StackConfig& config) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const LayerSpec& s = config.layers[i];
    os << (i > 0 ? ", " : "") << CacheKindName(s.kind);
    if (s.kind == CacheKind::kRotating) os << "(W=" << s.window << ")";
  }
  os << "] " << StackDTypesName(StackDTypes(config.dtype, config.v_dtype));
  if (config.dims != ModelDims{}) os << " " << config.dims.Describe();  // drawn dims
  return os.str();
}

}  // namespace kvtwin::sim::prop

namespace kvtwin::sim {
// A drawn stack prints as its label, not as the picks that built it.
inline void showValue(const StackConfig& config, std::ostream& os) {
  os << prop::StackLabel(config);
}
}  // namespace kvtwin::sim

namespace kvtwin::sim::prop {

struct OpCommand : rc::state::Command<StackModel, LockstepDriver> {
  Op op;

  explicit OpCommand(const StackModel& m) : op(GenOp(m)) {}

  // Shrinking drops earlier commands, which renumbers pools and moves offsets.
  void checkPreconditions(const StackModel& m) const override { RC_PRE(ValidFor(m, op)); }

  void apply(StackModel& m) const override { ApplyToModel(m, op); }

  void run(const StackModel&, LockstepDriver& sut) const override {
    RC_ASSERT(sut.Valid(op));  // else the model disagrees with the driver: a test bug
    AbortLog::Note(op.ToString());
    if (auto d = sut.Apply(op)) RC_FAIL(d->ToString());
  }

  void show(std::ostream& os) const override { os << op.ToString(); }
};

// Recurrent dims for one case, degenerate ones (a single head, one-wide heads, a conv tail
// of one row or none, a one-tap kernel) included. StackConfig's defaults have num_k_heads =
// head_k_dim = 2 and conv_tail = head_v_dim = 3: code that takes one of such a pair for the other
// matches the reference in every run with the defaults, so only other shapes can tell them apart.
inline RecurrentDims GenRecurrentDims() {
  RecurrentDims d;
  d.num_k_heads = *rc::gen::inRange<int64_t>(1, 4);
  d.num_v_heads = d.num_k_heads * *rc::gen::inRange<int64_t>(1, 3);
  d.head_k_dim = *rc::gen::inRange<int64_t>(1, 5);
  d.head_v_dim = *rc::gen::inRange<int64_t>(1, 5);
  d.conv_tail = *rc::gen::inRange<int64_t>(0, 5);
  return d;  // StackLabel shows them
}

// K/V widths for one case: 1-3 heads, each head width at least what the provenance tag
// needs (kTagElements across the heads) and up to 3 more, Dk and Dv drawn apart (equal in
// some cases), or 0 (MLA). The defaults have 2 heads of Dk 4 and Dv 5: a cache that takes the head
// count for a width, or sizes rows for 2 heads, passes every run with them.
inline void GenKvDims(ModelDims& d) {
  d.kv_heads = *rc::gen::inRange<int64_t>(1, 4);
  const int64_t min_width = (kTagElements + d.kv_heads - 1) / d.kv_heads;
  d.head_dim = *rc::gen::inRange<int64_t>(min_width, min_width + 4);
  d.value_dim = *rc::gen::inRange<int64_t>(min_width, min_width + 4);
  // An MLA layer (spec §2.5) in one case in eight: a V of no columns, kept one row per slot.
  if (*rc::gen::inRange(0, 8) == 0) d.value_dim = 0;
}

// One case: a fresh driver over `config` and a random op sequence against its model.
// `fallback_window` steers draft counts on stacks without a rotating layer.
inline void CheckStack(const StackConfig& config, int64_t fallback_window) {
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const std::string label = StackLabel(config) + " driver seed " + std::to_string(seed);
  RC_LOG() << "stack " << label << "\n";
  AbortLog::Begin("op", label);
  LockstepDriver sut(config, seed);
  rc::state::check(MakeStackModel(config, fallback_window), sut,
                   rc::state::gen::execOneOfWithArgs<OpCommand>());
}

}  // namespace kvtwin::sim::prop
