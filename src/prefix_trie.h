// PrefixTrie: the compressed prefix trie of the prefix-sharing manager (spec §3.1–§3.3),
// v1: λ = 0 and no media, so a key is the token id; every snapshot is owned (no lazy
// snapshots, hence no materialize hooks). A node names the token range
// [start_offset, end_offset) of its edge; it holds one snapshot slot per manager cache
// (KV: exactly its edge; rotating / recurrent: the whole state at its end, or nothing).
// The trie owns its nodes and their snapshots; it calls the caches only to Split and Merge
// snapshots (a null cache is a stateless hole whose slot stays null). `paged_out_bytes()`
// is kept equal to the sum of SizeBytes over every snapshot a node holds. Structural
// misuse (removing the root, splitting outside an edge, merging the root or a node without
// exactly one child) is a broken invariant and aborts. Single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "src/cache.h"
#include "src/core/clock.h"

namespace kvtwin {

using TrieKey = uint64_t;

class TrieNode {
 public:
  const std::vector<TrieKey>& edge() const { return edge_; }
  int64_t end_offset() const { return end_offset_; }
  int64_t start_offset() const { return end_offset_ - static_cast<int64_t>(edge_.size()); }
  TrieNode* parent() const { return parent_; }
  size_t num_children() const { return children_.size(); }
  TrieNode* child(size_t i) const { return children_.at(i).get(); }
  Tick last_used() const { return last_used_; }
  void set_last_used(Tick t) { last_used_ = t; }
  bool user() const { return user_; }
  void set_user(bool user) { user_ = user; }
  bool is_root() const { return parent_ == nullptr; }
  // Slot i holds the snapshot of manager cache i (null = none). Empty until first set.
  const std::vector<SnapshotPtr>& snapshots() const { return snapshots_; }
  const CacheSnapshot* snapshot(size_t layer) const;
  bool HasSnapshots() const;
  int64_t SnapshotBytes() const;

 private:
  friend class PrefixTrie;
  std::vector<TrieKey> edge_;
  int64_t end_offset_ = 0;
  TrieNode* parent_ = nullptr;
  std::vector<std::unique_ptr<TrieNode>> children_;
  // First key of a child's edge -> that child; present exactly while the node has more
  // than PrefixTrie::kScanChildren children (see PrefixTrie::IndexChild).
  std::unique_ptr<std::unordered_multimap<TrieKey, TrieNode*>> index_;
  Tick last_used_{0};
  bool user_ = false;
  std::vector<SnapshotPtr> snapshots_;
};

class PrefixTrie {
 public:
  // `caches`: the manager's per-layer caches in order (null = stateless hole); they must
  // outlive the trie. The root is created with last_used = `now`.
  PrefixTrie(std::vector<LayerCache*> caches, Tick now);
  ~PrefixTrie();
  PrefixTrie(const PrefixTrie&) = delete;
  PrefixTrie& operator=(const PrefixTrie&) = delete;

  TrieNode* root() const { return root_.get(); }
  size_t num_layers() const { return caches_.size(); }
  LayerCache* cache(size_t layer) const { return caches_.at(layer); }
  int64_t paged_out_bytes() const { return paged_out_bytes_; }
  // Nodes in the trie, the root included (kept, not counted by a walk).
  int64_t num_nodes() const { return num_nodes_; }

  struct Match {
    std::vector<TrieNode*> path;  // starts with `from` (empty when from is null)
    int64_t matched = 0;          // keys matched below `from`
  };
  // Spec §3.2 findBestMatch: at each node, among children whose first key is the next key,
  // prefer a whole-edge match, then the longer common prefix, then the earlier child; stop
  // after a partial edge match or when no child matches.
  Match FindBestMatch(TrieNode* from, std::span<const TrieKey> keys) const;
  // A new last child of `node` with a copy of `keys` (non-empty), end offset `end_offset`
  // (== node end + keys), last_used inherited, no snapshots.
  TrieNode* AppendChild(TrieNode* node, std::span<const TrieKey> keys, int64_t end_offset);
  // Unlinks a leaf (keeping sibling order) and closes its snapshots.
  // REQUIRES: not the root; no children.
  void RemoveNode(TrieNode* node);
  // Splits `node`'s edge at `at` (relative): a new parent P takes the first `at` keys
  // (user false, last_used inherited) and replaces node at its index; node keeps the
  // suffix, its end and its user flag; each snapshot is Split at P's end offset by its
  // cache (KV halves; whole-state kinds give P null). Returns P.
  // REQUIRES: 0 < at < edge length.
  TrieNode* SplitNode(TrieNode* node, int64_t at);
  // Absorbs the only child C: edge ++ C.edge, C's end, children and user flag, max of the
  // two last_used; per layer Merge(node's snapshot, C's snapshot) by its cache.
  // REQUIRES: not the root (its edge stays empty); exactly one child.
  void MergeWithChild(TrieNode* node);
  // Replaces the node's snapshot set (one slot per layer, or empty for none), closing the
  // old snapshots. REQUIRES: a snapshot in slot i has cache i's kind; slot of a null cache
  // is null.
  void SetSnapshots(TrieNode* node, std::vector<SnapshotPtr> snapshots);
  // Depth-first pre-order, children in list order; iterative, so a deep chain is fine.
  // The visitor must not change the tree's structure. A template rather than a
  // std::function: checkers walk the trie after every call, and a capturing visitor would
  // otherwise be a heap allocation per walk.
  template <typename Visit>
  void Walk(Visit&& visit) const {
    // Explicit stack, children pushed in reverse so they pop in list order. The trie keeps
    // the stack's buffer between walks (every eviction pass walks, and a buffer per walk was
    // a heap allocation each time); a walk started inside another's visitor uses its own.
    std::vector<TrieNode*> own;
    const bool nested = walking_;
    std::vector<TrieNode*>& pending = nested ? own : walk_stack_;
    walking_ = true;
    pending.clear();
    pending.push_back(root_.get());
    while (!pending.empty()) {
      TrieNode* node = pending.back();
      pending.pop_back();
      visit(node);
      for (auto it = node->children_.rbegin(); it != node->children_.rend(); ++it) {
        pending.push_back(it->get());
      }
    }
    walking_ = nested;
  }

 private:
  // Removes the node's snapshots from the byte counter and hands them over.
  std::vector<SnapshotPtr> Detach(TrieNode* node);
  // Installs a set on a node without snapshots and adds it to the byte counter.
  void Attach(TrieNode* node, std::vector<SnapshotPtr> snapshots);

  // Each node with more than kScanChildren children keeps its own index (first key of a
  // child's edge -> child), so FindBestMatch costs O(depth) and not O(siblings): a shared
  // system prompt has one child per distinct next token, tens of thousands under load.
  // Nodes with fewer children, most of them, are scanned and keep no index: maintaining one
  // index of every edge in the trie cost more than every match it served. A multimap, so a
  // broken trie with two siblings on one first key still matches exactly as the spec's
  // scan (the scan decides whenever a key has more than one entry).
  static constexpr size_t kScanChildren = 4;
  using Index = std::unordered_multimap<TrieKey, TrieNode*>;
  // Call after `child` joined its parent's children list.
  void IndexChild(TrieNode* child);
  // Call after the child left `parent`'s children list (or was replaced in its slot).
  void UnindexChild(TrieNode* parent, TrieKey first, const TrieNode* child);

  std::vector<LayerCache*> caches_;
  std::unique_ptr<TrieNode> root_;
  int64_t paged_out_bytes_ = 0;
  int64_t num_nodes_ = 1;
  mutable std::vector<TrieNode*> walk_stack_;  // Walk's stack, kept between walks
  mutable bool walking_ = false;               // a Walk is under way (its visitor runs)
};

}  // namespace kvtwin
