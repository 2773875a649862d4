// TrieIsSound: the spec §4.2 structure, sibling and byte-counter invariants of a PrefixTrie,
// re-derived from a Walk instead of trusting the trie's own bookkeeping. Shared by the trie
// tests and the prefix-cache manager tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "src/prefix_trie.h"

namespace kvtwin {

inline ::testing::AssertionResult TrieIsSound(const PrefixTrie& trie) {
  std::string error;
  auto fail = [&error](const TrieNode* n, const std::string& what) {
    if (error.empty()) error = what + " (node ending at " + std::to_string(n->end_offset()) + ")";
  };
  const TrieNode* root = trie.root();
  if (!root->edge().empty() || root->end_offset() != 0 || !root->is_root()) {
    fail(root, "root is not an empty edge at 0");
  }
  int64_t bytes = 0;
  std::set<const TrieNode*> seen;  // membership only; never ordered output
  trie.Walk([&](TrieNode* n) {
    if (!seen.insert(n).second) fail(n, "node reached twice");
    const std::vector<SnapshotPtr>& slots = n->snapshots();
    if (!slots.empty() && slots.size() != trie.num_layers()) fail(n, "wrong slot count");
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] == nullptr) continue;
      bytes += slots[i]->SizeBytes();
      if (trie.cache(i) == nullptr) fail(n, "snapshot in a stateless slot");
      if (trie.cache(i) != nullptr && slots[i]->kind() != trie.cache(i)->kind()) {
        fail(n, "snapshot kind differs from its cache");
      }
    }
    std::set<TrieKey> first_keys;
    for (size_t i = 0; i < n->num_children(); ++i) {
      const TrieNode* c = n->child(i);
      const int64_t len = static_cast<int64_t>(c->edge().size());
      if (c->parent() != n) fail(c, "child's parent link is wrong");
      if (c->edge().empty()) fail(c, "empty non-root edge");
      if (c->end_offset() - n->end_offset() != len) fail(c, "start != parent end");
      if (!c->edge().empty() && !first_keys.insert(c->edge().front()).second) {
        fail(c, "siblings share a first key");
      }
    }
  });
  if (bytes != trie.paged_out_bytes()) {
    fail(root,
         "counter " + std::to_string(trie.paged_out_bytes()) + " != sum " + std::to_string(bytes));
  }
  if (!error.empty()) return ::testing::AssertionFailure() << error;
  return ::testing::AssertionSuccess();
}

}  // namespace kvtwin
