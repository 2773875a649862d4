// CausalCache: the multi-sequence cell cache of ggml (spec §2.8, historical
// `kvcache.Causal`). One cache serves several sequences of a batch: every cell holds one
// token's K/V row and the metadata {pos, set of sequences}; a cell whose set is empty is
// free. Configurations: plain causal (window and memory unlimited), sliding window w (ggml
// convention: a query at p sees [p − w, p], w + 1 tokens), window with extra memory m >= w,
// chunked attention c. Optional shift callback (RoPE) for Remove with a gap.
//
// Semantics follow the spec literally, including what is not transactional (spec §8
// quirk 6): StartForward may prune metadata before reporting "cache full"; Remove may
// change metadata before refusing to shift a shared cell or lacking a shift callback.
// Errors are Status values: ResourceExhausted ("cache full"), Unsupported ("shifting
// shared cells unsupported", "shift not supported"), InvalidArgument for malformed calls
// (a batch larger than max_batch, a sequence id out of range, Put rows that do not match
// the batch). Broken internal invariants abort. Single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <vector>

#include "src/core/status.h"
#include "src/core/tensor.h"

namespace kvtwin {

inline constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

// The most cells (and per-field sizes) a causal cache takes: guards the cell-count
// arithmetic and the allocation, far above any simulated cache. Create and DeriveCells
// refuse more with InvalidArgument.
inline constexpr int64_t kMaxCausalCells = int64_t{1} << 24;

struct CausalConfig {
  int32_t max_seqs = 1;
  int64_t capacity = 64;  // per sequence, in tokens
  int64_t max_batch = 8;
  int64_t window = kUnbounded;  // w; kUnbounded = plain causal
  int64_t memory = kUnbounded;  // m; kUnbounded = "same as window" (spec Init)
  int64_t chunk = 0;            // c; 0 = no chunked attention
  int64_t padding = 1;          // cell count and mask range rounding
  bool permuted_v = false;      // V stored transposed ([cols, cells]); Get returns rows
  int64_t kv_cols = 8;          // K and V row width
  DType dtype = DType::kFloat32;
};

// One token of a batch.
struct BatchToken {
  int32_t seq = 0;
  int64_t pos = 0;
};

class CausalCache {
 public:
  // Init (spec §2.8): window default unbounded; memory defaults to the window; a finite
  // window with max_seqs > 1 gets memory >= window + 1; memory >= capacity becomes
  // unbounded; cells = max_seqs × capacity (unbounded memory) or max_seqs × memory +
  // max_batch, rounded up to `padding`. Errors: memory < window, non-positive sizes.
  static Result<CausalCache> Create(CausalConfig config);
  // The cell count Create would allocate, or its refusal, without allocating: what a caller
  // (or a test of the 2^24 bound) asks before committing the memory. `config` gets Create's
  // derived memory.
  static Result<int64_t> DeriveCells(CausalConfig& config);

  struct Cell {
    int64_t pos = -1;
    std::set<int32_t> seqs;  // empty = free
  };

  // spec §2.8 StartForward. Not reserving: window maintenance (finite memory only), first-fit
  // slot finding (token i -> the i-th free cell in index order), metadata, mask. Reserving:
  // locations 0..n-1, the whole cache as range, no metadata change. Resets SetCausal.
  // InvalidArgument for a position outside [0, 2^31): ggml's batch positions are int32, and
  // the window arithmetic then never nears int64's limits.
  Status StartForward(std::span<const BatchToken> batch, bool reserve = false);
  // Disables the causal condition for these batch indices until the next StartForward.
  Status SetCausal(std::span<const int64_t> except);
  // Scatters the batch's rows into the chosen cells. REQUIRES-as-status: rows == batch size.
  Status Put(const Tensor& k, const Tensor& v);

  // What attention sees for the current forward: K/V rows of the cell range
  // [range_begin, range_end) in cell order (padding-widened), and for each batch token the
  // visibility of each of those cells (true = mask 0, false = −∞).
  struct View {
    int64_t range_begin = 0, range_end = 0;
    Tensor k, v;
    std::vector<std::vector<bool>> visible;  // [batch][range_end - range_begin]
  };
  View Get() const;

  Status CopyPrefix(int32_t src, int32_t dst, int64_t len);
  // Remove positions [begin, end) of `seq` (end == kUnbounded: to the end), shifting later
  // positions by begin − end and calling the shift callback on their keys.
  Status Remove(int32_t seq, int64_t begin, int64_t end);
  bool CanResume(int32_t seq, int64_t pos) const;

  // The RoPE shift: called with the cells (indices) whose keys move and the offset, in groups
  // of at most max_batch cells; it edits K through mutable_k(). Unset = Remove with a gap
  // (finite end) is Unsupported after the metadata change.
  using ShiftFn =
      std::function<Status(CausalCache& cache, std::span<const int64_t> cells, int64_t delta)>;
  void set_shift(ShiftFn shift) { shift_ = std::move(shift); }
  Tensor& mutable_k() { return k_; }

  // Read-only state for checkers and the hybrid cache.
  const CausalConfig& config() const { return config_; }  // with the derived memory
  int64_t num_cells() const { return static_cast<int64_t>(cells_.size()); }
  const std::vector<Cell>& cells() const { return cells_; }
  // Cell index of batch token i in the current forward.
  const std::vector<int64_t>& locations() const { return locations_; }
  // The [first, last] cell indices each sequence occupies (absent = none).
  const std::map<int32_t, std::pair<int64_t, int64_t>>& ranges() const { return ranges_; }
  const Tensor& k() const { return k_; }
  // V rows of a cell whatever the storage layout.
  Tensor VRow(int64_t cell) const;
  // VRow into `row`, which becomes [1, kv_cols] of the cache dtype; a `row` already of that
  // shape is overwritten in place (no allocation), for checkers that read every cell.
  void VRowInto(int64_t cell, Tensor& row) const;

 private:
  explicit CausalCache(CausalConfig config);

  CausalConfig config_;
  std::vector<Cell> cells_;
  Tensor k_, v_;  // k_: [cells, cols]; v_: [cells, cols] or [cols, cells] when permuted
  std::map<int32_t, std::pair<int64_t, int64_t>> ranges_;
  std::vector<BatchToken> batch_;
  std::vector<int64_t> locations_;
  std::vector<bool> causal_off_;  // per batch index
  int64_t cur_begin_ = 0, cur_end_ = 0;
  // Built by StartForward and SetCausal (as the Go mask), so edits between StartForward and
  // Get do not change what Get reports; K/V in Get are read live.
  std::vector<std::vector<bool>> mask_;
  ShiftFn shift_;
};

}  // namespace kvtwin
