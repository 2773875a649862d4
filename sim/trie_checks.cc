#include "sim/trie_checks.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <functional>

#include "sim/synthetic.h"
#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

Mismatch AtNode(const TrieNode& node, const std::string& what, std::string expected,
                std::string actual) {
  return Mismatch{DescribeNode(node) + ": " + what, std::move(expected), std::move(actual)};
}

// The slot checks of one node: count, stateless holes, kinds; adds the bytes it holds.
Check CheckSlots(const PrefixTrie& trie, const TrieNode& n, int64_t& bytes) {
  const std::vector<SnapshotPtr>& slots = n.snapshots();
  if (!slots.empty() && slots.size() != trie.num_layers()) {
    return AtNode(n, "snapshot slots", std::to_string(trie.num_layers()),
                  std::to_string(slots.size()));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] == nullptr) continue;
    bytes += slots[i]->SizeBytes();
    const LayerCache* cache = trie.cache(i);
    if (cache == nullptr) {
      return AtNode(n, fmt::format("layer {} is stateless", i), "no snapshot",
                    CacheKindName(slots[i]->kind()));
    }
    if (slots[i]->kind() != cache->kind()) {
      return AtNode(n, fmt::format("layer {} snapshot kind", i), CacheKindName(cache->kind()),
                    CacheKindName(slots[i]->kind()));
    }
  }
  return std::nullopt;
}

// Links, edge lengths and first keys of one node's children, reported for the first child
// in list order that fails any of them. `keys` is the caller's scratch (no set per node).
Check CheckChildren(const TrieNode& n, std::vector<std::pair<TrieKey, size_t>>& keys) {
  keys.clear();
  for (size_t i = 0; i < n.num_children(); ++i) {
    const TrieNode* c = n.child(i);
    if (!c->edge().empty()) keys.emplace_back(c->edge().front(), i);
  }
  // The first child (in list order) whose first key an earlier sibling has: sorted by
  // (key, index), it is the least of the second entries of the runs of equal keys.
  std::sort(keys.begin(), keys.end());
  size_t first_shared = n.num_children();
  for (size_t i = 1; i < keys.size(); ++i) {
    if (keys[i].first == keys[i - 1].first && (i < 2 || keys[i - 2].first != keys[i].first)) {
      first_shared = std::min(first_shared, keys[i].second);
    }
  }
  for (size_t i = 0; i < n.num_children(); ++i) {
    const TrieNode* c = n.child(i);
    if (c->parent() != &n) {
      return AtNode(*c, "parent link", DescribeNode(n),
                    c->parent() == nullptr ? "null" : DescribeNode(*c->parent()));
    }
    if (c->edge().empty()) return AtNode(*c, "edge of a non-root node", "non-empty", "empty");
    // λ = 0 keys are 32-bit effective tokens (spec §3.1 Keys): a wider one is a token stored
    // through a sign extension (a media fold value's bit 31 spread into the high half).
    const std::vector<TrieKey>& edge = c->edge();
    if (auto wide = std::find_if(edge.begin(), edge.end(),
                                 [](TrieKey k) { return k > kMaxEffectiveToken; });
        wide != edge.end()) {
      return AtNode(*c,
                    fmt::format("edge key at offset {}", c->start_offset() + (wide - edge.begin())),
                    "a 32-bit effective token", fmt::format("{:#x}", *wide));
    }
    if (c->start_offset() != n.end_offset()) {
      return AtNode(*c, "start offset", fmt::format("{} (the parent's end)", n.end_offset()),
                    std::to_string(c->start_offset()));
    }
    if (i == first_shared) {
      return AtNode(
          *c,
          fmt::format("first key {} among the children of {}", c->edge().front(), DescribeNode(n)),
          "unique", "shared with an earlier sibling");
    }
  }
  return std::nullopt;
}

// `path`: the node's key path as a token log (PathLog), size == the node's end.
Check CheckNodeSnapshots(const PrefixTrie& trie, const TrieNode& n,
                         std::span<LayerOracle* const> oracles, const model::SharedLog& path) {
  if (n.is_root()) {
    return n.HasSnapshots() ? Check(AtNode(n, "snapshots", "none", "some")) : std::nullopt;
  }
  if (!n.HasSnapshots()) return std::nullopt;
  for (size_t i = 0; i < trie.num_layers(); ++i) {
    const CacheSnapshot* s = n.snapshot(i);
    if (s == nullptr) continue;
    // Formatted only for a report: this runs on every snapshot of every audit.
    const auto layer = [&] {
      return fmt::format("layer {} {} snapshot", i, CacheKindName(s->kind()));
    };
    // Scenario invariant: KV spans exactly the edge, a whole state sits at the node's end.
    const bool kv = s->kind() == CacheKind::kFullKv;
    if (s->to() != n.end_offset() || (kv && s->from() != n.start_offset())) {
      return AtNode(n, layer() + " range",
                    kv ? fmt::format("[{},{})", n.start_offset(), n.end_offset())
                       : fmt::format("@{}", n.end_offset()),
                    kv ? fmt::format("[{},{})", s->from(), s->to()) : fmt::format("@{}", s->to()));
    }
    KV_CHECK(i < oracles.size() && oracles[i] != nullptr, "no oracle for a stateful layer");
    const model::RefSnap ref = NodeReference(n, s->kind(), path);
    if (Check c = oracles[i]->CheckSnapshot(s, ref)) {
      c->what = DescribeNode(n) + ": " + layer() + ": " + c->what;
      return c;
    }
  }
  return std::nullopt;
}

// Everything a node's soundness depends on: its key path (provenance hash at the end), its
// range, and per layer the snapshot's kind, range and contents, gathered into `bytes` (the
// caller's scratch) and hashed once: most pieces are a few dozen bytes, and a hash call per
// piece cost more than the hashing itself (this runs on every snapshot of every audit). A
// piece longer than kInlineBytes (a snapshot's elements) is hashed where it lies and only its
// digest joins `bytes`: copying it cost more than the extra call.
uint64_t NodeFingerprint(const TrieNode& n, uint64_t path_hash, std::string& bytes) {
  constexpr size_t kInlineBytes = 64;
  bytes.clear();
  auto fold = [&bytes](const void* data, size_t size) {
    if (size > kInlineBytes) {
      const uint64_t digest = XXH3_64bits(data, size);
      bytes.append(reinterpret_cast<const char*>(&digest), sizeof(digest));
    } else {
      bytes.append(static_cast<const char*>(data), size);
    }
  };
  fold(&path_hash, sizeof(path_hash));
  auto fold_floats = [&fold](const MatF& m) {
    fold(m.data(), static_cast<size_t>(m.size()) * sizeof(float));
  };
  // The stored elements themselves, with dtype and shape (no float copy: this runs on every
  // snapshot of every audited trie).
  auto fold_tensor = [&fold](TensorView t) {
    const int64_t shape[3] = {static_cast<int64_t>(t.dtype()), t.rows(), t.cols()};
    fold(shape, sizeof(shape));
    t.Visit(
        [&](const auto& m) { fold(m.data(), static_cast<size_t>(m.size()) * sizeof(*m.data())); });
  };
  const int64_t range[2] = {n.start_offset(), n.end_offset()};
  fold(range, sizeof(range));
  for (size_t i = 0; i < n.snapshots().size(); ++i) {
    const CacheSnapshot* s = n.snapshot(i);
    const int64_t slot[4] = {static_cast<int64_t>(i),
                             s == nullptr ? -1 : static_cast<int64_t>(s->kind()),
                             s == nullptr ? 0 : s->from(), s == nullptr ? 0 : s->to()};
    fold(slot, sizeof(slot));
    if (s == nullptr) continue;
    // By kind rather than by dynamic_cast: each kind has one snapshot class, which the
    // oracle's static_casts rely on too.
    switch (s->kind()) {
      case CacheKind::kFullKv: {
        const auto& kv = static_cast<const KvSnapshot&>(*s);
        fold_tensor(kv.k());
        fold_tensor(kv.v());
        break;
      }
      case CacheKind::kRotating: {
        // The ring cursor too: the same rows under another cursor are another window order.
        const auto& rot = static_cast<const RotatingSnapshot&>(*s);
        const int64_t idx = rot.idx();
        fold(&idx, sizeof(idx));
        fold_tensor(rot.k());
        fold_tensor(rot.v());
        break;
      }
      case CacheKind::kRecurrent: {
        const auto& rec = static_cast<const RecurrentSnapshot&>(*s);
        fold_tensor(rec.conv());
        fold_floats(rec.delta());
        break;
      }
    }
  }
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace

int32_t KeyToken(TrieKey key) {
  // CheckTrieStructure reports a key past 32 bits before any of these runs.
  KV_CHECK(key <= kMaxEffectiveToken, "trie key " + std::to_string(key) + " is not a token");
  return static_cast<int32_t>(static_cast<uint32_t>(key));
}

NodeSketch SketchNode(const TrieNode& node) {
  NodeSketch s;
  s.root = node.is_root();
  s.start = node.start_offset();
  s.end = node.end_offset();
  s.edge_size = node.edge().size();
  const size_t shown = std::min(s.edge_size, NodeSketch::kShownKeys);
  std::copy_n(node.edge().begin(), shown, s.keys.begin());
  return s;
}

std::string DescribeNode(const NodeSketch& node) {
  if (node.root) return "root";
  std::string s = fmt::format("node [{},{}) keys", node.start, node.end);
  const size_t shown = std::min(node.edge_size, NodeSketch::kShownKeys);
  for (size_t i = 0; i < shown; ++i) s += fmt::format(" {}", node.keys[i]);
  if (node.edge_size > shown) s += " ...";
  return s;
}

std::string DescribeNode(const TrieNode& node) { return DescribeNode(SketchNode(node)); }

model::RefSnapshot NodeReference(const TrieNode& node, CacheKind kind,
                                 const model::SharedLog& path) {
  const int64_t end = node.end_offset();
  if (kind == CacheKind::kFullKv) {
    // Clamped, not checked: on a broken trie an unaudited page-in may pass a path that
    // disagrees with the node's range, and the reference it gets then makes the Restore
    // comparison fail rather than the checker abort.
    const size_t start = std::min(static_cast<size_t>(node.start_offset()), path.size());
    return {model::RefKind::kKv, node.start_offset(), end, path.Slice(start, path.size())};
  }
  return {ToRefKind(kind), 0, end, path};
}

model::TokenLog WithHashes(std::span<const int32_t> tokens, uint64_t hash_seed) {
  model::TokenLog log;
  log.reserve(tokens.size());
  uint64_t h = hash_seed;
  for (const int32_t t : tokens) {
    h = NextHash(h, t);
    log.push_back({t, h});
  }
  return log;
}

model::TokenLog PathLog(const TrieNode& node, uint64_t hash_seed) {
  // One allocation: the edges are written back to front while climbing to the root, then
  // hashed front to back (what WithHashes of the concatenated edges gives).
  size_t n = 0;
  for (const TrieNode* p = &node; p != nullptr; p = p->parent()) n += p->edge().size();
  model::TokenLog log(n);
  size_t at = n;
  for (const TrieNode* p = &node; p != nullptr; p = p->parent()) {
    at -= p->edge().size();
    for (size_t i = 0; i < p->edge().size(); ++i) log[at + i].id = KeyToken(p->edge()[i]);
  }
  uint64_t h = hash_seed;
  for (model::Token& t : log) t.h = h = NextHash(h, t.id);
  return log;
}

namespace {

// CheckTrieStructure's walk, one node at a time, so an audit can share its walk with the
// soundness check (AuditTrie).
class StructureWalk {
 public:
  StructureWalk(const PrefixTrie& trie, StructureScratch& buffers) : trie_(trie), b_(buffers) {
    b_.members.clear();
    b_.members.reserve(static_cast<size_t>(std::max<int64_t>(trie.num_nodes(), 1)));
  }

  // The root's own shape, before any walk.
  Check Root() const {
    const TrieNode& root = *trie_.root();
    if (!root.is_root() || !root.edge().empty() || root.end_offset() != 0) {
      return AtNode(root, "root", "an empty edge ending at 0",
                    fmt::format("{} keys ending at {}", root.edge().size(), root.end_offset()));
    }
    return std::nullopt;
  }

  void Visit(const TrieNode* n) {
    if (found_) return;
    b_.members.push_back(n);
    found_ = CheckSlots(trie_, *n, bytes_);
    if (!found_) found_ = CheckChildren(*n, b_.keys);
  }
  // Set from the first node that failed on: the links below it may not hold.
  bool failed() const { return found_.has_value(); }

  // What needs the whole walk: duplicates, the counters and the active path.
  Check Finish(std::span<TrieNode* const> active_path, int64_t min_offset) {
    // A node reached twice (a child linked under two parents) is a duplicate pointer among
    // the nodes visited, up to and including a failing one. Its second visit is reported
    // when it comes no later than the failure, as a check at every visit would have.
    std::vector<const TrieNode*>& sorted = b_.sorted;
    sorted.assign(b_.members.begin(), b_.members.end());
    std::sort(sorted.begin(), sorted.end(), std::less<const TrieNode*>());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      std::vector<const TrieNode*> seen;  // a broken trie only: quadratic is fine
      for (const TrieNode* n : b_.members) {
        if (std::find(seen.begin(), seen.end(), n) != seen.end()) {
          return AtNode(*n, "reached by the walk", "once", "twice");
        }
        seen.push_back(n);
      }
    }
    if (found_) return found_;
    // From here on membership is looked up in `sorted`.
    if (bytes_ != trie_.paged_out_bytes()) {
      return Mismatch{"paged-out byte counter", fmt::format("{} (sum over the walk)", bytes_),
                      std::to_string(trie_.paged_out_bytes())};
    }
    if (static_cast<int64_t>(sorted.size()) != trie_.num_nodes()) {
      return Mismatch{"node counter", fmt::format("{} (nodes in the walk)", sorted.size()),
                      std::to_string(trie_.num_nodes())};
    }
    if (active_path.empty() || active_path.front() != trie_.root()) {
      return Mismatch{"active path start", "the root",
                      active_path.empty() ? "an empty path" : "another node"};
    }
    for (size_t i = 1; i < active_path.size(); ++i) {
      // A node evicted or merged away is a dangling pointer: test membership before use.
      if (!std::binary_search(sorted.begin(), sorted.end(), active_path[i],
                              std::less<const TrieNode*>())) {
        return Mismatch{fmt::format("active path entry {} of {}", i, active_path.size()),
                        "a node of the trie", "a node no longer in the trie (evicted or merged)"};
      }
      if (active_path[i]->parent() != active_path[i - 1]) {
        return Mismatch{fmt::format("active path entry {} ({})", i, DescribeNode(*active_path[i])),
                        "the child of entry " + std::to_string(i - 1), "not its child"};
      }
    }
    if (active_path.back()->end_offset() > min_offset) {
      return Mismatch{"active path end (" + DescribeNode(*active_path.back()) + ")",
                      fmt::format("<= {} (the minimum cache offset)", min_offset),
                      std::to_string(active_path.back()->end_offset())};
    }
    return std::nullopt;
  }

 private:
  const PrefixTrie& trie_;
  StructureScratch& b_;
  int64_t bytes_ = 0;
  Check found_;
};

// CheckTrieSoundness's memoized walk, one node at a time. REQUIRES: the structure checks of
// every node visited so far passed, so the walk is pre-order along parent links and every
// node starts where its parent ends. The walk keeps the provenance hash at the end of each
// node down the current branch (`ends`); a node's end hash extends its parent's over its
// edge, through the memo's EdgeEnd for a long edge. The key path as tokens (`path`, valid
// for its first `valid_` positions on the current branch) is extended only where an edge is
// short and the path already reaches its start, and otherwise built for a node the memo
// does not vouch for (Materialize), so a check of an unchanged trie hashes each short edge
// once and each long one with one XXH3 call; a PathLog per node rehashed every path from the
// root (quadratic along a long conversation with a capture every few tokens).
class SoundnessWalk {
 public:
  SoundnessWalk(const PrefixTrie& trie, std::span<LayerOracle* const> oracles, uint64_t hash_seed,
                SoundnessMemo& memo)
      : trie_(trie), oracles_(oracles), seed_(hash_seed), memo_(memo) {
    memo_.next.clear();
    ++memo_.checks;
    memo_.edges_met = 0;
    memo_.path.clear();
    memo_.ends.assign(1, {0, seed_});
  }

  void Visit(const TrieNode* n) {
    if (found_) return;
    if (!n->is_root()) {
      std::vector<std::pair<int64_t, uint64_t>>& ends = memo_.ends;
      while (ends.back().first > n->start_offset()) ends.pop_back();
      KV_CHECK(ends.back().first == n->start_offset(),
               "pre-order reached a node before its parent");
      valid_ = std::min(valid_, n->start_offset());
      ends.emplace_back(n->end_offset(), EndHash(*n, ends.back().second));
    }
    if (!n->HasSnapshots()) return;
    const uint64_t key = NodeFingerprint(*n, end_hash(), memo_.bytes);
    if (!std::binary_search(memo_.verified.begin(), memo_.verified.end(), key)) {
      // One shared copy per node checked, which each layer's reference slices.
      found_ = CheckNodeSnapshots(trie_, *n, oracles_, model::SharedLog(Materialize(*n)));
    }
    if (!found_) memo_.next.push_back(key);
  }
  // The provenance hash at the end of the node visited last (hash_seed at the root).
  uint64_t end_hash() const { return memo_.ends.back().second; }

  // The verdict; on a pass the memo keeps exactly this trie's fingerprints. End hashes of
  // edges this check did not meet are dropped once they outnumber the ones it met.
  Check Finish() {
    if (!found_) {
      std::sort(memo_.next.begin(), memo_.next.end());
      std::swap(memo_.verified, memo_.next);
    }
    if (memo_.edge_ends.size() > 2 * memo_.edges_met + 1024) {
      std::erase_if(memo_.edge_ends,
                    [this](const auto& entry) { return entry.second.check != memo_.checks; });
    }
    return found_;
  }

 private:
  // The provenance hash at n's end, given the one at its start.
  uint64_t EndHash(const TrieNode& n, uint64_t start_hash) {
    const std::vector<TrieKey>& edge = n.edge();
    if (edge.size() < SoundnessMemo::kMemoEdgeKeys) {
      // Short: hash it key by key, extending the token path when it reaches this edge.
      const bool extend = valid_ == n.start_offset();
      if (extend) memo_.path.resize(static_cast<size_t>(valid_));
      uint64_t h = start_hash;
      for (const TrieKey k : edge) {
        const int32_t t = KeyToken(k);
        h = NextHash(h, t);
        if (extend) memo_.path.push_back({t, h});
      }
      if (extend) valid_ = n.end_offset();
      return h;
    }
    const uint64_t digest =
        XXH3_64bits_withSeed(edge.data(), edge.size() * sizeof(TrieKey), start_hash);
    SoundnessMemo::EdgeEnd& e = memo_.edge_ends[&n];
    if (e.check == 0 || e.digest != digest) {
      uint64_t h = start_hash;
      for (const TrieKey k : edge) h = NextHash(h, KeyToken(k));
      e.digest = digest;
      e.end_hash = h;
    }
    e.check = memo_.checks;
    ++memo_.edges_met;
    return e.end_hash;
  }

  // The key path of n, [0, end), as tokens with their provenance hashes: `path` extended
  // from its valid prefix over the edges of n and of the ancestors that prefix stops in.
  const model::TokenLog& Materialize(const TrieNode& n) {
    model::TokenLog& path = memo_.path;
    std::vector<const TrieNode*>& chain = memo_.chain;
    chain.clear();
    for (const TrieNode* m = &n; !m->is_root() && m->end_offset() > valid_; m = m->parent()) {
      chain.push_back(m);
    }
    path.resize(static_cast<size_t>(valid_));
    uint64_t h = valid_ == 0 ? seed_ : path.back().h;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const TrieNode& m = **it;
      for (int64_t p = std::max(valid_, m.start_offset()); p < m.end_offset(); ++p) {
        const int32_t t = KeyToken(m.edge()[static_cast<size_t>(p - m.start_offset())]);
        h = NextHash(h, t);
        path.push_back({t, h});
      }
    }
    valid_ = n.end_offset();
    // The memo's end hashes and the chain must agree: a failure is a bug of this walk.
    KV_CHECK(h == end_hash(), "a memoized end hash differs from the key path's");
    return path;
  }

  const PrefixTrie& trie_;
  std::span<LayerOracle* const> oracles_;
  uint64_t seed_;
  SoundnessMemo& memo_;
  int64_t valid_ = 0;  // memo_.path holds the current branch's key path up to here
  Check found_;
};

}  // namespace

Check CheckTrieStructure(const PrefixTrie& trie, std::span<TrieNode* const> active_path,
                         int64_t min_offset, StructureScratch* scratch) {
  StructureScratch local;
  StructureWalk structure(trie, scratch != nullptr ? *scratch : local);
  if (Check c = structure.Root()) return c;
  trie.Walk([&](TrieNode* n) { structure.Visit(n); });
  return structure.Finish(active_path, min_offset);
}

Check CheckTrieSoundness(const PrefixTrie& trie, std::span<LayerOracle* const> oracles,
                         uint64_t hash_seed, SoundnessMemo* memo) {
  if (memo == nullptr) {
    Check found;
    trie.Walk([&](TrieNode* n) {
      if (found) return;
      const model::SharedLog path =
          n->is_root() ? model::SharedLog() : model::SharedLog(PathLog(*n, hash_seed));
      found = CheckNodeSnapshots(trie, *n, oracles, path);
    });
    return found;
  }
  SoundnessWalk soundness(trie, oracles, hash_seed, *memo);
  trie.Walk([&](TrieNode* n) { soundness.Visit(n); });
  return soundness.Finish();
}

Check AuditTrie(const PrefixTrie& trie, std::span<TrieNode* const> active_path, int64_t min_offset,
                std::span<LayerOracle* const> oracles, uint64_t hash_seed, AuditScratch& scratch,
                EndStarts* ends) {
  StructureWalk structure(trie, scratch.structure);
  if (Check c = structure.Root()) return c;
  SoundnessWalk soundness(trie, oracles, hash_seed, scratch.memo);
  if (ends != nullptr) ends->clear();
  trie.Walk([&](TrieNode* n) {
    structure.Visit(n);
    if (structure.failed()) return;
    soundness.Visit(n);
    if (ends != nullptr && !n->is_root())
      ends->emplace_back(soundness.end_hash(), n->start_offset());
  });
  if (Check c = structure.Finish(active_path, min_offset)) return c;
  return soundness.Finish();
}

Check CheckLiveSoundness(std::span<LayerCache* const> caches, std::span<LayerOracle* const> oracles,
                         const model::TokenLog& log) {
  KV_CHECK(caches.size() == oracles.size(), "caches and oracles must be parallel");
  for (size_t i = 0; i < caches.size(); ++i) {
    if (caches[i] == nullptr) continue;
    if (Check c = oracles[i]->CheckLiveContent(*caches[i], log)) {
      c->what = fmt::format("layer {} live {}: {}", i, CacheKindName(caches[i]->kind()), c->what);
      return c;
    }
  }
  return std::nullopt;
}

Check CheckLiveBuffersAgainst(std::span<LayerCache* const> caches,
                              std::span<LayerOracle* const> oracles,
                              std::span<const std::optional<model::RefCache>> refs) {
  KV_CHECK(caches.size() == oracles.size() && caches.size() == refs.size(),
           "caches, oracles and references must be parallel");
  for (size_t i = 0; i < caches.size(); ++i) {
    KV_CHECK((caches[i] == nullptr) == !refs[i].has_value(),
             "a stateless hole on one side of the reference only");
    if (caches[i] == nullptr) continue;
    if (Check c = oracles[i]->CheckLiveBuffers(*caches[i], *refs[i])) {
      c->what = fmt::format("layer {} live {}: {}", i, CacheKindName(caches[i]->kind()), c->what);
      return c;
    }
  }
  return std::nullopt;
}

Check CheckEvictionBound(const PrefixTrie& trie, std::span<TrieNode* const> active_path,
                         int64_t budget_bytes) {
  if (trie.paged_out_bytes() <= budget_bytes) return std::nullopt;
  const TrieNode* eligible = nullptr;
  trie.Walk([&](TrieNode* n) {
    if (eligible == nullptr && !n->is_root() && n->num_children() <= 1 &&
        std::find(active_path.begin(), active_path.end(), n) == active_path.end()) {
      eligible = n;
    }
  });
  if (eligible == nullptr) return std::nullopt;
  return Mismatch{
      "paged-out bytes after an eviction pass",
      fmt::format("<= {} (budget) or no evictable node", budget_bytes),
      fmt::format("{} with {} evictable", trie.paged_out_bytes(), DescribeNode(*eligible))};
}

}  // namespace kvtwin::sim
