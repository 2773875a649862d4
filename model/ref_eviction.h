// The reference eviction pass (spec §3.4 "Eviction"), over a RefNode tree whose `bytes`
// give each slot's charged size. Where the policy has no latitude, the production pass
// must evict exactly these nodes in exactly this order: the simulator mirrors the
// production trie into RefNodes (sizes included) when a production pass begins, runs this
// pass on the mirror, and compares the two tries when the production pass ends.
//
// One pass: while Σ bytes > budget, among nodes that are not the root, not in `active`
// (the active path as it was when the pass began) and have at most one child, pick the
// oldest last_used; tie -> larger end (deeper); tie -> larger Bytes(); tie -> first in
// pre-order. A leaf is removed; a single-child node is merged into its child (edge ++
// child edge, the child's end, children, user flag; max last_used; per slot: KV -> both
// present: kv[parent.from, child.to) with the tokens concatenated and bytes summed (owned
// snapshots, so the merged copy is exactly both copies), else none; whole-state -> the
// child's slot and bytes). No eligible node -> stop, possibly still over budget.
// Written from the spec, never from src/. Single-threaded.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/ref_trie.h"

namespace kvtwin::model {

struct RefEviction {
  int64_t start = 0, end = 0;    // the victim's range when it was picked
  bool merged = false;           // merged into its only child (else removed as a leaf)
  std::string ToString() const;  // "remove [5,9)" / "merge [0,5) into its child"
};

// Runs the pass on `root`'s tree in place and returns the evictions in order.
// REQUIRES: `active` lists nodes of the tree, starting at the root.
std::vector<RefEviction> RefEvictionPass(RefNode& root, const std::vector<const RefNode*>& active,
                                         int64_t budget);

// Σ Bytes() over the tree.
int64_t RefTrieBytes(const RefNode& root);

// A slot's modeled size (spec §7): SnapshotUnits times its cache's `unit_bytes`; 0 if empty.
inline int64_t SlotBytes(const RefSnap& slot, int64_t unit_bytes) {
  return slot ? unit_bytes * SnapshotUnits(*slot) : 0;
}

// Sets every slot's `bytes` to SlotBytes(slot, unit_bytes[slot]). Returns Σ over the tree.
int64_t ChargeRefSlots(RefNode& root, std::span<const int64_t> unit_bytes);

}  // namespace kvtwin::model
