// RefPrefixCache: the naive reference of the prefix-sharing manager (spec §3.1–§3.4, v1:
// λ = 0, no media), where the policy has no latitude: given the same requests (and, under
// a byte budget, the same snapshot sizes), the production manager must end every session
// call with exactly this trie (edges, offsets, child order, user flags, LRU order, which slots hold
// a snapshot and over which range) and report exactly this Begin outcome.
//
// It runs the spec's algorithms literally over model::RefCache (one per manager cache,
// nullopt = stateless hole) and RefNode, and is written from the spec, never from src/.
// The reference caches are the live caches: the caller forwards through them with
// Forward / CommitSpeculation between the session calls, exactly where it forwards the
// production caches, so every restore outcome (and hence the prefix, the branch point and
// the captures) is the reference's own. Snapshots are the RefCache values (Snapshot,
// TakeSnapshots, Split, Merge, Restore of model/ref_cache.h), so each node's slots carry
// their token contents too.
//
// Time: a logical clock starting at 0; the root is created at 0; every "now" of the spec
// (the switch landing node, each attachCapturedSnapshots, the close frontier) takes a
// fresh tick (++clock).
//
// Eviction runs at the spec's points (the end of Begin's switch, the end of an attach that
// had offsets pending, inside a pageOut that installed) through the pass of
// model/ref_eviction.h. Sizes are the reference's own (spec §7): a slot's snapshot units
// (model::SnapshotUnits: KV rows, a window snapshot's modeled buffer rows, one recurrent
// state) times its cache's unit bytes, which only the caller knows (widths and dtypes are
// not the model's business). Without a budget (the default) no point evicts.
//
// Misuse (a second Begin, an empty prompt, calls without an open session, a second
// Schedule) aborts via KV_CHECK: the caller replays a production run that succeeded.
// Single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "model/ref_cache.h"
#include "model/ref_trie.h"

namespace kvtwin::model {

struct RefBeginReport {
  int64_t total = 0;
  int64_t matched = 0;  // keys matched before the hold-back (originalMatched)
  int64_t cached = 0;   // the prefix every cache was aligned to (0 after free-all)
  int64_t left = 0;     // total - cached
  bool free_all = false;
  // The child taken at each depth of the match of the whole prompt (before the hold-back
  // and the switch): path[d + 1] is path[d]->children[matched_positions[d]]. For ExpectBegin,
  // which walks the production trie by these positions instead of scanning wide nodes.
  std::vector<size_t> matched_positions;
};

class RefPrefixCache {
 public:
  // Called at each eviction-policy point, before the pass: the trie with every slot's
  // `bytes` charged and their sum, paged-out bytes (nullopt at an unlimited budget, where
  // nothing is charged), and whether a pass follows (the sum strictly over the budget).
  using PolicyHook =
      std::function<void(RefNode& root, std::optional<int64_t> paged_out, bool pass)>;
  static constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

  // REQUIRES: at least one non-null cache; none holds an active capture schedule.
  explicit RefPrefixCache(std::vector<std::optional<RefCache>> caches);

  // spec §3.4 begin: best match, hold-back, switchToPath (rewind, greedy page-in that
  // stops at the first refusal, align, free-all fallback that resets the active path to
  // [root], trim, landing tick, eviction policy), prefix, pending branch point.
  // `enforce_policy` false leaves the switch's policy point, its last step, to the caller
  // (EnforceEvictionPolicy right after): nothing after it in Begin reads the trie, so the
  // report is the same. REQUIRES: !inputs.empty().
  RefBeginReport Begin(std::span<const Token> inputs, bool enforce_policy = true);
  // spec §3.4 schedulePrefillSnapshots (λ = 0): clip to (base, len(inputs)], upgrade or add
  // user points, sort, PrepareSnapshots on every non-null cache when anything is pending.
  void SchedulePrefillSnapshots(const std::vector<int64_t>& requested);
  // One ordinary forward of `tokens` (|tokens| >= 1) through every non-null cache.
  void Forward(std::span<const Token> tokens);
  // One committed speculative forward (RefCache::CommitSpeculation) on every non-null cache.
  void CommitSpeculation(const TokenLog& forward, int64_t accepted);
  // spec §3.4 attachPrefillSnapshots (advancePath with split, user flag,
  // attachCapturedSnapshots with the head clipped off, compactPath), no eviction.
  void AttachPrefillSnapshots();
  // Sampled tokens of this session (stored keys = inputs ++ outputs).
  void AddOutputs(std::span<const Token> tokens);
  // spec §3.4 close: attach, frontier advance, pageOut, compactPath, frontier tick.
  // Returns the start offset of the node pageOut snapshotted (one Snapshot per non-null
  // cache), or nullopt when it took none, so a driver can hold the production manager's
  // cache calls to it.
  std::optional<int64_t> Close();
  // The eviction policy, run now (a driver's pass between sessions after lowering the
  // budget, as production's EnforceEvictionPolicy): charge every slot, tell the hook, and
  // run the pass when the paged-out bytes are over the budget.
  void EnforceEvictionPolicy();
  // The budget, compared with `>` as the spec does, and per manager cache the bytes of one
  // snapshot unit (ignored for a stateless hole). kUnlimited = no pass, nothing charged.
  void set_budget(int64_t budget, std::vector<int64_t> unit_bytes);
  void set_policy_hook(PolicyHook hook) { policy_hook_ = std::move(hook); }
  // For a driver that ages the production trie's nodes (a coarse clock) to age these alike.
  RefNode& mutable_root() { return *root_; }

  bool session_open() const { return open_; }
  const RefNode& root() const { return *root_; }
  // root -> ... -> the node the live caches hold (at least).
  const std::vector<RefNode*>& active_path() const { return active_path_; }
  const std::vector<std::optional<RefCache>>& caches() const { return caches_; }
  // Pending capture offsets of the open session, ascending, with their user flags.
  struct Pending {
    int64_t offset;
    bool user;
  };
  const std::vector<Pending>& pending() const { return pending_; }
  // Rotating and recurrent snapshots kept on a node beside a capture installed there, since
  // construction (coverage: the manager copies each of them; see AttachCaptured).
  int64_t kept_whole_states() const { return kept_whole_states_; }

 private:
  std::vector<std::optional<RefCache>> caches_;
  std::unique_ptr<RefNode> root_;
  std::vector<RefNode*> active_path_;
  int64_t clock_ = 0;
  int64_t kept_whole_states_ = 0;
  bool open_ = false;
  bool scheduled_ = false;  // SchedulePrefillSnapshots ran in this session
  TokenLog inputs_;
  TokenLog outputs_;
  std::vector<Pending> pending_;
  int64_t budget_ = kUnlimited;
  std::vector<int64_t> unit_bytes_;
  PolicyHook policy_hook_;
  // Forward's scratch: per cache, the index of the earlier cache whose log it takes after
  // the write, or -1 when it appends its own.
  std::vector<int64_t> leader_;
};

}  // namespace kvtwin::model
