// MultiSeqDriver: lock-step runs of the multi-sequence caches (spec §2.8, §2.9.1, §5.2). One
// production HybridCache (one attention layer over the embedded CausalCache, and
// num_conv_layers short-conv layers) and the reference RefHybridCache receive every MsOp;
// after each op the driver checks, and stops at the first difference:
// * the outcome class (StatusCode) of StartForward (+ the first ConvState), CopyPrefix,
//   Remove, and CanResume's bool;
// * after a forward, per batch token: the positions of the cells Get() shows visible (each
//   must hold the token's sequence) equal the model's Visible as multisets, and their K/V
//   rows are bit-exact (expected K = the row written at written_pos with its position tag
//   moved by the entry's RoPE shifts; V never moves);
// * every cell: per sequence the held positions equal the model's retained ones, cells are
//   shared exactly as the model's lineage says, and every stored K/V row is the expected one;
// * conv: each conv layer's state, as ConvState returns it in a forward and as each slot
//   holds it after every op, against the model's as-specified state (kAsSpecified);
// * slots: refcount == sequences mapped, no leaked or lost slot, the free list holds
//   exactly the free slots, and the sequences of each model group share one slot.
// With ConvExpectation::kIdeal a sequence whose as-specified conv state leaves the ideal one
// (the documented weaknesses, spec §8 quirk 7) is a divergence too; with kAsSpecified it is
// only counted. Values: K/V rows are SyntheticForward::KvRow(layer 0, pos, h), conv inputs
// FillConvInput(layer, pos, h), with h chained per sequence over that sequence's own history
// (so a row of another sequence shows). Every observable is folded into a 64-bit digest.
// Single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "model/ref_multi_seq.h"
#include "sim/checks.h"
#include "sim/multi_seq_ops.h"
#include "sim/synthetic.h"
#include "src/hybrid_cache.h"

namespace kvtwin::sim {

enum class ConvExpectation : uint8_t { kAsSpecified, kIdeal };

// The cache shape of a run: the ggml Init arguments plus the conv side.
struct MultiSeqConfig {
  int64_t window = kvtwin::kUnbounded;  // ggml w (a query sees w + 1 tokens)
  int64_t memory = kvtwin::kUnbounded;  // kUnbounded: the default, = window
  int64_t chunk = 0;                    // 0: off
  int32_t max_seqs = 4;
  int64_t capacity = 32;
  int64_t max_batch = 8;
  int64_t padding = 1;
  bool permuted_v = false;
  DType dtype = DType::kFloat32;
  int64_t kv_cols = 8;
  int32_t num_conv_layers = 1;
  int64_t d_conv = 2;
  int64_t hidden = 4;
  bool shift_supported = true;  // a RoPE shift callback is installed
  ConvExpectation conv = ConvExpectation::kAsSpecified;

  Status Validate() const;
  HybridConfig ToHybrid() const;
  model::MultiSeqInit ToModelInit() const;
  std::string Describe() const;  // one line, every field
  friend bool operator==(const MultiSeqConfig&, const MultiSeqConfig&) = default;
};

struct MsCoverage {
  int64_t forwards = 0;  // successful, not reserving
  int64_t reserves = 0;
  int64_t cache_full = 0;
  int64_t unequal_batches = 0;  // refused Unsupported by the hybrid
  int64_t causal_off = 0;       // forwards with SetCausal indices
  int64_t copy_prefix = 0;
  int64_t copy_prefix_partial = 0;  // len below the source's length
  int64_t removes_tail = 0;
  int64_t removes_whole = 0;
  int64_t removes_middle_shift = 0;
  int64_t removes_refused_shared = 0;
  int64_t removes_refused_no_shift = 0;
  int64_t cow_copies = 0;
  int64_t can_resume_true = 0;
  int64_t can_resume_false = 0;
  int64_t ideal_divergences = 0;  // a sequence newly leaving the ideal conv state
  std::string ToString() const;
  MsCoverage& operator+=(const MsCoverage& o);
};

struct MsDivergence {
  int64_t step = 0;
  std::string op;
  Mismatch mismatch;
  std::string ToString() const;  // multi-line human report
};

// Whether `op` is one a correct runner may issue to a cache of shape `config` whose reference
// state is `ref` (the reference's REQUIREs plus production's argument rules: batch sizes and
// ids in range, contiguous equal-count batches, indeterminate sequences only cleared).
// Shared by the driver and by generators that keep their own reference.
bool ValidMsOp(const MultiSeqConfig& config, const model::RefMultiSeqCache& ref, const MsOp& op);

class MultiSeqDriver {
 public:
  // REQUIRES: config.Validate().ok(). A production/model disagreement on the derived cell
  // count or memory is a divergence at step 0, before any op.
  MultiSeqDriver(MultiSeqConfig config, uint64_t value_seed);

  // Applies `op` to both caches and checks; returns the first divergence (also kept).
  // REQUIRES: no divergence yet; Valid(op).
  std::optional<MsDivergence> Apply(const MsOp& op);
  // ValidMsOp against the driver's reference.
  bool Valid(const MsOp& op) const { return ValidMsOp(config_, model_.kv(), op); }

  const MultiSeqConfig& config() const { return config_; }
  const model::RefHybridCache& model() const { return model_; }
  const HybridCache& cache() const { return *cache_; }
  // For tests that plant wrong state in production; the next check must report it.
  HybridCache& mutable_cache() { return *cache_; }
  // Re-runs every after-op check without an op (tests of planted state).
  std::optional<MsDivergence> CheckNow();
  bool Determinate(int32_t seq) const { return model_.kv().Determinate(SeqId{seq}); }
  int64_t steps() const { return steps_; }
  uint64_t digest() const { return digest_; }
  const MsCoverage& coverage() const { return coverage_; }
  const std::optional<MsDivergence>& divergence() const { return divergence_; }

 private:
  // The op's batch as model tokens, each h chained over its sequence's history.
  model::MsBatch Tokens(const MsOp& op) const;
  model::ConvRow ConvInput(int64_t written_pos, uint64_t h) const;  // all layers side by side
  Tensor ExpectedRow(const model::MsEntry& e, bool is_value) const;

  Check ApplyForward(const MsOp& op);
  Check ApplyReserve(const MsOp& op);
  Check ApplyCopyPrefix(const MsOp& op);
  Check ApplyRemove(const MsOp& op);
  Check ApplyCanResume(const MsOp& op);
  // Reads, checks and writes every conv layer of a started forward (the forward's graph).
  Check RunConv(const model::MsBatch& batch, const std::vector<int32_t>& order,
                const std::map<int32_t, std::optional<model::ConvRows>>& before);
  Status PutRows(const model::MsBatch& batch);
  Check CheckVisible(const model::MsBatch& batch, const std::vector<int64_t>& causal_off);

  // After every op (multi_seq_checks.cc).
  Check CheckState();
  Check CheckRetention() const;
  Check CheckCells() const;
  Check CheckSlots() const;
  // mapped[slot]: the sequences production maps to it.
  Check CheckSlotCounts(const std::vector<std::vector<int32_t>>& mapped) const;
  Check CheckSlotGroups(const std::vector<std::vector<int32_t>>& mapped) const;
  Check CheckConv() const;
  Check CheckIdeal();
  // One production cell as a checker reads it.
  struct StoredRow {
    int64_t cell = 0;
    int64_t pos = 0;
    Tensor k, v;
  };
  // A cell as (position, the determinate sequences holding it).
  using CellKey = std::pair<int64_t, std::vector<int32_t>>;
  std::map<CellKey, std::vector<StoredRow>> StoredCells() const;
  std::map<CellKey, std::vector<model::MsEntry>> ExpectedCells() const;
  // Pairs production rows with model entries of equal positions (the multisets of positions
  // already agree) by bit equality; an entry without data (its forward never ran) takes
  // any row.
  Check MatchRows(const std::vector<StoredRow>& rows, std::vector<model::MsEntry> entries,
                  const std::string& where) const;
  std::string DescribeConv(int32_t layer, const float* row) const;

  void Fold(uint64_t value);
  void FoldState();

  MultiSeqConfig config_;
  SyntheticForward synth_;
  std::optional<HybridCache> cache_;  // always set after construction
  model::RefHybridCache model_;
  int64_t steps_ = 0;
  uint64_t digest_ = 0;
  MsCoverage coverage_;
  std::set<int32_t> ideal_diverged_;  // sequences currently off the ideal conv state
  std::optional<MsDivergence> divergence_;
};

}  // namespace kvtwin::sim
