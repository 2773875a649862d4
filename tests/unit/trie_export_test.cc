// Goal: the trie's human views say what the trie holds: ranges, keys (abbreviated when
// long), ticks, bytes, per-layer snapshots, user points and the active path; the DOT
// export is a graph Graphviz accepts.
// Method: a small hand-built trie over [kv, null hole] with real KV snapshots, and one over
// [kv, rotating, recurrent, hole] for the whole-state snapshots; the dump is compared line
// by line, the DOT text is rendered with `dot -Tsvg` when Graphviz is
// installed (scripts/setup.sh installs it).
#include "src/trie_export.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "src/core/rng.h"
#include "src/kv_cache.h"
#include "src/recurrent_cache.h"
#include "src/rotating_cache.h"
#include "unit/tagged_rows.h"

namespace kvtwin {
namespace {

struct Fixture {
  KvCache kv;
  PrefixTrie trie{{&kv, nullptr}, Tick{1}};
  TrieNode* a = nullptr;
  TrieNode* b = nullptr;
  TrieNode* c = nullptr;

  Fixture() {
    const std::vector<float> tags = tagged::Positions(0, 12);
    kv.Update(tagged::Keys(tags), tagged::Values(tags));
    std::vector<TrieKey> long_edge;
    for (TrieKey k = 4; k < 14; ++k) long_edge.push_back(k);
    a = trie.AppendChild(trie.root(), std::vector<TrieKey>{1, 2, 3}, 3);
    b = trie.AppendChild(a, long_edge, 13);
    c = trie.AppendChild(a, std::vector<TrieKey>{99}, 4);
    a->set_last_used(Tick{5});
    b->set_user(true);
    std::vector<SnapshotPtr> snaps;
    snaps.push_back(kv.Snapshot(0));  // [0, 12): any KV range will do for a dump
    snaps.push_back(nullptr);
    trie.SetSnapshots(a, std::move(snaps));
    // A set whose every slot is null (a split parent over whole-state layers) restores
    // nothing, so it must dump as `none` like a node never given a set.
    std::vector<SnapshotPtr> nulls(2);
    trie.SetSnapshots(c, std::move(nulls));
  }
};

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    out.push_back(text.substr(start, nl - start));
  }
  return out;
}

TEST(TrieExport, DumpShowsEveryNodeIndentedWithItsState) {
  Fixture f;
  const std::vector<TrieNode*> active = {f.trie.root(), f.a, f.b};
  const int64_t bytes = f.trie.paged_out_bytes();
  ASSERT_GT(bytes, 0);
  const std::vector<std::string> want = {
      "paged out " + std::to_string(bytes) + " bytes",
      "root last=1 bytes=0 snaps=none active",
      "  [0,3) keys=1 2 3 last=5 bytes=" + std::to_string(bytes) + " snaps=[kv:[0,12) -] active",
      "    [3,13) keys=4 5 6 7 8 9 10 11 ... (10 keys) last=1 bytes=0 snaps=none user active",
      "    [3,4) keys=99 last=1 bytes=0 snaps=none",
  };
  EXPECT_EQ(Lines(DumpTrie(f.trie, active)), want);
}

// The abbreviation's boundary: eight keys are all shown, a ninth is elided with the count,
// so a dump never hides a key without saying so.
TEST(TrieExport, DumpAbbreviatesExactlyTheEdgesPastEightKeys) {
  KvCache kv;
  PrefixTrie trie{{&kv}, Tick{1}};
  std::vector<TrieKey> edge;
  for (TrieKey k = 1; k <= 9; ++k) edge.push_back(k);
  trie.AppendChild(trie.root(), std::vector<TrieKey>(edge.begin(), edge.end() - 1), 8);
  edge.front() = 100;
  trie.AppendChild(trie.root(), edge, 9);
  const std::vector<TrieNode*> active = {trie.root()};
  const std::vector<std::string> lines = Lines(DumpTrie(trie, active));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[2].rfind("  [0,8) keys=1 2 3 4 5 6 7 8 last=", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("  [0,9) keys=100 2 3 4 5 6 7 8 ... (9 keys) last=", 0), 0u) << lines[3];
}

// Keys are 64-bit (a token id, or a block hash when a trace keys the trie by blocks), so
// the dump prints every one whole: a key with bit 31 or bit 63 set is neither narrowed nor
// shown signed.
TEST(TrieExport, DumpPrintsSixtyFourBitKeysWhole) {
  KvCache kv;
  PrefixTrie trie{{&kv}, Tick{1}};
  const std::vector<TrieKey> edge = {TrieKey{1} << 31, (TrieKey{1} << 31) + 99,
                                     (TrieKey{1} << 63) + 1, ~TrieKey{0}};
  trie.AppendChild(trie.root(), edge, 4);
  const std::vector<TrieNode*> active = {trie.root()};
  const std::vector<std::string> lines = Lines(DumpTrie(trie, active));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2].rfind("  [0,4) keys=2147483648 2147483747 9223372036854775809 "
                           "18446744073709551615 last=",
                           0),
            0u)
      << lines[2];
  const std::string dot = TrieToDot(trie, active);
  EXPECT_NE(dot.find("18446744073709551615"), std::string::npos) << dot;
}

// A long conversation with a restore point every few tokens is a deep chain; the dump
// indents each node by its full depth, however deep (no cap that would flatten the tail).
TEST(TrieExport, DumpIndentsEveryNodeByItsFullDepth) {
  KvCache kv;
  PrefixTrie trie{{&kv}, Tick{1}};
  constexpr int kDepth = 600;
  TrieNode* n = trie.root();
  for (int d = 0; d < kDepth; ++d) {
    n = trie.AppendChild(n, std::vector<TrieKey>{static_cast<TrieKey>(d)}, d + 1);
  }
  const std::vector<TrieNode*> active = {trie.root()};
  const std::vector<std::string> lines = Lines(DumpTrie(trie, active));
  ASSERT_EQ(lines.size(), static_cast<size_t>(kDepth + 2));
  for (int d = 1; d <= kDepth; ++d) {
    const std::string& line = lines[static_cast<size_t>(d + 1)];
    const std::string want = std::string(static_cast<size_t>(2 * d), ' ') + "[" +
                             std::to_string(d - 1) + "," + std::to_string(d) + ") ";
    ASSERT_EQ(line.rfind(want, 0), 0u) << "depth " << d << ": " << line;
  }
}

// A rotating snapshot restores to its to(); its from() is only the window's first position,
// so the dump must name to() (a recurrent snapshot's from() and to() are equal).
TEST(TrieExport, DumpNamesWholeStateSnapshotsByTheOffsetTheyRestoreTo) {
  KvCache kv;
  RotatingCache rot(4);
  RecurrentCache rec(RecurrentDims{});
  PrefixTrie trie{{&kv, &rot, &rec, nullptr}, Tick{1}};
  const std::vector<float> tags = tagged::Positions(0, 12);
  kv.Update(tagged::Keys(tags), tagged::Values(tags));
  rot.Update(tagged::Keys(tags), tagged::Values(tags));
  const RecurrentDims& d = rec.dims();
  rec.Get(DType::kFloat32);
  rec.Put(12, {Tensor::FromFloat(DType::kFloat32, MatF::Constant(d.conv_tail, d.conv_dim(), 1))},
          {MatF::Constant(d.delta_rows(), d.head_k_dim, 1)});
  std::vector<TrieKey> edge;
  for (TrieKey k = 1; k <= 12; ++k) edge.push_back(k);
  TrieNode* a = trie.AppendChild(trie.root(), edge, 12);
  std::vector<SnapshotPtr> snaps;
  snaps.push_back(kv.Snapshot(0));
  snaps.push_back(rot.Snapshot(0));
  snaps.push_back(rec.Snapshot(0));
  snaps.push_back(nullptr);
  // The case that tells to() from from(): a window that kept only the last positions.
  ASSERT_NE(snaps[1], nullptr);
  ASSERT_NE(snaps[1]->from(), snaps[1]->to());
  trie.SetSnapshots(a, std::move(snaps));
  const std::vector<TrieNode*> active = {trie.root(), a};
  const std::vector<std::string> lines = Lines(DumpTrie(trie, active));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[2].find(" snaps=[kv:[0,12) rot:@12 rec:@12 -] "), std::string::npos) << lines[2];
  const std::string dot = TrieToDot(trie, active);
  EXPECT_NE(dot.find("rot:@12 rec:@12"), std::string::npos) << dot;
}

TEST(TrieExport, DotMarksActivePathAndUserPointsAndRenders) {
  Fixture f;
  const std::vector<TrieNode*> active = {f.trie.root(), f.a, f.b};
  const std::string dot = TrieToDot(f.trie, active);
  EXPECT_EQ(dot.rfind("digraph trie {", 0), 0u);
  EXPECT_NE(dot.find("n2 [label=\"[3,13)"), std::string::npos) << dot;
  EXPECT_NE(dot.find("peripheries=2, style=bold, color=red"), std::string::npos) << dot;
  EXPECT_NE(dot.find("n1 -> n2 [style=bold, color=red];"), std::string::npos) << dot;
  EXPECT_NE(dot.find("n1 -> n3;"), std::string::npos) << dot;  // not on the active path
  if (std::system("command -v dot >/dev/null 2>&1") != 0) GTEST_SKIP() << "Graphviz not installed";
  const std::string in = ::testing::TempDir() + "trie_export_test.dot";
  const std::string out = ::testing::TempDir() + "trie_export_test.svg";
  std::ofstream(in) << dot;
  ASSERT_EQ(std::system(("dot -Tsvg " + in + " -o " + out).c_str()), 0) << dot;
  std::ifstream svg(out);
  const std::string rendered((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_NE(rendered.find("<svg"), std::string::npos);
  std::remove(in.c_str());
  std::remove(out.c_str());
}

// The DOT graph is the trie, not just a picture of one: every node appears once and every
// arrow runs from a node's real parent to it, whatever the tree's shape. Random trees, so
// that later siblings have children of their own and depths repeat under several parents
// (a fixture shaped like a chain cannot tell "the parent" from "some node above").
// Each edge's first key is unique, so a label names its node.
TEST(TrieExport, DotArrowsAreExactlyTheTreesParentLinks) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    KvCache kv;
    PrefixTrie trie{{&kv}, Tick{1}};
    Rng rng(seed);
    std::vector<TrieNode*> nodes = {trie.root()};
    std::map<TrieKey, TrieKey> parent_of;  // first key -> parent's first key (root: 0)
    for (TrieKey id = 1; id <= 40; ++id) {
      TrieNode* parent = nodes[rng.Below(nodes.size())];
      const int64_t len = rng.Range(1, 3);
      std::vector<TrieKey> edge;
      for (int64_t i = 0; i < len; ++i) edge.push_back(id * 100 + static_cast<TrieKey>(i));
      nodes.push_back(trie.AppendChild(parent, edge, parent->end_offset() + len));
      parent_of[id * 100] = parent->is_root() ? 0 : parent->edge().front();
    }
    const std::vector<TrieNode*> active = {trie.root()};
    const std::string dot = TrieToDot(trie, active);

    std::map<std::string, TrieKey> key_of_id;  // "n7" -> its first key (root: 0)
    const std::regex node_line(R"re(\s*(n\d+) \[label="(root|\[\d+,\d+\)\\n(\d+)))re");
    const std::regex arrow_line(R"re(\s*(n\d+) -> (n\d+)[ ;])re");
    std::map<TrieKey, TrieKey> drawn_parent_of;
    std::vector<std::pair<std::string, std::string>> arrows;
    for (const std::string& line : Lines(dot)) {
      std::smatch m;
      if (std::regex_search(line, m, arrow_line) && m.position(0) == 0) {
        arrows.emplace_back(m[1], m[2]);
      } else if (std::regex_search(line, m, node_line) && m.position(0) == 0) {
        ASSERT_EQ(key_of_id.count(m[1]), 0u) << "node drawn twice: " << line;
        key_of_id[m[1]] = m[2] == "root" ? 0 : std::stoull(m[3]);
      }
    }
    ASSERT_EQ(key_of_id.size(), nodes.size()) << "seed " << seed << "\n" << dot;
    for (const auto& [from, to] : arrows) {
      ASSERT_EQ(key_of_id.count(from) + key_of_id.count(to), 2u) << from << " -> " << to;
      const TrieKey child = key_of_id[to];
      ASSERT_EQ(drawn_parent_of.count(child), 0u) << "two arrows into " << to;
      drawn_parent_of[child] = key_of_id[from];
    }
    EXPECT_EQ(drawn_parent_of, parent_of) << "seed " << seed << "\n" << dot;
  }
}

}  // namespace
}  // namespace kvtwin
