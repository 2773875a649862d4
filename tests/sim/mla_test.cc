// Goal: MLA layers (spec §2.5's MLA variant: the cache stores K alone and a zero-width V) are
// checked like any other, not waved through because V has nothing to compare. Method: (1)
// a forward's history over a zero-width V passes, and one whose V lost rows is reported by
// its row count, the only thing such a V has; (2) sweeps of every layer kind at value_dim 0
// pass on the correct caches.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sim/checks.h"
#include "sim/forward.h"
#include "sim/run.h"
#include "sim/stack.h"
#include "sim/trie_checks.h"
#include "tests/sim/one_layer.h"

namespace kvtwin::sim {
namespace {

ModelDims Mla() {
  ModelDims d;
  d.kv_heads = 2;
  d.head_dim = 4;
  d.value_dim = 0;
  return d;
}

model::TokenLog Tokens(int64_t n, uint64_t seed) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(1 + (i * 5 + 2) % 9));
  return WithHashes(t, seed);
}

TEST(Mla, AZeroWidthVHistoryPassesAndOneMissingRowsIsReported) {
  for (const char* preset : {"dense", "sliding"}) {
    OneLayer l(preset, Mla());
    const model::TokenLog log = Tokens(3, l.synth.seed());
    const History h = l.WriteAll(log);
    ASSERT_EQ(h.v->cols(), 0) << preset;
    ASSERT_EQ(h.v->rows(), h.k->rows()) << preset;
    EXPECT_FALSE(l.oracle->CheckHistory(h, log, 0, 3, Op{}).has_value()) << preset;
    model::RefCache ref =
        std::string(preset) == "dense" ? model::RefCache::Kv() : model::RefCache::Rotating(4);
    ref.Write(log);
    EXPECT_FALSE(l.oracle->CheckLive(*l.cache, ref).has_value()) << preset;

    // The bug under test: a V that kept its width (none) but not its rows.
    const Tensor short_v(h.v->dtype(), h.v->rows() - 1, 0);
    History lost = h;
    lost.v = &short_v;
    const Check c = l.oracle->CheckHistory(lost, log, 0, 3, Op{});
    ASSERT_TRUE(c.has_value()) << preset;
    EXPECT_NE(c->what.find("V rows"), std::string::npos) << c->what;
    EXPECT_EQ(c->expected, std::to_string(h.k->rows()));
  }
}

TEST(Mla, SweepsOfEveryLayerKindPassAtValueDimZero) {
  for (const char* preset : {"dense", "sliding", "mixed"}) {
    RunOptions o;
    o.preset = preset;
    o.layers = 3;
    o.steps = 300;
    o.dims = Mla();
    ASSERT_TRUE(ValidateRunOptions(o).ok());
    const RunResult r = RunSeed(o, 7);
    ASSERT_FALSE(r.divergence.has_value()) << r.divergence->ToString() << "\n" << r.reproduce;
    EXPECT_NE(r.stack.find(Mla().Describe()), std::string::npos) << r.stack;
    EXPECT_NE(r.reproduce.find("--kv-dims 2,4,0"), std::string::npos) << r.reproduce;
  }
}

}  // namespace
}  // namespace kvtwin::sim
