// LockstepDriver: applies one Op to the production stack (src/) and to the reference
// (model/) and checks, after every step, every layer's offset, live window / buffer / conv
// tail / delta state, the schedule flag, every snapshot the driver holds, and the outcome
// class of the op itself (Restore's bool, Split/Merge/Snapshot null-ness, PrepareSnapshots'
// status, TakeSnapshots' entries), and after a rotating Restore its buffer and cursor against
// the snapshot's (spec §2.2). The first difference is returned as a Divergence and the
// driver stops accepting ops. Every observable is folded into a 64-bit digest so equal
// seeds can be shown to give equal runs. One recurrent Free in two (by the step) is probed
// with a Get whose Put never comes (ProbeReadAlone). Single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/ref_cache.h"
#include "sim/checks.h"
#include "sim/forward.h"
#include "sim/ops.h"
#include "sim/stack.h"
#include "sim/synthetic.h"
#include "src/cache.h"
#include "src/kernels.h"

namespace kvtwin::sim {

// A hash of the rows [0, length) a History names (K then V) and of its applier, to tell
// whether they changed while the History should still be valid (src/cache.h: until its
// cache is next mutated).
uint64_t HashHistory(const History& h);

struct Divergence {
  int64_t step = 0;
  int32_t layer = -1;
  std::string op;
  Mismatch mismatch;
  std::string ToString() const;  // multi-line human report
};

class LockstepDriver {
 public:
  // REQUIRES: config.Validate().ok().
  LockstepDriver(StackConfig config, uint64_t seed);
  // Not movable: every layer's oracle refers to synth_.
  LockstepDriver(const LockstepDriver&) = delete;
  LockstepDriver& operator=(const LockstepDriver&) = delete;

  // Makes this driver what LockstepDriver(config, seed) would be: fresh caches, references
  // and pools, no steps, no divergence, zero digest. Only buffer capacity carries over (the
  // fuzz targets reuse one driver for every execution, whose cost under ASan is mostly
  // allocation). The constructor is this on an empty driver, so both share one path.
  // REQUIRES: config.Validate().ok().
  void Reset(StackConfig config, uint64_t seed);
  // Frees what the run built (caches, references, pools, kernel parameters, the divergence)
  // and keeps what Reset reuses. A fuzz target clears its driver after each input, so every
  // execution frees what it allocated: libFuzzer's per-input leak check compares mallocs and
  // frees within an execution, and state held until the next Reset made about half of all
  // executions look leaky (each then ran twice, and a real leak went unattributed).
  // REQUIRES: Reset before any other use.
  void Clear();

  // Every layer's oracle checks attention by `counts` (ShapeRunCounts; null, the default:
  // the first forward of each shape in a run), now and after any Reset. Not owned.
  void set_shape_run_counts(ShapeRunCounts* counts);
  // Forwards whose attention arithmetic was checked since Reset, over every layer.
  int64_t attention_checks() const;

  // Applies `op`; returns the first divergence (also kept in divergence()).
  // REQUIRES: no divergence yet; op.layer and op slots are valid (see Valid()).
  std::optional<Divergence> Apply(const Op& op);
  // Whether `op` names existing layers and pool slots (generators and shrinkers filter).
  bool Valid(const Op& op) const;

  const StackConfig& config() const { return config_; }
  int32_t num_layers() const { return static_cast<int32_t>(config_.layers.size()); }
  int64_t steps() const { return steps_; }
  uint64_t digest() const { return digest_; }
  const std::optional<Divergence>& divergence() const { return divergence_; }
  // Reference state, for generators choosing interesting arguments.
  const model::RefCache& ref(int32_t layer) const {
    return layers_[static_cast<size_t>(layer)].ref;
  }
  int32_t pool_size(int32_t layer) const;
  const model::RefSnap& pool_ref(int32_t layer, int32_t slot) const;

 private:
  struct PoolEntry {
    SnapshotPtr prod;
    model::RefSnap ref;
  };
  struct Layer {
    std::unique_ptr<LayerCache> cache;
    model::RefCache ref = model::RefCache::Kv();  // Reset sets the layer's kind
    std::unique_ptr<LayerOracle> oracle;
    std::vector<PoolEntry> pool;
    // Recurrent layers: the synthetic kernel parameters, fixed for the run.
    ConvWeights conv_weights;
    GdnParams gdn_params;
  };

  // Frees the layer's run state (cache, reference, pool, kernel parameters); keeps its oracle.
  static void ClearLayer(Layer& layer);
  Check ApplyToLayer(const Op& op, Layer& layer, int32_t index);
  Check Write(const Op& op, Layer& layer, int32_t index);
  // The op's tokens with their provenance hashes, continuing the layer's reference log,
  // into `out` (a scratch the driver keeps: its buffer outlives the op).
  void TokensInto(const Layer& layer, const Op& op, model::TokenLog& out) const;
  // One forward of `tokens` at the layer's reference offset plus `skip` (a speculation's
  // later forward) through `target` (the live cache or a speculation wrapper), folded into
  // the digest; empty for recurrent layers.
  History Forward(LayerCache& target, const Op& op, const Layer& layer, int32_t index,
                  std::span<const model::Token> tokens, int64_t skip = 0);
  // kSpeculate over every layer (sim/lockstep_speculate.cc); sets *layer on a mismatch.
  Check Speculate(const Op& op, int32_t* layer);
  Check Take(Layer& layer);
  // After a Free of a recurrent layer: a forward dropped between the layer's Get and its Put,
  // checked, then a second Free, so the run goes on exactly as after the op's own Free.
  Check ProbeReadAlone(Layer& layer);
  Check AddToPool(Layer& layer, SnapshotPtr prod, model::RefSnap ref, const char* what);
  Check CheckLayer(Layer& layer, int32_t index);
  // Keeps a History the op was handed (an Update's or a View's) with a hash of its rows, and
  // after the op checks that every kept one still reads the same: src/cache.h keeps a
  // History's pointers valid until that cache is next mutated, so neither another layer's
  // Update or View nor the layer's own View may change the rows it names.
  void Hold(int32_t index, const char* what, const History& history);
  Check CheckHeld(int32_t* layer);
  void Fold(uint64_t value);
  void FoldLayer(const Layer& layer);

  StackConfig config_;
  SyntheticForward synth_;
  std::vector<Layer> layers_;
  std::vector<Layer> spare_layers_;  // parked by a smaller stack, cleared (Reset)
  int64_t steps_ = 0;
  uint64_t digest_ = 0;
  std::optional<Divergence> divergence_;
  ShapeRunCounts* run_counts_ = nullptr;
  // Scratch kept across ops and runs, so a fuzz execution does not allocate them anew.
  model::TokenLog through_;                     // Speculate: the log plus the forwards
  model::TokenLog write_tokens_;                // Write: the op's tokens
  std::vector<LayerCache*> spec_live_;          // Speculate: the layers it wraps
  std::vector<model::TokenLog> spec_forwards_;  // Speculate: each layer's tokens
  std::vector<int64_t> spec_offsets_;           // Speculate: the contract probe's schedule
  ForwardScratch scratch_;                      // every forward's input buffers
  struct HeldHistory {
    int32_t layer;
    const char* what;
    History history;
    uint64_t hash;
  };
  std::vector<HeldHistory> held_;  // this op's Histories (Hold)
};

}  // namespace kvtwin::sim
