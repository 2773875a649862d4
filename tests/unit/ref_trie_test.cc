// Goal: the reference trie's list of child first keys (RefNode::child_keys), which the
// reference findBestMatch scans instead of the children, stays equal to the children's
// first keys through every way the reference adds, replaces, takes over and removes
// children.
// Method: grow a small trie with the helpers, checking every node after each step. (That a
// stale list is reported is tests/sim/trie_mirror_test.cc's: SameTrie audits it.)
#include "model/ref_trie.h"

#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

namespace kvtwin::model {
namespace {

// Every node's child_keys are its children's first keys, in order.
bool AllConsistent(RefNode& root) {
  for (const RefNode* n : RefPreOrder(root)) {
    if (n->child_keys.size() != n->children.size()) return false;
    for (size_t i = 0; i < n->children.size(); ++i) {
      if (n->children[i]->edge.front() != n->child_keys[i]) return false;
    }
  }
  return true;
}

std::unique_ptr<RefNode> Node(std::vector<int32_t> edge, int64_t end) {
  auto n = std::make_unique<RefNode>();
  n->edge = std::move(edge);
  n->end = end;
  return n;
}

TEST(RefTrie, ChildKeysFollowEveryChangeOfTheChildren) {
  RefNode root;
  RefNode* a = AppendRefChild(&root, {1, 2, 3}, 3);
  RefNode* b = AppendRefChild(&root, {5}, 1);
  AppendRefChild(a, {7, 8}, 5);
  AppendRefChild(a, {9}, 4);
  EXPECT_EQ(root.child_keys, (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(a->child_keys, (std::vector<int32_t>{7, 9}));
  ASSERT_TRUE(AllConsistent(root));

  // A split: the new parent [1] takes a's place (same first key), a keeps [2, 3] below it.
  RefNode* p = Node({1}, 1).release();
  a->edge.erase(a->edge.begin());
  std::unique_ptr<RefNode> old = ReplaceRefChild(a, std::unique_ptr<RefNode>(p));
  EXPECT_EQ(old.get(), a);
  EXPECT_EQ(a->parent, nullptr);
  AdoptRefChild(*p, std::move(old));
  EXPECT_EQ(root.children[0].get(), p);
  EXPECT_EQ(p->child_keys, (std::vector<int32_t>{2}));
  EXPECT_EQ(a->parent, p);
  ASSERT_TRUE(AllConsistent(root));

  // A merge: p absorbs its only child a and takes over a's children.
  std::unique_ptr<RefNode> child = std::move(p->children.front());
  p->children.clear();
  p->child_keys.clear();
  TakeRefChildren(*p, *child);
  EXPECT_EQ(p->child_keys, (std::vector<int32_t>{7, 9}));
  EXPECT_TRUE(child->children.empty() && child->child_keys.empty());
  for (const auto& c : p->children) EXPECT_EQ(c->parent, p);
  ASSERT_TRUE(AllConsistent(root));

  // A removal keeps the siblings' order.
  RefNode* first = p->children[0].get();
  std::unique_ptr<RefNode> removed = DetachRefChild(first);
  EXPECT_EQ(removed.get(), first);
  EXPECT_EQ(p->child_keys, (std::vector<int32_t>{9}));
  DetachRefChild(b);
  EXPECT_EQ(root.child_keys, (std::vector<int32_t>{1}));
  EXPECT_TRUE(AllConsistent(root));
}

// ForEachRefNode (the eviction pass's walk) visits exactly RefPreOrder's list, in order.
TEST(RefTrie, ForEachRefNodeWalksInPreOrder) {
  RefNode root;
  RefNode* a = AppendRefChild(&root, {1, 2}, 2);
  AppendRefChild(a, {3}, 3);
  RefNode* b = AppendRefChild(a, {4, 5}, 4);
  AppendRefChild(b, {6}, 5);
  AppendRefChild(&root, {7}, 1);
  std::vector<RefNode*> walked;
  ForEachRefNode(root, [&](RefNode& n) { walked.push_back(&n); });
  EXPECT_EQ(walked, RefPreOrder(root));
  EXPECT_EQ(walked.size(), 6u);
  std::vector<const RefNode*> walked_const;
  const RefNode& croot = root;
  ForEachRefNode(croot, [&](const RefNode& n) { walked_const.push_back(&n); });
  EXPECT_EQ(walked_const, RefPreOrder(croot));
}

TEST(RefTrie, AReplacementMustKeepTheFirstKey) {
  RefNode root;
  RefNode* a = AppendRefChild(&root, {1, 2}, 2);
  EXPECT_DEATH(ReplaceRefChild(a, Node({2}, 1)), "keeps the first key");
}

}  // namespace
}  // namespace kvtwin::model
