#include "bench/block_lru.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "src/core/check.h"

namespace kvtwin::bench {

BlockLru::BlockLru(const sim::StackConfig& config, uint64_t value_seed, int64_t budget_bytes)
    : synth_(value_seed),
      dtype_(config.dtype),
      k_cols_(config.k_cols()),
      v_cols_(config.v_cols()),
      budget_bytes_(budget_bytes),
      head_(std::make_unique<Block>()) {
  const Status valid = config.Validate();
  KV_CHECK(valid.ok(), valid.ToString());
  KV_CHECK(budget_bytes >= 0, "a byte budget is >= 0 (0 = unlimited)");
  for (size_t i = 0; i < config.layers.size(); ++i) {
    if (config.layers[i].kind != CacheKind::kRecurrent) {
      attention_layers_.push_back(static_cast<int32_t>(i));
    }
  }
  work_k_.resize(attention_layers_.size());
  work_v_.resize(attention_layers_.size());
  head_->prev = head_->next = head_.get();
}

BlockLru::~BlockLru() = default;

void BlockLru::Unlink(Block* b) {
  b->prev->next = b->next;
  b->next->prev = b->prev;
}

void BlockLru::PushFront(Block* b) {
  b->prev = head_.get();
  b->next = head_->next;
  head_->next->prev = b;
  head_->next = b;
}

BlockLru::Block* BlockLru::Lookup(int64_t id, int64_t len) {
  const auto it = blocks_.find(id);
  if (it == blocks_.end() || it->second.tokens != len) return nullptr;
  Block* b = &it->second;
  Unlink(b);
  PushFront(b);
  return b;
}

BlockLru::Block* BlockLru::Compute(int64_t id, std::span<const int32_t> tokens, int64_t start,
                                   uint64_t h) {
  const auto len = static_cast<int64_t>(tokens.size());
  const auto layers = static_cast<int64_t>(attention_layers_.size());
  auto [it, inserted] = blocks_.try_emplace(id);
  Block* b = &it->second;
  if (inserted) {
    b->id = id;
  } else {
    Unlink(b);
  }
  if (inserted || b->tokens != len) {
    bytes_ -= b->keys.Bytes() + b->values.Bytes();
    b->keys = Tensor(dtype_, layers * len, k_cols_);
    b->values = Tensor(dtype_, layers * len, v_cols_);
    bytes_ += b->keys.Bytes() + b->values.Bytes();
    b->tokens = len;
  }
  hashes_.resize(tokens.size());
  for (size_t t = 0; t < tokens.size(); ++t) hashes_[t] = h = sim::NextHash(h, tokens[t]);
  b->h_end = h;
  for (int64_t l = 0; l < layers; ++l) {
    const int32_t layer = attention_layers_[static_cast<size_t>(l)];
    for (int64_t t = 0; t < len; ++t) {
      const uint64_t ht = hashes_[static_cast<size_t>(t)];
      synth_.FillKvRow(b->keys, l * len + t, layer, start + t, ht, false);
      synth_.FillKvRow(b->values, l * len + t, layer, start + t, ht, true);
    }
  }
  PushFront(b);
  EvictOverBudget(b);
  return b;
}

void BlockLru::EvictOverBudget(const Block* keep) {
  while (budget_bytes_ > 0 && bytes_ > budget_bytes_) {
    Block* victim = head_->prev;
    if (victim == head_.get() || victim == keep) return;
    Unlink(victim);
    bytes_ -= victim->keys.Bytes() + victim->values.Bytes();
    blocks_.erase(victim->id);
    ++stats_.evicted_blocks;
  }
}

void BlockLru::CopyToWorking(const Block& block, int64_t start) {
  const int64_t len = block.tokens;
  for (size_t l = 0; l < attention_layers_.size(); ++l) {
    const auto base = static_cast<int64_t>(l) * len;
    work_k_[l].CopyRows(start, block.keys, base, len);
    work_v_[l].CopyRows(start, block.values, base, len);
  }
}

void BlockLru::EnsureWorking(int64_t rows) {
  for (size_t l = 0; l < attention_layers_.size(); ++l) {
    if (work_k_[l].rows() >= rows) continue;
    const int64_t grown = std::max(rows, 2 * work_k_[l].rows());
    work_k_[l] = Tensor(dtype_, grown, k_cols_);
    work_v_[l] = Tensor(dtype_, grown, v_cols_);
  }
}

// The decode forwards: the seed at position len - 1 is the prompt's last row (already
// there), then every sampled token but the last at len, len + 1, ... (the last one is
// never forwarded, as in the production run).
void BlockLru::Decode(const sim::RequestPlan& plan, uint64_t h) {
  const auto len = static_cast<int64_t>(plan.inputs.size());
  for (size_t i = 0; i + 1 < plan.outputs.size(); ++i) {
    h = sim::NextHash(h, plan.outputs[i]);
    const int64_t p = len + static_cast<int64_t>(i);
    for (size_t l = 0; l < attention_layers_.size(); ++l) {
      synth_.FillKvRow(work_k_[l], p, attention_layers_[l], p, h, false);
      synth_.FillKvRow(work_v_[l], p, attention_layers_[l], p, h, true);
    }
  }
}

void BlockLru::Run(std::span<const int64_t> block_ids, std::span<const int64_t> block_lens,
                   const sim::RequestPlan& plan) {
  KV_CHECK(block_ids.size() == block_lens.size(), "one length per block id");
  const auto len = static_cast<int64_t>(plan.inputs.size());
  KV_CHECK(std::accumulate(block_lens.begin(), block_lens.end(), int64_t{0}) == len,
           "the blocks' lengths add up to the prompt");
  const auto outputs = static_cast<int64_t>(plan.outputs.size());
  const int64_t rows = len + std::max<int64_t>(0, outputs - 1);
  EnsureWorking(rows);
  ++stats_.requests;
  stats_.prompt_tokens += len;
  stats_.output_tokens += outputs;
  uint64_t h = synth_.seed();  // h_{-1}: the hash seed of the production run
  int64_t pos = 0;
  bool reusing = true;
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const int64_t n = block_lens[i];
    ++stats_.block_accesses;
    Block* b = reusing ? Lookup(block_ids[i], n) : nullptr;
    if (b != nullptr) {
      ++stats_.block_hits;
      stats_.hit_tokens += n;
    } else {
      reusing = false;  // prefix semantics: a block's rows depend on every earlier token
      b = Compute(block_ids[i], {plan.inputs.data() + pos, static_cast<size_t>(n)}, pos, h);
    }
    h = b->h_end;
    CopyToWorking(*b, pos);
    pos += n;
  }
  Decode(plan, h);
  if (!attention_layers_.empty() && rows > 0) {
    checksum_ += work_k_[0].At(rows - 1, sim::kTagElements) + work_v_.back().At(0, 0);
  }
}

}  // namespace kvtwin::bench
