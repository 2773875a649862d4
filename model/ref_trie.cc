// RefNode helpers and the canonical rendering that the simulator compares tries with.
//
// Rendering decisions (the header fixes the line format; these fix what it leaves open):
// - one line per node, pre-order, indented by two spaces per depth, each line ending in
//   '\n';
// - every line shows exactly `num_slots` slots, where num_slots is the largest `snaps`
//   size in the tree. A node whose `snaps` is empty (never held a snapshot) and a node
//   whose slots are all null render alike ("-" per slot): both mean "no snapshot", and a
//   production mirror cannot tell the two apart either;
// - the root line has no keys: "[0,0) keys t<rank> | ...".
#include "model/ref_trie.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <utility>

#include "src/core/check.h"

namespace kvtwin::model {
namespace {

template <typename Node>
void PreOrderInto(Node& node, std::vector<Node*>& out) {
  out.push_back(&node);
  for (const auto& child : node.children) PreOrderInto<Node>(*child, out);
}

int Depth(const RefNode& node) {
  int depth = 0;
  for (const RefNode* n = node.parent; n != nullptr; n = n->parent) ++depth;
  return depth;
}

std::string SlotText(const RefNode& node, size_t i, bool with_bytes) {
  std::ostringstream out;
  const bool present = i < node.snaps.size() && node.snaps[i].has_value();
  if (!present) {
    out << "-";
  } else {
    const RefSnapshot& s = *node.snaps[i];
    switch (s.kind) {
      case RefKind::kKv:
        out << "kv[" << s.from << "," << s.to << ")";
        break;
      case RefKind::kRotating:
        out << "rot[" << s.from << "," << s.to << ")";
        break;
      case RefKind::kRecurrent:
        out << "rec@" << s.to;
        break;
    }
  }
  if (with_bytes) out << " " << (i < node.bytes.size() ? node.bytes[i] : 0) << "B";
  return out.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

bool RefNode::HasSnapshots() const {
  return std::any_of(snaps.begin(), snaps.end(), [](const RefSnap& s) { return s.has_value(); });
}

int64_t RefNode::Bytes() const {
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  return total;
}

size_t NextChildWithKey(const RefNode& node, int32_t key, size_t from) {
  const std::vector<int32_t>& keys = node.child_keys;
  // A block's matches are counted with no exit inside it, which g++ and clang turn into
  // vector compares (a boolean "any" is not); the root of a long trace holds thousands of
  // children, and most prompts match none of them.
  constexpr size_t kBlock = 64;
  const auto matches = [&](size_t at) {
    int n = 0;
    for (size_t j = at; j < at + kBlock; ++j) n += keys[j] == key ? 1 : 0;
    return n;
  };
  size_t i = from;
  while (i + kBlock <= keys.size() && matches(i) == 0) i += kBlock;
  for (; i < keys.size(); ++i) {
    if (keys[i] == key) return i;
  }
  return keys.size();
}

RefNode* AppendRefChild(RefNode* parent, std::vector<int32_t> edge, int64_t end) {
  KV_CHECK(parent != nullptr, "a child needs a parent");
  KV_CHECK(!edge.empty(), "only the root has an empty edge");
  KV_CHECK(end - static_cast<int64_t>(edge.size()) == parent->end,
           "a child starts where its parent ends");
  auto child = std::make_unique<RefNode>();
  child->edge = std::move(edge);
  child->end = end;
  child->last_used = parent->last_used;
  return AdoptRefChild(*parent, std::move(child));
}

RefNode* AdoptRefChild(RefNode& parent, std::unique_ptr<RefNode> child) {
  KV_CHECK(child != nullptr && !child->edge.empty(), "a child has a non-empty edge");
  child->parent = &parent;
  parent.child_keys.push_back(child->edge.front());
  parent.children.push_back(std::move(child));
  return parent.children.back().get();
}

void TakeRefChildren(RefNode& node, RefNode& from) {
  node.children = std::move(from.children);
  node.child_keys = std::move(from.child_keys);
  from.children.clear();
  from.child_keys.clear();
  for (auto& child : node.children) child->parent = &node;
}

namespace {

size_t IndexAmongSiblings(const RefNode* child) {
  KV_CHECK(child != nullptr && child->parent != nullptr, "the root has no siblings");
  const auto& siblings = child->parent->children;
  auto it = std::find_if(siblings.begin(), siblings.end(),
                         [&](const std::unique_ptr<RefNode>& c) { return c.get() == child; });
  KV_CHECK(it != siblings.end(), "a node is missing from its parent's children");
  return static_cast<size_t>(it - siblings.begin());
}

}  // namespace

std::unique_ptr<RefNode> ReplaceRefChild(RefNode* child, std::unique_ptr<RefNode> replacement) {
  RefNode* parent = child->parent;
  const size_t i = IndexAmongSiblings(child);
  KV_CHECK(replacement != nullptr && !replacement->edge.empty() &&
               replacement->edge.front() == parent->child_keys[i],
           "a replacement child keeps the first key of the child it replaces");
  replacement->parent = parent;
  std::unique_ptr<RefNode> detached = std::exchange(parent->children[i], std::move(replacement));
  detached->parent = nullptr;
  return detached;
}

std::unique_ptr<RefNode> DetachRefChild(RefNode* child) {
  RefNode* parent = child->parent;
  const size_t i = IndexAmongSiblings(child);
  std::unique_ptr<RefNode> detached = std::move(parent->children[i]);
  parent->children.erase(parent->children.begin() + static_cast<std::ptrdiff_t>(i));
  parent->child_keys.erase(parent->child_keys.begin() + static_cast<std::ptrdiff_t>(i));
  detached->parent = nullptr;
  return detached;
}

std::vector<RefNode*> RefPreOrder(RefNode& root) {
  std::vector<RefNode*> out;
  PreOrderInto<RefNode>(root, out);
  return out;
}

std::vector<const RefNode*> RefPreOrder(const RefNode& root) {
  std::vector<const RefNode*> out;
  PreOrderInto<const RefNode>(root, out);
  return out;
}

std::string RenderRefTrie(const RefNode& root, bool with_bytes, bool raw_ticks) {
  const std::vector<const RefNode*> nodes = RefPreOrder(root);
  std::vector<int64_t> ticks;
  for (const RefNode* n : nodes) ticks.push_back(n->last_used);
  std::sort(ticks.begin(), ticks.end());
  ticks.erase(std::unique(ticks.begin(), ticks.end()), ticks.end());
  std::ostringstream out;
  for (const RefNode* n : nodes) {
    out << std::string(static_cast<size_t>(2 * Depth(*n)), ' ');
    out << "[" << n->start() << "," << n->end << ") keys";
    for (int32_t k : n->edge) out << " " << k;
    if (n->user) out << " user";
    // Dense rank: the number of distinct older ticks.
    out << " t"
        << (raw_ticks ? n->last_used
                      : std::lower_bound(ticks.begin(), ticks.end(), n->last_used) - ticks.begin());
    // A node's line depends on the node alone, so the first differing line names the node
    // that differs: no slots at all when it holds no snapshot (an empty and an all-null slot
    // set are alike), else every slot of its set.
    if (n->HasSnapshots()) {
      for (size_t i = 0; i < n->snaps.size(); ++i) out << " | " << SlotText(*n, i, with_bytes);
    }
    out << "\n";
  }
  return out.str();
}

std::string FirstDifference(const std::string& expected, const std::string& actual) {
  const std::vector<std::string> want = Lines(expected);
  const std::vector<std::string> got = Lines(actual);
  const size_t n = std::max(want.size(), got.size());
  for (size_t i = 0; i < n; ++i) {
    // A missing line shows as "<none>", which no rendered line can be.
    const std::string w = i < want.size() ? "'" + want[i] + "'" : "<none>";
    const std::string g = i < got.size() ? "'" + got[i] + "'" : "<none>";
    if (w != g) return "line " + std::to_string(i + 1) + ": expected " + w + " got " + g;
  }
  return "";
}

}  // namespace kvtwin::model
