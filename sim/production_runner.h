// ProductionRunner: the production side of a request replay and nothing else — the same
// PrefixCache calls in the same order as RequestDriver (request_driver.h: Begin,
// SchedulePrefillSnapshots, chunked prefill, Attach, decode with speculative steps and
// AddOutputs, Close, the squeeze under a budget), fed by the same synthetic forward, with
// no oracle, reference or check. It is what benchmark mode (b) measures against the full
// differential replay (c), and the test that compares its trie with the driver's after
// every request keeps the two call sequences equal. Single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sim/forward.h"
#include "sim/request_driver.h"
#include "sim/stack.h"
#include "sim/synthetic.h"
#include "src/prefix_cache.h"
#include "src/speculation.h"

namespace kvtwin::sim {

class ProductionRunner {
 public:
  // REQUIRES: config.Validate().ok(); options.chunk >= 1.
  ProductionRunner(StackConfig config, RequestDriverOptions options, uint64_t value_seed);
  ~ProductionRunner();

  // Runs one request. A manager call that fails (a production bug, or a plan the manager
  // refuses) is returned; the runner must not be used after it.
  Status Run(const RequestPlan& plan);

  const PrefixCache& manager() const { return *manager_; }
  // Σ of every cache's offset after each forward: keeps the work observable.
  uint64_t checksum() const { return checksum_; }
  const BeginReport& last_report() const { return last_report_; }

 private:
  void Forward(std::span<const model::Token> tokens, Speculation* spec);
  // A step's isolated probe (SpeculativeStep::probe): its tokens through
  // BeginIsolatedSpeculation, dropped.
  Status Probe(const SpeculativeStep& spec, std::span<const model::Token> tokens);
  std::vector<LayerCache*> Caches() const;

  StackConfig config_;
  RequestDriverOptions options_;
  SyntheticForward synth_;
  std::vector<std::unique_ptr<LayerCache>> caches_;
  LayerKernels kernels_;
  ForwardScratch scratch_;
  std::unique_ptr<PrefixCache> manager_;
  int64_t offset_ = 0;  // the live offset every cache is at
  uint64_t checksum_ = 0;
  BeginReport last_report_;
  // Per-request buffers, kept so that a request allocates only what the caches keep.
  model::TokenLog stored_, drafts_;
  std::vector<int64_t> capture_offsets_;
  std::vector<LayerCache*> live_;  // the non-null caches, in order (speculation wraps them)
};

}  // namespace kvtwin::sim
