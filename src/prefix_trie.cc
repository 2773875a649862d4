// PrefixTrie (spec §3.1–§3.3), v1: owned snapshots only, so the byte counter moves exactly
// when a snapshot set enters or leaves a node (Attach / Detach) and at no other time.
// Everything that walks the tree is iterative: a long conversation is a chain of thousands
// of nodes, and recursion over it (including the recursive unique_ptr destructor) would
// overflow the stack.
#include "src/prefix_trie.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>

#include "src/core/check.h"

namespace kvtwin {
namespace {

// The slot of `node` in its parent's children list. REQUIRES: node is not the root and is
// linked (a miss means the parent/children links disagree).
std::vector<std::unique_ptr<TrieNode>>::iterator SlotInParent(
    std::vector<std::unique_ptr<TrieNode>>& siblings, const TrieNode* node) {
  auto it = std::find_if(siblings.begin(), siblings.end(),
                         [node](const std::unique_ptr<TrieNode>& c) { return c.get() == node; });
  KV_CHECK(it != siblings.end(), "trie node missing from its parent's children");
  return it;
}

// Length of the common prefix of an edge and the remaining keys.
size_t CommonPrefix(const std::vector<TrieKey>& edge, std::span<const TrieKey> keys) {
  const size_t n = std::min(edge.size(), keys.size());
  size_t j = 0;
  while (j < n && edge[j] == keys[j]) ++j;
  return j;
}

}  // namespace

const CacheSnapshot* TrieNode::snapshot(size_t layer) const {
  // A node that never had a set reads as all-null in every layer.
  if (snapshots_.empty()) return nullptr;
  KV_CHECK(layer < snapshots_.size(), "snapshot layer " + std::to_string(layer) + " out of range " +
                                          std::to_string(snapshots_.size()));
  return snapshots_[layer].get();
}

bool TrieNode::HasSnapshots() const {
  return std::any_of(snapshots_.begin(), snapshots_.end(),
                     [](const SnapshotPtr& s) { return s != nullptr; });
}

int64_t TrieNode::SnapshotBytes() const {
  int64_t bytes = 0;
  for (const SnapshotPtr& s : snapshots_) {
    if (s != nullptr) bytes += s->SizeBytes();
  }
  return bytes;
}

PrefixTrie::PrefixTrie(std::vector<LayerCache*> caches, Tick now)
    : caches_(std::move(caches)), root_(std::make_unique<TrieNode>()) {
  root_->last_used_ = now;
}

PrefixTrie::~PrefixTrie() {
  // Each node is destroyed only after its children were moved out, so no destructor
  // recurses more than one level.
  std::vector<std::unique_ptr<TrieNode>> pending;
  pending.push_back(std::move(root_));
  while (!pending.empty()) {
    std::unique_ptr<TrieNode> node = std::move(pending.back());
    pending.pop_back();
    for (std::unique_ptr<TrieNode>& c : node->children_) pending.push_back(std::move(c));
    node->children_.clear();
  }
}

PrefixTrie::Match PrefixTrie::FindBestMatch(TrieNode* from, std::span<const TrieKey> keys) const {
  Match match;
  if (from == nullptr) return match;
  match.path.push_back(from);
  TrieNode* node = from;
  size_t pos = 0;
  while (pos < keys.size()) {
    const std::span<const TrieKey> rest = keys.subspan(pos);
    TrieNode* best = nullptr;
    size_t best_len = 0;
    bool best_full = false;
    // Under the sibling invariant at most one child qualifies, found through the index;
    // the tie-breaks (whole edge, then longer prefix, then earlier child) keep a broken
    // trie deterministic (spec §3.2), so the list is scanned when a key has several. A
    // node with few children is scanned directly: the scan reads the children the match
    // reads anyway, where the index costs a hash-table probe (most nodes on a path have
    // one or two children).
    const bool scan = node->index_ == nullptr;
    KV_CHECK(scan == (node->children_.size() <= kScanChildren),
             "trie node with " + std::to_string(node->children_.size()) + " children " +
                 (scan ? "lacks" : "keeps") + " a child index");
    const auto [lo, hi] = scan ? std::pair<Index::iterator, Index::iterator>{}
                               : node->index_->equal_range(rest.front());
    if (!scan && lo == hi) break;
    if (!scan && std::next(lo) == hi) {
      TrieNode* c = lo->second;
      const size_t len = CommonPrefix(c->edge_, rest);
      match.path.push_back(c);
      match.matched += static_cast<int64_t>(len);
      pos += len;
      if (len != c->edge_.size()) break;
      node = c;
      continue;
    }
    for (const std::unique_ptr<TrieNode>& c : node->children_) {
      if (c->edge_.empty() || c->edge_.front() != rest.front()) continue;
      const size_t len = CommonPrefix(c->edge_, rest);
      const bool full = len == c->edge_.size();
      if (best == nullptr || (full && !best_full) || (full == best_full && len > best_len)) {
        best = c.get();
        best_len = len;
        best_full = full;
      }
    }
    if (best == nullptr) break;
    match.path.push_back(best);
    match.matched += static_cast<int64_t>(best_len);
    pos += best_len;
    if (!best_full) break;
    node = best;
  }
  return match;
}

TrieNode* PrefixTrie::AppendChild(TrieNode* node, std::span<const TrieKey> keys,
                                  int64_t end_offset) {
  KV_CHECK(node != nullptr, "AppendChild to a null node");
  KV_CHECK(!keys.empty(), "AppendChild with an empty edge");
  KV_CHECK(end_offset == node->end_offset_ + static_cast<int64_t>(keys.size()),
           "AppendChild end offset " + std::to_string(end_offset) + " != parent end " +
               std::to_string(node->end_offset_) + " + " + std::to_string(keys.size()) + " keys");
  auto child = std::make_unique<TrieNode>();
  child->edge_.assign(keys.begin(), keys.end());
  child->end_offset_ = end_offset;
  child->parent_ = node;
  child->last_used_ = node->last_used_;
  node->children_.push_back(std::move(child));
  ++num_nodes_;
  IndexChild(node->children_.back().get());
  return node->children_.back().get();
}

void PrefixTrie::RemoveNode(TrieNode* node) {
  KV_CHECK(node != nullptr, "RemoveNode of a null node");
  KV_CHECK(!node->is_root(), "RemoveNode of the root");
  KV_CHECK(node->children_.empty(),
           "RemoveNode of a node with " + std::to_string(node->children_.size()) + " children");
  std::vector<std::unique_ptr<TrieNode>>& siblings = node->parent_->children_;
  auto it = SlotInParent(siblings, node);
  std::unique_ptr<TrieNode> owned = std::move(*it);
  siblings.erase(it);  // keeps sibling order
  UnindexChild(node->parent_, node->edge_.front(), node);
  --num_nodes_;
  // Out of the counter now; the snapshots are closed with the node at the end of scope.
  Detach(owned.get());
}

TrieNode* PrefixTrie::SplitNode(TrieNode* node, int64_t at) {
  KV_CHECK(node != nullptr && !node->is_root(), "SplitNode of the root or a null node");
  const int64_t len = static_cast<int64_t>(node->edge_.size());
  KV_CHECK(0 < at && at < len,
           "SplitNode at " + std::to_string(at) + " outside (0, " + std::to_string(len) + ")");
  auto parent = std::make_unique<TrieNode>();
  TrieNode* p = parent.get();
  ++num_nodes_;
  p->edge_.assign(node->edge_.begin(), node->edge_.begin() + at);
  p->end_offset_ = node->start_offset() + at;
  p->parent_ = node->parent_;
  p->last_used_ = node->last_used_;
  p->user_ = false;
  node->edge_.erase(node->edge_.begin(), node->edge_.begin() + at);

  if (node->HasSnapshots()) {
    std::vector<SnapshotPtr> whole = Detach(node);
    std::vector<SnapshotPtr> heads(num_layers());
    std::vector<SnapshotPtr> tails(num_layers());
    for (size_t i = 0; i < num_layers(); ++i) {
      if (whole[i] == nullptr || caches_[i] == nullptr) continue;
      // Absolute offset: KV halves [start, at) and [at, end); whole-state kinds give the
      // new parent nothing, since their state at P's end was never captured.
      std::tie(heads[i], tails[i]) = caches_[i]->Split(std::move(whole[i]), p->end_offset_);
    }
    Attach(p, std::move(heads));
    Attach(node, std::move(tails));
  }

  std::vector<std::unique_ptr<TrieNode>>& siblings = node->parent_->children_;
  auto it = SlotInParent(siblings, node);
  std::unique_ptr<TrieNode> owned = std::move(*it);
  *it = std::move(parent);  // same index: sibling order is part of the match tie-break
  UnindexChild(p->parent_, p->edge_.front(), node);  // P took node's first key
  IndexChild(p);
  owned->parent_ = p;
  p->children_.push_back(std::move(owned));
  IndexChild(node);
  return p;
}

void PrefixTrie::MergeWithChild(TrieNode* node) {
  KV_CHECK(node != nullptr, "MergeWithChild of a null node");
  // The root must keep its empty edge (spec §4.2); no manager path merges it.
  KV_CHECK(!node->is_root(), "MergeWithChild of the root");
  KV_CHECK(node->children_.size() == 1, "MergeWithChild needs exactly one child, node has " +
                                            std::to_string(node->children_.size()));
  std::unique_ptr<TrieNode> child = std::move(node->children_.front());
  node->children_.clear();
  // A node keeps an index only above kScanChildren children (IndexChild, UnindexChild), so
  // a one-child node has none to update; the child's own index moves up below.
  KV_CHECK(node->index_ == nullptr, "a one-child node keeps a child index");
  --num_nodes_;

  if (node->HasSnapshots() || child->HasSnapshots()) {
    std::vector<SnapshotPtr> heads = Detach(node);
    std::vector<SnapshotPtr> tails = Detach(child.get());
    heads.resize(num_layers());  // a node without a set reads as all-null
    tails.resize(num_layers());
    std::vector<SnapshotPtr> merged(num_layers());
    for (size_t i = 0; i < num_layers(); ++i) {
      if (caches_[i] == nullptr) continue;
      merged[i] = caches_[i]->Merge(std::move(heads[i]), std::move(tails[i]));
    }
    Attach(node, std::move(merged));
  }

  node->edge_.insert(node->edge_.end(), child->edge_.begin(), child->edge_.end());
  node->end_offset_ = child->end_offset_;
  node->children_ = std::move(child->children_);
  node->index_ = std::move(child->index_);  // keyed by first keys, which do not change
  for (std::unique_ptr<TrieNode>& c : node->children_) c->parent_ = node;
  node->user_ = child->user_;  // the child's flag wins, even over a user parent
  node->last_used_ = std::max(node->last_used_, child->last_used_);
  // `child` (now childless, its snapshots consumed) is destroyed here.
}

void PrefixTrie::SetSnapshots(TrieNode* node, std::vector<SnapshotPtr> snapshots) {
  KV_CHECK(node != nullptr, "SetSnapshots on a null node");
  std::vector<SnapshotPtr> old = Detach(node);
  Attach(node, std::move(snapshots));
  // `old` is closed on return.
}

void PrefixTrie::IndexChild(TrieNode* child) {
  TrieNode* parent = child->parent_;
  if (parent->index_ != nullptr) {
    parent->index_->emplace(child->edge_.front(), child);
  } else if (parent->children_.size() > kScanChildren) {
    parent->index_ = std::make_unique<Index>();
    for (const std::unique_ptr<TrieNode>& c : parent->children_) {
      parent->index_->emplace(c->edge_.front(), c.get());
    }
  }
}

void PrefixTrie::UnindexChild(TrieNode* parent, TrieKey first, const TrieNode* child) {
  if (parent->index_ == nullptr) return;
  auto [lo, hi] = parent->index_->equal_range(first);
  auto it = std::find_if(lo, hi, [child](const auto& entry) { return entry.second == child; });
  KV_CHECK(it != hi, "trie child index misses a child");
  parent->index_->erase(it);
  if (parent->children_.size() <= kScanChildren) parent->index_.reset();
}

std::vector<SnapshotPtr> PrefixTrie::Detach(TrieNode* node) {
  paged_out_bytes_ -= node->SnapshotBytes();
  return std::exchange(node->snapshots_, {});
}

void PrefixTrie::Attach(TrieNode* node, std::vector<SnapshotPtr> snapshots) {
  KV_CHECK(node->snapshots_.empty(), "Attach over an existing snapshot set");
  KV_CHECK(snapshots.empty() || snapshots.size() == num_layers(),
           "snapshot set of " + std::to_string(snapshots.size()) + " slots for " +
               std::to_string(num_layers()) + " layers");
  for (size_t i = 0; i < snapshots.size(); ++i) {
    if (snapshots[i] == nullptr) continue;
    KV_CHECK(caches_[i] != nullptr,
             "snapshot in slot " + std::to_string(i) + " of a null (stateless) cache");
    KV_CHECK(snapshots[i]->kind() == caches_[i]->kind(),
             std::string("slot ") + std::to_string(i) + " holds a " +
                 CacheKindName(snapshots[i]->kind()) + " snapshot for a " +
                 CacheKindName(caches_[i]->kind()) + " cache");
  }
  node->snapshots_ = std::move(snapshots);
  paged_out_bytes_ += node->SnapshotBytes();
}

}  // namespace kvtwin
