// Goal: the request-level simulator passes on the correct prefix manager across every
// preset and dtype, with and without an eviction budget; it is deterministic; its
// workload reaches the mechanisms it exists for; and its trie and live checks fire on a
// snapshot or live cache that holds another branch's state. Method: pinned seeds through
// RunRequests (no divergence, counters above zero, equal digests twice); hand-built tries
// whose snapshots were captured on a look-alike branch (same tokens except one), and a
// live cache rewritten from such a branch right after Begin, must be reported with the
// decoded provenance of the wrong rows.
#include "sim/requests.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "sim/cache_calls.h"
#include "sim/run.h"
#include "sim/stack.h"
#include "sim/switch_reference.h"
#include "sim/trie_checks.h"
#include "src/kv_cache.h"
#include "src/prefix_cache.h"

namespace kvtwin::sim {
namespace {

RequestOptions Options(const std::string& preset, const std::string& dtype, int64_t budget,
                       uint64_t seed) {
  RequestOptions o;
  o.preset = preset;
  // Five holey layers: [none, kv, rotating, none, recurrent], holes first, inside and last
  // but one.
  if (preset == "holey") o.layers = 5;
  o.dtype = dtype;
  o.budget_bytes = budget;
  o.seed = seed;
  return o;
}

std::string Report(const RequestResult& r) {
  if (!r.divergence) return "";
  std::string s = r.divergence->ToString() + "\nmix: " + r.mix + "\n";
  for (const std::string& line : r.recent) s += "  " + line + "\n";
  return s + r.trie_dump + "reproduce: " + r.reproduce;
}

// 3000 bytes hold about a dozen tokens of a 4-layer stack: eviction runs on most calls
// and little survives. 20000 bytes keep a few conversations' branches.
constexpr int64_t kTinyBudget = 3000;
constexpr int64_t kModerateBudget = 20000;

class RequestSweep
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, int64_t>> {};

TEST_P(RequestSweep, FindsNoDivergenceOnTheCorrectManager) {
  const auto& [preset, dtype, budget] = GetParam();
  RequestCoverage total;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    const RequestResult r = RunRequests(Options(preset, dtype, budget, seed));
    ASSERT_FALSE(r.divergence.has_value()) << Report(r);
    EXPECT_EQ(r.requests, 60);
    total += r.coverage;
  }
  EXPECT_GT(total.completed, 0);
  EXPECT_GT(total.cache_hits, 0);
  EXPECT_GT(total.continuations, 0);
  // A tiny budget evicts most nodes before a later prompt can split them.
  if (budget != kTinyBudget) {
    EXPECT_GT(total.splits, 0);
  }
  if (budget > 0) {
    EXPECT_GT(total.evictions, 0);
  } else {
    EXPECT_EQ(total.evictions, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(PresetsDtypesBudgets, RequestSweep,
                         ::testing::Combine(::testing::Values("dense", "sliding", "recurrent",
                                                              "mixed", "holey"),
                                            ::testing::Values("f32", "bf16"),
                                            ::testing::Values(0, kTinyBudget, kModerateBudget)),
                         [](const ::testing::TestParamInfo<RequestSweep::ParamType>& p) {
                           const int64_t budget = std::get<2>(p.param);
                           return std::get<0>(p.param) + "_" + std::get<1>(p.param) +
                                  (budget == 0             ? "_unlimited"
                                   : budget == kTinyBudget ? "_tiny_budget"
                                                           : "_budget");
                         });

// Stateless layers are null holes in the manager's list (spec §3.1): the holey preset builds
// them, the request runs take it, and everything that drives layers directly refuses it.
// Per-layer windows: the rotating layers of one stack get W, 2W + 1 and ceil(W / 2); the
// preset is accepted everywhere a preset is, but no swarm list holds it (their draws stay).
TEST(StaggeredStack, RotatingLayersHoldDifferentWindows) {
  const StackConfig config = StackFromPreset(kStaggeredPreset, 5, 5, DType::kFloat32).value();
  ASSERT_EQ(config.layers.size(), 5u);
  const std::vector<std::pair<CacheKind, int64_t>> want = {{CacheKind::kRotating, 5},
                                                           {CacheKind::kRotating, 11},
                                                           {CacheKind::kFullKv, 0},
                                                           {CacheKind::kRotating, 3},
                                                           {CacheKind::kRotating, 5}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(config.layers[i].kind, want[i].first) << i;
    EXPECT_EQ(config.layers[i].window, want[i].second) << i;
  }
  const std::vector<std::unique_ptr<LayerCache>> caches = BuildCaches(config);
  EXPECT_EQ(static_cast<const RotatingCache&>(*caches[1]).window(), 11);
  // The doubling stops where it would overflow: such a window is unbounded in effect.
  const int64_t huge = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(StackFromPreset(kStaggeredPreset, 2, huge, DType::kFloat32).value().layers[1].window,
            huge);
  for (const std::vector<std::string>* list : {&PresetNames(), &RequestPresetNames()}) {
    EXPECT_EQ(std::ranges::count(*list, kStaggeredPreset), 0);
  }
  EXPECT_EQ(AcceptedPresetNames(true).back(), kStaggeredPreset);
  RunOptions sweep;
  sweep.preset = kStaggeredPreset;
  EXPECT_TRUE(ValidateRunOptions(sweep).ok());
  RequestOptions requests;
  requests.preset = kStaggeredPreset;
  EXPECT_TRUE(ValidateRequestOptions(requests).ok());
}

TEST(HoleyStack, HolesAreNullCachesAndOnlyRequestRunsTakeThem) {
  const StackConfig config = StackFromPreset("holey", 5, 4, DType::kFloat32).value();
  const std::vector<std::unique_ptr<LayerCache>> caches = BuildCaches(config);
  ASSERT_EQ(caches.size(), 5u);
  EXPECT_EQ(caches[0], nullptr);
  EXPECT_EQ(caches[3], nullptr);
  ASSERT_NE(caches[1], nullptr);
  ASSERT_NE(caches[2], nullptr);
  ASSERT_NE(caches[4], nullptr);
  EXPECT_EQ(caches[1]->kind(), CacheKind::kFullKv);
  EXPECT_EQ(caches[2]->kind(), CacheKind::kRotating);
  EXPECT_EQ(caches[4]->kind(), CacheKind::kRecurrent);
  EXPECT_NE(config.Describe().find("[none, kv, rotating(W=4), none, ...]"), std::string::npos)
      << config.Describe();
  EXPECT_FALSE(StackFromPreset("holey", 1, 4, DType::kFloat32).ok());  // nothing stateful
  RunOptions sweep;
  sweep.preset = "holey";
  EXPECT_NE(ValidateRunOptions(sweep).message().find("stateless layers"), std::string::npos);
  RequestOptions requests;
  requests.preset = "holey";
  EXPECT_TRUE(ValidateRequestOptions(requests).ok());
}

TEST(RequestCoverage, TheWorkloadReachesEveryMechanism) {
  RequestCoverage c;
  int64_t hits_budgeted = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    c += RunRequests(Options("mixed", "f32", 0, seed)).coverage;
    const RequestResult budgeted = RunRequests(Options("mixed", "f32", kTinyBudget, seed));
    c += budgeted.coverage;
    hits_budgeted += budgeted.coverage.evictions;
  }
  SCOPED_TRACE(c.ToString());
  for (int64_t counter :
       {c.completed,       c.cancelled,       c.cache_hits,        c.extensions,
        c.dropped_tails,   c.divergent,       c.new_conversations, c.repeats,
        c.retries,         c.user_offsets,    c.unscheduled,       c.speculative,
        c.continuations,   c.resumed_exactly, c.branch_points,     c.splits,
        c.kv_gaps,         c.forwarded_last,  c.past_stop,         c.isolated_probes,
        c.abandoned_steps, c.session_budgets}) {
    EXPECT_GT(counter, 0);
  }
  EXPECT_GT(hits_budgeted, 0);
  // Free-all is legitimate only where a KV chain is broken (kv gaps); it is counted, and
  // ExpectBegin decides per request whether it had to happen.
  EXPECT_GE(c.free_all, 0);
}

// Long contexts reach what the default workload never does: prompts past a KV buffer's
// 256-row growth step inside the manager, rotating windows of 256 and more, and longer
// nodes; the seed's other draws (preset, dtype, budget, mix) stay those of plain swarm.
TEST(RequestLongContext, PromptsCrossTheGrowthStepAndWindowsReach256) {
  int64_t longest = 0, wide_windows = 0, runs_past_256 = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    RequestOptions o;
    o.swarm = true;
    o.long_context = true;
    o.conversations = 3;
    o.seed = seed;
    Trace trace;
    const RequestResult r = RunRequests(o, &trace);
    ASSERT_FALSE(r.divergence.has_value()) << r.reproduce;
    EXPECT_NE(r.reproduce.find("--long"), std::string::npos) << r.reproduce;
    RequestOptions plain = o;
    plain.long_context = false;
    const RequestResult p = RunRequests(plain);
    EXPECT_EQ(r.mix.substr(0, p.mix.size()), p.mix);
    EXPECT_NE(r.mix, p.mix);  // the long mix names its lengths
    wide_windows += trace.header.window >= 256;
    int64_t run_longest = 0;
    for (const TraceEvent& e : trace.events) {
      run_longest = std::max<int64_t>(run_longest, std::ssize(std::get<RequestPlan>(e).inputs));
    }
    runs_past_256 += run_longest > 256;
    longest = std::max(longest, run_longest);
  }
  EXPECT_GE(runs_past_256, 3);
  EXPECT_GT(longest, 384);
  EXPECT_LE(longest, kLongPromptTokens);
  EXPECT_GE(wide_windows, 3);
}

// The seeded streams reach every mechanism the coverage counts, by floors well below what
// the pinned seeds reach, so a generator or driver change that starves one fails here (as
// MultiSeqRun.TwoHundredSeedsPassAndCoverEveryMechanism does for the multi-sequence runs):
// the gate's 200 swarm seeds, and 300 seeds of the sliding stream under a tight budget for
// the rare shapes (a free-all, a page-in cut at a KV restore without its base, whole
// states copied beside a capture: 1-3 in those seeds).
TEST(Requests, SeededStreamsReachEveryCountedMechanism) {
  RequestCoverage swarm, sliding;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    RequestOptions o;
    o.swarm = true;
    o.seed = seed;
    const RequestResult r = RunRequests(o);
    ASSERT_FALSE(r.divergence.has_value()) << r.reproduce;
    swarm += r.coverage;
  }
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    RequestOptions o;
    o.preset = "sliding";
    o.window = 16;
    o.budget_bytes = 20000;
    o.seed = seed;
    const RequestResult r = RunRequests(o);
    ASSERT_FALSE(r.divergence.has_value()) << r.reproduce;
    sliding += r.coverage;
  }
  const std::map<std::string_view, int64_t> rare = {
      {"free_all", 1}, {"kv_cut_pageins", 2}, {"whole_state_copies", 1}, {"kv_gaps", 100}};
  for (const auto& [name, member] : RequestCoverage::Fields()) {
    const std::string_view n = name;
    // Long contexts only (RequestHugeContext above): forwards that trust earlier rows.
    if (n == "trusting_forwards") continue;
    if (const auto it = rare.find(n); it != rare.end()) {
      EXPECT_GE(sliding.*member, it->second) << name << "\n" << sliding.ToString();
    } else if (n == "largest_eviction_pass") {
      EXPECT_GE(swarm.*member, 10) << swarm.ToString();
    } else {
      EXPECT_GE(swarm.*member, 100) << name << "\n" << swarm.ToString();
    }
  }
}

// Production lengths: prompts past 4,096 tokens (where a trie edge that long is split late),
// windows of 2,047 and more, seeds without periodic captures (a prompt's uncached tail is one
// edge), and divergences that split those edges.
TEST(RequestHugeContext, PromptsReachProductionLengthsAndSplitLongEdges) {
  int64_t longest = 0, runs_past_4096 = 0, wide_windows = 0, uncaptured = 0, splits = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    RequestOptions o;
    o.swarm = true;
    o.huge_context = true;
    o.conversations = 3;
    o.seed = seed;
    Trace trace;
    const RequestResult r = RunRequests(o, &trace);
    ASSERT_FALSE(r.divergence.has_value()) << r.reproduce;
    EXPECT_NE(r.reproduce.find("--huge"), std::string::npos) << r.reproduce;
    wide_windows += trace.header.window >= 2047;
    uncaptured += trace.header.capture_interval == 0;
    splits += r.coverage.splits;
    int64_t run_longest = 0;
    for (const TraceEvent& e : trace.events) {
      run_longest = std::max<int64_t>(run_longest, std::ssize(std::get<RequestPlan>(e).inputs));
    }
    runs_past_4096 += run_longest > 4096;
    longest = std::max(longest, run_longest);
  }
  EXPECT_GE(runs_past_4096, 6);
  EXPECT_GT(longest, 12'000);
  EXPECT_LE(longest, kHugePromptTokens);
  EXPECT_GE(wide_windows, 2);
  EXPECT_GE(uncaptured, 2);
  EXPECT_GT(splits, 100);
  RequestOptions both;
  both.long_context = both.huge_context = true;
  EXPECT_NE(ValidateRequestOptions(both).message().find("--huge"), std::string::npos);
}

// Memory that is plentiful until it is gone: the trie grows for kSpikeEvery - 1 requests under
// a budget nothing reaches, then one request runs under a budget of exactly 0 and its first
// pass takes every evictable node. Every seed's largest checked pass must be past a thousand
// victims (where a pass capped at 1,024 stops short), and the spike is the only request whose
// budget differs from the run's.
TEST(RequestSpike, OnePassTakesOverAThousandNodes) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    RequestOptions o;
    o.swarm = true;
    o.spike = true;
    o.requests = kSpikeEvery;
    o.seed = seed;
    Trace trace;
    const RequestResult r = RunRequests(o, &trace);
    ASSERT_FALSE(r.divergence.has_value()) << r.reproduce;
    EXPECT_NE(r.reproduce.find("--spike"), std::string::npos) << r.reproduce;
    EXPECT_EQ(trace.header.budget_bytes, kSpikeBudgetBytes);
    EXPECT_GT(r.coverage.largest_eviction_pass, 1024) << r.coverage.ToString();
    ASSERT_EQ(std::ssize(trace.events), kSpikeEvery);
    for (const TraceEvent& e : trace.events) {
      const RequestPlan& plan = std::get<RequestPlan>(e);
      EXPECT_EQ(plan.budget_pct, plan.index == kSpikeEvery - 1 ? 0 : 100) << plan.ToString();
      EXPECT_EQ(plan.budget_pct_after_prefill, -1) << plan.ToString();
    }
  }
  RequestOptions both;
  both.spike = both.huge_context = true;
  both.requests = kSpikeEvery;
  EXPECT_NE(ValidateRequestOptions(both).message().find("--huge"), std::string::npos);
  RequestOptions short_run;
  short_run.spike = true;
  short_run.requests = kSpikeEvery - 1;  // no budget of 0 would ever come
  EXPECT_NE(ValidateRequestOptions(short_run).message().find("--requests"), std::string::npos);
}

TEST(RequestDeterminism, SameSeedGivesTheSameRunTwice) {
  for (uint64_t seed : {3u, 11u}) {
    const RequestResult a = RunRequests(Options("mixed", "bf16", kTinyBudget, seed));
    const RequestResult b = RunRequests(Options("mixed", "bf16", kTinyBudget, seed));
    EXPECT_EQ(a.digest, b.digest);
    EXPECT_EQ(a.trie_dump, b.trie_dump);
    EXPECT_EQ(a.mix, b.mix);
    EXPECT_EQ(a.coverage.ToString(), b.coverage.ToString());
  }
  EXPECT_NE(RunRequests(Options("mixed", "f32", 0, 1)).digest,
            RunRequests(Options("mixed", "f32", 0, 2)).digest);
}

TEST(RequestOptionsTest, ValidationNamesTheField) {
  auto error = [](auto change) {
    RequestOptions o;
    change(o);
    return ValidateRequestOptions(o).message();
  };
  EXPECT_TRUE(ValidateRequestOptions(RequestOptions{}).ok());
  EXPECT_NE(error([](RequestOptions& o) { o.conversations = 0; }).find("--conversations"),
            std::string::npos);
  EXPECT_NE(error([](RequestOptions& o) { o.requests = 0; }).find("--requests"), std::string::npos);
  EXPECT_NE(error([](RequestOptions& o) { o.budget_bytes = -1; }).find("--budget"),
            std::string::npos);
  EXPECT_NE(error([](RequestOptions& o) { o.chunk = 0; }).find("--chunk"), std::string::npos);
  EXPECT_NE(error([](RequestOptions& o) { o.window = 0; }).find("--window"), std::string::npos);
  EXPECT_NE(error([](RequestOptions& o) { o.preset = "nope"; }).find("--preset"),
            std::string::npos);
  EXPECT_NE(error([](RequestOptions& o) { o.dtype = "f16"; }).find("--dtype"), std::string::npos);
  EXPECT_NE(error([](RequestOptions& o) { o.layers = 0; }).find("--layers"), std::string::npos);
}

// ---- the checks fire ---------------------------------------------------------------------

// A mixed stack [kv, rotating(W=4), recurrent] with its oracles, written like the driver
// writes it.
struct Rig {
  StackConfig config = StackFromPreset("mixed", 3, 4, DType::kFloat32).value();
  SyntheticForward synth{77};
  std::vector<std::unique_ptr<LayerCache>> caches = BuildCaches(config);
  std::vector<std::unique_ptr<LayerOracle>> oracles;
  std::vector<LayerOracle*> oracle_ptrs;

  Rig() {
    for (int32_t i = 0; i < 3; ++i) {
      oracles.push_back(std::make_unique<LayerOracle>(synth, config, i));
      oracle_ptrs.push_back(oracles.back().get());
    }
  }
  std::vector<LayerCache*> Raw() const {
    return {caches[0].get(), caches[1].get(), caches[2].get()};
  }
  model::TokenLog Log(const std::vector<int32_t>& tokens) const {
    return WithHashes(tokens, synth.seed());
  }
  // Writes log[from, to) into every cache (each must be at `from`).
  void Write(const model::TokenLog& log, int64_t from, int64_t to) {
    const std::span<const model::Token> part(log.data() + from, static_cast<size_t>(to - from));
    for (int32_t i = 0; i < 3; ++i) {
      ForwardSynthetic(*caches[static_cast<size_t>(i)], config, synth, i, from, part);
    }
  }
  // Every cache's snapshot of its whole state (KV: [0, offset)).
  std::vector<SnapshotPtr> SnapshotAll() {
    std::vector<SnapshotPtr> out;
    for (auto& c : caches) out.push_back(c->Snapshot(0));
    return out;
  }
};

const std::vector<int32_t> kBranchA = {1, 2, 3, 4};
const std::vector<int32_t> kLookAlike = {1, 2, 9, 4};  // differs at position 2 only

std::vector<TrieKey> Keys(const std::vector<int32_t>& tokens) {
  return {tokens.begin(), tokens.end()};
}

// Writes branch A into the caches and adds the node [0,4) on it holding their snapshots.
TrieNode* AddSoundNode(Rig& rig, PrefixTrie& trie) {
  rig.Write(rig.Log(kBranchA), 0, 4);
  TrieNode* node = trie.AppendChild(trie.root(), Keys(kBranchA), 4);
  trie.SetSnapshots(node, rig.SnapshotAll());
  return node;
}

TEST(TrieSoundness, AcceptsSnapshotsOfTheNodesOwnKeyPath) {
  Rig rig;
  PrefixTrie trie(rig.Raw(), Tick{0});
  AddSoundNode(rig, trie);
  EXPECT_FALSE(CheckTrieStructure(trie, std::vector<TrieNode*>{trie.root()}, 4).has_value());
  const Check c = CheckTrieSoundness(trie, rig.oracle_ptrs, rig.synth.seed());
  EXPECT_FALSE(c.has_value()) << c->what << "\n" << c->expected << "\n" << c->actual;
}

// λ = 0 keys are 32-bit effective tokens: a media fold value (bit 31 set) is a valid key,
// the same value sign-extended to 64 bits is a structure error at its offset.
TEST(TrieStructure, KeysAre32BitEffectiveTokens) {
  Rig rig;
  PrefixTrie trie(rig.Raw(), Tick{0});
  const std::vector<TrieKey> edge = {1, 0x80000000u, 0xFFFFFFFFu, 2};
  TrieNode* node = trie.AppendChild(trie.root(), edge, 4);
  const std::vector<TrieNode*> path = {trie.root()};
  EXPECT_FALSE(CheckTrieStructure(trie, path, 4).has_value());
  EXPECT_EQ(KeyToken(0x80000000u), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(KeyToken(0xFFFFFFFFu), -1);
  auto& keys = const_cast<std::vector<TrieKey>&>(node->edge());
  keys[2] = 0xFFFFFFFFFFFFFFFFull;  // -1 sign-extended
  const Check c = CheckTrieStructure(trie, path, 4);
  ASSERT_TRUE(c.has_value());
  EXPECT_NE(c->what.find("edge key at offset 2"), std::string::npos) << c->what;
}

// --media: some user turns carry image spans, negative ids repeated over the span, from a
// few images per workload, so two conversations' prompts share them; the rest of the run is
// what the seed draws without it (the mix only names the media share).
TEST(RequestMedia, PromptsCarrySharedImageSpans) {
  int64_t media_positions = 0, shared_images = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    RequestOptions o;
    o.swarm = true;
    o.media = true;
    o.seed = seed;
    Trace trace;
    const RequestResult r = RunRequests(o, &trace);
    ASSERT_FALSE(r.divergence.has_value()) << r.reproduce;
    EXPECT_NE(r.reproduce.find("--media"), std::string::npos) << r.reproduce;
    RequestOptions plain = o;
    plain.media = false;
    Trace plain_trace;
    const RequestResult p = RunRequests(plain, &plain_trace);
    EXPECT_EQ(r.mix, p.mix + ", media 25%");
    ASSERT_EQ(trace.events.size(), plain_trace.events.size());
    std::map<int32_t, std::set<int32_t>> conversations_of;  // image -> conversations
    for (size_t i = 0; i < trace.events.size(); ++i) {
      const auto& m = std::get<RequestPlan>(trace.events[i]);
      const auto& t = std::get<RequestPlan>(plain_trace.events[i]);
      EXPECT_EQ(m.kind, t.kind);
      EXPECT_EQ(m.inputs.size(), t.inputs.size());
      EXPECT_EQ(m.outputs, t.outputs);
      for (const int32_t token : m.inputs) {
        if (token >= 0) continue;
        ++media_positions;
        conversations_of[token].insert(m.conversation);
      }
      for (const int32_t token : m.outputs) EXPECT_GE(token, 0);
    }
    for (const auto& [image, convs] : conversations_of) shared_images += convs.size() > 1;
  }
  EXPECT_GT(media_positions, 100);
  EXPECT_GT(shared_images, 2);
}

TEST(TrieSoundness, ReportsEverySnapshotKindTakenOnALookAlikeBranch) {
  for (size_t layer = 0; layer < 3; ++layer) {
    SCOPED_TRACE(layer);
    Rig rig;
    rig.Write(rig.Log(kLookAlike), 0, 4);
    std::vector<SnapshotPtr> wrong = rig.SnapshotAll();
    std::vector<SnapshotPtr> set(3);
    set[layer] = std::move(wrong[layer]);  // the other layers stay empty
    PrefixTrie trie(rig.Raw(), Tick{0});
    TrieNode* node = trie.AppendChild(trie.root(), Keys(kBranchA), 4);
    trie.SetSnapshots(node, std::move(set));
    ASSERT_FALSE(CheckTrieStructure(trie, std::vector<TrieNode*>{trie.root()}, 4).has_value());
    const Check c = CheckTrieSoundness(trie, rig.oracle_ptrs, rig.synth.seed());
    ASSERT_TRUE(c.has_value());
    EXPECT_NE(c->what.find("node [0,4) keys 1 2 3 4: layer " + std::to_string(layer)),
              std::string::npos)
        << c->what;
    if (layer < 2) {
      // K/V rows decode: the right position, the hash of the other branch's prefix.
      EXPECT_NE(c->what.find("(logical position 2)"), std::string::npos) << c->what;
      EXPECT_EQ(c->expected.rfind("pos 2 h=0x", 0), 0u) << c->expected;
      EXPECT_EQ(c->actual.rfind("pos 2 h=0x", 0), 0u) << c->actual;
      EXPECT_NE(c->expected, c->actual);
    } else {
      EXPECT_NE(c->what.find("recurrent snapshot"), std::string::npos) << c->what;
    }
  }
}

TEST(TrieSoundness, ReportsAKvSnapshotThatDoesNotSpanItsEdge) {
  Rig rig;
  rig.Write(rig.Log(kBranchA), 0, 4);
  PrefixTrie trie(rig.Raw(), Tick{0});
  TrieNode* node = trie.AppendChild(trie.root(), Keys(kBranchA), 4);
  std::vector<SnapshotPtr> set(3);
  set[0] = rig.caches[0]->Snapshot(2);  // [2,4) on the node [0,4)
  trie.SetSnapshots(node, std::move(set));
  const Check c = CheckTrieSoundness(trie, rig.oracle_ptrs, rig.synth.seed());
  ASSERT_TRUE(c.has_value());
  EXPECT_NE(c->what.find("layer 0 kv snapshot range"), std::string::npos) << c->what;
  EXPECT_EQ(c->expected, "[0,4)");
  EXPECT_EQ(c->actual, "[2,4)");
}

// The memo skips snapshots verified before, keyed by their contents too: a stored snapshot
// rewritten in place afterwards (a copy-on-write slot the live cache still writes into) is
// verified again and reported, on the very next memoized check.
TEST(TrieSoundness, TheMemoStillSeesASnapshotRewrittenInPlace) {
  Rig rig;
  PrefixTrie trie(rig.Raw(), Tick{0});
  const TrieNode* node = AddSoundNode(rig, trie);
  SoundnessMemo memo;
  for (int round = 0; round < 2; ++round) {  // the second round is all memo hits
    const Check c = CheckTrieSoundness(trie, rig.oracle_ptrs, rig.synth.seed(), &memo);
    ASSERT_FALSE(c.has_value()) << c->what;
  }
  ASSERT_EQ(memo.verified.size(), 1u);
  const auto* kv = dynamic_cast<const KvSnapshot*>(node->snapshot(0));
  ASSERT_NE(kv, nullptr);
  // The bug under test: a buffer shared with something that writes it.
  const TensorView k = kv->k();
  ASSERT_EQ(k.dtype(), DType::kFloat32);
  float* row3 = const_cast<float*>(static_cast<const float*>(k.data())) + 3 * k.cols();
  row3[0] += 1.0f;
  const Check c = CheckTrieSoundness(trie, rig.oracle_ptrs, rig.synth.seed(), &memo);
  ASSERT_TRUE(c.has_value());
  EXPECT_NE(c->what.find("node [0,4) keys 1 2 3 4: layer 0 kv snapshot"), std::string::npos)
      << c->what;
  EXPECT_NE(c->what.find("(logical position 3)"), std::string::npos) << c->what;
}

// The memo's key covers a rotating snapshot's ring cursor: the same rows re-installed
// under cursor 0 (a copy that dropped it) are another window order, verified again and
// reported.
TEST(TrieSoundness, TheMemoStillSeesARotatingSnapshotUnderAnotherCursor) {
  Rig rig;
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6};
  const model::TokenLog log = rig.Log(tokens);
  rig.Write(log, 0, 4);
  rig.Write(log, 4, 5);  // single-token writes wrap the W = 4 ring
  rig.Write(log, 5, 6);
  PrefixTrie trie(rig.Raw(), Tick{0});
  TrieNode* node = trie.AppendChild(trie.root(), Keys(tokens), 6);
  trie.SetSnapshots(node, rig.SnapshotAll());
  SoundnessMemo memo;
  const Check sound = CheckTrieSoundness(trie, rig.oracle_ptrs, rig.synth.seed(), &memo);
  ASSERT_FALSE(sound.has_value()) << sound->what;
  const auto* rot = dynamic_cast<const RotatingSnapshot*>(node->snapshot(1));
  ASSERT_NE(rot, nullptr);
  ASSERT_NE(rot->idx(), 0) << "the ring did not wrap";
  const auto* kv = dynamic_cast<const KvSnapshot*>(node->snapshot(0));
  const auto* rec = dynamic_cast<const RecurrentSnapshot*>(node->snapshot(2));
  ASSERT_TRUE(kv != nullptr && rec != nullptr);
  std::vector<SnapshotPtr> set;  // equal copies but for the rotating cursor
  set.push_back(KvSnapshot::Make(kv->from(), kv->to(), {kv->k()}, {kv->v()}));
  set.push_back(std::make_unique<RotatingSnapshot>(rot->from(), rot->to(), 0, rot->k(), rot->v()));
  set.push_back(std::make_unique<RecurrentSnapshot>(rec->offset(), rec->conv(), rec->delta()));
  trie.SetSnapshots(node, std::move(set));
  const Check c = CheckTrieSoundness(trie, rig.oracle_ptrs, rig.synth.seed(), &memo);
  ASSERT_TRUE(c.has_value());
  EXPECT_NE(c->what.find("node [0,6) keys 1 2 3 4 ...: layer 1 rotating snapshot"),
            std::string::npos)
      << c->what;
}

// An edge of at least kMemoEdgeKeys keys has its end hash memoized under a digest of its
// keys: keys rewritten in place under unchanged snapshots (a node's edge edited behind the
// trie's back) change the digest, so the node and the child below it are verified again and
// the node is reported, on the very next memoized check.
TEST(TrieSoundness, TheMemoStillSeesALongEdgeRewrittenInPlace) {
  Rig rig;
  const auto n = static_cast<int32_t>(SoundnessMemo::kMemoEdgeKeys) + 6;
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < n + 4; ++i) tokens.push_back(1 + i % 6);
  const model::TokenLog log = rig.Log(tokens);
  rig.Write(log, 0, n);
  PrefixTrie trie(rig.Raw(), Tick{0});
  TrieNode* node = trie.AppendChild(trie.root(), Keys({tokens.begin(), tokens.begin() + n}), n);
  trie.SetSnapshots(node, rig.SnapshotAll());
  rig.Write(log, n, n + 4);
  TrieNode* child = trie.AppendChild(node, Keys({tokens.begin() + n, tokens.end()}), n + 4);
  std::vector<SnapshotPtr> set = rig.SnapshotAll();
  set[0] = rig.caches[0]->Snapshot(n);  // a KV snapshot spans its edge
  trie.SetSnapshots(child, std::move(set));
  SoundnessMemo memo;
  for (int round = 0; round < 2; ++round) {  // the second round is all memo hits
    const Check c = CheckTrieSoundness(trie, rig.oracle_ptrs, rig.synth.seed(), &memo);
    ASSERT_FALSE(c.has_value()) << c->what << "\n" << c->expected << "\n" << c->actual;
  }
  ASSERT_EQ(memo.edge_ends.size(), 1u) << "the long edge's end hash is memoized";
  ASSERT_EQ(memo.verified.size(), 2u);
  // The bug under test: one key of the long edge changed in place.
  auto& keys = const_cast<std::vector<TrieKey>&>(node->edge());
  keys[static_cast<size_t>(n - 10)] = 9;
  const Check c = CheckTrieSoundness(trie, rig.oracle_ptrs, rig.synth.seed(), &memo);
  ASSERT_TRUE(c.has_value());
  EXPECT_NE(c->what.find("node [0," + std::to_string(n) + ")"), std::string::npos) << c->what;
  EXPECT_NE(c->what.find("(logical position " + std::to_string(n - 10) + ")"), std::string::npos)
      << c->what;
}

// AuditTrie is CheckTrieStructure then CheckTrieSoundness in one walk: the same verdict as
// the pair in that order, so a structure failure found only at the end of the walk (here
// the active path) still wins over a soundness failure found on the way; on a pass it
// lists every non-root node's end hash (PathLog's last) and start, in walk order.
TEST(AuditTrie, GivesThePairsVerdictInOrderAndEveryNodesEndHash) {
  Rig rig;
  rig.Write(rig.Log(kLookAlike), 0, 4);
  std::vector<SnapshotPtr> wrong = rig.SnapshotAll();
  PrefixTrie trie(rig.Raw(), Tick{0});
  TrieNode* bad = trie.AppendChild(trie.root(), Keys(kBranchA), 4);
  trie.SetSnapshots(bad, std::move(wrong));
  trie.AppendChild(bad, Keys({7, 8}), 6);
  trie.AppendChild(trie.root(), Keys({5}), 1);
  const std::vector<TrieNode*> good_path = {trie.root()};
  const std::vector<TrieNode*> far_path = {trie.root(), bad};  // ends past min_offset 0
  AuditScratch scratch;

  const Check sound = CheckTrieSoundness(trie, rig.oracle_ptrs, rig.synth.seed());
  ASSERT_TRUE(sound.has_value());
  const Check audit = AuditTrie(trie, good_path, 0, rig.oracle_ptrs, rig.synth.seed(), scratch);
  ASSERT_TRUE(audit.has_value());
  EXPECT_EQ(audit->what, sound->what);
  EXPECT_EQ(audit->expected, sound->expected);
  EXPECT_EQ(audit->actual, sound->actual);

  const Check structure = CheckTrieStructure(trie, far_path, 0);
  ASSERT_TRUE(structure.has_value());
  const Check both = AuditTrie(trie, far_path, 0, rig.oracle_ptrs, rig.synth.seed(), scratch);
  ASSERT_TRUE(both.has_value());
  EXPECT_EQ(both->what, structure->what);
  EXPECT_EQ(both->actual, structure->actual);

  // A sound trie of the same shape: a pass, with the census's end hashes.
  Rig sound_rig;
  PrefixTrie ok(sound_rig.Raw(), Tick{0});
  TrieNode* a = AddSoundNode(sound_rig, ok);
  TrieNode* a_child = ok.AppendChild(a, Keys({7, 8}), 6);
  TrieNode* b = ok.AppendChild(ok.root(), Keys({5}), 1);
  EndStarts ends = {{1, 1}};  // stale entries are replaced
  const Check pass = AuditTrie(ok, std::vector<TrieNode*>{ok.root()}, 0, sound_rig.oracle_ptrs,
                               sound_rig.synth.seed(), scratch, &ends);
  ASSERT_FALSE(pass.has_value()) << pass->what;
  const EndStarts want = {{PathLog(*a, sound_rig.synth.seed()).back().h, 0},
                          {PathLog(*a_child, sound_rig.synth.seed()).back().h, 4},
                          {PathLog(*b, sound_rig.synth.seed()).back().h, 0}};
  EXPECT_EQ(ends, want);
}

TEST(LiveSoundness, ReportsALiveCacheRewrittenFromALookAlikeBranchAfterBegin) {
  Rig rig;
  PrefixCache pc(rig.Raw());
  // Request 1: prompt A + 5, one sampled token; the caches end at 5 and page out.
  const std::vector<int32_t> first = {1, 2, 3, 4, 5};
  ASSERT_TRUE(pc.Begin(first).ok());
  ASSERT_TRUE(pc.SchedulePrefillSnapshots({}).ok());
  const model::TokenLog log = rig.Log({1, 2, 3, 4, 5, 6});
  rig.Write(log, 0, 4);
  ASSERT_TRUE(pc.AttachPrefillSnapshots().ok());
  ASSERT_TRUE(pc.AddOutputs(std::vector<int32_t>{6}).ok());
  rig.Write(log, 4, 5);
  ASSERT_TRUE(pc.Close().ok());
  // Request 2 extends it: Begin resumes at 5 with sound live caches.
  const std::vector<int32_t> second = {1, 2, 3, 4, 5, 6, 7};
  Result<BeginReport> begun = pc.Begin(second);
  ASSERT_TRUE(begun.ok());
  ASSERT_EQ(begun->cached, 5);
  const model::TokenLog want(log.begin(), log.begin() + 5);
  EXPECT_FALSE(CheckLiveSoundness(rig.Raw(), rig.oracle_ptrs, want).has_value());
  // Corrupt the KV layer: rewind to 2 and write the look-alike branch's rows back to 5.
  const model::TokenLog other = rig.Log({1, 2, 9, 4, 5});
  ASSERT_TRUE(rig.caches[0]->Restore(nullptr, 2));
  ForwardSynthetic(*rig.caches[0], rig.config, rig.synth, 0, 2,
                   std::span<const model::Token>(other.data() + 2, 3));
  const Check c = CheckLiveSoundness(rig.Raw(), rig.oracle_ptrs, want);
  ASSERT_TRUE(c.has_value());
  EXPECT_NE(c->what.find("layer 0 live kv"), std::string::npos) << c->what;
  EXPECT_NE(c->what.find("(logical position 2)"), std::string::npos) << c->what;
  EXPECT_EQ(c->expected.rfind("pos 2 h=0x", 0), 0u) << c->expected;
  EXPECT_EQ(c->actual.rfind("pos 2 h=0x", 0), 0u) << c->actual;
  EXPECT_NE(c->expected, c->actual);
}

// What a token log cannot say: six tokens written as six decodes leave the same window as
// one batch of six, but spec §2.2 gives the window buffer 4 rows (a step capped at W) where
// the batch leaves min(0, W - 1) + 6; and a schedule prepared on one side only.
TEST(LiveBuffers, ReportsTheBufferSizeAndTheScheduleFlagThatContentsCannotShow) {
  Rig rig;
  const model::TokenLog log = rig.Log({1, 2, 3, 4, 5, 6});
  std::vector<std::optional<model::RefCache>> refs = {
      model::RefCache::Kv(), model::RefCache::Rotating(4), model::RefCache::Recurrent()};
  for (auto& r : refs) r->Write(log);
  for (int64_t p = 0; p < 6; ++p) rig.Write(log, p, p + 1);
  EXPECT_FALSE(CheckLiveSoundness(rig.Raw(), rig.oracle_ptrs, log).has_value());
  const Check rows = CheckLiveBuffersAgainst(rig.Raw(), rig.oracle_ptrs, refs);
  ASSERT_TRUE(rows.has_value());
  EXPECT_EQ(rows->what, "layer 1 live rotating: window buffer rows Dim (spec §2.2)");
  EXPECT_EQ(rows->expected, "6");
  EXPECT_EQ(rows->actual, "4");

  Rig batched;
  batched.Write(log, 0, 6);
  EXPECT_FALSE(CheckLiveBuffersAgainst(batched.Raw(), batched.oracle_ptrs, refs).has_value());
  ASSERT_TRUE(batched.caches[0]->PrepareSnapshots({8}).ok());
  const Check flag = CheckLiveBuffersAgainst(batched.Raw(), batched.oracle_ptrs, refs);
  ASSERT_TRUE(flag.has_value());
  EXPECT_EQ(flag->what, "layer 0 live kv: capture schedule active");
  EXPECT_EQ(flag->expected, "no");
  EXPECT_EQ(flag->actual, "yes");
}

TEST(TrieStructure, ReportsSiblingsSharingAFirstKeyAndABadActivePath) {
  Rig rig;
  PrefixTrie trie(rig.Raw(), Tick{0});
  TrieNode* a = trie.AppendChild(trie.root(), Keys({1, 2}), 2);
  const std::vector<TrieNode*> root_only{trie.root()};
  EXPECT_FALSE(CheckTrieStructure(trie, root_only, 0).has_value());
  // An active path ending beyond the caches.
  const Check beyond = CheckTrieStructure(trie, std::vector<TrieNode*>{trie.root(), a}, 1);
  ASSERT_TRUE(beyond.has_value());
  EXPECT_NE(beyond->what.find("active path end"), std::string::npos) << beyond->what;
  // A node that is not in this trie (as after an eviction of an active node).
  PrefixTrie other(rig.Raw(), Tick{0});
  TrieNode* stranger = other.AppendChild(other.root(), Keys({1, 2}), 2);
  const Check dangling = CheckTrieStructure(trie, std::vector<TrieNode*>{trie.root(), stranger}, 2);
  ASSERT_TRUE(dangling.has_value());
  EXPECT_NE(dangling->actual.find("no longer in the trie"), std::string::npos);
  // AppendChild does not police siblings; the check does.
  trie.AppendChild(trie.root(), Keys({1, 3}), 2);
  const Check siblings = CheckTrieStructure(trie, root_only, 0);
  ASSERT_TRUE(siblings.has_value());
  EXPECT_NE(siblings->what.find("first key 1 among the children of root"), std::string::npos)
      << siblings->what;
}

// The driver reuses one scratch for every structure check: each result must be the one a
// fresh check gives, e.g. a node of a trie checked before (still in the scratch's lists) is
// not a node of this one.
TEST(TrieStructure, AReusedScratchGivesTheResultsOfAFreshCheck) {
  Rig rig;
  PrefixTrie big(rig.Raw(), Tick{0});
  TrieNode* far = big.AppendChild(big.root(), Keys({1, 2}), 2);
  big.AppendChild(far, Keys({3}), 3);
  big.AppendChild(big.root(), Keys({4}), 1);
  PrefixTrie small(rig.Raw(), Tick{0});
  TrieNode* a = small.AppendChild(small.root(), Keys({1}), 1);
  StructureScratch scratch;
  using Path = std::vector<TrieNode*>;
  EXPECT_FALSE(CheckTrieStructure(big, Path{big.root(), far}, 2, &scratch).has_value());
  const Check dangling = CheckTrieStructure(small, Path{small.root(), far}, 2, &scratch);
  ASSERT_TRUE(dangling.has_value());
  EXPECT_EQ(dangling->actual, CheckTrieStructure(small, Path{small.root(), far}, 2)->actual);
  EXPECT_FALSE(CheckTrieStructure(small, Path{small.root(), a}, 1, &scratch).has_value());
  small.AppendChild(small.root(), Keys({1, 5}), 2);  // two children on first key 1
  const Check siblings = CheckTrieStructure(small, Path{small.root()}, 0, &scratch);
  ASSERT_TRUE(siblings.has_value());
  EXPECT_EQ(siblings->what, CheckTrieStructure(small, Path{small.root()}, 0)->what);
  EXPECT_FALSE(CheckTrieStructure(big, Path{big.root()}, 0, &scratch).has_value());
}

// PathLog (one buffer, filled leaf to root) is WithHashes of the key path root -> node.
TEST(TrieChecks, PathLogIsTheHashedKeyPath) {
  Rig rig;
  PrefixTrie trie(rig.Raw(), Tick{0});
  TrieNode* a = trie.AppendChild(trie.root(), Keys({4, 5}), 2);
  TrieNode* b = trie.AppendChild(a, Keys({6}), 3);
  TrieNode* c = trie.AppendChild(b, Keys({7, 8, 9}), 6);
  EXPECT_TRUE(PathLog(*trie.root(), 11).empty());
  EXPECT_EQ(PathLog(*a, 11), WithHashes(std::vector<int32_t>{4, 5}, 11));
  EXPECT_EQ(PathLog(*c, 11), WithHashes(std::vector<int32_t>{4, 5, 6, 7, 8, 9}, 11));
  EXPECT_NE(PathLog(*c, 11), PathLog(*c, 12));
}

TEST(TrieStructure, NamesTheFirstChildInListOrderThatRepeatsAFirstKey) {
  Rig rig;
  PrefixTrie trie(rig.Raw(), Tick{0});
  // First keys 5 1 7 1 5: children 3 (key 1) and 4 (key 5) repeat an earlier sibling's.
  for (const std::vector<int32_t>& edge :
       std::vector<std::vector<int32_t>>{{5, 2}, {1, 2}, {7, 2}, {1, 9}, {5, 9}}) {
    trie.AppendChild(trie.root(), Keys(edge), 2);
  }
  const Check c = CheckTrieStructure(trie, std::vector<TrieNode*>{trie.root()}, 0);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->what.rfind("node [0,2) keys 1 9: first key 1 among the children of root", 0), 0u)
      << c->what;
  EXPECT_EQ(c->actual, "shared with an earlier sibling");
}

TEST(EvictionBound, ReportsAnEvictableNodeOverBudgetOnly) {
  Rig rig;
  rig.Write(rig.Log(kBranchA), 0, 4);
  PrefixTrie trie(rig.Raw(), Tick{0});
  TrieNode* node = trie.AppendChild(trie.root(), Keys(kBranchA), 4);
  trie.SetSnapshots(node, rig.SnapshotAll());
  const std::vector<TrieNode*> root_only{trie.root()};
  EXPECT_TRUE(CheckEvictionBound(trie, root_only, 1).has_value());
  EXPECT_TRUE(CheckEvictionBound(trie, root_only, 0).has_value());  // a budget of 0 is one
  EXPECT_FALSE(
      CheckEvictionBound(trie, root_only, std::numeric_limits<int64_t>::max()).has_value());
  EXPECT_FALSE(CheckEvictionBound(trie, root_only, trie.paged_out_bytes()).has_value());
  // On the active path the node is protected: over budget with nothing evictable is fine.
  EXPECT_FALSE(CheckEvictionBound(trie, std::vector<TrieNode*>{trie.root(), node}, 1).has_value());
}

std::vector<std::optional<model::RefCache>> EmptyRefs() {
  std::vector<std::optional<model::RefCache>> refs;
  refs.emplace_back(model::RefCache::Kv());
  refs.emplace_back(model::RefCache::Rotating(4));
  refs.emplace_back(model::RefCache::Recurrent());
  return refs;
}

TEST(ExpectBeginTest, FollowsTheHoldBackAndTheGreedyPageIn) {
  Rig rig;
  PrefixTrie trie(rig.Raw(), Tick{0});
  rig.Write(rig.Log(kBranchA), 0, 4);
  TrieNode* node = trie.AppendChild(trie.root(), Keys(kBranchA), 4);
  trie.SetSnapshots(node, rig.SnapshotAll());
  const std::vector<TrieNode*> root_only{trie.root()};
  // An exact repeat matches 4 keys and is held back to 3: KV restores clamped to 3, the
  // window too (its end 4 <= W), the recurrent state only to 4, so page-in stops there and
  // alignment rewinds everything to 0.
  BeginExpectation e = ExpectBegin(trie, root_only, EmptyRefs(), kBranchA, rig.synth.seed());
  EXPECT_EQ(e.matched, 4);
  EXPECT_EQ(e.cached, 0);
  EXPECT_FALSE(e.free_all);
  EXPECT_TRUE(e.kv_chain);
  EXPECT_EQ(e.active_path.size(), 1u);
  // An extension matches the whole node: every layer restores to its end.
  e = ExpectBegin(trie, root_only, EmptyRefs(), std::vector<int32_t>{1, 2, 3, 4, 5},
                  rig.synth.seed());
  EXPECT_EQ(e.matched, 4);
  EXPECT_EQ(e.cached, 4);
  ASSERT_EQ(e.active_path.size(), 2u);
  EXPECT_EQ(e.active_path[1], node);
}

// With the reference's child positions the walk takes the child at each position when it
// starts with the next key, falls back to the scan (and stays exact) when it does not, and
// stops where the positions end: there the reference matched no further.
TEST(ExpectBeginTest, FollowsChildPositionsAndScansPastAWrongOne) {
  Rig rig;
  PrefixTrie trie(rig.Raw(), Tick{0});
  trie.AppendChild(trie.root(), Keys(std::vector<int32_t>{7, 8}), 2);
  rig.Write(rig.Log(kBranchA), 0, 4);
  TrieNode* node = trie.AppendChild(trie.root(), Keys(kBranchA), 4);
  trie.SetSnapshots(node, rig.SnapshotAll());
  const std::vector<TrieNode*> root_only{trie.root()};
  const std::vector<int32_t> extension{1, 2, 3, 4, 5};
  auto expect = [&](std::optional<std::vector<size_t>> positions) {
    return ExpectBegin(
        trie, root_only, EmptyRefs(), extension, rig.synth.seed(),
        positions ? std::optional<std::span<const size_t>>(*positions) : std::nullopt);
  };
  const BeginExpectation scanned = expect(std::nullopt);
  ASSERT_EQ(scanned.matched, 4);
  ASSERT_EQ(scanned.active_path.size(), 2u);
  for (const std::vector<size_t>& positions : std::vector<std::vector<size_t>>{
           {1},     // right
           {0},     // a sibling with another first key: scanned
           {9, 3},  // out of range: scanned, and the rest of the walk too
       }) {
    const BeginExpectation e = expect(positions);
    EXPECT_EQ(e.matched, 4);
    EXPECT_EQ(e.cached, scanned.cached);
    EXPECT_EQ(e.active_path, scanned.active_path);
    EXPECT_TRUE(SameStateMovingCalls(e.calls, scanned.calls));
  }
  const BeginExpectation none = expect(std::vector<size_t>{});
  EXPECT_EQ(none.matched, 0);
  EXPECT_EQ(none.active_path.size(), 1u);
}

}  // namespace
}  // namespace kvtwin::sim
