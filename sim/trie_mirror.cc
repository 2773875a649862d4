#include "sim/trie_mirror.h"

#include <fmt/format.h>

#include <unordered_map>
#include <utility>

#include "sim/checks.h"

namespace kvtwin::sim {
namespace {

model::RefSnap MirrorSlot(const CacheSnapshot* s) {
  if (s == nullptr) return std::nullopt;
  return model::RefSnapshot{ToRefKind(s->kind()), s->from(), s->to(), {}};
}

}  // namespace

TrieMirror MirrorTrie(const PrefixTrie& trie, std::span<TrieNode* const> active_path) {
  TrieMirror m;
  // Lookup only (a parent is visited before its children); nothing is ordered by it.
  std::unordered_map<const TrieNode*, model::RefNode*> mirror_of;
  trie.Walk([&](TrieNode* n) {
    model::RefNode* node = nullptr;
    if (n->is_root()) {
      m.root = std::make_unique<model::RefNode>();
      node = m.root.get();
    } else {
      model::RefNode* parent = mirror_of.at(n->parent());
      auto child = std::make_unique<model::RefNode>();
      child->parent = parent;
      node = child.get();
      parent->children.push_back(std::move(child));
      for (const TrieKey k : n->edge()) node->edge.push_back(static_cast<int32_t>(k));
    }
    node->end = n->end_offset();
    node->user = n->user();
    node->last_used = static_cast<int64_t>(n->last_used());
    for (const SnapshotPtr& s : n->snapshots()) {
      node->snaps.push_back(MirrorSlot(s.get()));
      node->bytes.push_back(s != nullptr ? s->SizeBytes() : 0);
    }
    mirror_of[n] = node;
  });
  for (const TrieNode* n : active_path) {
    auto it = mirror_of.find(n);
    if (it != mirror_of.end()) m.active.push_back(it->second);
  }
  return m;
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
