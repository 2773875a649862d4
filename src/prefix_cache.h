// PrefixCache: the prefix-sharing cache manager (spec §3, v1: λ = 0, no media). It owns a
// PrefixTrie over the caller's per-layer caches and runs one session at a time:
//
//   report = Begin(inputs)               match, hold back one token, switch the live caches
//                                        to the best path (rewind, greedy page-in, align)
//   SchedulePrefillSnapshots(requested)  periodic / user capture offsets (+ branch point)
//   ... the caller forwards inputs[report.cached : len - 1] through the caches ...
//   AttachPrefillSnapshots()             captures become trie nodes (split / advance)
//   ... the caller forwards the seed and all sampled tokens but the last, and reports
//       every sampled token with AddOutputs ...
//   Close()                              frontier node, page-out, compaction
//
// The manager never runs a model: the caller writes the caches between the calls, exactly
// as spec §3.4 lays out, and the manager only reads offsets, restores, snapshots and
// schedules. Eviction (LRU under a byte budget, §3.4 "Eviction") runs at the end of the
// switch, of attach and of page-out. Time is a LogicalClock advanced once per "now" of the
// spec: the switch landing node, each attached capture node and the close frontier.
//
// Invariants kept between calls (spec §4.2): active_path() runs root -> ... parent->child,
// its last node ends at or below every cache offset (exactly at it after Close); no cache
// holds a capture schedule outside an open session. Operating errors (a second Begin, an
// empty prompt, calls out of order) are Status values; broken invariants abort.
// Single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "src/cache.h"
#include "src/core/clock.h"
#include "src/core/status.h"
#include "src/prefix_trie.h"

namespace kvtwin {

struct PrefixCacheOptions {
  int64_t max_paged_out_bytes = int64_t{8} << 30;  // eviction runs while strictly above
};

// What Begin reports (spec §3.4 begin step 7).
struct BeginReport {
  int64_t total = 0;      // len(inputs)
  int64_t matched = 0;    // keys matched in the trie before the hold-back
  int64_t cached = 0;     // prefix: the offset every cache was aligned to
  int64_t left = 0;       // len(inputs) - cached: tokens the caller must evaluate
  bool free_all = false;  // alignment failed and every cache was freed (spec §8 quirk 1)
};

class PrefixCache {
 public:
  // `caches`: per-layer caches in order, null = stateless layer; they must outlive the
  // manager, and only the manager's session may move them (the caller writes through them
  // only between the session calls above).
  // REQUIRES: at least one non-null cache; no cache holds an active capture schedule.
  PrefixCache(std::vector<LayerCache*> caches, PrefixCacheOptions options = {});

  // Errors: FailedPrecondition if a session is open; InvalidArgument for an empty prompt.
  Result<BeginReport> Begin(std::span<const int32_t> inputs);
  // `requested` are prefix lengths the caller wants restorable (user points); merged with
  // the pending branch point, clipped to (cached, len(inputs)], then scheduled on every
  // cache. Errors (FailedPrecondition): no open session; already scheduled or attached in
  // this session; the caches moved since Begin (the schedule must precede the prefill).
  Status SchedulePrefillSnapshots(std::span<const int64_t> requested);
  // Turns the captures of the prefill into trie nodes. No-op when nothing is pending; a
  // second call is a no-op. Pending offsets that were never sent to the caches (no
  // SchedulePrefillSnapshots in this session) still become nodes, without captures.
  // Error: no open session. REQUIRES: every non-null cache at the same offset.
  Status AttachPrefillSnapshots();
  // Sampled tokens of this session, in order (the last one may never be forwarded).
  // Error: no open session.
  Status AddOutputs(std::span<const int32_t> tokens);
  // Ends the session (also after a cancelled prefill): attaches pending captures, records
  // the frontier, pages it out. Error: no open session.
  // REQUIRES: every non-null cache at the same offset, at most len(inputs) + len(outputs).
  Status Close();

  // The LRU pass of spec §3.4 "Eviction", run now. The session runs it at the spec's points
  // by itself; tests and drivers call it after changing the budget.
  void EnforceEvictionPolicy();

  bool session_open() const { return open_; }
  const PrefixTrie& trie() const { return trie_; }
  // root -> ... -> the node whose content the live caches hold (at least).
  const std::vector<TrieNode*>& active_path() const { return active_path_; }
  Tick now() const { return clock_.Now(); }
  const PrefixCacheOptions& options() const { return options_; }
  // Tests and drivers may age nodes (trie().Walk + set_last_used) or change the budget
  // between sessions; a new budget takes effect at the next eviction pass.
  // REQUIRES: bytes >= 0 (so is the constructor's): a counter of bytes is never negative, so a
  // negative budget would only be a caller's slip, and "strictly above" would then evict
  // nodes that hold nothing, which no budget of 0 does.
  void set_max_paged_out_bytes(int64_t bytes);
  // Observer of eviction passes that evict (the counter is over budget when they begin),
  // for checkers and logs: called with ended = false before the first victim is picked and
  // with ended = true after the last. It must not change the manager. Empty = none.
  using EvictionHook = std::function<void(bool ended)>;
  void set_eviction_hook(EvictionHook hook) { eviction_hook_ = std::move(hook); }
  // Observer of every eviction-policy point (spec §3.4: the end of a switch, of an attach
  // that had captures pending, a page-out that installed, and each EnforceEvictionPolicy
  // call), called before the counter is compared with the budget, whether or not a pass
  // follows: a checker replaying the policy on a reference trie pairs its own points with
  // these. It must not change the manager. Empty = none.
  using PolicyHook = std::function<void()>;
  void set_policy_hook(PolicyHook hook) { policy_hook_ = std::move(hook); }
  // Pending capture offsets of the open session (ascending) and whether each is a user
  // point; for checkers.
  struct Pending {
    int64_t offset;
    bool user;
  };
  const std::vector<Pending>& pending() const { return pending_; }

 private:
  // spec §3.4, one function each. SwitchToPath returns true when alignment fell back to
  // freeing every cache.
  bool SwitchToPath(std::vector<TrieNode*> path, int64_t matched);
  // Restores the caches from the snapshots along `path` until the first refusal.
  void PageIn(const std::vector<TrieNode*>& path, int64_t matched);
  TrieNode* AdvancePath(TrieNode* from, std::span<const TrieKey> keys, int64_t end_offset);
  void AttachCaptured(TrieNode* node, std::vector<SnapshotPtr> row);
  void CompactPath();
  void PageOut(TrieNode* node);
  // The oldest evictable node outside `active` (tie-breaks of spec §3.4), or null.
  TrieNode* PickVictim(const std::set<const TrieNode*>& active) const;
  int64_t MinOffset() const;
  // The common offset of the non-null caches; aborts if they disagree.
  int64_t AlignedOffset(const char* where) const;
  std::vector<TrieKey> StoredKeys() const;
  void EndSession();

  std::vector<LayerCache*> caches_;
  PrefixCacheOptions options_;
  LogicalClock clock_;
  PrefixTrie trie_;
  std::vector<TrieNode*> active_path_;
  // The open session.
  bool open_ = false;
  bool scheduled_ = false;  // SchedulePrefillSnapshots ran
  bool attached_ = false;   // AttachPrefillSnapshots ran
  int64_t cached_ = 0;      // the aligned offset Begin reported
  std::vector<int32_t> inputs_;
  std::vector<int32_t> outputs_;
  std::vector<Pending> pending_;
  EvictionHook eviction_hook_;
  PolicyHook policy_hook_;
};

}  // namespace kvtwin
