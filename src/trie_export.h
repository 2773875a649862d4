// Human views of a PrefixTrie: an indented text dump for reports and a Graphviz DOT export
// (`dot -Tsvg`). Both show every node's range, edge keys (abbreviated), last-used tick, user
// flag, snapshot bytes and per-layer snapshot kinds, and mark the active path. Pure
// functions of the trie; deterministic output (children in list order).
#pragma once

#include <span>
#include <string>

#include "src/prefix_trie.h"

namespace kvtwin {

// One line per node, indented by depth:
//   [5,9) keys=10 11 12 30 last=7 bytes=256 snaps=[kv:[5,9) rot:@9 rec:@9 -] user active
std::string DumpTrie(const PrefixTrie& trie, std::span<TrieNode* const> active_path);
// A `digraph` with one box per node; the active path is drawn bold, user restore points
// double-bordered, and the node label carries range, keys, bytes and tick.
std::string TrieToDot(const PrefixTrie& trie, std::span<TrieNode* const> active_path);

}  // namespace kvtwin
