// Goal: SameTrie (sim/trie_mirror.h) is the fast path of the manager and eviction
// references: it must say "same" exactly when the renderings of the production trie's
// mirror and of the reference tree are equal, or a real difference would go unreported.
// Method: seeded production tries (inserts with splits, KV snapshot sets on some nodes, a
// stateless hole, user flags, ticks with ties); each mirror is mutated in one field at a
// time (a key, an end, a user flag, a tick, a slot, a slot range, bytes, a child added,
// removed or moved) and SameTrie is compared with rendering equality (raw ticks) with and
// without bytes. A mirror built from a pool of recycled nodes equals a fresh one.
#include "sim/trie_mirror.h"

#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "model/ref_trie.h"
#include "src/core/rng.h"
#include "src/kv_cache.h"
#include "unit/tagged_rows.h"

namespace kvtwin::sim {
namespace {

using Keys = std::vector<TrieKey>;

void Insert(PrefixTrie& trie, const Keys& keys) {
  const PrefixTrie::Match m = trie.FindBestMatch(trie.root(), keys);
  TrieNode* last = m.path.back();
  if (m.matched < last->end_offset()) last = trie.SplitNode(last, m.matched - last->start_offset());
  if (m.matched < static_cast<int64_t>(keys.size())) {
    trie.AppendChild(last, std::span(keys).subspan(static_cast<size_t>(m.matched)),
                     static_cast<int64_t>(keys.size()));
  }
}

std::vector<SnapshotPtr> KvSet(int64_t from, int64_t to) {
  const std::vector<float> tags = tagged::Positions(from, to - from);
  std::vector<SnapshotPtr> set;
  set.push_back(KvSnapshot::Make(from, to, {tagged::Keys(tags)}, {tagged::Values(tags)}));
  set.push_back(nullptr);  // the stateless hole
  return set;
}

std::vector<model::RefNode*> Nodes(model::RefNode& root) { return model::RefPreOrder(root); }

// One field of one node of `m` changed (which one: `kind`); false if `m` offers nothing of
// that kind (no non-root node, no snapshot, ...).
bool Mutate(model::RefNode& root, int kind, Rng& rng) {
  const std::vector<model::RefNode*> all = Nodes(root);  // all[0] is the root
  if (all.size() < 2) return false;
  model::RefNode* n = all[1 + rng.Below(all.size() - 1)];
  switch (kind) {
    case 0: {
      const size_t k = rng.Below(n->edge.size());
      n->edge[k] += 1;
      // Another trie, not a stale key cache: the parent's list of first keys follows.
      model::RefNode* p = n->parent;
      for (size_t i = 0; i < p->children.size(); ++i) {
        if (p->children[i].get() == n) p->child_keys[i] = n->edge.front();
      }
      return true;
    }
    case 1:
      n->end += 1;
      return true;
    case 2:
      n->user = !n->user;
      return true;
    case 3:  // may or may not change the dense ranks
      n->last_used = static_cast<int64_t>(rng.Below(8));
      return true;
    case 4: {  // a slot dropped, or one added to a node without any
      if (n->HasSnapshots()) {
        n->snaps[0].reset();
        n->bytes[0] = 0;
      } else {
        n->snaps = {model::RefSnapshot{model::RefKind::kKv, n->start(), n->end, {}}, std::nullopt};
        n->bytes = {64, 0};
      }
      return true;
    }
    case 5:
      if (!n->HasSnapshots()) return false;
      n->snaps[0]->from -= 1;
      return true;
    case 6:
      if (!n->HasSnapshots()) return false;
      n->bytes[0] += 1;
      return true;
    case 7:
      model::AppendRefChild(n, {999}, n->end + 1);
      return true;
    case 8: {
      model::DetachRefChild(n);
      return true;
    }
    case 9: {
      model::RefNode* p = n->parent;
      if (p->children.size() < 2) return false;
      std::swap(p->children.front(), p->children.back());
      std::swap(p->child_keys.front(), p->child_keys.back());
      return true;
    }
  }
  return false;
}

TEST(SameTrie, AgreesWithRenderingEqualityUnderSingleFieldMutations) {
  int checked = 0, differing = 0, same_after_mutation = 0;
  for (uint64_t seed = 1; seed <= 90; ++seed) {
    Rng rng(seed);
    KvCache kv;
    PrefixTrie trie({&kv, nullptr}, Tick{0});
    for (int i = 0; i < 12; ++i) {
      Keys keys(static_cast<size_t>(rng.Range(1, 6)));
      for (TrieKey& k : keys) k = rng.Below(3);
      Insert(trie, keys);
    }
    trie.Walk([&](TrieNode* n) {
      if (n->is_root()) return;
      n->set_last_used(Tick{rng.Below(5)});
      n->set_user(rng.Chance(1, 4));
      if (rng.Chance(1, 2)) trie.SetSnapshots(n, KvSet(n->start_offset(), n->end_offset()));
    });
    for (int kind = 0; kind < 10; ++kind) {
      for (const bool with_bytes : {false, true}) {
        const TrieMirror original = MirrorTrie(trie, {});
        const std::string want = model::RenderRefTrie(*original.root, with_bytes, true);
        ASSERT_TRUE(SameTrie(trie, *original.root, with_bytes)) << seed;
        TrieMirror mutated = MirrorTrie(trie, {});
        if (!Mutate(*mutated.root, kind, rng)) continue;
        const bool equal = model::RenderRefTrie(*mutated.root, with_bytes, true) == want;
        ASSERT_EQ(SameTrie(trie, *mutated.root, with_bytes), equal)
            << "seed " << seed << " mutation " << kind << " bytes " << with_bytes;
        ++checked;
        differing += !equal;
        same_after_mutation += equal;
      }
    }
  }
  // Both outcomes occur: most mutations show, some (bytes without with_bytes, a tick set to
  // its own value) do not.
  EXPECT_GT(checked, 1500);
  EXPECT_GT(differing, 1000);
  EXPECT_GT(same_after_mutation, 50);
}

// A mirror built from a pool's recycled nodes is the mirror built fresh: every node the
// pool hands out is emptied, whatever the tree it came from held (other shapes, flags,
// ticks, slots, bytes, and fields an eviction pass changed before the tree came back).
TEST(MirrorPool, RecycledNodesMirrorAsFreshOnes) {
  MirrorPool pool;
  int compared = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    Rng rng(seed);
    KvCache kv;
    PrefixTrie trie({&kv, nullptr}, Tick{0});
    const int inserts = static_cast<int>(rng.Range(1, 14));
    for (int i = 0; i < inserts; ++i) {
      Keys keys(static_cast<size_t>(rng.Range(1, 6)));
      for (TrieKey& k : keys) k = rng.Below(3);
      Insert(trie, keys);
    }
    std::vector<TrieNode*> active = {trie.root()};
    trie.Walk([&](TrieNode* n) {
      if (n->is_root()) return;
      n->set_last_used(Tick{rng.Below(5)});
      n->set_user(rng.Chance(1, 4));
      if (rng.Chance(1, 2)) trie.SetSnapshots(n, KvSet(n->start_offset(), n->end_offset()));
      if (n->parent() == active.back() && rng.Chance(2, 3)) active.push_back(n);
    });
    const TrieMirror fresh = MirrorTrie(trie, active);
    TrieMirror pooled = MirrorTrie(trie, active, &pool);
    for (const bool with_bytes : {false, true}) {
      ASSERT_EQ(model::RenderRefTrie(*pooled.root, with_bytes, true),
                model::RenderRefTrie(*fresh.root, with_bytes, true))
          << "seed " << seed;
      ASSERT_TRUE(SameTrie(trie, *pooled.root, with_bytes)) << "seed " << seed;
    }
    ASSERT_EQ(RenderPath(pooled.active), RenderPath(fresh.active)) << "seed " << seed;
    ASSERT_EQ(pooled.active.size(), active.size());
    ++compared;
    // Dirty the tree before it goes back, as a reference eviction pass would.
    for (model::RefNode* n : Nodes(*pooled.root)) {
      n->user = !n->user;
      n->last_used += 100;
      n->end += 1;
      n->snaps.emplace_back(model::RefSnapshot{model::RefKind::kRecurrent, 0, 9, {}});
      n->bytes.push_back(99);
    }
    pool.Recycle(std::move(pooled.root));
  }
  EXPECT_EQ(compared, 60);
}

// The reference's list of child first keys is a cache: SameTrie, which reads every edge,
// aborts when the list disagrees with them (a key changed or a child added behind the
// list's back) instead of letting the reference match on stale keys.
TEST(SameTrie, AbortsOnStaleReferenceChildKeys) {
  KvCache kv;
  PrefixTrie trie({&kv, nullptr}, Tick{0});
  Insert(trie, Keys{1, 2});
  Insert(trie, Keys{2});
  ASSERT_TRUE(SameTrie(trie, *MirrorTrie(trie, {}).root, false));
  EXPECT_DEATH(
      {
        TrieMirror m = MirrorTrie(trie, {});
        m.root->child_keys.back() = 7;
        (void)SameTrie(trie, *m.root, false);
      },
      "child keys went stale");
  EXPECT_DEATH(
      {
        TrieMirror m = MirrorTrie(trie, {});
        m.root->child_keys.pop_back();
        (void)SameTrie(trie, *m.root, false);
      },
      "child keys went stale");
}

}  // namespace
}  // namespace kvtwin::sim
