// The memory series (scaling_series.h): what the manager holds against the raw tensor bytes
// of what it caches. Rows have a realistic width (K/V of 8 heads x 128 in bfloat16, 4 KiB
// per token per full KV layer) so that per-node, per-snapshot and allocator overheads are
// measured against honest payloads. The stack is Qwen3.5-like (three gated-delta layers per
// full KV layer); a recurrent snapshot is a whole state, so "raw" counts one state per
// recurrent snapshot held: the overhead measured is what the manager adds around the
// tensors (capacity, duplicated rows, bookkeeping), not the capture policy.
#include <malloc.h>
#include <unistd.h>

#include <fstream>
#include <memory>

#include "bench/scaling_series.h"
#include "bench/scaling_workload.h"
#include "sim/production_runner.h"
#include "sim/stack.h"
#include "src/core/check.h"

namespace kvtwin::bench {
namespace {

sim::StackConfig MemoryStack() {
  Result<sim::StackConfig> c = sim::StackFromPreset("recurrent", 4, 1, DType::kBFloat16);
  KV_CHECK(c.ok(), c.status().ToString());
  c->dims.kv_heads = 8;
  c->dims.head_dim = 128;
  c->dims.value_dim = 128;
  // Small recurrent dims keep the gated-delta kernels (scalar loops) from dominating the
  // run time; the states are counted in the raw bytes either way.
  c->dims.recurrent.num_k_heads = 1;
  c->dims.recurrent.num_v_heads = 2;
  c->dims.recurrent.head_k_dim = 32;
  c->dims.recurrent.head_v_dim = 32;
  return *c;
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// Raw bytes of one recurrent state: the conv tail in the activation dtype, delta float32.
int64_t RecurrentStateBytes(const sim::StackConfig& c) {
  const RecurrentDims& d = c.dims.recurrent;
  return d.conv_tail * d.conv_dim() * ElementBytes(c.dtype) +
         d.delta_rows() * d.head_k_dim * static_cast<int64_t>(sizeof(float));
}

MemoryPoint Measure(const sim::StackConfig& config, const PrefixCache& manager,
                    int64_t conversations, int64_t rss_before) {
  const PrefixTrie& trie = manager.trie();
  MemoryPoint p;
  p.conversations = conversations;
  int64_t walked_bytes = 0;
  trie.Walk([&](TrieNode* node) {
    p.cached_tokens += static_cast<int64_t>(node->edge().size());
    walked_bytes += node->SnapshotBytes();
    for (size_t i = 0; i < trie.num_layers(); ++i) {
      const CacheSnapshot* s = node->snapshot(i);
      if (s != nullptr && s->kind() == CacheKind::kRecurrent) ++p.recurrent_states;
    }
  });
  KV_CHECK(walked_bytes == trie.paged_out_bytes(), "the trie's byte counter is off");
  int64_t kv_layers = 0;
  for (size_t i = 0; i < trie.num_layers(); ++i) {
    const LayerCache* c = trie.cache(i);
    p.live_bytes += c->LiveBytes();
    if (c->kind() == CacheKind::kFullKv) ++kv_layers;
    if (c->kind() == CacheKind::kRecurrent && c->LiveBytes() > 0) ++p.recurrent_states;
  }
  p.snapshot_bytes = trie.paged_out_bytes();
  p.trie_nodes = trie.num_nodes();
  p.raw_bytes = p.cached_tokens * kv_layers * (config.k_cols() + config.v_cols()) *
                    ElementBytes(config.dtype) +
                p.recurrent_states * RecurrentStateBytes(config);
  p.rss_delta_bytes = ResidentBytes() - rss_before;
  return p;
}

}  // namespace

double MemoryPoint::held_ratio() const {
  return raw_bytes > 0
             ? static_cast<double>(snapshot_bytes + live_bytes) / static_cast<double>(raw_bytes)
             : 0;
}
double MemoryPoint::rss_ratio() const {
  return raw_bytes > 0 ? static_cast<double>(rss_delta_bytes) / static_cast<double>(raw_bytes) : 0;
}

MemorySeries RunMemorySeries(const ScalingOptions& options) {
  MemorySeries series;
  const sim::StackConfig config = MemoryStack();
  series.stack = config.Describe();
  series.notes =
      "conversations of two turns (256-token shared system prompt + 512 user tokens + 8 "
      "outputs, then 240 user tokens + 8 outputs) until the trie holds T tokens";
  ChatShape shape;
  shape.system_tokens = 256;
  shape.user_min = shape.user_max = 512;
  shape.outputs = 8;
  const ChatWorkload chats(options.seed, shape);
  std::vector<int64_t> targets = {8192, 16384, 32768};
  if (!options.quick) targets.insert(targets.end(), {65536, 131072});

  // Returns freed heap pages to the system, so the baseline holds no reusable slack.
  malloc_trim(0);
  const int64_t rss_before = ResidentBytes();
  sim::RequestDriverOptions driver;
  driver.chunk = 2048;
  driver.capture_interval = 8192;
  auto runner = std::make_unique<sim::ProductionRunner>(config, driver, options.seed);
  Rng rng = Rng::Derive(options.seed, "memory");
  int64_t conversations = 0;
  for (const int64_t target : targets) {
    while (true) {
      const MemoryPoint now = Measure(config, runner->manager(), conversations, rss_before);
      if (now.cached_tokens >= target) {
        series.points.push_back(now);
        break;
      }
      sim::RequestPlan plan = chats.Open(static_cast<int32_t>(conversations++), rng);
      KV_CHECK(runner->Run(plan).ok(), "memory populate");
      KV_CHECK(runner->Run(chats.Continue(plan, rng, 240)).ok(), "memory populate");
    }
  }
  return series;
}

}  // namespace kvtwin::bench
