// EvictionReference: checks every eviction pass of a PrefixCache against the reference
// pass (model/ref_eviction.h), where the policy has no latitude: when a pass that evicts
// begins, the production trie is mirrored (sizes included) and the reference pass runs on
// the mirror; when it ends, the production trie must equal the reference result: same
// victims in effect (removed leaves, merges into the only child), same counter, same LRU
// order, same slots. Sizes are the production's own, an input of the policy; their sum is
// checked against the counter by CheckTrieStructure.
//
// Every pass is checked, whatever the driver's audit schedule: a production pass walks the
// whole trie once per victim (PrefixCache::PickVictim), so mirroring it and running the
// reference pass once per pass costs about as much as the pass itself and needs no
// amortization. (Checked on audited calls only, the Mooncake workload under a budget,
// traces/workloads/mooncake-500-*, had none of its 310 passes checked.)
//
// Its owner forwards the manager's eviction hook to OnPass; the first disagreement is kept
// until TakeMismatch. The manager must outlive it.
// Single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/ref_eviction.h"
#include "model/ref_trie.h"
#include "sim/checks.h"
#include "sim/trie_mirror.h"
#include "src/prefix_cache.h"

namespace kvtwin::sim {

class EvictionReference {
 public:
  explicit EvictionReference(PrefixCache& manager) : manager_(manager) {}
  EvictionReference(const EvictionReference&) = delete;
  EvictionReference& operator=(const EvictionReference&) = delete;

  // The manager's eviction hook (PrefixCache::set_eviction_hook).
  void OnPass(bool ended);

  // The first pass that disagreed since the last call, if any.
  Check TakeMismatch();
  int64_t passes() const { return passes_; }
  int64_t evictions() const { return evictions_; }
  // The most victims one checked pass had (a pass that must go on past any fixed count).
  int64_t largest_pass() const { return largest_pass_; }

 private:
  std::string Victims() const;  // "remove [5,9), merge [0,5) into its child" or "none"

  PrefixCache& manager_;
  int64_t budget_ = 0;
  std::unique_ptr<model::RefNode> expected_;  // the reference result of the pass under way
  std::vector<model::RefEviction> victims_;   // its evictions, for the report
  MirrorPool pool_;                           // the mirrors' nodes, reused pass after pass
  Check mismatch_;
  int64_t passes_ = 0, evictions_ = 0, largest_pass_ = 0;
  bool open_ = false;  // a pass began and has not ended
};

}  // namespace kvtwin::sim
