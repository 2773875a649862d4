// RefNode: a node of the reference prefix trie (spec §3.1), a plain value tree the
// reference manager (model/ref_prefix_cache.h) grows and the reference eviction pass
// (model/ref_eviction.h) shrinks. Keys are token ids (λ = 0, no media). Written from the
// spec, never from src/: the simulator compares a production trie with it by rendering
// both through RenderRefTrie (it mirrors the production trie into RefNodes first).
// Single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/ref_cache.h"

namespace kvtwin::model {

struct RefNode {
  std::vector<int32_t> edge;  // empty only at the root
  int64_t end = 0;            // end offset; start = end - |edge|
  bool user = false;
  int64_t last_used = 0;  // logical tick; only its order among nodes is observable
  // One slot per manager cache (nullopt = no snapshot, always for a stateless hole), or
  // empty for "no snapshots at all" (a node that never held any).
  std::vector<RefSnap> snaps;
  // Bytes charged for each slot (same length as `snaps`, 0 for an empty slot). The
  // reference manager charges them at each eviction-policy point under a budget from its
  // snapshots' modeled sizes (ChargeRefSlots); a mirror of a production trie fills them
  // from SizeBytes for the eviction pass.
  std::vector<int64_t> bytes;
  RefNode* parent = nullptr;
  // Read freely; change only through the functions below, which keep `child_keys` with it.
  std::vector<std::unique_ptr<RefNode>> children;
  // children[i]->edge.front() for every i: findBestMatch's scan of a wide node (the root
  // holds one child per conversation) reads these contiguous keys instead of following two
  // pointers per child. A cache of the children's first keys, nothing more: no operation
  // of the spec changes a child's first key (a split's new parent keeps the node's, a merge
  // extends the edge at its end), so only adding and removing children touch it.
  std::vector<int32_t> child_keys;

  int64_t start() const { return end - static_cast<int64_t>(edge.size()); }
  bool is_root() const { return parent == nullptr; }
  bool HasSnapshots() const;  // any non-null slot
  int64_t Bytes() const;      // sum of `bytes`
};

// The first index i >= from with node.child_keys[i] == key, or the number of children.
// The scan of findBestMatch, in blocks the compiler turns into vector compares.
size_t NextChildWithKey(const RefNode& node, int32_t key, size_t from);
// Appends a child with `edge` and `end` at the end of `parent`'s children; the child
// inherits parent->last_used and has no snapshots. Returns it.
RefNode* AppendRefChild(RefNode* parent, std::vector<int32_t> edge, int64_t end);
// Appends `child` (non-empty edge) to `parent`'s children and sets its parent link.
RefNode* AdoptRefChild(RefNode& parent, std::unique_ptr<RefNode> child);
// `node`'s children (and their keys) become `from`'s (the end of a merge: `from` is the
// absorbed only child); `from` keeps none.
void TakeRefChildren(RefNode& node, RefNode& from);
// Puts `replacement` in `child`'s place among its parent's children (same first key: a
// split's new parent) and returns `child`, detached.
std::unique_ptr<RefNode> ReplaceRefChild(RefNode* child, std::unique_ptr<RefNode> replacement);
// Unlinks `child` from its parent, keeping its siblings' order; returns it, detached.
std::unique_ptr<RefNode> DetachRefChild(RefNode* child);
// (The simulator's SameTrie checks child_keys against every edge it compares: a change
// that bypasses these functions aborts the next trie comparison.)

// Depth-first pre-order, children in list order (the spec's walk).
std::vector<RefNode*> RefPreOrder(RefNode& root);
std::vector<const RefNode*> RefPreOrder(const RefNode& root);
// The same walk calling f(node) in place of a list: the eviction pass walks the tree once
// per victim, and a list per walk was most of what a checked eviction allocated. `f` must
// not add or remove children while it runs.
template <typename Node, typename F>
void ForEachRefNode(Node& node, F&& f) {
  f(node);
  for (const auto& child : node.children) ForEachRefNode(*child, f);
}

// Canonical text of a trie, one line per node in pre-order:
//   "<indent>[start,end) keys k1 k2 ... user? t<tick> | <slot> | <slot> ..."
// where <tick> is last_used itself when `raw_ticks` (tries on one clock) or else its dense
// rank among all nodes of the trie (0 = oldest), so two tries with the same LRU order
// render alike whatever their clocks' values. A node without any snapshot shows no slots;
// otherwise every slot of its set is "-" (none), "kv[from,to)", "rot[from,to)" or "rec@to",
// followed by " <bytes>B" when `with_bytes`. A line depends on its node (and, for ranks,
// on the set of ticks) only, so the first differing line names a differing node. Keys are
// shown in full.
std::string RenderRefTrie(const RefNode& root, bool with_bytes, bool raw_ticks = false);

// The first line where two renderings differ, as "line N: expected '...' got '...'", or ""
// when they are equal.
std::string FirstDifference(const std::string& expected, const std::string& actual);

}  // namespace kvtwin::model
