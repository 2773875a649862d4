// The reference eviction pass, transcribed from spec §3.4 "Eviction" and §3.2
// removeNode / mergeWithChild. It works on slot descriptions and charged bytes only (a
// mirror of a production trie may carry snapshots without token contents), so it never
// calls a RefCache: the merge rule of the cache contract (§1.2) is applied to the slots
// directly.
#include "model/ref_eviction.h"

#include <algorithm>
#include <functional>

#include "src/core/check.h"

namespace kvtwin::model {
namespace {

struct MergedSlot {
  RefSnap snap;
  int64_t bytes = 0;
};

// One slot of mergeWithChild: KV concatenates when both sides hold a snapshot (owned
// copies, so the merged bytes are both sides' bytes) and drops the data otherwise;
// whole-state kinds keep the child's state (the parent's is closed).
MergedSlot MergeSlot(const RefNode& parent, const RefNode& child, size_t i) {
  const bool has_p = i < parent.snaps.size() && parent.snaps[i].has_value();
  const bool has_c = i < child.snaps.size() && child.snaps[i].has_value();
  if (has_p && has_c) {
    KV_CHECK(parent.snaps[i]->kind == child.snaps[i]->kind, "one slot holds two cache kinds");
  }
  const bool kv = (has_p && parent.snaps[i]->kind == RefKind::kKv) ||
                  (has_c && child.snaps[i]->kind == RefKind::kKv);
  if (!kv) {
    if (!has_c) return {};
    return {child.snaps[i], i < child.bytes.size() ? child.bytes[i] : 0};
  }
  if (!has_p || !has_c) return {};
  const RefSnapshot& p = *parent.snaps[i];
  const RefSnapshot& c = *child.snaps[i];
  RefSnapshot merged{RefKind::kKv, p.from, c.to, p.tokens};
  merged.tokens.Concat(c.tokens);
  return {std::move(merged), parent.bytes.at(i) + child.bytes.at(i)};
}

// mergeWithChild(node): `node` absorbs its only child and keeps its place in the tree.
// Returns the detached child, emptied.
std::unique_ptr<RefNode> MergeIntoOnlyChild(RefNode& node) {
  KV_CHECK(node.children.size() == 1, "merge needs exactly one child");
  std::unique_ptr<RefNode> child = std::move(node.children.front());
  const size_t slots = std::max(node.snaps.size(), child->snaps.size());
  std::vector<RefSnap> snaps(slots);
  std::vector<int64_t> bytes(slots, 0);
  for (size_t i = 0; i < slots; ++i) {
    MergedSlot m = MergeSlot(node, *child, i);
    snaps[i] = std::move(m.snap);
    bytes[i] = m.bytes;
  }
  node.snaps = std::move(snaps);
  node.bytes = std::move(bytes);
  node.edge.insert(node.edge.end(), child->edge.begin(), child->edge.end());
  node.end = child->end;
  node.user = child->user;
  node.last_used = std::max(node.last_used, child->last_used);
  TakeRefChildren(node, *child);
  child->parent = nullptr;
  return child;
}

// removeNode(leaf): unlink it, keeping its siblings' order. Returns the detached leaf.
std::unique_ptr<RefNode> RemoveLeaf(RefNode& leaf) {
  KV_CHECK(!leaf.is_root() && leaf.children.empty(), "only a non-root leaf can be removed");
  return DetachRefChild(&leaf);
}

// The victim per the tie-breaks (oldest, deeper, larger, first in pre-order), or null.
// `active` is sorted by address (an identity set: its order reaches no output).
RefNode* PickVictim(RefNode& root, const std::vector<const RefNode*>& active) {
  RefNode* best = nullptr;
  ForEachRefNode(root, [&](RefNode& node) {
    RefNode* n = &node;
    if (n->is_root() || n->children.size() > 1 ||
        std::binary_search(active.begin(), active.end(), n, std::less<const RefNode*>())) {
      return;
    }
    if (best == nullptr || n->last_used < best->last_used) {
      best = n;
      return;
    }
    if (n->last_used != best->last_used) return;
    // Strict comparisons keep the earlier node in pre-order on a full tie.
    if (n->end > best->end || (n->end == best->end && n->Bytes() > best->Bytes())) best = n;
  });
  return best;
}

// Whether `n` is a node of `root`'s tree: its parent links lead there.
bool InTree(const RefNode& root, const RefNode* n) {
  while (n != nullptr && n != &root) n = n->parent;
  return n == &root;
}

}  // namespace

std::string RefEviction::ToString() const {
  const std::string range = "[" + std::to_string(start) + "," + std::to_string(end) + ")";
  return merged ? "merge " + range + " into its child" : "remove " + range;
}

int64_t RefTrieBytes(const RefNode& root) {
  int64_t total = 0;
  ForEachRefNode(root, [&](const RefNode& n) { total += n.Bytes(); });
  return total;
}

int64_t ChargeRefSlots(RefNode& root, std::span<const int64_t> unit_bytes) {
  int64_t total = 0;
  ForEachRefNode(root, [&](RefNode& n) {
    KV_CHECK(n.snaps.size() <= unit_bytes.size(), "a slot without a unit size");
    n.bytes.assign(n.snaps.size(), 0);
    for (size_t i = 0; i < n.snaps.size(); ++i) {
      n.bytes[i] = SlotBytes(n.snaps[i], unit_bytes[i]);
      total += n.bytes[i];
    }
  });
  return total;
}

std::vector<RefEviction> RefEvictionPass(RefNode& root, const std::vector<const RefNode*>& active,
                                         int64_t budget) {
  KV_CHECK(!active.empty() && active.front() == &root, "the active path starts at the root");
  // Identity only: sorted by address for lookup, never iterated, so pointer order reaches
  // no output.
  std::vector<const RefNode*> protected_nodes;
  protected_nodes.reserve(active.size());
  for (const RefNode* n : active) {
    KV_CHECK(InTree(root, n), "an active-path node is not in the tree");
    protected_nodes.push_back(n);
  }
  std::sort(protected_nodes.begin(), protected_nodes.end(), std::less<const RefNode*>());
  std::vector<RefEviction> evictions;
  // A protected node detached by a merge (the child of a non-active victim, only possible
  // when `active` is not a chain) just stops matching, as in the spec's identity set; the
  // detached nodes are kept until the pass ends so that no address is reused meanwhile.
  std::vector<std::unique_ptr<RefNode>> detached;
  // The sum over the tree, kept as the victims change it: one walk for the pass, not one
  // per victim (the walk that picks each victim remains).
  int64_t total = RefTrieBytes(root);
  while (total > budget) {
    RefNode* victim = PickVictim(root, protected_nodes);
    if (victim == nullptr) break;  // nothing eligible: stay over budget
    RefEviction e{victim->start(), victim->end, !victim->children.empty()};
    total -= victim->Bytes() + (e.merged ? victim->children.front()->Bytes() : 0);
    detached.push_back(e.merged ? MergeIntoOnlyChild(*victim) : RemoveLeaf(*victim));
    if (e.merged) total += victim->Bytes();
    evictions.push_back(e);
  }
  KV_CHECK(total == RefTrieBytes(root), "the pass's running byte sum drifted");
  return evictions;
}

}  // namespace kvtwin::model
