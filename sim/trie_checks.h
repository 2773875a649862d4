// Checks of a prefix manager's trie and of the live caches it aligned (spec §4.2), for the
// request-level simulator. Each returns a Check (sim/checks.h): nullopt, or one Mismatch
// whose `what` names the node (its range and first keys) and the layer, so a report is one
// clear line.
//
// Soundness is the key oracle: a snapshot on node N must equal the reference state derived
// only from N's key path root -> N (the edges concatenated, with the same rolling hash h_p
// the driver used for the values), never from what the manager or the caches believe. A
// snapshot taken on another branch that shares tokens at the same positions therefore
// still shows, through the provenance tags its rows carry.
//
// Keys are token ids (λ = 0, no media). The checks only read the trie and the caches; a
// LayerOracle memoizes recurrent folds, so the oracles are passed mutable. Single-threaded.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/ref_cache.h"
#include "sim/checks.h"
#include "sim/synthetic.h"
#include "src/cache.h"
#include "src/core/check.h"
#include "src/prefix_trie.h"

namespace kvtwin::sim {

// "node [5,9) keys 10 11 12 ..." (the root is "root").
std::string DescribeNode(const TrieNode& node);
// What DescribeNode shows of a node, kept by value: a check that may have to name nodes
// a faulty call could free keeps these and renders text only when it fails.
struct NodeSketch {
  static constexpr size_t kShownKeys = 4;
  bool root = false;
  int64_t start = 0, end = 0;
  size_t edge_size = 0;
  std::array<TrieKey, kShownKeys> keys{};  // the first min(edge_size, kShownKeys)
};
NodeSketch SketchNode(const TrieNode& node);
std::string DescribeNode(const NodeSketch& node);

// The token ids of `tokens` with their rolling provenance hashes, h_{-1} = `hash_seed`.
model::TokenLog WithHashes(std::span<const int32_t> tokens, uint64_t hash_seed);
// The key path root -> node as a token log with hashes.
model::TokenLog PathLog(const TrieNode& node, uint64_t hash_seed);

// λ = 0: a key is an effective token, a uint32 (spec §3.1 Keys); one with bit 31 set is a
// media span's fold value, a negative token id in kvtwin's int32 tokens.
inline constexpr TrieKey kMaxEffectiveToken = 0xFFFFFFFFu;
// A trie key as the token id it stands for. REQUIRES: key <= kMaxEffectiveToken.
int32_t KeyToken(TrieKey key);

// The reference snapshot a node holds for a layer of `kind`, given its key path `path`
// (PathLog): KV the tokens of its edge [start, end); whole-state kinds the tokens [0, end)
// at to == end (`from` is informational for them). Slices of `path`, sharing its buffer: a
// check of every node on a path copies no tokens. REQUIRES: path.size() == node's end.
model::RefSnapshot NodeReference(const TrieNode& node, CacheKind kind,
                                 const model::SharedLog& path);

// Spec §4.2 structure: the root is an empty edge at 0; parent / children links agree;
// every non-root edge is non-empty with start == parent end and length == end - start; no
// two siblings share a first key; every slot set has 0 or num_layers slots, a stateless
// cache's slot is null, and a snapshot's kind is its cache's; the byte counter equals the
// sum of SizeBytes over a Walk, and the node counter the number of nodes it visits. The active path
// starts at the root, holds only nodes of the trie (checked before any of them is dereferenced),
// runs parent -> child and ends at or below `min_offset` (the minimum cache offset).
// `scratch` (optional) keeps the check's buffers between calls.
struct StructureScratch {
  std::vector<const TrieNode*> members, sorted;
  std::vector<std::pair<TrieKey, size_t>> keys;
};
Check CheckTrieStructure(const PrefixTrie& trie, std::span<TrieNode* const> active_path,
                         int64_t min_offset, StructureScratch* scratch = nullptr);

// Soundness of every snapshot of every node: the reference state of the node's key path
// (KV: tokens [start, end); whole-state kinds: tokens [0, end) at `to == end`) compared by
// `oracles[layer]` (null for a stateless layer). Also the scenario invariant: a KV
// snapshot spans exactly its node's edge and a whole-state snapshot ends at its node's
// end; the root holds no snapshot. REQUIRES: CheckTrieStructure passed.
// `memo` (optional) remembers what was verified, keyed by everything soundness depends on:
// the node's key path (its provenance hash at the end), range, layer, kind and the
// snapshot's contents. A snapshot verified once in the same place with the same contents is
// not recomputed; the memo keeps only the entries of the trie it last checked.
// The memo also keeps, for each edge of at least kMemoEdgeKeys keys, the provenance hash at
// its end, keyed by the node and checked against a digest of (hash at its start, its keys):
// the walk then hashes a long edge's keys once per check with one fast XXH3 call instead of
// once per key through the provenance chain, and builds a key path token by token only
// for a node it re-verifies. An end hash is a pure function of what the digest covers, so a
// node rewritten in place, or a new node at a freed node's address, misses.
struct SoundnessMemo {
  static constexpr size_t kMemoEdgeKeys = 64;
  struct EdgeEnd {
    uint64_t digest = 0;  // XXH3 of the edge's keys seeded with the hash at its start
    uint64_t end_hash = 0;
    uint64_t check = 0;  // the check that last met the node (older entries are pruned)
  };
  std::vector<uint64_t> verified;  // sorted fingerprints
  std::vector<uint64_t> next;      // scratch: this check's fingerprints
  std::unordered_map<const TrieNode*, EdgeEnd> edge_ends;
  uint64_t checks = 0;   // memoized checks started
  size_t edges_met = 0;  // long edges the current check met
  std::string bytes;     // scratch: one node's fingerprinted bytes
  model::TokenLog path;  // scratch: the key path of the node being checked
  std::vector<std::pair<int64_t, uint64_t>> ends;  // scratch: (end, hash) down the walk
  std::vector<const TrieNode*> chain;              // scratch: nodes a key path is built over
};
Check CheckTrieSoundness(const PrefixTrie& trie, std::span<LayerOracle* const> oracles,
                         uint64_t hash_seed, SoundnessMemo* memo = nullptr);

// The whole-trie audit: CheckTrieStructure, then CheckTrieSoundness with a memo, in one walk
// (each node, its slots and its children are read once; two walks of a trie larger than
// the caches read it twice). The verdict is the pair's in that order: a structure failure
// anywhere comes first, and soundness stops at the first node the structure check fails on
// (its walk assumes the links that check passed). `ends` (optional) receives, on a pass,
// (provenance hash at the node's end, start) of every non-root node in walk order.
struct AuditScratch {
  StructureScratch structure;
  SoundnessMemo memo;
};
using EndStarts = std::vector<std::pair<uint64_t, int64_t>>;
Check AuditTrie(const PrefixTrie& trie, std::span<TrieNode* const> active_path, int64_t min_offset,
                std::span<LayerOracle* const> oracles, uint64_t hash_seed, AuditScratch& scratch,
                EndStarts* ends = nullptr);

// Live soundness: every non-null cache is at log.size() and holds exactly `log` (content
// only, LayerOracle::CheckLiveContent). `caches` and `oracles` are parallel.
Check CheckLiveSoundness(std::span<LayerCache* const> caches, std::span<LayerOracle* const> oracles,
                         const model::TokenLog& log);
// The live caches' buffers against the reference manager's live caches
// (LayerOracle::CheckLiveBuffers): what a token log cannot say, the schedule flag, whether
// a buffer or state exists, and its size (a KV buffer's capacity, a window buffer's rows).
// `caches`, `oracles` and `refs` are parallel; a null cache has no reference (nullopt).
Check CheckLiveBuffersAgainst(std::span<LayerCache* const> caches,
                              std::span<LayerOracle* const> oracles,
                              std::span<const std::optional<model::RefCache>> refs);

// After an eviction pass the counter is within the budget (0 included; the largest int64
// for none), or no node is eligible (not the root, not on the active path, at most one child).
Check CheckEvictionBound(const PrefixTrie& trie, std::span<TrieNode* const> active_path,
                         int64_t budget_bytes);

}  // namespace kvtwin::sim
