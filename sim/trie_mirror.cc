#include "sim/trie_mirror.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "model/ref_eviction.h"
#include "sim/checks.h"
#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

model::RefSnap MirrorSlot(const CacheSnapshot* s) {
  if (s == nullptr) return std::nullopt;
  return model::RefSnapshot{ToRefKind(s->kind()), s->from(), s->to(), {}};
}

// `n` as a default node whose vectors keep their capacity (a field added to RefNode later
// is reset by the assignment without being listed here).
void EmptyKeepingCapacity(model::RefNode& n) {
  std::vector<int32_t> edge = std::move(n.edge), child_keys = std::move(n.child_keys);
  std::vector<model::RefSnap> snaps = std::move(n.snaps);
  std::vector<int64_t> bytes = std::move(n.bytes);
  std::vector<std::unique_ptr<model::RefNode>> children = std::move(n.children);
  KV_CHECK(children.empty(), "a node is emptied after its children were taken");
  n = model::RefNode();
  edge.clear();
  child_keys.clear();
  snaps.clear();
  bytes.clear();
  n.edge = std::move(edge);
  n.child_keys = std::move(child_keys);
  n.snaps = std::move(snaps);
  n.bytes = std::move(bytes);
  n.children = std::move(children);
}

}  // namespace

void MirrorPool::Recycle(std::unique_ptr<model::RefNode> root) {
  if (root == nullptr) return;
  stack_.push_back(std::move(root));
  while (!stack_.empty()) {
    std::unique_ptr<model::RefNode> n = std::move(stack_.back());
    stack_.pop_back();
    for (auto& child : n->children) stack_.push_back(std::move(child));
    n->children.clear();
    EmptyKeepingCapacity(*n);
    free_.push_back(std::move(n));
  }
}

std::unique_ptr<model::RefNode> MirrorPool::Take() {
  if (free_.empty()) return std::make_unique<model::RefNode>();
  std::unique_ptr<model::RefNode> n = std::move(free_.back());
  free_.pop_back();
  return n;
}

TrieMirror MirrorTrie(const PrefixTrie& trie, std::span<TrieNode* const> active_path,
                      MirrorPool* pool) {
  TrieMirror m;
  MirrorPool local;
  MirrorPool& p = pool != nullptr ? *pool : local;
  // (node, mirror) in walk order, sorted afterwards to look up the active path; the chain
  // root -> current node (pre-order: a parent is visited before its children) finds parents.
  std::vector<std::pair<const TrieNode*, model::RefNode*>>& mirror_of = p.mirror_of_;
  std::vector<std::pair<const TrieNode*, model::RefNode*>>& chain = p.chain_;
  mirror_of.clear();
  chain.clear();
  mirror_of.reserve(static_cast<size_t>(std::max<int64_t>(trie.num_nodes(), 1)));
  trie.Walk([&](TrieNode* n) {
    model::RefNode* node = nullptr;
    while (!chain.empty() && chain.back().first != n->parent()) chain.pop_back();
    if (n->is_root()) {
      m.root = p.Take();
      node = m.root.get();
    } else {
      KV_CHECK(!chain.empty(), "pre-order reached a node before its parent");
      model::RefNode* parent = chain.back().second;
      std::unique_ptr<model::RefNode> child = p.Take();
      child->edge.reserve(n->edge().size());
      for (const TrieKey k : n->edge()) child->edge.push_back(static_cast<int32_t>(k));
      node = model::AdoptRefChild(*parent, std::move(child));
    }
    node->end = n->end_offset();
    node->user = n->user();
    node->last_used = static_cast<int64_t>(n->last_used());
    node->snaps.reserve(n->snapshots().size());
    node->bytes.reserve(n->snapshots().size());
    for (const SnapshotPtr& s : n->snapshots()) {
      node->snaps.push_back(MirrorSlot(s.get()));
      node->bytes.push_back(s != nullptr ? s->SizeBytes() : 0);
    }
    mirror_of.emplace_back(n, node);
    chain.emplace_back(n, node);
  });
  auto by_node = [](const auto& a, const auto& b) {
    return std::less<const TrieNode*>()(a.first, b.first);
  };
  std::sort(mirror_of.begin(), mirror_of.end(), by_node);
  for (const TrieNode* n : active_path) {
    // A pointer not in the trie (evicted or merged away) has no mirror and is left out.
    const std::pair<const TrieNode*, model::RefNode*> probe(n, nullptr);
    auto it = std::lower_bound(mirror_of.begin(), mirror_of.end(), probe, by_node);
    if (it != mirror_of.end() && it->first == n) m.active.push_back(it->second);
  }
  return m;
}

namespace {

// Slot i as RenderRefTrie shows it: present or not, its kind, and the range it prints.
bool SameSlot(const CacheSnapshot* got, const model::RefSnap& want, int64_t want_bytes,
              bool with_bytes) {
  if ((got != nullptr) != want.has_value()) return false;
  if (with_bytes && (got != nullptr ? got->SizeBytes() : 0) != want_bytes) return false;
  if (got == nullptr) return true;
  const model::RefKind kind = ToRefKind(got->kind());
  if (kind != want->kind || got->to() != want->to) return false;
  return kind == model::RefKind::kRecurrent || got->from() == want->from;
}

bool SameNode(const TrieNode& got, const model::RefNode& want, bool with_bytes,
              std::span<const int64_t> unit_bytes) {
  if (got.end_offset() != want.end || got.user() != want.user ||
      got.num_children() != want.children.size() || got.edge().size() != want.edge.size()) {
    return false;
  }
  for (size_t i = 0; i < want.edge.size(); ++i) {
    if (static_cast<int32_t>(got.edge()[i]) != want.edge[i]) return false;
  }
  if (got.HasSnapshots() != want.HasSnapshots()) return false;
  if (!want.HasSnapshots()) return true;
  if (got.snapshots().size() != want.snaps.size()) return false;
  for (size_t i = 0; i < want.snaps.size(); ++i) {
    int64_t bytes = i < want.bytes.size() ? want.bytes[i] : 0;
    if (!unit_bytes.empty()) bytes = model::SlotBytes(want.snaps[i], unit_bytes[i]);
    if (!SameSlot(got.snapshot(i), want.snaps[i], bytes, with_bytes)) return false;
  }
  return true;
}

}  // namespace

bool SameTrie(const PrefixTrie& trie, const model::RefNode& want, bool with_bytes,
              std::span<const int64_t> unit_bytes) {
  KV_CHECK(unit_bytes.empty() || (with_bytes && unit_bytes.size() == trie.num_layers()),
           "unit sizes are one per layer and only compared with bytes");
  struct Pair {
    const TrieNode* got;
    const model::RefNode* want;
    int32_t first_key;  // want's first key as its parent's child_keys lists it (not the root)
  };
  std::vector<Pair> stack = {{trie.root(), &want, 0}};
  while (!stack.empty()) {  // pre-order; children pushed in reverse
    const auto [g, w, first_key] = stack.back();
    stack.pop_back();
    // The reference's cached first keys, audited here where each edge is read anyway.
    KV_CHECK(w->is_root() || (!w->edge.empty() && w->edge.front() == first_key),
             "a reference node's child keys went stale");
    KV_CHECK(w->child_keys.size() == w->children.size(),
             "a reference node's child keys went stale");
    if (!SameNode(*g, *w, with_bytes, unit_bytes)) return false;
    if (static_cast<int64_t>(g->last_used()) != w->last_used) return false;
    for (size_t i = w->children.size(); i-- > 0;)
      stack.push_back({g->child(i), w->children[i].get(), w->child_keys[i]});
  }
  return true;
}

std::string RenderPath(std::span<const model::RefNode* const> path) {
  std::string s;
  for (const model::RefNode* n : path) {
    if (n->is_root()) continue;
    s += fmt::format("{}[{},{})", s.empty() ? "" : " ", n->start(), n->end);
  }
  return s.empty() ? "root" : s;
}

}  // namespace kvtwin::sim
