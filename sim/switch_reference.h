// ExpectBegin: the reference outcome of PrefixCache::Begin (spec §3.4 begin and
// switchToPath, λ = 0, no media; spec §5.4 "matched, prefix from the exact greedy
// switchToPath algorithm"). It re-runs the algorithm on reference caches (model::RefCache,
// the token logs the live caches hold) and on reference snapshots derived from each node's
// key path, reading the trie and the active path as they are before Begin and changing
// neither. The match is recomputed from the keys, not asked of the trie: by scanning each
// node's children, or, given the reference manager's matched child positions
// (model::RefBeginReport::matched_positions), by taking the child at each position
// when it starts with the next key. A wide node (the root holds one child per
// conversation) then costs one child instead of a scan of all. Where the positions end,
// the walk trusts that the reference matched no further: a production child the reference
// trie lacks is a divergence of the trie itself, which the whole-trie comparison reports
// (ManagerReference::CheckTrie, at the latest in the driver's final audit), and one that
// production's Begin follows shows here at once, as a matched count above the expected.
//
// Eviction runs at the end of the switch and never touches the active path, so the
// expected active path after Begin is the switched path (pointers into the pre-Begin trie,
// compared, never dereferenced, by the caller). Single-threaded.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "model/ref_cache.h"
#include "sim/cache_calls.h"
#include "src/prefix_trie.h"

namespace kvtwin::sim {

struct BeginExpectation {
  int64_t matched = 0;  // keys matched before the hold-back
  int64_t cached = 0;   // the aligned prefix
  bool free_all = false;
  std::vector<const TrieNode*> active_path;
  // Every non-root node of the matched path holds a snapshot in every full KV layer (the
  // scenario's coverage invariant, spec §4.2): then no page-in can stop on a KV layer.
  bool kv_chain = true;
  // The page-in stopped at a refused restore before restores a page-in going on past it
  // would make (a later cache of the node, a deeper node): where "the first refusal ends all
  // of it" (spec §3.4) shows.
  bool pagein_cut = false;
  // Of those, a cut at a full KV layer's restore: one without its base, after a node that
  // holds no KV snapshot (the interior refusal of spec §3.4's page-in).
  bool pagein_cut_at_kv = false;
  // Every Restore and Free the switch makes, in the spec's order (rewind, page-in, align),
  // with the pre-Begin trie's snapshots (compared by identity, never dereferenced later).
  std::vector<CacheCall> calls;
};

// `caches`: one reference cache per manager cache holding what it holds now (nullopt for
// a stateless hole); consumed. `hash_seed`: h_{-1} of the driver's provenance hashes.
// `positions`: the reference manager's matched child positions for `inputs`, when one
// runs beside the trie (see above).
// REQUIRES: the trie passes CheckTrieStructure and CheckTrieSoundness; non-empty inputs.
BeginExpectation ExpectBegin(const PrefixTrie& trie, std::span<TrieNode* const> active_path,
                             std::vector<std::optional<model::RefCache>> caches,
                             std::span<const int32_t> inputs, uint64_t hash_seed,
                             std::optional<std::span<const size_t>> positions = std::nullopt);

}  // namespace kvtwin::sim
