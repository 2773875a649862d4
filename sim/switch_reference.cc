#include "sim/switch_reference.h"

#include <algorithm>
#include <span>

#include "sim/trie_checks.h"
#include "src/core/check.h"
#include "src/rotating_cache.h"

namespace kvtwin::sim {
namespace {

using RefCaches = std::vector<std::optional<model::RefCache>>;

struct Match {
  std::vector<const TrieNode*> path;  // root first
  int64_t matched = 0;
};

// Spec §3.2 findBestMatch from the root. Under the sibling invariant (checked by the
// caller) at most one child starts with the next key, so no tie-break is needed. With
// `positions`, each step first tries the child at the reference's position and takes it if
// it starts with the next key; once a position fails, the rest of the walk scans.
Match MatchKeys(const PrefixTrie& trie, std::span<const int32_t> tokens,
                std::optional<std::span<const size_t>> positions) {
  Match m;
  const TrieNode* node = trie.root();
  m.path.push_back(node);
  size_t pos = 0;
  auto starts = [&](const TrieNode* c) {
    return c->edge().front() == TrieKey{static_cast<uint32_t>(tokens[pos])};
  };
  while (pos < tokens.size()) {
    const TrieNode* next = nullptr;
    const size_t depth = m.path.size() - 1;
    if (positions && depth < positions->size() && (*positions)[depth] < node->num_children() &&
        starts(node->child((*positions)[depth]))) {
      next = node->child((*positions)[depth]);
    } else if (positions && depth == positions->size()) {
      break;  // the reference matched no further (see ExpectBegin)
    } else {
      positions.reset();
      for (size_t i = 0; i < node->num_children() && next == nullptr; ++i) {
        if (starts(node->child(i))) next = node->child(i);
      }
    }
    if (next == nullptr) break;
    size_t j = 0;
    while (j < next->edge().size() && pos + j < tokens.size() &&
           next->edge()[j] == TrieKey{static_cast<uint32_t>(tokens[pos + j])}) {
      ++j;
    }
    m.path.push_back(next);
    pos += j;
    if (j < next->edge().size()) break;  // a partial edge ends the walk
    node = next;
  }
  m.matched = static_cast<int64_t>(pos);
  return m;
}

int64_t MinOffset(const RefCaches& caches) {
  int64_t min_off = -1;
  for (const auto& c : caches) {
    if (c && (min_off < 0 || c->Offset() < min_off)) min_off = c->Offset();
  }
  return min_off;
}

// Whether a page-in that went on past a refusal at `path[at]`'s cache `j` would call another
// Restore: a later cache of that node, or a cache of a deeper node, holding a snapshot above
// what its cache holds now.
bool RestoresAfter(const std::vector<const TrieNode*>& path, size_t at, size_t j, int64_t matched,
                   const RefCaches& caches) {
  for (size_t i = at; i < path.size(); ++i) {
    const int64_t target = std::min(path[i]->end_offset(), matched);
    for (size_t k = i == at ? j + 1 : 0; k < caches.size(); ++k) {
      if (caches[k] && path[i]->snapshot(k) != nullptr && caches[k]->Offset() < target) {
        return true;
      }
    }
  }
  return false;
}

// Greedy page-in: node by node, cache by cache; the first refusal ends all of it (`cut`: a
// page-in that went on would have restored more; `cut_at_kv`: and the refusal was a KV one).
void PageIn(const std::vector<const TrieNode*>& path, int64_t matched, RefCaches& caches,
            uint64_t hash_seed, std::vector<CacheCall>& calls, bool* cut, bool* cut_at_kv) {
  // When the parent links follow `path` (they do unless the trie is broken and unaudited),
  // every node's PathLog is a prefix of the deepest node's: one log serves them all.
  bool chained = true;
  for (size_t i = 1; i < path.size(); ++i) chained = chained && path[i]->parent() == path[i - 1];
  // Shared, so each node's reference is a slice of it rather than a copy.
  const model::SharedLog full =
      chained ? model::SharedLog(PathLog(*path.back(), hash_seed)) : model::SharedLog();
  size_t keys = 0;  // along `path`, through the current node
  for (size_t at = 0; at < path.size(); ++at) {
    const TrieNode* node = path[at];
    keys += node->edge().size();
    if (!node->HasSnapshots()) continue;
    const int64_t target = std::min(node->end_offset(), matched);
    const model::SharedLog node_path =
        chained ? full.Slice(0, keys) : model::SharedLog(PathLog(*node, hash_seed));
    for (size_t j = 0; j < caches.size(); ++j) {
      const CacheSnapshot* s = node->snapshot(j);
      if (!caches[j] || s == nullptr || caches[j]->Offset() >= target) continue;
      model::RefSnapshot ref = NodeReference(*node, s->kind(), node_path);
      // These caches predict the switch's calls and outcome, never sizes (the reference
      // manager's caches model those): a window restore takes the rows it is handed.
      if (s->kind() == CacheKind::kRotating) {
        ref.rows = static_cast<const RotatingSnapshot*>(s)->k().rows();
      }
      const bool ok = caches[j]->Restore(&ref, target);
      calls.push_back(CacheCall::Restore(static_cast<int32_t>(j), s, target, ok));
      if (!ok) {
        *cut = RestoresAfter(path, at, j, matched, caches);
        *cut_at_kv = *cut && s->kind() == CacheKind::kFullKv;
        return;
      }
    }
  }
}

}  // namespace

BeginExpectation ExpectBegin(const PrefixTrie& trie, std::span<TrieNode* const> active_path,
                             RefCaches caches, std::span<const int32_t> inputs, uint64_t hash_seed,
                             std::optional<std::span<const size_t>> positions) {
  KV_CHECK(!inputs.empty(), "Begin needs a prompt");
  KV_CHECK(caches.size() == trie.num_layers(), "one reference cache per manager cache");
  BeginExpectation out;
  Match m = MatchKeys(trie, inputs, positions);
  out.matched = m.matched;
  // Hold-back: the last prompt token always seeds generation.
  if (m.matched == static_cast<int64_t>(inputs.size())) {
    m = MatchKeys(trie, inputs.first(inputs.size() - 1), positions);
  }
  for (const TrieNode* node : m.path) {
    for (size_t j = 0; j < caches.size() && !node->is_root(); ++j) {
      if (caches[j] && caches[j]->kind() == model::RefKind::kKv && node->snapshot(j) == nullptr) {
        out.kv_chain = false;
      }
    }
  }
  size_t common = 0;
  while (common < active_path.size() && common < m.path.size() &&
         active_path[common] == m.path[common]) {
    ++common;
  }
  const int64_t ancestor = common > 0 ? active_path[common - 1]->end_offset() : 0;
  const int64_t rewind_target = std::min(ancestor, m.matched);
  for (size_t j = 0; j < caches.size(); ++j) {
    if (!caches[j]) continue;
    const auto index = static_cast<int32_t>(j);
    const bool ok = caches[j]->Restore(nullptr, rewind_target);
    out.calls.push_back(CacheCall::Restore(index, nullptr, rewind_target, ok));
    if (ok) continue;
    caches[j]->Free();
    out.calls.push_back(CacheCall::Free(index));
  }
  PageIn(m.path, m.matched, caches, hash_seed, out.calls, &out.pagein_cut, &out.pagein_cut_at_kv);
  const int64_t min_off = MinOffset(caches);
  for (size_t j = 0; j < caches.size(); ++j) {
    if (!caches[j] || caches[j]->Offset() == min_off) continue;
    const bool ok = caches[j]->Restore(nullptr, min_off);
    out.calls.push_back(CacheCall::Restore(static_cast<int32_t>(j), nullptr, min_off, ok));
    if (ok) continue;
    out.free_all = true;
    // The manager then frees every stateful cache, in order.
    for (size_t f = 0; f < caches.size(); ++f) {
      if (caches[f]) out.calls.push_back(CacheCall::Free(static_cast<int32_t>(f)));
    }
    break;
  }
  out.active_path = m.path;
  if (out.free_all) {
    out.active_path = {trie.root()};
  } else {
    while (out.active_path.back()->end_offset() > min_off) out.active_path.pop_back();
  }
  out.cached = out.free_all ? 0 : min_off;
  return out;
}

}  // namespace kvtwin::sim
