// Goal: pin the reference eviction pass (model/ref_eviction.h) and the canonical trie
// rendering (model/ref_trie.h) to spec §3.4 "Eviction" and §3.2 removeNode /
// mergeWithChild, since the simulator judges the production pass by them: each tie-break
// in order, leaf removal versus merge into the only child (per-kind slot and byte rules,
// flag and tick inheritance), the nodes that are never evicted, the strict budget
// comparison, and the exact text of RenderRefTrie / FirstDifference.
// Method: small hand-built trees whose ticks, ends and bytes make exactly one rule decide
// each pick; expectations are the eviction list and the rendered trie, derived by hand.
#include "model/ref_eviction.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/ref_trie.h"

namespace kvtwin::model {
namespace {

using Ids = std::vector<int32_t>;

RefSnap Kv(int64_t from, int64_t to) { return RefSnapshot{RefKind::kKv, from, to, {}}; }
RefSnap Rot(int64_t to) { return RefSnapshot{RefKind::kRotating, 0, to, {}}; }
RefSnap Rec(int64_t to) { return RefSnapshot{RefKind::kRecurrent, 0, to, {}}; }

// A child of `parent` with the given keys, tick and charged slots.
RefNode* Add(RefNode* parent, const Ids& edge, int64_t tick, std::vector<RefSnap> snaps = {},
             std::vector<int64_t> bytes = {}) {
  RefNode* n = AppendRefChild(parent, edge, parent->end + static_cast<int64_t>(edge.size()));
  n->last_used = tick;
  n->snaps = std::move(snaps);
  n->bytes = std::move(bytes);
  return n;
}

// A leaf charged `bytes` in one KV slot covering its edge.
RefNode* Leaf(RefNode* parent, const Ids& edge, int64_t tick, int64_t bytes) {
  const int64_t end = parent->end + static_cast<int64_t>(edge.size());
  return Add(parent, edge, tick, {Kv(parent->end, end)}, {bytes});
}

std::vector<std::string> Pass(RefNode& root, const std::vector<const RefNode*>& active,
                              int64_t budget) {
  std::vector<std::string> out;
  for (const RefEviction& e : RefEvictionPass(root, active, budget)) out.push_back(e.ToString());
  return out;
}

std::string Trie(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

using Evictions = std::vector<std::string>;

TEST(RefEviction, OlderBeatsDeeper) {
  RefNode root;
  Leaf(&root, {1, 2, 3}, 5, 10);
  Leaf(&root, {4}, 3, 10);
  EXPECT_EQ(Pass(root, {&root}, 15), (Evictions{"remove [0,1)"}));
  EXPECT_EQ(RefTrieBytes(root), 10);
}

TEST(RefEviction, OnEqualAgeDeeperBeatsLarger) {
  RefNode root;
  Leaf(&root, {1, 2}, 4, 20);
  Leaf(&root, {3, 4, 5}, 4, 10);
  EXPECT_EQ(Pass(root, {&root}, 29), (Evictions{"remove [0,3)"}));
}

TEST(RefEviction, OnEqualAgeAndDepthLargerBeatsPreOrder) {
  RefNode root;
  Leaf(&root, {1, 2}, 4, 10);
  Leaf(&root, {3, 4}, 4, 20);
  EXPECT_EQ(Pass(root, {&root}, 29), (Evictions{"remove [0,2)"}));
  EXPECT_EQ(RenderRefTrie(root, true),
            Trie({"[0,0) keys t0", "  [0,2) keys 1 2 t1 | kv[0,2) 10B"}));
}

TEST(RefEviction, FullTieGoesToTheFirstInPreOrderAndKeepsSiblingOrder) {
  RefNode root;
  RefNode* x = Add(&root, {1}, 9);
  Leaf(x, {7, 8}, 4, 10);
  Leaf(x, {9, 10}, 4, 10);
  Leaf(x, {11, 12}, 4, 10);
  Leaf(&root, {2, 3, 4}, 4, 10);  // same end 3, later in pre-order
  EXPECT_EQ(Pass(root, {&root}, 39), (Evictions{"remove [1,3)"}));
  EXPECT_EQ(RenderRefTrie(root, false),
            Trie({"[0,0) keys t0", "  [0,1) keys 1 t2", "    [1,3) keys 9 10 t1 | kv[1,3)",
                  "    [1,3) keys 11 12 t1 | kv[1,3)", "  [0,3) keys 2 3 4 t1 | kv[0,3)"}));
}

TEST(RefEviction, SingleChildNodeMergesIntoItsChild) {
  RefNode root;
  RefNode* m = Add(&root, {1, 2}, 3, {Kv(0, 2), Rec(2), Rot(2), Kv(0, 2)}, {8, 5, 6, 4});
  m->snaps[0]->tokens = TokenLog{Token{1, 11}, Token{2, 12}};
  RefNode* c = Add(m, {3, 4, 5}, 7, {Kv(2, 5), Rec(5), std::nullopt, std::nullopt}, {12, 9, 0, 0});
  c->user = true;
  c->snaps[0]->tokens = TokenLog{Token{3, 13}, Token{4, 14}, Token{5, 15}};
  RefNode* g = Leaf(c, {6}, 8, 1);
  EXPECT_EQ(Pass(root, {&root}, 44), (Evictions{"merge [0,2) into its child"}));
  // KV: both sides -> concatenated, bytes summed; a missing side -> none. Whole-state:
  // the child's slot and bytes, even when the child has none. Flag and newest tick: child's.
  EXPECT_EQ(RenderRefTrie(root, true),
            Trie({"[0,0) keys t0",
                  "  [0,5) keys 1 2 3 4 5 user t1 | kv[0,5) 20B | rec@5 9B | - 0B | - 0B",
                  "    [5,6) keys 6 t2 | kv[5,6) 1B"}));
  EXPECT_EQ(m->snaps[0]->tokens, (TokenLog{{1, 11}, {2, 12}, {3, 13}, {4, 14}, {5, 15}}));
  EXPECT_EQ(m->last_used, 7);
  EXPECT_EQ(g->parent, m);
  EXPECT_EQ(RefTrieBytes(root), 30);
}

TEST(RefEviction, ActivePathAndRootAreNeverEvictedAndThePassStops) {
  RefNode root;
  root.snaps = {Kv(0, 0)};
  root.bytes = {5};
  RefNode* a = Leaf(&root, {1, 2}, 1, 10);
  RefNode* b = Leaf(a, {3, 4}, 2, 10);
  Leaf(&root, {9}, 9, 10);
  // Budget 0 is out of reach: only the off-path leaf can go, then nothing is eligible.
  EXPECT_EQ(Pass(root, {&root, a, b}, 0), (Evictions{"remove [0,1)"}));
  EXPECT_EQ(RefTrieBytes(root), 25);
  EXPECT_EQ(RenderRefTrie(root, false),
            Trie({"[0,0) keys t0 | kv[0,0)", "  [0,2) keys 1 2 t1 | kv[0,2)",
                  "    [2,4) keys 3 4 t2 | kv[2,4)"}));
}

TEST(RefEviction, BranchPointWaitsUntilItHasOneChild) {
  RefNode root;
  RefNode* b = Leaf(&root, {1}, 1, 10);
  Leaf(b, {2}, 5, 10);
  Leaf(b, {3}, 6, 10);
  EXPECT_EQ(Pass(root, {&root}, 25), (Evictions{"remove [1,2)"}));
  EXPECT_EQ(Pass(root, {&root}, 5), (Evictions{"merge [0,1) into its child", "remove [0,2)"}));
  EXPECT_TRUE(root.children.empty());
}

TEST(RefEviction, BudgetComparisonIsStrict) {
  RefNode root;
  Leaf(&root, {1}, 1, 10);
  EXPECT_EQ(Pass(root, {&root}, 10), Evictions{});
  EXPECT_EQ(Pass(root, {&root}, 9), (Evictions{"remove [0,1)"}));
}

TEST(RefEvictionDeathTest, ActivePathMustStartAtTheRoot) {
  RefNode root;
  RefNode* a = Leaf(&root, {1}, 1, 10);
  EXPECT_DEATH(RefEvictionPass(root, {a}, 0), "starts at the root");
}

// Every active-path entry must be a node of the tree: one of another tree, or one detached
// from this one, aborts (the mirror of a broken production trie leaves such entries out).
TEST(RefEvictionDeathTest, ActivePathNodesMustBeInTheTree) {
  RefNode root;
  RefNode* a = Leaf(&root, {1}, 1, 10);
  RefNode other;
  RefNode* stranger = Leaf(&other, {2}, 1, 10);
  EXPECT_DEATH(RefEvictionPass(root, {&root, stranger}, 0), "not in the tree");
  std::unique_ptr<RefNode> detached = DetachRefChild(a);
  EXPECT_DEATH(RefEvictionPass(root, {&root, detached.get()}, 0), "not in the tree");
}

TEST(RenderRefTrie, RanksAreDenseAndNodesWithoutSnapshotsShowNoSlots) {
  RefNode root;
  root.last_used = 10;
  RefNode* a = Add(&root, {1, 2}, 30);  // never held a snapshot: no slots at all
  a->user = true;
  Add(a, {3}, 20, {std::nullopt, std::nullopt, std::nullopt}, {0, 0, 0});
  Add(&root, {9}, 30, {Kv(0, 1), Rot(1), Rec(1)}, {16, 4, 8});
  EXPECT_EQ(RenderRefTrie(root, false),
            Trie({"[0,0) keys t0", "  [0,2) keys 1 2 user t2", "    [2,3) keys 3 t1",
                  "  [0,1) keys 9 t2 | kv[0,1) | rot[0,1) | rec@1"}));
  EXPECT_EQ(RenderRefTrie(root, true),
            Trie({"[0,0) keys t0", "  [0,2) keys 1 2 user t2", "    [2,3) keys 3 t1",
                  "  [0,1) keys 9 t2 | kv[0,1) 16B | rot[0,1) 4B | rec@1 8B"}));
  // Tries on one clock compare the ticks themselves.
  EXPECT_EQ(RenderRefTrie(root, false, /*raw_ticks=*/true),
            Trie({"[0,0) keys t10", "  [0,2) keys 1 2 user t30", "    [2,3) keys 3 t20",
                  "  [0,1) keys 9 t30 | kv[0,1) | rot[0,1) | rec@1"}));
  EXPECT_FALSE(a->HasSnapshots());
  EXPECT_EQ(RefTrieBytes(root), 28);
}

TEST(RenderRefTrie, AppendedChildInheritsItsParentsTick) {
  RefNode root;
  root.last_used = 4;
  RefNode* a = AppendRefChild(&root, {5, 6}, 2);
  EXPECT_EQ(a->last_used, 4);
  EXPECT_EQ(a->start(), 0);
  EXPECT_EQ(RefPreOrder(root), (std::vector<RefNode*>{&root, a}));
}

TEST(FirstDifference, NamesTheFirstDifferingLine) {
  EXPECT_EQ(FirstDifference("a\nb\n", "a\nb\n"), "");
  EXPECT_EQ(FirstDifference("a\nb\nc\n", "a\nx\ny\n"), "line 2: expected 'b' got 'x'");
  EXPECT_EQ(FirstDifference("a\n", "a\nb\n"), "line 2: expected <none> got 'b'");
  EXPECT_EQ(FirstDifference("a\nb\n", "a\n"), "line 2: expected 'b' got <none>");
}

}  // namespace
}  // namespace kvtwin::model
