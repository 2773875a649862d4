// Goal: multi-request timelines of the prefix-sharing manager. (1) The worked trace of spec
// §3.7 step by step, asserting every intermediate fact it states: matched / cached, which
// caches were rewound, freed or refused (read from each layer's RecordingCache log), node
// ranges after each split and where the recurrent states sit. (2) ollama's
// prefix_cache_scenario_test.go (spec §6.11) adapted to λ = 0 without a draft cache: the
// stack [recurrent, KV, recurrent, KV], a capture every 8 tokens and at len − 4 (requested by
// the caller, as the pipeline does).
// Method: real caches with (position, token)-tagged values (prefix_env.h); after every
// request the trie invariants, KV coverage of every node and every snapshot's content are
// re-derived, alignment never falls back to freeing every cache, and each begin satisfies
// cached >= matched − (8 + 4 + λ + last generation + dropped tokens), λ = 0. No randomness.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "src/prefix_cache.h"
#include "unit/prefix_env.h"

namespace kvtwin {
namespace {

using pcfx::Cat;
using pcfx::EnvKind;
using pcfx::PrefixEnv;
using pcfx::RecordingCache;
using pcfx::Seq;
using pcfx::SnapName;
using pcfx::Tokens;
using Log = std::vector<std::string>;

// "[start,end) kv-snapshot whole-state-snapshot" of a node in the [KV, recurrent] stack.
std::string Describe(const TrieNode* n) {
  return "[" + std::to_string(n->start_offset()) + "," + std::to_string(n->end_offset()) + ") " +
         SnapName(n->snapshot(0)) + " " + SnapName(n->snapshot(1));
}

TEST(PrefixCacheTrace, WorkedTraceOfSpec37) {
  PrefixEnv env(EnvKind::kRecurrent);  // caches = [KV, recurrent]
  PrefixCache& pc = env.pc();
  RecordingCache& kv = env.recorder(0);
  RecordingCache& rec = env.recorder(1);
  const TrieNode* root = env.trie().root();

  // 1. A = 1..8 generating [20, 21]: a miss; close pages out A = [0,9) at offset 9.
  const pcfx::RequestResult a = env.Request(Seq(1, 8), {20, 21});
  EXPECT_EQ(a.report.cached, 0);
  ASSERT_EQ(root->num_children(), 1u);
  const TrieNode* node_a = root->child(0);
  EXPECT_EQ(node_a->edge(), (std::vector<TrieKey>{1, 2, 3, 4, 5, 6, 7, 8, 20}));
  EXPECT_EQ(Describe(node_a), "[0,9) kv[0,9) rec@9");
  kv.TakeLog();
  rec.TakeLog();

  // 2. B = 1..5,10,11,12 matches 5 inside A. KV rewinds to 5; the recurrent layer cannot
  // and is freed; page-in of A stops at its refused state @9; alignment rewinds KV to 0.
  const Tokens b = Cat(Seq(1, 5), {10, 11, 12});
  const BeginReport rb = pc.Begin(b).value();
  EXPECT_EQ(rb.matched, 5);
  EXPECT_EQ(rb.cached, 0);
  EXPECT_EQ(rb.left, 8);
  EXPECT_EQ(kv.TakeLog(), (Log{"restore(null,5)=ok", "restore(null,0)=ok"}));
  EXPECT_EQ(rec.TakeLog(), (Log{"restore(null,5)=refused", "free", "restore(rec@9,5)=refused"}));
  EXPECT_EQ(pc.active_path(), std::vector<TrieNode*>{env.trie().root()});
  ASSERT_EQ(pc.pending().size(), 1u);
  EXPECT_EQ(pc.pending()[0].offset, 5);
  EXPECT_FALSE(pc.pending()[0].user) << "a branch point is not a user point";

  // 3. Prefill 1..7 with the schedule [5]; attach splits A into P = [0,5) (KV half, the
  // new recurrent capture @5) and A' = [5,9) (KV half, the old state @9).
  ASSERT_TRUE(pc.SchedulePrefillSnapshots({}).ok());
  EXPECT_EQ(kv.TakeLog(), Log{"prepare[5]"});
  EXPECT_EQ(rec.TakeLog(), Log{"prepare[5]"});
  env.Feed(std::span(b).first(7));
  ASSERT_TRUE(pc.AttachPrefillSnapshots().ok());
  ASSERT_EQ(root->num_children(), 1u);
  const TrieNode* p = root->child(0);
  EXPECT_EQ(Describe(p), "[0,5) kv[0,5) rec@5");
  EXPECT_FALSE(p->user());
  ASSERT_EQ(p->num_children(), 1u);
  EXPECT_EQ(Describe(p->child(0)), "[5,9) kv[5,9) rec@9");
  EXPECT_EQ(pc.active_path(), (std::vector<TrieNode*>{env.trie().root(), p->child(0)->parent()}));
  EXPECT_TRUE(env.TrieHolds());

  // 4. Decode 12, 30 (31 never forwarded); close at 9: B = [5,9) under P, paged out; P has
  // two children, so no compaction.
  ASSERT_TRUE(pc.AddOutputs(std::vector<int32_t>{30, 31}).ok());
  env.FeedEach(std::vector<int32_t>{12, 30});
  ASSERT_TRUE(pc.Close().ok());
  EXPECT_EQ(kv.TakeLog(), Log{"snapshot(5)=kv[5,9)"});
  EXPECT_EQ(rec.TakeLog(), Log{"snapshot(5)=rec@9"});
  ASSERT_EQ(p->num_children(), 2u);
  EXPECT_EQ(p->child(1)->edge(), (std::vector<TrieKey>{10, 11, 12, 30}));
  EXPECT_EQ(Describe(p->child(1)), "[5,9) kv[5,9) rec@9");
  EXPECT_TRUE(env.TrieHolds(true, /*at_offset=*/true));

  // 5. C = 1..8,40,41 matches 8 (P whole, A' 3 of 4). KV rewinds to the ancestor 5, the
  // recurrent layer (at 9) is freed; page-in: P gives the state @5, A' refills KV to 8 and
  // refuses the state @9 at 8; alignment brings KV back to 5.
  const Tokens c = Cat(Seq(1, 8), {40, 41});
  const BeginReport rc = pc.Begin(c).value();
  EXPECT_EQ(rc.matched, 8);
  EXPECT_EQ(rc.cached, 5);
  EXPECT_EQ(kv.TakeLog(),
            (Log{"restore(null,5)=ok", "restore(kv[5,9),8)=ok", "restore(null,5)=ok"}));
  EXPECT_EQ(rec.TakeLog(), (Log{"restore(null,5)=refused", "free", "restore(rec@5,5)=ok",
                                "restore(rec@9,8)=refused"}));
  EXPECT_EQ(pc.active_path().back(), p);
  ASSERT_EQ(pc.pending().size(), 1u);
  EXPECT_EQ(pc.pending()[0].offset, 8);

  // Prefill 6,7,8,40 with the capture at 8: A' splits into [5,8) (KV half + state @8) and
  // [8,9) (KV half + the old state @9); close at 9 adds [8,9) for key 40.
  ASSERT_TRUE(pc.SchedulePrefillSnapshots({}).ok());
  env.Feed(std::span(c).subspan(5, 4));
  ASSERT_TRUE(pc.AttachPrefillSnapshots().ok());
  const TrieNode* mid = p->child(0);
  EXPECT_EQ(Describe(mid), "[5,8) kv[5,8) rec@8");
  ASSERT_EQ(mid->num_children(), 1u);
  EXPECT_EQ(Describe(mid->child(0)), "[8,9) kv[8,9) rec@9");
  ASSERT_TRUE(pc.Close().ok());
  ASSERT_EQ(mid->num_children(), 2u);
  EXPECT_EQ(mid->child(1)->edge(), std::vector<TrieKey>{40});
  EXPECT_EQ(Describe(mid->child(1)), "[8,9) kv[8,9) rec@9");
  EXPECT_TRUE(env.LiveHolds(Cat(Seq(1, 8), {40})));
  EXPECT_TRUE(env.TrieHolds(true, /*at_offset=*/true));
}

// ---- spec §6.11 at λ = 0 ---------------------------------------------------------------

constexpr int64_t kInterval = 8;
constexpr int64_t kPreThinking = 4;

// The capture offsets the caller requests for a prompt: every 8 tokens and len − 4.
std::vector<int64_t> Periodic(int64_t prompt_len) {
  std::vector<int64_t> offsets;
  for (int64_t o = kInterval; o < prompt_len; o += kInterval) offsets.push_back(o);
  if (prompt_len - kPreThinking > 0) offsets.push_back(prompt_len - kPreThinking);
  return offsets;
}

// How far a restore may trail its match: the capture cadence, λ (0) and the tokens
// generated or dropped since the last prompt, which have no capture of their own.
int64_t RestoreBound(int64_t last_gen, int64_t dropped) {
  return kInterval + kPreThinking + 0 + last_gen + dropped;
}

class PrefixCacheScenario : public ::testing::Test {
 protected:
  Tokens Fresh(int n) {
    Tokens t;
    for (int i = 0; i < n; ++i) t.push_back(++last_token_);
    return t;
  }
  BeginReport Run(const Tokens& inputs, const Tokens& generated) {
    const BeginReport r =
        env_.Request(inputs, generated, Periodic(static_cast<int64_t>(inputs.size()))).report;
    EXPECT_FALSE(r.free_all) << "alignment freed every cache";
    return r;
  }
  // A prefill cancelled once the caches reach `stop`, in chunks of 9: close without attach.
  BeginReport Cancel(const Tokens& inputs, int64_t stop) {
    const BeginReport r = env_.pc().Begin(inputs).value();
    EXPECT_FALSE(r.free_all);
    const std::vector<int64_t> requested = Periodic(static_cast<int64_t>(inputs.size()));
    EXPECT_TRUE(env_.pc().SchedulePrefillSnapshots(requested).ok());
    for (int64_t off = r.cached; off < stop;) {
      const int64_t n = std::min<int64_t>(9, stop - off);
      env_.Feed(std::span(inputs).subspan(off, n));
      off += n;
    }
    EXPECT_TRUE(env_.pc().Close().ok());
    EXPECT_TRUE(env_.LiveHolds(Tokens(inputs.begin(), inputs.begin() + stop)));
    EXPECT_TRUE(env_.TrieHolds(true, /*at_offset=*/true));
    return r;
  }
  std::vector<int64_t> NodeEnds() const {
    std::vector<int64_t> ends;
    env_.trie().Walk([&](TrieNode* n) {
      if (!n->is_root()) ends.push_back(n->end_offset());
    });
    return ends;
  }

  PrefixEnv env_{EnvKind::kHybrid};
  int32_t last_token_ = 0;
};

TEST_F(PrefixCacheScenario, ScenarioConversationTurns) {
  struct Turn {
    int keep_gen;  // previous generation kept in the prompt (-1 = all)
    int new_tail;
    int gen_len;
    bool away;  // an unrelated session runs before this turn
  };
  const std::vector<Turn> turns = {
      {3, 9, 6, false}, {-1, 4, 5, false}, {4, 6, 7, false}, {-1, 5, 6, false}, {5, 8, 8, false},
      {4, 7, 6, true},  {-1, 6, 7, false}, {3, 8, 6, false}, {-1, 5, 5, false}, {4, 9, 6, false},
  };
  Tokens stream = Fresh(50);  // the committed conversation, minus the latest response
  Tokens last_gen = Fresh(6);
  Run(stream, last_gen);
  for (size_t i = 0; i < turns.size(); ++i) {
    SCOPED_TRACE("turn " + std::to_string(i));
    const Turn& t = turns[i];
    if (t.away) Run(Fresh(24), Fresh(4));
    const int kept = t.keep_gen < 0 ? static_cast<int>(last_gen.size()) : t.keep_gen;
    const int64_t dropped = static_cast<int64_t>(last_gen.size()) - kept;
    const Tokens prompt =
        Cat(Cat(stream, Tokens(last_gen.begin(), last_gen.begin() + kept)), Fresh(t.new_tail));
    const Tokens gen = Fresh(t.gen_len);
    const BeginReport r = Run(prompt, gen);
    if (dropped == 0 && !t.away) {
      EXPECT_EQ(r.cached, r.matched) << "an extension resumes exactly";
    }
    EXPECT_GE(r.cached, r.matched - RestoreBound(static_cast<int64_t>(last_gen.size()), dropped));
    stream = prompt;
    last_gen = gen;
  }
  EXPECT_TRUE(env_.TrieHolds());
}

TEST_F(PrefixCacheScenario, ScenarioCancelledPrefills) {
  const Tokens prompt = Fresh(47);  // captures requested at 8 16 24 32 40 43
  const BeginReport first = Cancel(prompt, 18);
  EXPECT_EQ(first.cached, 0);
  // The captures the cancelled prefill crossed (8, 16; user points) plus the frontier 18.
  EXPECT_EQ(NodeEnds(), (std::vector<int64_t>{8, 16, 18}));

  // A probe sharing 18 tokens. At λ = 0 it matches all 18 and resumes exactly at the
  // frontier (at λ = 1 its pair key 17 differs: matched 17, cached 15).
  const Tokens probe = Cat(Tokens(prompt.begin(), prompt.begin() + 18), Fresh(10));
  const BeginReport p = Run(probe, Fresh(3));
  EXPECT_EQ(p.matched, 18);
  EXPECT_EQ(p.cached, 18);

  // The retry matches 18 but resumes at 16: the probe's capture at 24 became a user child of
  // the plain frontier node [16,18), and compaction folded that node into it, taking its
  // recurrent states @18 along. The pending branch point re-creates the restore point at 18.
  const BeginReport retry = Cancel(prompt, 36);
  EXPECT_EQ(retry.matched, 18);
  EXPECT_EQ(retry.cached, 16);
  EXPECT_EQ(NodeEnds(), (std::vector<int64_t>{8, 16, 18, 24, 30, 24, 32, 36}));

  const BeginReport full = Run(prompt, Fresh(5));
  EXPECT_EQ(full.matched, 36);
  EXPECT_EQ(full.cached, 36);
  EXPECT_TRUE(env_.TrieHolds());
}

TEST_F(PrefixCacheScenario, ScenarioDivergentCancels) {
  const Tokens turn1 = Fresh(30);  // captures at 8 16 24 26
  const Tokens gen1 = Fresh(5);
  Run(turn1, gen1);

  // Cancelled, diverging between the captures at 16 and 24: the recurrent layers resume
  // from the user point at 16.
  const Tokens between = Cat(Tokens(turn1.begin(), turn1.begin() + 20), Fresh(15));
  BeginReport r = Cancel(between, 28);
  EXPECT_EQ(r.matched, 20);
  EXPECT_EQ(r.cached, 16);
  EXPECT_GE(r.cached, r.matched - RestoreBound(5, 0));

  // The conversation goes on with the whole response: it resumes exactly at its frontier
  // 30 + 5 - 1 = 34 (the cancelled branch did not disturb it).
  const Tokens turn2 = Cat(Cat(turn1, gen1), Fresh(8));
  const Tokens gen2 = Fresh(6);
  r = Run(turn2, gen2);
  EXPECT_EQ(r.matched, 34);
  EXPECT_EQ(r.cached, 34);

  // Cancelled, diverging below the first capture: nothing whole-state below 5, so 0.
  const Tokens below = Cat(Tokens(turn1.begin(), turn1.begin() + 5), Fresh(20));
  r = Cancel(below, 14);
  EXPECT_EQ(r.matched, 5);
  EXPECT_EQ(r.cached, 0);
  EXPECT_GE(r.cached, r.matched - RestoreBound(6, 0));

  // The full conversation again resumes exactly at its frontier 43 + 6 - 1 = 48.
  r = Run(Cat(Cat(turn2, gen2), Fresh(6)), Fresh(4));
  EXPECT_EQ(r.matched, 48);
  EXPECT_EQ(r.cached, 48);
  EXPECT_TRUE(env_.TrieHolds());
}

}  // namespace
}  // namespace kvtwin
