// ManagerReference: the reference manager (model/ref_prefix_cache.h) run in lock step with
// a production PrefixCache at an unlimited budget, where the policy has no latitude. The
// request driver makes the same session calls and forwards on both; after each session
// call the production trie (mirrored, sim/trie_mirror.h) must render exactly as the
// reference trie (edges, offsets, child order, user flags, LRU order, slot kinds and
// ranges), the active paths must name the same ranges, and Begin must report the same
// outcome. Snapshot contents are judged separately (CheckTrieSoundness).
// Single-threaded.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/ref_prefix_cache.h"
#include "sim/checks.h"
#include "src/prefix_cache.h"

namespace kvtwin::sim {

class ManagerReference {
 public:
  // `caches`: one empty reference cache per manager cache (nullopt for a stateless hole).
  explicit ManagerReference(std::vector<std::optional<model::RefCache>> caches);

  model::RefPrefixCache& manager() { return ref_; }
  // Runs the reference Begin on `inputs`, before production's (the reference does not read
  // production), and keeps its report: its matched child positions guide ExpectBegin.
  const model::RefBeginReport& Begin(const model::TokenLog& inputs);
  // After production's Begin reported `got`: compares it with the kept report and the
  // pending branch point (CheckTrie does the rest).
  Check CheckBegin(const PrefixCache& pc, const BeginReport& got) const;
  // After SchedulePrefillSnapshots: the pending offsets and their user flags.
  Check CheckPending(const PrefixCache& pc) const;
  // The trie and the active path, after any session call; `after` names the call.
  Check CheckTrie(const PrefixCache& pc, const char* after) const;

 private:
  bool SamePath(const PrefixTrie& trie, std::span<TrieNode* const> got) const;

  model::RefPrefixCache ref_;
  model::RefBeginReport begun_;  // the last Begin's report
};

}  // namespace kvtwin::sim
