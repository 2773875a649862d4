// BlockLru: the baseline of the replay benchmark, what a user would otherwise write to model
// prefix caching at block granularity with real payloads: an LRU (hash map + intrusive
// list) of blocks keyed by the chained block id (a Mooncake hash id names a block together
// with every block before it), each block holding the K and V rows of its tokens for every
// attention layer of the stack (the stack's dtype and columns). A request looks its blocks
// up in order and copies each hit into its working K/V; the first miss ends the reuse
// (prefix semantics) and that block and every later one is computed with the same
// synthetic rows the production run writes (SyntheticForward::FillKvRow over the rolling
// hash) and stored. Decode tokens are computed into the working K/V as well. A block whose
// stored length differs from the requested one (a short last block) is a miss and is
// replaced. With a byte budget (payload bytes; 0 = unlimited) the least recently used
// blocks are dropped after each insert. Recurrent layers have no K/V and are not modelled.
// Single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "sim/stack.h"
#include "sim/synthetic.h"
#include "sim/trace.h"

namespace kvtwin::bench {

struct BlockLruStats {
  int64_t requests = 0;
  int64_t block_accesses = 0;  // blocks looked up
  int64_t block_hits = 0;
  int64_t hit_tokens = 0;  // prompt tokens copied from the cache
  int64_t prompt_tokens = 0, output_tokens = 0;
  int64_t evicted_blocks = 0;
};

class BlockLru {
 public:
  // REQUIRES: config.Validate().ok(); budget_bytes >= 0.
  BlockLru(const sim::StackConfig& config, uint64_t value_seed, int64_t budget_bytes);
  ~BlockLru();
  BlockLru(const BlockLru&) = delete;
  BlockLru& operator=(const BlockLru&) = delete;

  // One request: its chained block ids and each block's token length (parallel), and the
  // plan whose inputs are those blocks' tokens in order.
  // REQUIRES: Σ block_lens == plan.inputs.size().
  void Run(std::span<const int64_t> block_ids, std::span<const int64_t> block_lens,
           const sim::RequestPlan& plan);

  const BlockLruStats& stats() const { return stats_; }
  int64_t cached_bytes() const { return bytes_; }
  // Folds one element of every request's last row: keeps the copies observable.
  double checksum() const { return checksum_; }

 private:
  // K and V rows (of different widths) are laid out [layer][token]: two allocations per
  // block, and each layer's K (or V) rows are contiguous, so a hit is two row-range copies
  // per layer.
  struct Block {
    int64_t id = 0;
    int64_t tokens = 0;
    uint64_t h_end = 0;  // the rolling hash after the block's last token
    Tensor keys, values;
    Block* prev = nullptr;
    Block* next = nullptr;
  };
  // The block for `id` with `len` tokens at the front of the list, or null (a miss).
  Block* Lookup(int64_t id, int64_t len);
  // Computes the block's rows for positions [start, start + tokens.size()) from hash `h`
  // into a fresh or replaced block at the front of the list; returns it.
  Block* Compute(int64_t id, std::span<const int32_t> tokens, int64_t start, uint64_t h);
  void CopyToWorking(const Block& block, int64_t start);
  void Decode(const sim::RequestPlan& plan, uint64_t h);
  void EnsureWorking(int64_t rows);
  void Unlink(Block* b);
  void PushFront(Block* b);
  void EvictOverBudget(const Block* keep);

  sim::SyntheticForward synth_;
  DType dtype_;
  int64_t k_cols_, v_cols_;
  std::vector<int32_t> attention_layers_;  // stack layer index of each modelled layer
  int64_t budget_bytes_;
  // Lookups only: nothing about this map's order reaches an output.
  // Nodes are stable, so the list links blocks in place.
  std::unordered_map<int64_t, Block> blocks_;
  std::unique_ptr<Block> head_;  // sentinel: head_->next is the most recently used
  int64_t bytes_ = 0;
  // The request's K/V: per modelled layer, rows [0, prompt + decoded).
  std::vector<Tensor> work_k_, work_v_;
  std::vector<uint64_t> hashes_;  // scratch: the rolling hash of a computed block's tokens
  BlockLruStats stats_;
  double checksum_ = 0;
};

}  // namespace kvtwin::bench
