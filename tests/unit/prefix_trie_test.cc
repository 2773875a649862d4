// Goal: pin PrefixTrie (spec §3.1–§3.3) to the contract: every scenario of ollama's
// cache_trie_test.go (spec §6.9) under its Go name, the per-kind effect of SplitNode and
// MergeWithChild on real KV, rotating and recurrent snapshots side by side with a stateless
// hole, the byte counter, the structural aborts, and destruction of a very deep chain.
// Method: K/V rows are position-tagged (tagged_rows.h), so a snapshot's rows say which
// positions it holds; the recurrent state is filled with the offset it was taken at.
// After every mutation TrieIsSound re-derives the §4.2 invariants and the counter from a
// Walk instead of trusting the trie's own bookkeeping. No randomness.
#include "src/prefix_trie.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/core/rng.h"
#include "src/kv_cache.h"
#include "src/recurrent_cache.h"
#include "src/rotating_cache.h"
#include "unit/tagged_rows.h"
#include "unit/trie_soundness.h"

namespace kvtwin {
namespace {

using Keys = std::vector<TrieKey>;
using Nodes = std::vector<TrieNode*>;
using Found = std::pair<int64_t, Nodes>;  // (matched, path)

Keys Seq(TrieKey first, TrieKey last) {
  Keys keys;
  for (TrieKey k = first; k <= last; ++k) keys.push_back(k);
  return keys;
}

int64_t Len(const Keys& keys) { return static_cast<int64_t>(keys.size()); }

Nodes Children(const TrieNode* node) {
  Nodes out;
  for (size_t i = 0; i < node->num_children(); ++i) out.push_back(node->child(i));
  return out;
}

// A tagged KV snapshot of positions [from, to).
SnapshotPtr KvSnap(int64_t from, int64_t to) {
  const std::vector<float> tags = tagged::Positions(from, to - from);
  return KvSnapshot::Make(from, to, {tagged::Keys(tags)}, {tagged::Values(tags)});
}

std::vector<SnapshotPtr> KvSet(int64_t from, int64_t to) {
  std::vector<SnapshotPtr> set;
  set.push_back(KvSnap(from, to));
  return set;
}

// Whether slot `layer` holds a KV snapshot of exactly positions [from, to), row by row.
::testing::AssertionResult HoldsKv(const TrieNode* node, int64_t from, int64_t to,
                                   size_t layer = 0) {
  const auto* s = dynamic_cast<const KvSnapshot*>(node->snapshot(layer));
  if (s == nullptr) return ::testing::AssertionFailure() << "no KV snapshot";
  const std::vector<float> tags = tagged::Tags(s->k(), s->v(), 0, s->k().rows());
  if (s->from() == from && s->to() == to && tags == tagged::Positions(from, to - from)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "KV snapshot [" << s->from() << "," << s->to()
                                       << ") with rows " << ::testing::PrintToString(tags);
}

// The single-KV-layer environment of the Go tests.
struct KvEnv {
  KvCache kv;
  PrefixTrie trie{{&kv}, Tick{0}};
  TrieNode* root() const { return trie.root(); }
  // FindBestMatch from the root as one comparable value (matched, path).
  Found Match(const Keys& keys) const {
    PrefixTrie::Match m = trie.FindBestMatch(trie.root(), keys);
    return {m.matched, std::move(m.path)};
  }
};

// The advancePath shape (spec §3.4) from the root: match, split a partially matched edge,
// append what is left. Returns the node ending after the last key.
TrieNode* Insert(PrefixTrie& trie, const Keys& keys) {
  const PrefixTrie::Match m = trie.FindBestMatch(trie.root(), keys);
  TrieNode* last = m.path.back();
  if (m.matched < last->end_offset()) {
    last = trie.SplitNode(last, m.matched - last->start_offset());
  }
  if (m.matched < Len(keys)) {
    last = trie.AppendChild(last, std::span(keys).subspan(m.matched), Len(keys));
  }
  return last;
}

// --- spec §6.9: cache_trie_test.go -----------------------------------------------------

TEST(PrefixTrie, FindBestMatchMultipleBranches) {
  KvEnv e;
  TrieNode* a = e.trie.AppendChild(e.root(), Seq(1, 3), 3);
  TrieNode* b = e.trie.AppendChild(e.root(), Seq(4, 6), 3);
  ASSERT_TRUE(TrieIsSound(e.trie));
  EXPECT_EQ(e.Match(Seq(1, 3)), (Found{3, {e.root(), a}}));
  EXPECT_EQ(e.Match(Seq(4, 6)), (Found{3, {e.root(), b}}));
  EXPECT_EQ(e.Match(Seq(7, 9)), (Found{0, {e.root()}}));
  EXPECT_TRUE(e.trie.FindBestMatch(nullptr, Seq(1, 3)).path.empty());
}

TEST(PrefixTrie, FindBestMatchPrefersFullEdge) {
  // Deliberately breaks the sibling invariant; the longer sibling comes first so neither
  // "earlier child" nor "longer prefix" alone picks the right one.
  KvEnv e;
  TrieNode* p = e.trie.AppendChild(e.root(), Seq(1, 3), 3);
  e.trie.AppendChild(p, Seq(10, 14), 8);
  TrieNode* shorter = e.trie.AppendChild(p, Seq(10, 12), 6);
  EXPECT_EQ(e.Match(Keys{1, 2, 3, 10, 11, 12, 99}), (Found{6, {e.root(), p, shorter}}));
}

TEST(PrefixTrie, FindBestMatchPrefersLongerPartial) {
  KvEnv e;
  e.trie.AppendChild(e.root(), Keys{1, 2, 9}, 3);
  TrieNode* longer = e.trie.AppendChild(e.root(), Seq(1, 5), 5);
  EXPECT_EQ(e.Match(Keys{1, 2, 3, 7}), (Found{3, {e.root(), longer}}));
}

// FindBestMatch scans a node with few children and probes its child index otherwise: the
// same tie-breaks must hold on both paths, so the broken tries above are rebuilt under a
// node with more children than the scan takes.
TEST(PrefixTrie, FindBestMatchTieBreaksHoldOnAWideNode) {
  // Both insertion orders: the index keeps equal keys in an order of its own.
  for (const bool reversed : {false, true}) {
    KvEnv e;
    TrieNode* p = e.trie.AppendChild(e.root(), Seq(1, 3), 3);
    for (TrieKey k = 50; k < 56; ++k) e.trie.AppendChild(p, Keys{k, k}, 5);
    TrieNode* shorter = nullptr;
    TrieNode* longer = nullptr;
    if (!reversed) {
      e.trie.AppendChild(p, Seq(10, 14), 8);
      shorter = e.trie.AppendChild(p, Seq(10, 12), 6);
      e.trie.AppendChild(p, Keys{20, 21, 29}, 6);
      longer = e.trie.AppendChild(p, Seq(20, 24), 8);
    } else {
      shorter = e.trie.AppendChild(p, Seq(10, 12), 6);
      e.trie.AppendChild(p, Seq(10, 14), 8);
      longer = e.trie.AppendChild(p, Seq(20, 24), 8);
      e.trie.AppendChild(p, Keys{20, 21, 29}, 6);
    }
    ASSERT_GT(p->num_children(), 4);
    EXPECT_EQ(e.Match(Keys{1, 2, 3, 10, 11, 12, 99}), (Found{6, {e.root(), p, shorter}}))
        << "reversed " << reversed;
    EXPECT_EQ(e.Match(Keys{1, 2, 3, 20, 21, 22, 7}), (Found{6, {e.root(), p, longer}}))
        << "reversed " << reversed;
    EXPECT_EQ(e.Match(Keys{1, 2, 3, 53, 53, 9}), (Found{5, {e.root(), p, p->child(3)}}));
    EXPECT_EQ(e.Match(Keys{1, 2, 3, 99}), (Found{3, {e.root(), p}}));
  }
}

TEST(PrefixTrie, SplitNodeWithSnapshots) {
  KvEnv e;
  TrieNode* left = e.trie.AppendChild(e.root(), Keys{7}, 1);
  TrieNode* node = e.trie.AppendChild(e.root(), Seq(1, 5), 5);
  TrieNode* right = e.trie.AppendChild(e.root(), Keys{9}, 1);
  node->set_user(true);
  node->set_last_used(Tick{7});
  e.trie.SetSnapshots(node, KvSet(0, 5));
  ASSERT_TRUE(TrieIsSound(e.trie));

  TrieNode* p = e.trie.SplitNode(node, 3);
  EXPECT_TRUE(TrieIsSound(e.trie));
  EXPECT_EQ(Children(e.root()), (Nodes{left, p, right}));  // same index
  EXPECT_EQ(Children(p), Nodes{node});
  EXPECT_EQ(p->edge(), Seq(1, 3));
  EXPECT_EQ(p->end_offset(), 3);
  EXPECT_EQ(node->edge(), Seq(4, 5));
  EXPECT_EQ(node->start_offset(), 3);
  EXPECT_EQ(node->end_offset(), 5);
  EXPECT_FALSE(p->user());
  EXPECT_TRUE(node->user());
  EXPECT_EQ(p->last_used(), Tick{7});
  EXPECT_TRUE(HoldsKv(p, 0, 3));
  EXPECT_TRUE(HoldsKv(node, 3, 5));
}

TEST(PrefixTrie, FindSplitAppendSequence) {
  KvEnv e;
  TrieNode* n = e.trie.AppendChild(e.root(), Seq(1, 5), 5);
  const Keys second{1, 2, 3, 6, 7};
  EXPECT_EQ(e.Match(second), (Found{3, {e.root(), n}}));
  TrieNode* p = e.trie.SplitNode(n, 3);
  EXPECT_TRUE(p->snapshots().empty());  // nothing to split, nothing invented
  EXPECT_TRUE(n->snapshots().empty());
  TrieNode* branch = e.trie.AppendChild(p, Keys{6, 7}, 5);
  EXPECT_TRUE(TrieIsSound(e.trie));

  EXPECT_EQ(Children(e.root()), Nodes{p});
  EXPECT_EQ(p->edge(), Seq(1, 3));
  EXPECT_EQ(Children(p), (Nodes{n, branch}));
  EXPECT_EQ(e.Match(Seq(1, 5)), (Found{5, {e.root(), p, n}}));
  EXPECT_EQ(e.Match(second), (Found{5, {e.root(), p, branch}}));
  EXPECT_EQ(e.Match(Keys{1, 2, 3, 9, 9}), (Found{3, {e.root(), p}}));
}

TEST(PrefixTrie, RepeatedBranching) {
  KvEnv e;
  const std::vector<Keys> prompts = {Seq(1, 6), Keys{1, 2, 3, 4, 7, 8}, Keys{1, 2, 9, 9, 9}};
  for (const Keys& keys : prompts) {
    Insert(e.trie, keys);
    ASSERT_TRUE(TrieIsSound(e.trie));
  }
  for (const Keys& keys : prompts) {
    const PrefixTrie::Match m = e.trie.FindBestMatch(e.root(), keys);
    EXPECT_EQ(m.matched, Len(keys));
    EXPECT_EQ(m.path.back()->end_offset(), Len(keys));
  }
  // root -> [1,2] -> {[3,4] -> {[5,6], [7,8]}, [9,9,9]}: two splits, three leaves.
  ASSERT_EQ(e.root()->num_children(), 1u);
  const TrieNode* top = e.root()->child(0);
  EXPECT_EQ(top->edge(), Seq(1, 2));
  ASSERT_EQ(top->num_children(), 2u);
  EXPECT_EQ(top->child(0)->edge(), Seq(3, 4));
  EXPECT_EQ(top->child(1)->edge(), (Keys{9, 9, 9}));
  ASSERT_EQ(top->child(0)->num_children(), 2u);
  EXPECT_EQ(top->child(0)->child(0)->edge(), Seq(5, 6));
  EXPECT_EQ(top->child(0)->child(1)->edge(), Seq(7, 8));
}

TEST(MergeWithChild, Basic) {
  KvEnv e;
  TrieNode* a = e.trie.AppendChild(e.root(), Seq(1, 3), 3);
  TrieNode* b = e.trie.AppendChild(a, Seq(4, 5), 5);
  TrieNode* c = e.trie.AppendChild(b, Keys{6}, 6);
  TrieNode* d = e.trie.AppendChild(b, Keys{7}, 6);
  e.trie.SetSnapshots(a, KvSet(0, 3));
  e.trie.SetSnapshots(b, KvSet(3, 5));
  ASSERT_TRUE(TrieIsSound(e.trie));

  e.trie.MergeWithChild(a);
  EXPECT_TRUE(TrieIsSound(e.trie));
  EXPECT_EQ(a->edge(), Seq(1, 5));
  EXPECT_EQ(a->end_offset(), 5);
  EXPECT_EQ(Children(a), (Nodes{c, d}));
  EXPECT_EQ(c->parent(), a);
  EXPECT_EQ(d->parent(), a);
  Nodes all;
  e.trie.Walk([&all](TrieNode* n) { all.push_back(n); });
  EXPECT_EQ(all, (Nodes{e.root(), a, c, d}));  // B is gone
  EXPECT_TRUE(HoldsKv(a, 0, 5));
}

// A wide child's index moves to the node that absorbs it, and a node whose children drop
// to the scan limit drops its index: FindBestMatch checks that a node keeps an index exactly
// while it has more children than it scans, and finds each child by its key either way.
TEST(MergeWithChild, AWideChildKeepsItsChildrenFindable) {
  KvEnv e;
  TrieNode* a = e.trie.AppendChild(e.root(), Seq(1, 3), 3);
  TrieNode* b = e.trie.AppendChild(a, Seq(4, 5), 5);
  Nodes leaves;
  for (TrieKey k = 10; k < 16; ++k) leaves.push_back(e.trie.AppendChild(b, Keys{k, k}, 7));
  e.trie.MergeWithChild(a);
  for (TrieKey k = 10; k < 16; ++k) {
    EXPECT_EQ(e.Match(Keys{1, 2, 3, 4, 5, k, k}),
              (Found{7, {e.root(), a, leaves[static_cast<size_t>(k - 10)]}}));
  }
  e.trie.RemoveNode(leaves[0]);
  e.trie.RemoveNode(leaves[5]);  // down to four: scanned from here on
  EXPECT_EQ(e.Match(Keys{1, 2, 3, 4, 5, 12, 12}), (Found{7, {e.root(), a, leaves[2]}}));
  EXPECT_EQ(e.Match(Keys{1, 2, 3, 4, 5, 10, 10}), (Found{5, {e.root(), a}}));
  e.trie.AppendChild(a, Keys{20}, 6);  // five again: indexed
  EXPECT_EQ(e.Match(Keys{1, 2, 3, 4, 5, 20}).first, 6);
  EXPECT_EQ(e.Match(Keys{1, 2, 3, 4, 5, 13, 13}), (Found{7, {e.root(), a, leaves[3]}}));
}

TEST(MergeWithChild, UserFlag) {
  // The child's flag wins both ways: a user parent merged into a plain child is plain.
  for (const bool child_user : {true, false}) {
    KvEnv e;
    TrieNode* a = e.trie.AppendChild(e.root(), Seq(1, 3), 3);
    TrieNode* b = e.trie.AppendChild(a, Seq(4, 5), 5);
    a->set_user(!child_user);
    b->set_user(child_user);
    e.trie.MergeWithChild(a);
    EXPECT_EQ(a->user(), child_user);
  }
}

TEST(MergeWithChild, LastUsed) {
  for (const auto& [parent_tick, child_tick] : {std::pair{5, 9}, std::pair{9, 5}}) {
    KvEnv e;
    TrieNode* a = e.trie.AppendChild(e.root(), Seq(1, 3), 3);
    TrieNode* b = e.trie.AppendChild(a, Seq(4, 5), 5);
    a->set_last_used(Tick{static_cast<uint64_t>(parent_tick)});
    b->set_last_used(Tick{static_cast<uint64_t>(child_tick)});
    e.trie.MergeWithChild(a);
    EXPECT_EQ(a->last_used(), Tick{9});
  }
}

TEST(MergeWithChildDeathTest, PanicOnMultipleChildren) {
  KvEnv e;
  TrieNode* a = e.trie.AppendChild(e.root(), Seq(1, 3), 3);
  EXPECT_DEATH(e.trie.MergeWithChild(a), "exactly one child");  // none
  e.trie.AppendChild(a, Keys{4}, 4);
  e.trie.AppendChild(a, Keys{5}, 4);
  EXPECT_DEATH(e.trie.MergeWithChild(a), "exactly one child");
  EXPECT_DEATH(e.trie.MergeWithChild(e.root()), "of the root");
}

// A split keeps every key and offset whatever the edge's length and wherever it falls: a
// long conversation compacted into one node and re-entered near its end is an edge of
// thousands of keys split late. Below an edge of 3 keys, so its start is not 0.
TEST(PrefixTrie, SplitAnywhereInAnEdgeOfAnyLengthKeepsKeysAndOffsets) {
  for (int64_t len : {5, 255, 256, 4095, 4096, 4097, 10000}) {
    for (int64_t at : {int64_t{1}, len / 2, len / 2 + 1, len - 1}) {
      KvEnv e;
      TrieNode* head = e.trie.AppendChild(e.root(), Seq(1, 3), 3);
      const Keys keys = Seq(100, static_cast<TrieKey>(99 + len));
      TrieNode* n = e.trie.AppendChild(head, keys, 3 + len);
      TrieNode* p = e.trie.SplitNode(n, at);
      const std::string where =
          "edge of " + std::to_string(len) + " split at " + std::to_string(at);
      ASSERT_TRUE(TrieIsSound(e.trie)) << where;
      EXPECT_EQ(p->start_offset(), 3) << where;
      EXPECT_EQ(p->end_offset(), 3 + at) << where;
      EXPECT_EQ(n->start_offset(), 3 + at) << where;
      EXPECT_EQ(n->end_offset(), 3 + len) << where;
      EXPECT_EQ(p->edge(), Keys(keys.begin(), keys.begin() + at)) << where;
      EXPECT_EQ(n->edge(), Keys(keys.begin() + at, keys.end())) << where;
      Keys all = Seq(1, 3);
      all.insert(all.end(), keys.begin(), keys.end());
      EXPECT_EQ(e.Match(all), (Found{3 + len, {e.root(), head, p, n}})) << where;
    }
  }
}

TEST(PrefixTrie, SplitMergeRoundTrip) {
  KvEnv e;
  TrieNode* n = e.trie.AppendChild(e.root(), Seq(1, 5), 5);
  e.trie.SetSnapshots(n, KvSet(0, 5));
  const int64_t bytes = e.trie.paged_out_bytes();
  TrieNode* p = e.trie.SplitNode(n, 3);
  ASSERT_TRUE(TrieIsSound(e.trie));
  e.trie.MergeWithChild(p);
  EXPECT_TRUE(TrieIsSound(e.trie));
  EXPECT_EQ(Children(e.root()), Nodes{p});
  EXPECT_EQ(p->edge(), Seq(1, 5));
  EXPECT_EQ(p->num_children(), 0u);
  EXPECT_TRUE(HoldsKv(p, 0, 5));
  EXPECT_EQ(e.trie.paged_out_bytes(), bytes);
}

TEST(RemoveNode, Leaf) {
  KvEnv e;
  TrieNode* a = e.trie.AppendChild(e.root(), Keys{1}, 1);
  TrieNode* b = e.trie.AppendChild(e.root(), Keys{2}, 1);
  TrieNode* c = e.trie.AppendChild(e.root(), Keys{3}, 1);
  e.trie.SetSnapshots(a, KvSet(0, 1));
  e.trie.SetSnapshots(b, KvSet(0, 1));
  const int64_t kept = a->SnapshotBytes();
  ASSERT_GT(kept, 0);
  ASSERT_EQ(e.trie.paged_out_bytes(), 2 * kept);
  e.trie.RemoveNode(b);
  EXPECT_TRUE(TrieIsSound(e.trie));
  EXPECT_EQ(Children(e.root()), (Nodes{a, c}));
  EXPECT_EQ(e.trie.paged_out_bytes(), kept);
}

TEST(RemoveNodeDeathTest, PanicOnRoot) {
  KvEnv e;
  EXPECT_DEATH(e.trie.RemoveNode(e.root()), "of the root");
}

TEST(RemoveNodeDeathTest, PanicOnNonLeaf) {
  KvEnv e;
  TrieNode* a = e.trie.AppendChild(e.root(), Keys{1}, 1);
  e.trie.AppendChild(a, Keys{2}, 2);
  EXPECT_DEATH(e.trie.RemoveNode(a), "1 children");
}

// --- mixed stack: [kv, rotating, recurrent, stateless hole] -------------------------------

struct MixedEnv {
  KvCache kv;
  RotatingCache rot{4};
  RecurrentCache rec{RecurrentDims{}};
  PrefixTrie trie{{&kv, &rot, &rec, nullptr}, Tick{0}};

  // Forwards positions [offset, offset + n) through every cache; the recurrent state is
  // filled with the offset it ends at, so a snapshot of it names its own end.
  void Forward(int64_t n) {
    const std::vector<float> tags = tagged::Positions(kv.Offset(), n);
    kv.Update(tagged::Keys(tags), tagged::Values(tags));
    rot.Update(tagged::Keys(tags), tagged::Values(tags));
    const RecurrentDims& d = rec.dims();
    rec.Get(DType::kFloat32);
    const auto end = static_cast<float>(rec.Offset() + n);
    rec.Put(n, {Tensor::FromFloat(DType::kFloat32, MatF::Constant(d.conv_tail, d.conv_dim(), end))},
            {MatF::Constant(d.delta_rows(), d.head_k_dim, end)});
  }
  // What pageOut installs on a node starting at `from` (spec §3.4).
  std::vector<SnapshotPtr> Capture(int64_t from) {
    std::vector<SnapshotPtr> set;
    set.push_back(kv.Snapshot(from));
    set.push_back(rot.Snapshot(from));
    set.push_back(rec.Snapshot(from));
    set.push_back(nullptr);
    return set;
  }
};

float RecurrentTag(const CacheSnapshot* s) {
  const auto* r = dynamic_cast<const RecurrentSnapshot*>(s);
  return r == nullptr ? -1.0f : r->delta()(0, 0);
}

TEST(PrefixTrie, SplitGivesKvHalvesAndLeavesWholeStateOnTheNode) {
  MixedEnv e;
  e.Forward(5);
  TrieNode* a = e.trie.AppendChild(e.trie.root(), Seq(1, 5), 5);
  e.trie.SetSnapshots(a, e.Capture(0));
  ASSERT_TRUE(TrieIsSound(e.trie));
  ASSERT_GT(e.trie.paged_out_bytes(), 0);
  const CacheSnapshot* window = a->snapshot(1);
  const CacheSnapshot* state = a->snapshot(2);
  ASSERT_NE(window, nullptr);
  ASSERT_NE(state, nullptr);

  TrieNode* p = e.trie.SplitNode(a, 2);
  EXPECT_TRUE(TrieIsSound(e.trie));
  EXPECT_TRUE(HoldsKv(p, 0, 2));
  EXPECT_TRUE(HoldsKv(a, 2, 5));
  for (size_t layer : {1u, 2u, 3u}) EXPECT_EQ(p->snapshot(layer), nullptr) << layer;
  ASSERT_EQ(a->snapshot(1), window);  // the very same end-state snapshots, untouched
  EXPECT_EQ(a->snapshot(2), state);
  EXPECT_EQ(a->snapshot(1)->to(), 5);
  EXPECT_EQ(RecurrentTag(a->snapshot(2)), 5.0f);
  EXPECT_EQ(a->snapshot(3), nullptr);
}

TEST(PrefixTrie, MergeConcatenatesKvAndKeepsTheChildsWholeState) {
  MixedEnv e;
  e.Forward(5);
  TrieNode* a = e.trie.AppendChild(e.trie.root(), Seq(1, 5), 5);
  e.trie.SetSnapshots(a, e.Capture(0));
  TrieNode* p = e.trie.SplitNode(a, 2);
  e.Forward(3);
  TrieNode* b = e.trie.AppendChild(a, Seq(6, 8), 8);
  e.trie.SetSnapshots(b, e.Capture(5));
  ASSERT_TRUE(TrieIsSound(e.trie));
  const CacheSnapshot* window = b->snapshot(1);
  const CacheSnapshot* state = b->snapshot(2);
  ASSERT_NE(window, nullptr);
  ASSERT_NE(state, nullptr);

  e.trie.MergeWithChild(a);  // a's own end state (at 5) is closed, b's (at 8) kept
  EXPECT_TRUE(TrieIsSound(e.trie));
  EXPECT_EQ(a->edge(), Seq(3, 8));
  EXPECT_TRUE(HoldsKv(a, 2, 8));
  EXPECT_EQ(a->snapshot(1), window);
  EXPECT_EQ(a->snapshot(2), state);
  EXPECT_EQ(RecurrentTag(a->snapshot(2)), 8.0f);

  e.trie.MergeWithChild(p);  // p has no end state: the child's passes through
  EXPECT_TRUE(TrieIsSound(e.trie));
  EXPECT_EQ(p->edge(), Seq(1, 8));
  EXPECT_EQ(p->num_children(), 0u);
  EXPECT_TRUE(HoldsKv(p, 0, 8));
  ASSERT_EQ(p->snapshot(1), window);
  EXPECT_EQ(p->snapshot(1)->to(), 8);
  EXPECT_EQ(p->snapshot(2), state);
  EXPECT_EQ(p->snapshot(3), nullptr);
  EXPECT_EQ(e.trie.paged_out_bytes(), p->SnapshotBytes());
}

TEST(PrefixTrie, SetSnapshotsReplacesTheSetAndRecounts) {
  MixedEnv e;
  e.Forward(3);
  TrieNode* a = e.trie.AppendChild(e.trie.root(), Seq(1, 3), 3);
  e.trie.SetSnapshots(a, e.Capture(0));
  const int64_t full = e.trie.paged_out_bytes();
  std::vector<SnapshotPtr> kv_only(4);
  kv_only[0] = e.kv.Snapshot(0);
  const int64_t kv_bytes = kv_only[0]->SizeBytes();
  ASSERT_LT(kv_bytes, full);
  e.trie.SetSnapshots(a, std::move(kv_only));
  EXPECT_TRUE(TrieIsSound(e.trie));
  EXPECT_EQ(e.trie.paged_out_bytes(), kv_bytes);
  e.trie.SetSnapshots(a, {});
  EXPECT_FALSE(a->HasSnapshots());
  EXPECT_EQ(e.trie.paged_out_bytes(), 0);
}

TEST(PrefixTrieDeathTest, MisplacedSnapshotsAndBadEdgesAbort) {
  MixedEnv e;
  e.Forward(3);
  TrieNode* a = e.trie.AppendChild(e.trie.root(), Seq(1, 3), 3);
  auto set_with = [&](size_t slot, SnapshotPtr snap) {
    std::vector<SnapshotPtr> set(4);
    set[slot] = std::move(snap);
    e.trie.SetSnapshots(a, std::move(set));
  };
  EXPECT_DEATH(set_with(0, e.rot.Snapshot(0)), "rotating snapshot for a kv cache");
  EXPECT_DEATH(set_with(3, e.kv.Snapshot(0)), "stateless");
  EXPECT_DEATH(e.trie.SetSnapshots(a, KvSet(0, 3)), "1 slots for 4 layers");
  EXPECT_DEATH(e.trie.AppendChild(a, Keys{4}, 5), "end offset");
  EXPECT_DEATH(e.trie.AppendChild(a, Keys{}, 3), "empty edge");
  EXPECT_DEATH(e.trie.SplitNode(a, 0), "outside");
  EXPECT_DEATH(e.trie.SplitNode(a, 3), "outside");
}

// Runs `fn` on a thread with a stack of `bytes`. The test process's own stack may be
// unlimited (ulimit -s in a container), and then no recursion would ever overflow it.
void OnStackOf(size_t bytes, const std::function<void()>& fn) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, bytes), 0);
  pthread_t thread;
  const auto run = [](void* f) -> void* {
    (*static_cast<const std::function<void()>*>(f))();
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&thread, &attr, run, const_cast<std::function<void()>*>(&fn)), 0);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
  pthread_attr_destroy(&attr);
}

TEST(PrefixTrie, DeepChainWalksAndDestroysWithoutOverflowingTheStack) {
  constexpr int64_t kDepth = 100'000;
  // A recursive walk or teardown takes a frame of at least 16 bytes per node: 1.6 MB here,
  // against a 512 KB stack (a release teardown through unique_ptr fits 100,000 levels
  // in the default 8 MB, so the default stack would not tell).
  constexpr size_t kStack = 512 * 1024;
  auto trie = std::make_unique<PrefixTrie>(std::vector<LayerCache*>{}, Tick{0});
  TrieNode* node = trie->root();
  const Keys key{7};
  for (int64_t i = 0; i < kDepth; ++i) node = trie->AppendChild(node, key, i + 1);
  int64_t visited = 0;
  OnStackOf(kStack, [&] {
    trie->Walk([&visited](TrieNode*) { ++visited; });
    trie.reset();
  });
  EXPECT_EQ(visited, kDepth + 1);
  EXPECT_EQ(trie, nullptr);
}

// Walk keeps its stack between walks; a walk started inside another's visitor gets one of
// its own, so both still visit every node once in pre-order.
TEST(PrefixTrie, AWalkInsideAWalkVisitsEveryNodeInPreOrder) {
  PrefixTrie trie(std::vector<LayerCache*>{}, Tick{0});
  TrieNode* a = trie.AppendChild(trie.root(), Keys{1, 2}, 2);
  trie.AppendChild(a, Keys{3}, 3);
  trie.AppendChild(a, Keys{4}, 3);
  trie.AppendChild(trie.root(), Keys{5}, 1);
  std::vector<const TrieNode*> order;
  trie.Walk([&](TrieNode* n) { order.push_back(n); });
  ASSERT_EQ(order.size(), 5u);
  EXPECT_EQ(order[0], trie.root());
  EXPECT_EQ(order[1], a);
  std::vector<const TrieNode*> outer;
  int inner_walks = 0;
  trie.Walk([&](TrieNode* n) {
    outer.push_back(n);
    std::vector<const TrieNode*> inner;
    trie.Walk([&](TrieNode* m) { inner.push_back(m); });
    EXPECT_EQ(inner, order);
    ++inner_walks;
  });
  EXPECT_EQ(outer, order);
  EXPECT_EQ(inner_walks, 5);
  std::vector<const TrieNode*> again;
  trie.Walk([&](TrieNode* n) { again.push_back(n); });
  EXPECT_EQ(again, order);
}

}  // namespace
}  // namespace kvtwin

namespace kvtwin {
namespace {

// The key path root -> node.
Keys KeyPath(const TrieNode* node) {
  std::vector<const TrieNode*> chain;
  for (; !node->is_root(); node = node->parent()) chain.push_back(node);
  Keys keys;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it)
    keys.insert(keys.end(), (*it)->edge().begin(), (*it)->edge().end());
  return keys;
}

// FindBestMatch looks children up by first key; the index must follow every structural
// change. Seeded inserts over a small alphabet (many splits, wide nodes), removals of
// leaves and merges of single-child nodes; after each, every node is found by its own key
// path (a whole-path match ending exactly at it) and one key past a leaf matches nothing
// more.
TEST(PrefixTrie, EveryNodeIsFoundByItsKeyPathThroughSplitsMergesAndRemovals) {
  KvEnv e;
  Rng rng(7);
  for (int step = 0; step < 600; ++step) {
    std::vector<TrieNode*> nodes;
    e.trie.Walk([&](TrieNode* n) { nodes.push_back(n); });
    const uint64_t op = rng.Below(10);
    if (op < 6 || nodes.size() < 3) {
      Keys keys(static_cast<size_t>(rng.Range(1, 8)));
      for (TrieKey& k : keys) k = rng.Below(op < 3 ? 3 : 40);
      Insert(e.trie, keys);
    } else {
      TrieNode* n = nodes[1 + rng.Below(nodes.size() - 1)];
      if (n->num_children() == 0)
        e.trie.RemoveNode(n);
      else if (n->num_children() == 1)
        e.trie.MergeWithChild(n);
    }
    ASSERT_TRUE(TrieIsSound(e.trie)) << "step " << step;
    e.trie.Walk([&](TrieNode* n) {
      Keys keys = KeyPath(n);
      const Found found = e.Match(keys);
      ASSERT_EQ(found.first, n->end_offset()) << "step " << step;
      ASSERT_EQ(found.second.back(), n) << "step " << step;
      if (n->num_children() == 0) {
        keys.push_back(1000);  // a key no insert uses
        ASSERT_EQ(e.Match(keys).first, n->end_offset()) << "step " << step;
      }
    });
  }
  EXPECT_GT(e.trie.num_nodes(), 20);
}

}  // namespace
}  // namespace kvtwin
