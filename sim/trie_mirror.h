// A production trie seen as a model::RefNode tree, so the reference eviction pass can run
// on it and RenderRefTrie can compare it with the reference manager: edges (keys as token
// ids), ends, user flags, last_used ticks, and one slot per layer carrying the snapshot's
// kind, range and SizeBytes (no token contents: CheckTrieSoundness judges those).
// Reads the trie only. Single-threaded.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/ref_trie.h"
#include "src/prefix_trie.h"

namespace kvtwin::sim {

struct TrieMirror {
  std::unique_ptr<model::RefNode> root;
  // The active path's nodes in the mirror; an entry that is not a node of the trie (a
  // broken manager) is left out, for the structure check to report.
  std::vector<const model::RefNode*> active;
};

// Nodes kept between mirrors with their vectors' capacities, and the walk's scratch: a
// checked eviction pass mirrors the whole trie, and building every node anew was most of
// what checking a pass allocated.
class MirrorPool {
 public:
  // Takes back every node of the tree under `root` (null: nothing), emptied.
  void Recycle(std::unique_ptr<model::RefNode> root);

 private:
  friend TrieMirror MirrorTrie(const PrefixTrie&, std::span<TrieNode* const>, MirrorPool*);
  std::unique_ptr<model::RefNode> Take();  // an empty node, recycled when one is free
  std::vector<std::unique_ptr<model::RefNode>> free_;
  std::vector<std::unique_ptr<model::RefNode>> stack_;  // Recycle's walk
  std::vector<std::pair<const TrieNode*, model::RefNode*>> mirror_of_, chain_;
};

// `pool` (optional) supplies the nodes and the scratch; the mirror is the same either way.
TrieMirror MirrorTrie(const PrefixTrie& trie, std::span<TrieNode* const> active_path,
                      MirrorPool* pool = nullptr);

// Whether RenderRefTrie(*MirrorTrie(trie, ...).root, with_bytes, /*raw_ticks=*/true) would
// equal RenderRefTrie(want, with_bytes, true), decided by walking both trees in lock step
// with no mirror and no text: same shape, edges, ends, user flags, ticks (as values: the
// managers stamp at the same spec events, so equal LRU order is not enough), and slots
// shown alike (a node without any snapshot shows none; kv by range, rot and rec by end;
// bytes when asked). Callers render only when this says they differ, to report the first
// differing line. `want`'s bytes are its `bytes`, or with `unit_bytes` (one per layer) each
// snapshot's modeled size, model::SnapshotUnits times its layer's unit.
bool SameTrie(const PrefixTrie& trie, const model::RefNode& want, bool with_bytes,
              std::span<const int64_t> unit_bytes = {});

// "[0,5) [5,9)": the ranges of a path after the root, for comparing active paths.
std::string RenderPath(std::span<const model::RefNode* const> path);

}  // namespace kvtwin::sim
