// ManagerReference: the reference manager (model/ref_prefix_cache.h) run in lock step with
// a production PrefixCache, where the policy has no latitude. The request driver makes the
// same session calls and forwards on both; after each session call the production trie
// (mirrored, sim/trie_mirror.h) must render exactly as the reference trie (edges, offsets,
// child order, user flags, LRU order, slot kinds and ranges), the active paths must name
// the same ranges, and Begin must report the same outcome. Snapshot contents are judged
// separately (CheckTrieSoundness).
//
// The reference runs the eviction policy at its own points (spec §3.4) with its own active
// path, ages and snapshot sizes (spec §7: its snapshots' modeled rows times each layer's
// row or state bytes), and decides itself whether a pass begins. Production's hooks record
// the counter at each of its policy points and, when a pass begins, every node's range,
// age and slot sizes in pre-order. The reference pairs its k-th point of a call with
// production's k-th: the count must agree; under a budget the counter must equal the
// reference's paged-out bytes, and a pass must begin on both sides or neither; where one
// begins, the active paths, the tries' shapes and ages, and every slot's size must agree.
// After each call the tries are compared with every slot's size (CheckTrie).
// Single-threaded.
#pragma once

#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/ref_prefix_cache.h"
#include "sim/checks.h"
#include "src/prefix_cache.h"

namespace kvtwin::sim {

class ManagerReference {
 public:
  // `caches`: one empty reference cache per manager cache (nullopt for a stateless hole);
  // `unit_bytes`: per cache, the bytes of one snapshot unit (model::SnapshotUnits): a KV or
  // window row's K and V, or one recurrent state (LayerOracle::SnapshotUnitBytes).
  ManagerReference(std::vector<std::optional<model::RefCache>> caches,
                   std::vector<int64_t> unit_bytes);
  ManagerReference(const ManagerReference&) = delete;  // the charge points into it
  ManagerReference& operator=(const ManagerReference&) = delete;

  // The budget production compares with; set wherever the driver sets production's.
  void set_budget(int64_t bytes);
  // Production's hooks: PrefixCache::set_policy_hook, and the begin of a pass
  // (set_eviction_hook with ended = false).
  void OnProductionPoint(const PrefixCache& pc);
  void OnProductionPass(const PrefixCache& pc);
  // Before each production session call: forgets points nothing paired (a refused call's).
  void StartCall();

  model::RefPrefixCache& manager() { return ref_; }
  // Runs the reference Begin on `inputs`, before production's (the reference does not read
  // production), and keeps its report: its matched child positions guide ExpectBegin. Its
  // eviction-policy point, the last thing the switch does (spec §3.4 step 7), waits for
  // AfterBegin: production's record of that point exists only once production's Begin ran.
  const model::RefBeginReport& Begin(std::span<const model::Token> inputs);
  // After production's Begin: Begin's policy point, then FinishCall("Begin", pc).
  Check AfterBegin(const PrefixCache* pc = nullptr);
  // After the reference made the session call production made: every point of the call
  // paired. Reports the first disagreement of the call's points, prefixed by `call`. A
  // counter that differs from the reference's sizes names no slot; given production's
  // manager `pc`, the report then adds where the tries differ at the call's end (CheckTrie).
  Check FinishCall(const char* call, const PrefixCache* pc = nullptr);
  // After production's Begin reported `got`: compares it with the kept report and the
  // pending branch point (CheckTrie does the rest).
  Check CheckBegin(const PrefixCache& pc, const BeginReport& got) const;
  // After SchedulePrefillSnapshots: the pending offsets and their user flags.
  Check CheckPending(const PrefixCache& pc) const;
  // The trie (every slot's size included) and the active path, after any session call;
  // `after` names the call.
  Check CheckTrie(const PrefixCache& pc, const char* after);

 private:
  // A policy point of production's current call.
  struct Point {
    int64_t counter = 0;                    // paged-out bytes when it was reached
    size_t first = 0;                       // the pass's first entry in nodes_, if `pass`
    size_t first_on_path = 0, on_path = 0;  // its active path in path_, if `pass`
    bool pass = false;                      // a pass began at it
  };
  // A production node when a pass began, in pre-order; its slots are sizes_[first_slot, +slots)
  // with -1 for an empty slot.
  struct NodeSizes {
    int64_t start = 0, end = 0, last_used = 0;
    size_t children = 0, first_slot = 0, slots = 0;
  };

  bool SamePath(const PrefixTrie& trie, std::span<TrieNode* const> got) const;
  std::string BudgetText() const;  // "6000 B" or "unlimited"
  // The reference's policy hook (model::RefPrefixCache::PolicyHook): pairs the point.
  void OnReferencePoint(model::RefNode& root, std::optional<int64_t> paged_out, bool pass);
  // Where both pass: `p`'s record against the reference trie (charged) and active path.
  Check ComparePass(const Point& p, size_t k, const model::RefNode& root) const;

  model::RefPrefixCache ref_;
  std::vector<int64_t> unit_bytes_;
  model::RefBeginReport begun_;  // the last Begin's report
  int64_t budget_ = std::numeric_limits<int64_t>::max();
  std::vector<Point> points_;  // production's points in the current call
  std::vector<NodeSizes> nodes_;
  std::vector<int64_t> sizes_;
  std::vector<std::pair<int64_t, int64_t>> path_;  // [start, end) of each active-path node
  size_t next_ = 0;                                // the reference's next point in the call
  Check mismatch_;                                 // the call's first disagreement
  bool counter_differs_ = false;  // mismatch_ is a counter against the reference's sizes
  bool begin_point_ = false;      // Begin's policy point is waiting for AfterBegin
};

}  // namespace kvtwin::sim
