// Goal: pin the reference prefix-sharing manager (model/ref_prefix_cache.h) to the spec,
// since the simulator trusts it as the oracle for the production manager: the worked trace
// of cache-semantics.md §3.7 step by step, and the λ = 0 scenarios of §6.10 that need no
// media and no eviction (continuation, divergence, hold-back, user points, cancelled
// prefills, branch switches, whole-state layers landing on node ends), and where the
// eviction policy runs under a byte budget over the reference's own sizes (spec §3.4 "Eviction").
// Method: requests are served as §6.10 simulates them (begin, schedule, prefill
// inputs[prefix : len-1], attach, decode seed + all sampled tokens but the last, close);
// expectations (Begin reports, live cache logs, pending captures, the rendered trie with
// its LRU ranks) are hand-derived from the spec text, never from the code under test.
#include "model/ref_prefix_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/ref_trie.h"

namespace kvtwin::model {
namespace {

using Ids = std::vector<int32_t>;

// Tokens with a rolling hash of their prefix, so that a log restored from the wrong branch
// differs from the expected one even where the ids agree.
TokenLog Toks(const Ids& ids) {
  TokenLog log;
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids) {
    h = (h ^ static_cast<uint64_t>(id)) * 0x100000001b3ull;
    log.push_back(Token{id, h});
  }
  return log;
}

Ids Range(int32_t first, int32_t last) {
  Ids ids;
  for (int32_t i = first; i <= last; ++i) ids.push_back(i);
  return ids;
}

Ids Cat(Ids a, const Ids& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TokenLog Slice(const TokenLog& log, int64_t begin, int64_t end) {
  return TokenLog(log.begin() + begin, log.begin() + end);
}

struct Request {
  Ids prompt;
  Ids gen;                    // sampled tokens; all but the last are forwarded
  std::vector<int64_t> user;  // requested restore points
  int64_t cancel_at = -1;     // >= 0: prefill stops there and the session closes
};

RefBeginReport Open(RefPrefixCache& pc, const Request& r) {
  const RefBeginReport rep = pc.Begin(Toks(r.prompt));
  pc.SchedulePrefillSnapshots(r.user);
  return rep;
}

void Finish(RefPrefixCache& pc, const Request& r, const RefBeginReport& rep) {
  const TokenLog all = Toks(Cat(r.prompt, r.gen));
  const int64_t len = static_cast<int64_t>(r.prompt.size());
  const int64_t stop = r.cancel_at >= 0 ? r.cancel_at : len - 1;
  if (rep.cached < stop) pc.Forward(Slice(all, rep.cached, stop));
  if (r.cancel_at < 0) {
    pc.AttachPrefillSnapshots();
    for (int64_t p = len - 1; p + 1 < static_cast<int64_t>(all.size()); ++p) {
      pc.Forward(Slice(all, p, p + 1));
    }
    pc.AddOutputs(Slice(all, len, static_cast<int64_t>(all.size())));
  }
  pc.Close();
}

RefBeginReport Serve(RefPrefixCache& pc, const Request& r) {
  const RefBeginReport rep = Open(pc, r);
  Finish(pc, r, rep);
  return rep;
}

std::string Report(const RefBeginReport& r) {
  return "total=" + std::to_string(r.total) + " matched=" + std::to_string(r.matched) +
         " cached=" + std::to_string(r.cached) + " left=" + std::to_string(r.left) +
         (r.free_all ? " free-all" : "");
}

// Pending captures as "5 8u" (u = user point).
std::string PendingText(const RefPrefixCache& pc) {
  std::string out;
  for (const auto& p : pc.pending()) {
    out += (out.empty() ? "" : " ") + std::to_string(p.offset) + (p.user ? "u" : "");
  }
  return out;
}

std::string Trie(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

std::string Render(const RefPrefixCache& pc) { return RenderRefTrie(pc.root(), false); }

TokenLog LogOf(const RefPrefixCache& pc, size_t i) {
  const std::span<const Token> log = pc.caches()[i]->log();
  return TokenLog(log.begin(), log.end());
}

RefPrefixCache KvRecurrent() { return RefPrefixCache({RefCache::Kv(), RefCache::Recurrent()}); }

// §3.7 requests.
const Request kA{Range(1, 8), {20, 21}, {}};
const Request kB{{1, 2, 3, 4, 5, 10, 11, 12}, {30, 31}, {}};
const Request kC{Cat(Range(1, 8), {40, 41}), {}, {}};

TEST(RefPrefixCacheTrace, RequestAMissesAndPagesOutTheFrontier) {
  RefPrefixCache pc = KvRecurrent();
  const RefBeginReport rep = Open(pc, kA);
  EXPECT_EQ(Report(rep), "total=8 matched=0 cached=0 left=8");
  EXPECT_EQ(PendingText(pc), "");
  Finish(pc, kA, rep);
  EXPECT_EQ(Render(pc),
            Trie({"[0,0) keys t0", "  [0,9) keys 1 2 3 4 5 6 7 8 20 t1 | kv[0,9) | rec@9"}));
  const RefNode& a = *pc.root().children[0];
  EXPECT_EQ(a.snaps[0]->tokens, Toks(Cat(Range(1, 8), {20})));
  EXPECT_EQ(a.snaps[1]->tokens, Toks(Cat(Range(1, 8), {20})));
  EXPECT_EQ(a.bytes, (std::vector<int64_t>{0, 0}));
  EXPECT_FALSE(pc.session_open());
}

TEST(RefPrefixCacheTrace, RequestBDivergesInsideAAndSplitsIt) {
  RefPrefixCache pc = KvRecurrent();
  Serve(pc, kA);
  const RefBeginReport rep = Open(pc, kB);
  // KV rewinds to 5, the recurrent state@9 cannot: freed, page-in stops, align to 0.
  EXPECT_EQ(Report(rep), "total=8 matched=5 cached=0 left=8");
  EXPECT_TRUE(LogOf(pc, 0).empty());
  EXPECT_TRUE(LogOf(pc, 1).empty());
  ASSERT_EQ(pc.active_path().size(), 1u);
  EXPECT_EQ(PendingText(pc), "5");
  Finish(pc, kB, rep);
  EXPECT_EQ(Render(pc), Trie({"[0,0) keys t1", "  [0,5) keys 1 2 3 4 5 t2 | kv[0,5) | rec@5",
                              "    [5,9) keys 6 7 8 20 t0 | kv[5,9) | rec@9",
                              "    [5,9) keys 10 11 12 30 t3 | kv[5,9) | rec@9"}));
  // The recurrent capture at 5 is B's own state, the KV half is A's (same ids and hashes).
  EXPECT_EQ(pc.root().children[0]->snaps[1]->tokens, Toks(Range(1, 5)));
}

TEST(RefPrefixCacheTrace, RequestCRestoresToPAndSplitsATail) {
  RefPrefixCache pc = KvRecurrent();
  Serve(pc, kA);
  Serve(pc, kB);
  const RefBeginReport rep = Open(pc, kC);
  // P pages the recurrent state@5 in, A' brings KV to 8 and refuses state@9 at 8.
  EXPECT_EQ(Report(rep), "total=10 matched=8 cached=5 left=5");
  EXPECT_EQ(LogOf(pc, 0), Toks(Range(1, 5)));
  EXPECT_EQ(LogOf(pc, 1), Toks(Range(1, 5)));
  EXPECT_EQ(pc.active_path().back()->end, 5);
  EXPECT_EQ(PendingText(pc), "8");
  Finish(pc, kC, rep);
  EXPECT_EQ(Render(pc), Trie({"[0,0) keys t1", "  [0,5) keys 1 2 3 4 5 t3 | kv[0,5) | rec@5",
                              "    [5,8) keys 6 7 8 t4 | kv[5,8) | rec@8",
                              "      [8,9) keys 20 t0 | kv[8,9) | rec@9",
                              "      [8,9) keys 40 t5 | kv[8,9) | rec@9",
                              "    [5,9) keys 10 11 12 30 t2 | kv[5,9) | rec@9"}));
  EXPECT_EQ(LogOf(pc, 0), Toks(Cat(Range(1, 8), {40})));
}

TEST(RefPrefixCache, RewindableCacheResumesAtTheDivergenceWithoutBranchPoint) {
  RefPrefixCache pc({RefCache::Kv()});
  Serve(pc, kA);
  const RefBeginReport rep = Open(pc, kB);
  EXPECT_EQ(Report(rep), "total=8 matched=5 cached=5 left=3");
  EXPECT_EQ(LogOf(pc, 0), Toks(Range(1, 5)));
  EXPECT_EQ(PendingText(pc), "");
  Finish(pc, kB, rep);
  // The split happens at close, when advancing from the root; P keeps A's old tick.
  EXPECT_EQ(Render(pc), Trie({"[0,0) keys t1", "  [0,5) keys 1 2 3 4 5 t0 | kv[0,5)",
                              "    [5,9) keys 6 7 8 20 t0 | kv[5,9)",
                              "    [5,9) keys 10 11 12 30 t2 | kv[5,9)"}));
}

TEST(RefPrefixCache, ContinuationResumesExactlyAndCompactsIntoOneNode) {
  RefPrefixCache pc = KvRecurrent();
  Serve(pc, {Range(1, 5), {10, 11}, {}});
  const Request turn2{Cat(Range(1, 5), {10, 11, 20}), {21, 22}, {}};
  const RefBeginReport rep = Open(pc, turn2);
  EXPECT_EQ(Report(rep), "total=8 matched=6 cached=6 left=2");
  EXPECT_EQ(LogOf(pc, 1), Toks(Cat(Range(1, 5), {10})));
  EXPECT_EQ(PendingText(pc), "");
  Finish(pc, turn2, rep);
  EXPECT_EQ(Render(pc),
            Trie({"[0,0) keys t0", "  [0,9) keys 1 2 3 4 5 10 11 20 21 t1 | kv[0,9) | rec@9"}));
  EXPECT_EQ(pc.root().children[0]->snaps[0]->tokens, Toks(Cat(Range(1, 5), {10, 11, 20, 21})));
}

// Memory, not semantics: every layer writes the same tokens, so the stack's logs share one
// buffer, after a fresh start, a continuation and a switch back to a conversation that the
// KV layers restore edge by edge from the trie (SharedLog::SameTokensAs, AppendLike, Concat).
TEST(RefPrefixCache, TheLayersOfAStackShareOneLogBuffer) {
  RefPrefixCache pc({RefCache::Kv(), RefCache::Rotating(3), RefCache::Recurrent(), RefCache::Kv()});
  const auto expect_one_buffer = [&](const char* when) {
    for (size_t i = 1; i < pc.caches().size(); ++i) {
      EXPECT_EQ(pc.caches()[i]->log().data(), pc.caches()[0]->log().data())
          << when << ", layer " << i;
      EXPECT_EQ(LogOf(pc, i), LogOf(pc, 0)) << when << ", layer " << i;
    }
  };
  const Request a{Range(1, 9), {50, 51}, {4}};
  Serve(pc, a);
  expect_one_buffer("fresh start");
  const Request a2{Cat(Range(1, 9), Range(60, 66)), {70, 71}, {12}};
  Serve(pc, a2);
  expect_one_buffer("continuation");
  Serve(pc, {Range(200, 210), {220, 221}, {}});
  expect_one_buffer("another conversation");
  const Request a3{Cat(Cat(Range(1, 9), Range(60, 66)), Range(80, 84)), {90, 91}, {}};
  const RefBeginReport rep = Open(pc, a3);
  EXPECT_GT(rep.cached, 9);
  Finish(pc, a3, rep);
  expect_one_buffer("switch back");
}

TEST(RefPrefixCache, ExactlyMatchedPromptHoldsBackItsLastToken) {
  const Request same{Range(1, 5), {20, 21}, {}};
  RefPrefixCache kv({RefCache::Kv()});
  Serve(kv, same);
  EXPECT_EQ(Report(Serve(kv, same)), "total=5 matched=5 cached=4 left=1");
  RefPrefixCache pc = KvRecurrent();
  Serve(pc, same);
  const RefBeginReport rep = Open(pc, same);
  EXPECT_EQ(Report(rep), "total=5 matched=5 cached=0 left=5");
  EXPECT_EQ(PendingText(pc), "4");  // the re-matched 4, not the reported 5
  Finish(pc, same, rep);
  // The branch point at 4 is not a user point: close re-merges it with [4,6).
  EXPECT_EQ(Render(pc), Trie({"[0,0) keys t0", "  [0,6) keys 1 2 3 4 5 20 t1 | kv[0,6) | rec@6"}));
  EXPECT_EQ(pc.root().children[0]->snaps[0]->tokens, Toks(Cat(Range(1, 5), {20})));
}

TEST(RefPrefixCache, UserPointResistsCompaction) {
  const Request same{Range(1, 5), {20, 21}, {}};
  RefPrefixCache pc = KvRecurrent();
  Serve(pc, same);
  const Request with_user{Range(1, 5), {20, 21}, {4, 9, 0}};  // 9 and 0 are out of range
  const RefBeginReport rep = Open(pc, with_user);
  EXPECT_EQ(PendingText(pc), "4u");  // the branch point upgraded, not duplicated
  Finish(pc, with_user, rep);
  EXPECT_EQ(Render(pc), Trie({"[0,0) keys t0", "  [0,4) keys 1 2 3 4 user t1 | kv[0,4) | rec@4",
                              "    [4,6) keys 5 20 t2 | kv[4,6) | rec@6"}));
}

TEST(RefPrefixCache, CancelledPrefillKeepsTheCapturesItCrossed) {
  RefPrefixCache pc = KvRecurrent();
  Serve(pc, {Range(1, 8), {}, {3, 6}, 4});
  EXPECT_EQ(Render(pc), Trie({"[0,0) keys t0", "  [0,3) keys 1 2 3 user t1 | kv[0,3) | rec@3",
                              "    [3,4) keys 4 t2 | kv[3,4) | rec@4"}));
  const Request retry{Range(1, 8), {60, 61}, {5}};
  const RefBeginReport rep = Open(pc, retry);
  EXPECT_EQ(Report(rep), "total=8 matched=4 cached=4 left=4");
  EXPECT_EQ(PendingText(pc), "5u");
  Finish(pc, retry, rep);
  // [3,4) is not a user point: it merges with the capture at 5, which is one.
  EXPECT_EQ(Render(pc), Trie({"[0,0) keys t0", "  [0,3) keys 1 2 3 user t1 | kv[0,3) | rec@3",
                              "    [3,5) keys 4 5 user t2 | kv[3,5) | rec@5",
                              "      [5,9) keys 6 7 8 60 t3 | kv[5,9) | rec@9"}));
}

TEST(RefPrefixCache, CaptureBeyondTheReachedOffsetIsDropped) {
  RefPrefixCache pc = KvRecurrent();
  const Request r{Range(1, 5), {}, {3, 5}};
  const RefBeginReport rep = Open(pc, r);
  EXPECT_EQ(PendingText(pc), "3u 5u");
  Finish(pc, r, rep);  // prefill to 4: the capture at 5 is never crossed
  EXPECT_EQ(Render(pc), Trie({"[0,0) keys t0", "  [0,3) keys 1 2 3 user t1 | kv[0,3) | rec@3",
                              "    [3,4) keys 4 t2 | kv[3,4) | rec@4"}));
  EXPECT_FALSE(pc.caches()[0]->ScheduleActive());
  EXPECT_FALSE(pc.caches()[1]->ScheduleActive());
}

TEST(RefPrefixCache, BranchSwitchPagesTheOtherBranchIn) {
  RefPrefixCache pc = KvRecurrent();
  Serve(pc, {Range(1, 5), {10, 11}, {}});
  Serve(pc, {{1, 2, 3, 6, 7}, {12, 13}, {}});
  EXPECT_EQ(Render(pc), Trie({"[0,0) keys t1", "  [0,3) keys 1 2 3 t2 | kv[0,3) | rec@3",
                              "    [3,6) keys 4 5 10 t0 | kv[3,6) | rec@6",
                              "    [3,6) keys 6 7 12 t3 | kv[3,6) | rec@6"}));
  const Request back{Cat(Range(1, 5), {10, 11, 20}), {21, 22}, {}};
  const RefBeginReport rep = Open(pc, back);
  EXPECT_EQ(Report(rep), "total=8 matched=6 cached=6 left=2");
  EXPECT_EQ(LogOf(pc, 0), Toks(Cat(Range(1, 5), {10})));
  EXPECT_EQ(LogOf(pc, 1), Toks(Cat(Range(1, 5), {10})));
  Finish(pc, back, rep);
  // Only the landing node and the frontier were refreshed; B keeps its age.
  EXPECT_EQ(Render(pc), Trie({"[0,0) keys t0", "  [0,3) keys 1 2 3 t1 | kv[0,3) | rec@3",
                              "    [3,9) keys 4 5 10 11 20 21 t3 | kv[3,9) | rec@9",
                              "    [3,6) keys 6 7 12 t2 | kv[3,6) | rec@6"}));
}

TEST(RefPrefixCache, WholeStateLayersLandOnNodeEnds) {
  RefPrefixCache pc({RefCache::Kv(), RefCache::Rotating(4), RefCache::Recurrent()});
  Serve(pc, {Range(1, 8), {20, 21}, {4}});
  const Request b{Cat(Range(1, 7), {50}), {51, 52}, {}};
  const RefBeginReport rep = Open(pc, b);
  // KV could reach 7; the wrapped window and the recurrent state only reach U's end 4.
  EXPECT_EQ(Report(rep), "total=8 matched=7 cached=4 left=4");
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(LogOf(pc, i), Toks(Range(1, 4))) << "cache " << i;
  EXPECT_EQ(PendingText(pc), "7");
  Finish(pc, b, rep);
  EXPECT_EQ(Render(pc),
            Trie({"[0,0) keys t0", "  [0,4) keys 1 2 3 4 user t2 | kv[0,4) | rot[0,4) | rec@4",
                  "    [4,7) keys 5 6 7 t3 | kv[4,7) | rot[3,7) | rec@7",
                  "      [7,9) keys 8 20 t1 | kv[7,9) | rot[4,9) | rec@9",
                  "      [7,9) keys 50 51 t4 | kv[7,9) | rot[7,9) | rec@9"}));
  // The window snapshots' labels (spec §2.2): a capture at o covers [o - min(o, W), o), a
  // page-out is Snapshot(node start), and a split hands the whole window to the child, so
  // the first leaf keeps the label of the page-out [4, 9) it was cut from.
}

TEST(RefPrefixCache, RotatingLayerRewindsLiveOnlyWithinItsWindow) {
  RefPrefixCache wide({RefCache::Kv(), RefCache::Rotating(16)});
  Serve(wide, {Range(1, 8), {20, 21}, {4}});
  EXPECT_EQ(Report(Serve(wide, {Cat(Range(1, 7), {50}), {51, 52}, {}})),
            "total=8 matched=7 cached=7 left=1");
  RefPrefixCache small({RefCache::Kv(), RefCache::Rotating(4)});
  Serve(small, {{1, 2, 3}, {20, 21}, {}});  // node [0,4) ends within the window
  const RefBeginReport rep = Open(small, {{1, 2, 9}, {30, 31}, {}});
  EXPECT_EQ(Report(rep), "total=3 matched=2 cached=2 left=1");
  EXPECT_EQ(LogOf(small, 1), Toks({1, 2}));
}

TEST(RefPrefixCache, StatelessHolesKeepEmptySlots) {
  RefPrefixCache pc({RefCache::Recurrent(), std::nullopt, RefCache::Kv(), std::nullopt});
  Serve(pc, kA);
  EXPECT_EQ(Report(Serve(pc, kB)), "total=8 matched=5 cached=0 left=8");
  EXPECT_EQ(Render(pc),
            Trie({"[0,0) keys t1", "  [0,5) keys 1 2 3 4 5 t2 | rec@5 | - | kv[0,5) | -",
                  "    [5,9) keys 6 7 8 20 t0 | rec@9 | - | kv[5,9) | -",
                  "    [5,9) keys 10 11 12 30 t3 | rec@9 | - | kv[5,9) | -"}));
}

// Begin's matched_positions name the match of the whole prompt by each node's place among
// its siblings: across a root wider than one block of the vector scan (64 keys), at the
// block edges and in the tail, through a split, and nothing for a prompt no child starts.
// Each Begin runs on a fresh trie, since a served prompt would grow it.
TEST(RefPrefixCache, BeginNamesTheMatchedPathByChildPositions) {
  const auto positions = [](bool split, const Ids& prompt) {
    RefPrefixCache pc({RefCache::Kv()});
    for (int32_t i = 0; i < 70; ++i) Serve(pc, {{100 + i, 1, 2, 3}, {9}, {}});
    EXPECT_EQ(pc.root().children.size(), 70u);
    // Splits child 65 after key 1; the new branch is its second child.
    if (split) Serve(pc, {{165, 1, 7, 7}, {9}, {}});
    return pc.Begin(Toks(prompt)).matched_positions;
  };
  for (const int32_t i : {0, 1, 63, 64, 65, 69}) {
    EXPECT_EQ(positions(false, Ids{100 + i, 1, 2}), std::vector<size_t>{size_t(i)});
  }
  EXPECT_TRUE(positions(false, Ids{99, 1}).empty());
  EXPECT_TRUE(positions(false, Ids{170}).empty());
  // Every key matched: the hold-back's match of {165, 1} would stop at child 65.
  EXPECT_EQ(positions(true, Ids{165, 1, 7}), (std::vector<size_t>{65, 1}));
  EXPECT_EQ(positions(true, Ids{165, 1, 2}), (std::vector<size_t>{65, 0}));
  EXPECT_EQ(positions(true, Ids{165}), std::vector<size_t>{65});
}

// Eviction (spec §3.4) under `budget`, at 1 B per KV row and 10 B per recurrent state:
// each policy point the session reaches as "<paged-out bytes>" or "<bytes> pass".
void BudgetAndRecordPoints(RefPrefixCache& pc, int64_t budget, std::vector<std::string>& points) {
  std::vector<int64_t> units;
  for (const auto& c : pc.caches()) units.push_back(c && c->kind() == RefKind::kRecurrent ? 10 : 1);
  pc.set_budget(budget, units);
  pc.set_policy_hook([&points](RefNode&, std::optional<int64_t> paged_out, bool pass) {
    points.push_back(std::to_string(paged_out.value_or(-1)) + (pass ? " pass" : ""));
  });
}

TEST(RefPrefixCacheEviction, RunsAtTheSwitchAndThePageOutOverTheChargedSizes) {
  RefPrefixCache pc = KvRecurrent();
  std::vector<std::string> points;
  BudgetAndRecordPoints(pc, 30, points);
  Serve(pc, kA);  // nothing pending: the attach returns before its point
  // Begin over an empty trie; the page-out of kv[0,9) (9 B) and rec@9 (10 B).
  EXPECT_EQ(points, (std::vector<std::string>{"0", "19"}));
  // Begin: 19 B, within 30. The page-out of D's frontier adds kv[0,5) and rec@5: 34 B, and
  // A is the only node off the active path.
  Serve(pc, {{50, 51, 52, 53}, {60, 61}, {}});
  EXPECT_EQ(points, (std::vector<std::string>{"0", "19", "19", "34 pass"}));
  EXPECT_EQ(Render(pc),
            Trie({"[0,0) keys t0", "  [0,5) keys 50 51 52 53 60 t1 | kv[0,5) | rec@5"}));
}

TEST(RefPrefixCacheEviction, AnAttachWithOffsetsPendingIsAPoint) {
  RefPrefixCache pc({RefCache::Kv()});
  std::vector<std::string> points;
  BudgetAndRecordPoints(pc, int64_t{1} << 40, points);
  Serve(pc, {Range(1, 8), {20, 21}, {4}});
  // Begin, the attach of kv[0,4), the page-out of kv[4,9).
  EXPECT_EQ(points, (std::vector<std::string>{"0", "4", "9"}));
}

// The switch trims A off the active path (the caches align at 5 inside its edge), so its
// pass evicts A; the capture at 8 began at 5, but the attach's node starts at 0. The slot
// is the live cache's slice of the whole edge (the placement convention of spec §3.1), as
// production's documented decision; the literal clip would install kv[5,8).
TEST(RefPrefixCacheEviction, AKvCaptureWhoseEdgeHeadWasEvictedIsSlicedFromTheLiveCache) {
  RefPrefixCache pc({RefCache::Kv()});
  std::vector<std::string> points;
  BudgetAndRecordPoints(pc, 5, points);
  Serve(pc, kA);
  const Request e{{1, 2, 3, 4, 5, 70, 71, 72, 73}, {80}, {8}};
  const RefBeginReport rep = Open(pc, e);
  EXPECT_EQ(Report(rep), "total=9 matched=5 cached=5 left=4");
  EXPECT_TRUE(pc.root().children.empty());
  EXPECT_EQ(PendingText(pc), "8u");
  Finish(pc, e, rep);
  EXPECT_EQ(Render(pc), Trie({"[0,0) keys t0", "  [0,8) keys 1 2 3 4 5 70 71 72 user t1 | kv[0,8)",
                              "    [8,9) keys 73 t2 | kv[8,9)"}));
  EXPECT_EQ(pc.root().children[0]->snaps[0]->tokens, Slice(Toks(e.prompt), 0, 8));
}

TEST(RefPrefixCacheDeathTest, MisuseAborts) {
  RefPrefixCache pc = KvRecurrent();
  EXPECT_DEATH(pc.Begin({}), "empty prompt");
  EXPECT_DEATH(pc.Close(), "without an open session");
  pc.Begin(Toks({1, 2}));
  EXPECT_DEATH(pc.Begin(Toks({1, 2})), "session is open");
  pc.SchedulePrefillSnapshots({});
  EXPECT_DEATH(pc.SchedulePrefillSnapshots({}), "twice");
}

}  // namespace
}  // namespace kvtwin::model
