#include "src/trie_export.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace kvtwin {
namespace {

// Long edges are abbreviated: a dump of a 10k-token conversation stays readable.
constexpr size_t kShownKeys = 8;

std::string Keys(const TrieNode& n) {
  const auto& e = n.edge();
  std::string s;
  const size_t shown = std::min(e.size(), kShownKeys);
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) s += ' ';
    s += std::to_string(e[i]);
  }
  if (e.size() > shown) s += " ... (" + std::to_string(e.size()) + " keys)";
  return s;
}

// "[a,b)".
std::string Span(int64_t a, int64_t b) {
  std::string s = "[";
  s += std::to_string(a);
  s += ',';
  s += std::to_string(b);
  s += ')';
  return s;
}

std::string Range(const TrieNode& n) { return Span(n.start_offset(), n.end_offset()); }

std::string Snaps(const TrieNode& n) {
  if (!n.HasSnapshots()) return "none";
  std::string s = "[";
  for (size_t i = 0; i < n.snapshots().size(); ++i) {
    const CacheSnapshot* snap = n.snapshots()[i].get();
    if (i > 0) s += " ";
    if (snap == nullptr) {
      s += "-";
    } else if (snap->kind() == CacheKind::kFullKv) {
      s += "kv:";
      s += Span(snap->from(), snap->to());
    } else {
      s += snap->kind() == CacheKind::kRotating ? "rot:@" : "rec:@";
      s += std::to_string(snap->to());
    }
  }
  return s + "]";
}

int Depth(const TrieNode* n) {
  int d = 0;
  for (; !n->is_root(); n = n->parent()) ++d;
  return d;
}

}  // namespace

std::string DumpTrie(const PrefixTrie& trie, std::span<TrieNode* const> active_path) {
  const std::unordered_set<const TrieNode*> active(active_path.begin(), active_path.end());
  std::string out = "paged out " + std::to_string(trie.paged_out_bytes()) + " bytes\n";
  trie.Walk([&](TrieNode* n) {
    out += std::string(static_cast<size_t>(2 * Depth(n)), ' ');
    out += n->is_root() ? "root" : Range(*n) + " keys=" + Keys(*n);
    out += " last=" + std::to_string(static_cast<uint64_t>(n->last_used()));
    out += " bytes=" + std::to_string(n->SnapshotBytes()) + " snaps=" + Snaps(*n);
    if (n->user()) out += " user";
    if (active.count(n) > 0) out += " active";
    out += "\n";
  });
  return out;
}

std::string TrieToDot(const PrefixTrie& trie, std::span<TrieNode* const> active_path) {
  const std::unordered_set<const TrieNode*> active(active_path.begin(), active_path.end());
  std::unordered_map<const TrieNode*, int> ids;
  std::string out = "digraph trie {\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n";
  out += "  label=\"paged out " + std::to_string(trie.paged_out_bytes()) + " bytes\";\n";
  trie.Walk([&](TrieNode* n) {
    const int id = static_cast<int>(ids.size());
    ids[n] = id;
    // Labels hold only digits, brackets, spaces and letters: nothing needs DOT escaping.
    std::string label = n->is_root() ? std::string("root") : Range(*n) + "\\n" + Keys(*n);
    label += "\\nbytes " + std::to_string(n->SnapshotBytes()) + "  t" +
             std::to_string(static_cast<uint64_t>(n->last_used())) + "\\n" + Snaps(*n);
    out += "  n" + std::to_string(id) + " [label=\"" + label + "\"";
    if (n->user()) out += ", peripheries=2";
    if (active.count(n) > 0) out += ", style=bold, color=red";
    out += "];\n";
    if (!n->is_root()) {
      out += "  n" + std::to_string(ids.at(n->parent())) + " -> n" + std::to_string(id);
      if (active.count(n) > 0) out += " [style=bold, color=red]";
      out += ";\n";
    }
  });
  return out + "}\n";
}

}  // namespace kvtwin
