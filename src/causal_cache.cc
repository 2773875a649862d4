// CausalCache (spec §2.8), the forward-pass half: Init derivations, StartForward (window
// maintenance, first-fit slot finding, metadata, current range), SetCausal, Put and Get with
// the mask. The sequence edits (CopyPrefix, Remove with its shift, CanResume) live in
// causal_cache_edit.cc. Ranges are maintained where the historical Go code maintains them
// (not recomputed on read) because a stale range after a failed Remove is observable.
#include "src/causal_cache.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "src/core/check.h"

namespace kvtwin {
namespace {

constexpr int64_t kMaxCells = kMaxCausalCells;
// ggml's batch positions are int32 (spec §2.8's Go code).
constexpr int64_t kMaxPos = std::numeric_limits<int32_t>::max();

int64_t RoundUp(int64_t n, int64_t pad) { return (n + pad - 1) / pad * pad; }
int64_t RoundDown(int64_t n, int64_t pad) { return n / pad * pad; }

// [min, max] cell indices; empty while max < min.
struct CellSpan {
  int64_t min = kUnbounded;
  int64_t max = -1;
  bool empty() const { return max < min; }
  void Add(int64_t cell) {
    min = std::min(min, cell);
    max = std::max(max, cell);
  }
};

Status ValidateSizes(const CausalConfig& c) {
  if (c.max_seqs < 1 || c.capacity < 1 || c.max_batch < 1 || c.padding < 1 || c.kv_cols < 1) {
    return InvalidArgument(
        "causal cache: max_seqs, capacity, max_batch, padding and kv_cols "
        "must be positive");
  }
  if (c.window < 1 || c.memory < 1 || c.chunk < 0) {
    return InvalidArgument("causal cache: window and memory must be positive, chunk >= 0");
  }
  if (c.capacity > kMaxCells || c.max_seqs > kMaxCells || c.max_batch > kMaxCells) {
    return InvalidArgument("causal cache: sizes beyond " + std::to_string(kMaxCells));
  }
  return Status::Ok();
}

// The memory rules of spec §2.8 Init, in the order of the Go code (the `>= capacity` test
// comes before the `< window` test, so a large memory can rescue an unbounded window).
Status DeriveMemory(CausalConfig& c) {
  if (c.memory == kUnbounded) c.memory = c.window;
  // One extra cell per sequence for the stop token, which is not part of a follow-on
  // sequence: jumping back to it must not break the window. Only needed with parallel
  // sequences; with one, the token stays in the batch headroom.
  if (c.memory != kUnbounded && c.window != kUnbounded && c.max_seqs > 1) {
    c.memory = std::max(c.memory, c.window + 1);
  }
  if (c.memory >= c.capacity) c.memory = kUnbounded;
  if (c.memory < c.window) {
    return InvalidArgument("causal cache: memory (" + std::to_string(c.memory) +
                           ") smaller than the window (" + std::to_string(c.window) + ")");
  }
  return Status::Ok();
}

Status ValidateBatch(std::span<const BatchToken> batch, const CausalConfig& c) {
  if (batch.empty()) return InvalidArgument("causal cache: empty batch");
  if (static_cast<int64_t>(batch.size()) > c.max_batch) {
    return InvalidArgument("causal cache: batch of " + std::to_string(batch.size()) +
                           " tokens exceeds max_batch " + std::to_string(c.max_batch));
  }
  for (const BatchToken& t : batch) {
    if (t.seq < 0 || t.seq >= c.max_seqs) {
      return InvalidArgument("causal cache: sequence " + std::to_string(t.seq) + " out of range");
    }
    if (t.pos < 0 || t.pos > kMaxPos) {
      return InvalidArgument("causal cache: position " + std::to_string(t.pos) +
                             " outside [0, 2^31)");
    }
  }
  return Status::Ok();
}

using Ranges = std::map<int32_t, std::pair<int64_t, int64_t>>;

// Spec §2.8 step 1. Prunes every stored sequence to its memory and returns the cells the
// batch's sequences still see through the window (the current range before placement).
// With unbounded memory nothing is pruned and the range is the union of the batch's
// sequences' ranges.
CellSpan UpdateWindow(std::vector<CausalCache::Cell>& cells, Ranges& ranges,
                      std::span<const BatchToken> batch, const CausalConfig& c) {
  CellSpan current;
  if (c.memory == kUnbounded) {
    for (const BatchToken& t : batch) {
      auto it = ranges.find(t.seq);
      if (it == ranges.end()) continue;
      current.Add(it->second.first);
      current.Add(it->second.second);
    }
    return current;
  }
  struct Lowest {
    int64_t pos;
    bool in_batch;
  };
  std::map<int32_t, Lowest> lowest;
  for (const BatchToken& t : batch) {
    auto [it, inserted] = lowest.try_emplace(t.seq, Lowest{t.pos, true});
    if (!inserted) it->second.pos = std::min(it->second.pos, t.pos);
  }
  // A sequence outside the batch keeps what its next token (last + 1) would need.
  for (const auto& [seq, range] : ranges) {
    if (lowest.contains(seq)) continue;
    int64_t last = 0;
    for (int64_t i = range.first; i <= range.second; ++i) {
      if (cells[i].seqs.contains(seq)) last = std::max(last, cells[i].pos);
    }
    lowest.emplace(seq, Lowest{last + 1, false});
  }
  for (const auto& [seq, low] : lowest) {
    auto it = ranges.find(seq);
    if (it == ranges.end()) continue;
    CellSpan kept;
    for (int64_t i = it->second.first; i <= it->second.second; ++i) {
      CausalCache::Cell& cell = cells[i];
      if (!cell.seqs.contains(seq)) continue;
      if (cell.pos < low.pos - c.memory) {
        cell.seqs.erase(seq);
      } else {
        kept.Add(i);
      }
      if (low.in_batch && cell.pos >= low.pos - c.window) current.Add(i);
    }
    if (kept.empty()) {
      ranges.erase(it);
    } else {
      it->second = {kept.min, kept.max};
    }
  }
  return current;
}

// Spec §2.8 step 2: token i goes to the i-th free cell in index order (not a contiguous
// block). Fewer than n free cells: returns what it found, the caller reports "cache full".
std::vector<int64_t> FindFreeCells(const std::vector<CausalCache::Cell>& cells, size_t n) {
  std::vector<int64_t> found;
  for (size_t i = 0; i < cells.size() && found.size() < n; ++i) {
    if (cells[i].seqs.empty()) found.push_back(static_cast<int64_t>(i));
  }
  return found;
}

bool Visible(const CausalCache::Cell& cell, const BatchToken& token, bool causal,
             const CausalConfig& c) {
  if (!cell.seqs.contains(token.seq)) return false;
  if (causal && cell.pos > token.pos) return false;
  if (c.chunk > 0 && cell.pos < token.pos - token.pos % c.chunk) return false;
  return c.window == kUnbounded || cell.pos >= token.pos - c.window;
}

// visible[i][j] for batch token i and cell begin + j (spec §2.8 Mask).
std::vector<std::vector<bool>> BuildMask(const std::vector<CausalCache::Cell>& cells,
                                         const std::vector<BatchToken>& batch,
                                         const std::vector<bool>& causal_off, int64_t begin,
                                         int64_t end, const CausalConfig& c) {
  std::vector<std::vector<bool>> mask(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    for (int64_t j = begin; j < end; ++j) {
      mask[i].push_back(Visible(cells[static_cast<size_t>(j)], batch[i], !causal_off[i], c));
    }
  }
  return mask;
}

}  // namespace

CausalCache::CausalCache(CausalConfig config) : config_(config) {}

Result<int64_t> CausalCache::DeriveCells(CausalConfig& config) {
  KV_RETURN_IF_ERROR(ValidateSizes(config));
  KV_RETURN_IF_ERROR(DeriveMemory(config));
  const int64_t cells = config.memory == kUnbounded
                            ? config.max_seqs * config.capacity
                            : config.max_seqs * config.memory + config.max_batch;
  const int64_t padded = RoundUp(cells, config.padding);
  if (padded > kMaxCells) {
    return InvalidArgument("causal cache: " + std::to_string(padded) + " cells exceed " +
                           std::to_string(kMaxCells));
  }
  return padded;
}

Result<CausalCache> CausalCache::Create(CausalConfig config) {
  Result<int64_t> cells = DeriveCells(config);
  if (!cells.ok()) return cells.status();
  const int64_t padded = *cells;
  CausalCache cache(config);
  cache.cells_.resize(static_cast<size_t>(padded));
  cache.k_ = Tensor(config.dtype, padded, config.kv_cols);
  cache.v_ = config.permuted_v ? Tensor(config.dtype, config.kv_cols, padded)
                               : Tensor(config.dtype, padded, config.kv_cols);
  return cache;
}

Status CausalCache::StartForward(std::span<const BatchToken> batch, bool reserve) {
  KV_RETURN_IF_ERROR(ValidateBatch(batch, config_));
  batch_.assign(batch.begin(), batch.end());
  causal_off_.assign(batch.size(), false);  // SetCausal lasts one forward
  locations_.clear();
  if (reserve) {
    // Worst-case sizing: the whole cache as range, no metadata change.
    if (static_cast<int64_t>(batch.size()) > num_cells()) {
      batch_.clear();
      return ResourceExhausted("causal cache full: reserving more tokens than cells");
    }
    for (int64_t i = 0; i < static_cast<int64_t>(batch.size()); ++i) locations_.push_back(i);
    cur_begin_ = 0;
    cur_end_ = num_cells();
    mask_ = BuildMask(cells_, batch_, causal_off_, cur_begin_, cur_end_, config_);
    return Status::Ok();
  }
  CellSpan current = UpdateWindow(cells_, ranges_, batch, config_);
  std::vector<int64_t> free_cells = FindFreeCells(cells_, batch.size());
  if (free_cells.size() < batch.size()) {
    // Not transactional (spec §8 quirk 6): the pruning above stays.
    batch_.clear();
    return ResourceExhausted("causal cache full (cells: " + std::to_string(num_cells()) +
                             ", batch: " + std::to_string(batch.size()) + ")");
  }
  locations_ = std::move(free_cells);
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t loc = locations_[i];
    cells_[loc] = Cell{batch[i].pos, {batch[i].seq}};
    auto [it, inserted] = ranges_.try_emplace(batch[i].seq, loc, loc);
    if (!inserted) {
      it->second.first = std::min(it->second.first, loc);
      it->second.second = std::max(it->second.second, loc);
    }
    current.Add(loc);
  }
  cur_begin_ = RoundDown(current.min, config_.padding);
  cur_end_ = std::min(RoundUp(current.max + 1, config_.padding), num_cells());
  mask_ = BuildMask(cells_, batch_, causal_off_, cur_begin_, cur_end_, config_);
  return Status::Ok();
}

Status CausalCache::SetCausal(std::span<const int64_t> except) {
  for (int64_t i : except) {
    if (i < 0 || i >= static_cast<int64_t>(batch_.size())) {
      return InvalidArgument("causal cache: SetCausal index " + std::to_string(i) +
                             " outside the batch");
    }
  }
  // The list replaces the previous one; as in Go, the mask is rebuilt only when it changes.
  std::vector<bool> off(batch_.size(), false);
  for (int64_t i : except) off[static_cast<size_t>(i)] = true;
  if (off == causal_off_) return Status::Ok();
  causal_off_ = std::move(off);
  mask_ = BuildMask(cells_, batch_, causal_off_, cur_begin_, cur_end_, config_);
  return Status::Ok();
}

Status CausalCache::Put(const Tensor& k, const Tensor& v) {
  if (batch_.empty()) return FailedPrecondition("causal cache: Put without a started forward");
  const auto n = static_cast<int64_t>(batch_.size());
  if (k.rows() != n || v.rows() != n) {
    return InvalidArgument("causal cache: Put of " + std::to_string(k.rows()) + "/" +
                           std::to_string(v.rows()) + " rows for a batch of " + std::to_string(n));
  }
  if (k.cols() != config_.kv_cols || v.cols() != config_.kv_cols || k.dtype() != config_.dtype ||
      v.dtype() != config_.dtype) {
    return InvalidArgument("causal cache: Put rows of shape " + k.ShapeString() + "/" +
                           v.ShapeString() + " do not match the cache");
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t loc = locations_[static_cast<size_t>(i)];
    k_.CopyRows(loc, k, i, 1);
    if (!config_.permuted_v) {
      v_.CopyRows(loc, v, i, 1);
      continue;
    }
    for (int64_t c = 0; c < config_.kv_cols; ++c) v_.Set(c, loc, v.At(i, c));
  }
  return Status::Ok();
}

CausalCache::View CausalCache::Get() const {
  KV_CHECK(!batch_.empty(), "causal cache: Get without a started forward");
  View view;
  view.range_begin = cur_begin_;
  view.range_end = cur_end_;
  const int64_t len = cur_end_ - cur_begin_;
  view.k = k_.Rows(cur_begin_, len);
  if (config_.permuted_v) {
    view.v = Tensor(config_.dtype, len, config_.kv_cols);
    for (int64_t r = 0; r < len; ++r) {
      for (int64_t c = 0; c < config_.kv_cols; ++c) view.v.Set(r, c, v_.At(c, cur_begin_ + r));
    }
  } else {
    view.v = v_.Rows(cur_begin_, len);
  }
  view.visible = mask_;
  return view;
}

Tensor CausalCache::VRow(int64_t cell) const {
  Tensor row;
  VRowInto(cell, row);
  return row;
}

void CausalCache::VRowInto(int64_t cell, Tensor& row) const {
  KV_CHECK(cell >= 0 && cell < num_cells(), "causal cache: VRow cell out of range");
  row.EnsureShape(config_.dtype, 1, config_.kv_cols);
  if (!config_.permuted_v) {
    row.CopyRows(0, v_, cell, 1);
    return;
  }
  for (int64_t c = 0; c < config_.kv_cols; ++c) row.Set(0, c, v_.At(c, cell));
}

}  // namespace kvtwin
