// MultiSeqDriver, the op half: configuration, token hashes, op validity, a forward's decoy
// SetCausal list, and applying the sequence edits (CopyPrefix, Remove, CanResume) to both
// caches. Forwards live in multi_seq_forward.cc; the after-op state checks and the digest in
// multi_seq_checks.cc.
#include "sim/multi_seq_driver.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "src/core/check.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

SeqId S(int32_t seq) { return SeqId{seq}; }

std::string End(int64_t v) { return v == kvtwin::kUnbounded ? "inf" : std::to_string(v); }

// Every conv layer's input row for one token, side by side: the reference carries one conv
// state per sequence, so its rows hold all layers and the driver slices them. Without conv
// layers the reference still needs a width; layer 0's row stands in.
// `row` is scratch for one layer's row (resized once); `out` is replaced.
void ConvInputRow(const SyntheticForward& synth, const MultiSeqConfig& c, int64_t written_pos,
                  uint64_t h, MatF& row, model::ConvRow& out) {
  const int32_t layers = std::max(1, c.num_conv_layers);
  if (row.rows() != 1 || row.cols() != c.hidden) row.resize(1, c.hidden);
  out.clear();
  out.reserve(static_cast<size_t>(layers * c.hidden));
  for (int32_t layer = 0; layer < layers; ++layer) {
    synth.FillConvInput(row, 0, c.dtype, layer, written_pos, h, c.hidden);
    out.insert(out.end(), row.data(), row.data() + c.hidden);
  }
}

model::RefHybridCache MakeModel(const MultiSeqConfig& c, const SyntheticForward& synth) {
  Result<model::MultiSeqConfig> resolved = model::ResolveMultiSeqConfig(c.ToModelInit());
  KV_CHECK(resolved.ok(), "reference refused the configuration: " + resolved.status().ToString());
  // `row` is the lambda's own scratch: FillConvInput overwrites it before each read.
  return model::RefHybridCache(
      *resolved, c.d_conv, std::max(1, c.num_conv_layers) * c.hidden,
      [synth, c, row = MatF(1, c.hidden)](int64_t pos, const model::Token& t) mutable {
        model::ConvRow out;
        ConvInputRow(synth, c, pos, t.h, row, out);
        return out;
      });
}

Mismatch Outcome(const std::string& what, const Status& expected, const Status& actual) {
  return Mismatch{what + " outcome", expected.ToString(), actual.ToString()};
}

// Which outcome a Remove had: §2.8's two Unsupported refusals differ in cause and in what
// they leave behind, so the code alone does not tell them apart.
enum class RemoveOutcome : uint8_t { kOk, kSharedCells, kNoShift, kShiftFailed, kOther };

RemoveOutcome ClassifyRemove(const Status& s) {
  if (s.ok()) return RemoveOutcome::kOk;
  if (s.code() == StatusCode::kResourceExhausted) return RemoveOutcome::kShiftFailed;
  if (s.code() != StatusCode::kUnsupported) return RemoveOutcome::kOther;
  return s.message().find("shared") != std::string::npos ? RemoveOutcome::kSharedCells
                                                         : RemoveOutcome::kNoShift;
}

}  // namespace

Status MultiSeqConfig::Validate() const {
  // Past 4,096 sequences the generator's per-op scans of every id would dominate a run.
  if (max_seqs < 1 || max_seqs > 4096 || capacity < 1 || max_batch < 1 || padding < 1) {
    return InvalidArgument("multiseq: max_seqs (1..4096), capacity, max_batch, padding >= 1");
  }
  if (window < 1 || memory < 1 || chunk < 0) {
    return InvalidArgument("multiseq: window and memory >= 1, chunk >= 0");
  }
  if (kv_cols < kTagElements || num_conv_layers < 0 || num_conv_layers > 8 || d_conv < 1 ||
      hidden < 1) {
    return InvalidArgument("multiseq: kv_cols >= 7, conv layers 0..8, d_conv and hidden >= 1");
  }
  // A memory below the window is refused only where spec §2.8's Init refuses it: with
  // several sequences it is raised to window + 1, and a memory past the capacity means none.
  // The reference's derivation decides, so a cache that refuses a config the spec rescues
  // stops the driver at creation instead of being kept out of every run.
  const Result<model::MultiSeqConfig> resolved = model::ResolveMultiSeqConfig(ToModelInit());
  if (!resolved.ok()) return InvalidArgument("multiseq: " + resolved.status().message());
  // The cache's own bound, on the cells the layout derives.
  if (resolved->cells > kMaxCausalCells) {
    return InvalidArgument(
        fmt::format("multiseq: {} cells (max_seqs x {}) beyond 2^24", resolved->cells,
                    resolved->memory == model::kUnbounded ? "capacity" : "memory + max_batch"));
  }
  return Status::Ok();
}

HybridConfig MultiSeqConfig::ToHybrid() const {
  HybridConfig h;
  h.kv = CausalConfig{max_seqs, capacity, max_batch,  window,  memory,
                      chunk,    padding,  permuted_v, kv_cols, dtype};
  h.num_conv_layers = num_conv_layers;
  h.d_conv = d_conv;
  h.hidden = hidden;
  return h;
}

model::MultiSeqInit MultiSeqConfig::ToModelInit() const {
  model::MultiSeqInit init;
  init.window = window == kvtwin::kUnbounded ? model::kUnbounded : window;
  init.memory = memory == kvtwin::kUnbounded ? 0 : memory;
  init.chunk = chunk == 0 ? model::kUnbounded : chunk;
  init.max_seqs = max_seqs;
  init.capacity = capacity;
  init.max_batch = max_batch;
  init.padding = padding;
  init.shift_supported = shift_supported;
  return init;
}

std::string MultiSeqConfig::Describe() const {
  return fmt::format(
      "window={} memory={} chunk={} max_seqs={} capacity={} max_batch={} padding={} "
      "permuted_v={} dtype={} conv_layers={} d_conv={} hidden={} shift={} conv={}",
      End(window), memory == kvtwin::kUnbounded ? "default" : std::to_string(memory), chunk,
      max_seqs, capacity, max_batch, padding, permuted_v, DTypeName(dtype), num_conv_layers, d_conv,
      hidden, shift_supported, conv == ConvExpectation::kIdeal ? "ideal" : "as-specified");
}

std::string MsDivergence::ToString() const {
  return fmt::format("divergence at step {} ({}):\n  {}\n  expected: {}\n  actual:   {}", step, op,
                     mismatch.what, mismatch.expected, mismatch.actual);
}

MultiSeqDriver::MultiSeqDriver(MultiSeqConfig config, uint64_t value_seed)
    : config_(config), synth_(value_seed), model_(MakeModel(config, synth_)) {
  const Status valid = config_.Validate();
  KV_CHECK(valid.ok(), valid.ToString());
  Result<HybridCache> cache = HybridCache::Create(config_.ToHybrid());
  KV_CHECK(cache.ok(), "production refused the configuration: " + cache.status().ToString());
  cache_.emplace(std::move(cache).value());
  conv_allocated_.assign(static_cast<size_t>(config_.num_conv_layers), 0);
  if (config_.shift_supported) {
    // RoPE moves a key's position, not its content: re-encode the tag of each moved row.
    // The calls are recorded too: their grouping is checked after the Remove.
    // A Remove may make one call fail (FailingShiftCall): it is recorded, shifts nothing
    // and returns the error a shift graph that cannot be allocated would.
    cache_->mutable_kv().set_shift(
        [calls = shift_calls_, failing = failing_shift_call_](
            CausalCache& kv, std::span<const int64_t> cells, int64_t delta) {
          const auto call = static_cast<int64_t>(calls->size());
          calls->push_back({{cells.begin(), cells.end()}, delta});
          if (call == *failing) return ResourceExhausted(model::kShiftFailure);
          for (int64_t cell : cells) ShiftPositionTag(kv.mutable_k(), cell, delta);
          return Status::Ok();
        });
  }
  const model::MultiSeqConfig& m = model_.kv().config();
  const int64_t memory = cache_->kv().config().memory;
  const int64_t m_memory = m.memory == model::kUnbounded ? kvtwin::kUnbounded : m.memory;
  if (cache_->kv().num_cells() != m.cells || memory != m_memory) {
    divergence_ = MsDivergence{
        0, "init",
        Mismatch{"derived cell count / memory", fmt::format("{} / {}", m.cells, End(m_memory)),
                 fmt::format("{} / {}", cache_->kv().num_cells(), End(memory))}};
  }
  FoldState();
}

bool ValidMsOp(const MultiSeqConfig& config, const model::RefMultiSeqCache& ref, const MsOp& op) {
  (void)ref;  // every sequence is predictable: the reference state restricts nothing
  auto seq_ok = [&config](int32_t s) { return s >= 0 && s < config.max_seqs; };
  switch (op.kind) {
    case MsOpKind::kForward: {
      const auto n = static_cast<int64_t>(op.batch.size());
      if (n == 0 || n > config.max_batch) return false;
      for (const MsBatchToken& t : op.batch) {
        if (!seq_ok(t.seq) || t.pos < 0 || t.pos > kMaxBatchPosition) return false;
      }
      for (int64_t i : op.causal_off) {
        if (i < 0 || i >= n) return false;
      }
      if (op.reserve) return op.edits.empty();
      // Edits inside a forward go to the causal cache alone and leave the slots as they were,
      // so the ideal conv state (which follows the KV history) would part from the slots'
      // by construction: only as-specified runs take them.
      if (!op.edits.empty() && config.conv != ConvExpectation::kAsSpecified) return false;
      for (const MsOp& e : op.edits) {
        const bool edit = e.kind == MsOpKind::kCopyPrefix || e.kind == MsOpKind::kRemove;
        if (!edit || !e.edits.empty() || !ValidMsOp(config, ref, e)) return false;
      }
      // Sequences may interleave: the driver's conv takes each sequence's tokens in batch
      // order, whatever stands between them.
      return true;
    }
    case MsOpKind::kCopyPrefix:  // any int32 length: a negative one copies nothing
      return seq_ok(op.seq) && seq_ok(op.dst) && op.begin >= std::numeric_limits<int32_t>::min();
    case MsOpKind::kRemove:
      return seq_ok(op.seq) && op.begin >= 0 && op.end >= op.begin;
    case MsOpKind::kCanResume:
      return seq_ok(op.seq) && op.begin >= 0;
  }
  return false;
}

std::optional<std::vector<int64_t>> CausalDecoy(const MsOp& op) {
  if (op.kind != MsOpKind::kForward || op.reserve) return std::nullopt;
  // A hash of what the trace records of the op: replays and shrinks see the same calls.
  uint64_t h = 0;
  auto fold = [&h](uint64_t v) {
    uint64_t state = h ^ v;
    h = SplitMix64(state);
  };
  for (const MsBatchToken& t : op.batch) {
    fold(static_cast<uint64_t>(t.seq));
    fold(static_cast<uint64_t>(t.pos));
    fold(static_cast<uint64_t>(t.token));
  }
  for (int64_t i : op.causal_off) fold(static_cast<uint64_t>(i));
  if (h % 3 != 0) return std::nullopt;
  // Every index, or the ones the op leaves causal: either way the decoy and the op's list
  // together disable more than the op's list alone, unless that list is already all.
  const bool all = (h / 3) % 2 == 0;
  std::vector<int64_t> decoy;
  bool adds = false;  // some index the op leaves causal
  for (int64_t i = 0; i < static_cast<int64_t>(op.batch.size()); ++i) {
    const bool off =
        std::find(op.causal_off.begin(), op.causal_off.end(), i) != op.causal_off.end();
    if (all || !off) decoy.push_back(i);
    adds |= !off;
  }
  if (!adds) return std::nullopt;  // the op disables every index: a decoy would add nothing
  return decoy;
}

std::optional<MsDivergence> MultiSeqDriver::Apply(const MsOp& op) {
  KV_CHECK(!divergence_.has_value(), "the driver already diverged");
  KV_CHECK(Valid(op), "invalid multi-sequence op: " + op.ToString());
  ++steps_;
  Fold(static_cast<uint64_t>(op.kind));
  bool half_edited = half_edited_.contains(op.seq) && op.kind != MsOpKind::kForward;
  for (const MsBatchToken& t : op.batch) half_edited |= half_edited_.contains(t.seq);
  if (half_edited) ++coverage_.half_edited_ops;
  Check c;
  switch (op.kind) {
    case MsOpKind::kForward:
      c = op.reserve ? ApplyReserve(op) : ApplyForward(op);
      break;
    case MsOpKind::kCopyPrefix:
      c = ApplyCopyPrefix(op);
      break;
    case MsOpKind::kRemove:
      c = ApplyRemove(op);
      break;
    case MsOpKind::kCanResume:
      c = ApplyCanResume(op);
      break;
  }
  if (!c) c = CheckState();
  if (c) {
    divergence_ = MsDivergence{steps_ - 1, op.ToString(), *c};
    return divergence_;
  }
  FoldState();
  return std::nullopt;
}

std::optional<MsDivergence> MultiSeqDriver::CheckNow() {
  if (Check c = CheckState()) {
    divergence_ = MsDivergence{steps_, "check", *c};
    return divergence_;
  }
  return std::nullopt;
}

model::MsBatch MultiSeqDriver::Tokens(const MsOp& op) {
  // pos -> h per sequence, seeded from the sequence's own history (newest entry per
  // position), then extended by the batch's earlier tokens: h chains over the nearest
  // lower position, so forks that share a prefix share hashes and then part. A chain is a
  // vector of (pos, h) ascending by pos with unique positions (the history has one entry
  // per position), kept per sequence id so its storage is reused across forwards.
  const auto n = static_cast<size_t>(config_.max_seqs);
  chains_.resize(n);
  chained_.assign(n, 0);
  model::MsBatch out;
  out.reserve(op.batch.size());
  for (const MsBatchToken& t : op.batch) {
    std::vector<std::pair<int64_t, uint64_t>>& chain = chains_[static_cast<size_t>(t.seq)];
    if (chained_[static_cast<size_t>(t.seq)] == 0) {
      chained_[static_cast<size_t>(t.seq)] = 1;
      chain.clear();
      model_.kv().HistoryInto(S(t.seq), entries_);
      for (const model::MsEntry& e : entries_) chain.emplace_back(e.pos, e.token.h);
    }
    const auto below = std::lower_bound(
        chain.begin(), chain.end(), t.pos,
        [](const std::pair<int64_t, uint64_t>& e, int64_t pos) { return e.first < pos; });
    const uint64_t prev = below == chain.begin() ? synth_.seed() : std::prev(below)->second;
    const uint64_t h = NextHash(prev, t.token);
    if (below != chain.end() && below->first == t.pos) {
      below->second = h;
    } else {
      chain.insert(below, {t.pos, h});
    }
    out.push_back(model::MsToken{S(t.seq), t.pos, model::Token{t.token, h}});
  }
  return out;
}

model::ConvRow MultiSeqDriver::ConvInput(int64_t written_pos, uint64_t h) const {
  MatF row(1, config_.hidden);
  model::ConvRow out;
  ConvInputRow(synth_, config_, written_pos, h, row, out);
  return out;
}

void MultiSeqDriver::ConvInputInto(int64_t written_pos, uint64_t h, model::ConvRow& out) {
  ConvInputRow(synth_, config_, written_pos, h, conv_in_, out);
}

Check MultiSeqDriver::ApplyCopyPrefix(const MsOp& op, bool in_forward) {
  const Status actual = in_forward ? cache_->mutable_kv().CopyPrefix(op.seq, op.dst, op.begin)
                                   : cache_->CopyPrefix(op.seq, op.dst, op.begin);
  Fold(static_cast<uint64_t>(actual.code()));
  if (!actual.ok()) return Outcome("CopyPrefix", Status::Ok(), actual);
  entries_.clear();
  if (op.seq != op.dst) model_.kv().HistoryInto(S(op.seq), entries_);
  const std::vector<model::MsEntry>& src = entries_;
  if (!src.empty() && op.begin <= src.back().pos) ++coverage_.copy_prefix_partial;
  if (in_forward) {
    model_.mutable_kv().CopyPrefix(S(op.seq), S(op.dst), op.begin);
  } else {
    model_.CopyPrefix(S(op.seq), S(op.dst), op.begin);
  }
  half_edited_.erase(op.dst);  // dst's cells are all replaced
  ++coverage_.copy_prefix;
  return std::nullopt;
}

Check MultiSeqDriver::ApplyRemove(const MsOp& op, bool in_forward) {
  const bool finite = op.end != kvtwin::kUnbounded;
  model_.kv().HistoryInto(S(op.seq), entries_);
  const std::vector<model::MsEntry>& history = entries_;
  const int64_t next = history.empty() ? 0 : history.back().pos + 1;
  if (finite && (op.begin == op.end || op.end > next)) ++coverage_.removes_degenerate;
  if (finite && op.end >= std::numeric_limits<int32_t>::max()) ++coverage_.removes_far_end;
  shift_calls_->clear();
  // One finite Remove in five (by its fields alone, so a replay chooses alike; `end` reduced
  // first, as it may lie near the int64 bound) has the shift
  // callback fail on its first or second call: production returns the error with the
  // positions moved and the groups before it shifted.
  *failing_shift_call_ =
      finite && (op.seq * 7 + op.begin * 3 + op.end % 5) % 5 == 0 ? op.begin % 2 : int64_t{-1};
  const Status actual = in_forward ? cache_->mutable_kv().Remove(op.seq, op.begin, op.end)
                                   : cache_->Remove(op.seq, op.begin, op.end);
  const int64_t model_end = finite ? op.end : model::kUnbounded;
  const int64_t failing_call = config_.shift_supported ? *failing_shift_call_ : -1;
  const Status expected =
      in_forward ? model_.mutable_kv().Remove(S(op.seq), op.begin, model_end, failing_call)
                 : model_.Remove(S(op.seq), op.begin, model_end, failing_call);
  const int64_t failing = *failing_shift_call_;
  *failing_shift_call_ = -1;
  Fold(static_cast<uint64_t>(actual.code()));
  const RemoveOutcome outcome = ClassifyRemove(expected);
  if (actual.code() != expected.code() || ClassifyRemove(actual) != outcome) {
    return Outcome("Remove", expected, actual);
  }
  const bool shifted = finite && (expected.ok() || outcome == RemoveOutcome::kShiftFailed);
  if (Check c = CheckShiftCalls(op.seq, op.begin, op.end, shifted,
                                outcome == RemoveOutcome::kShiftFailed ? failing : -1)) {
    return c;
  }
  if (outcome == RemoveOutcome::kShiftFailed) {
    ++coverage_.removes_shift_failed;
    half_edited_.insert(op.seq);  // positions moved, some keys not
  } else if (outcome == RemoveOutcome::kSharedCells) {
    ++coverage_.removes_refused_shared;
    half_edited_.insert(op.seq);
  } else if (outcome == RemoveOutcome::kNoShift) {
    ++coverage_.removes_refused_no_shift;
  } else if (finite) {
    ++coverage_.removes_middle_shift;
  } else {
    ++(op.begin == 0 ? coverage_.removes_whole : coverage_.removes_tail);
    if (op.begin == 0) half_edited_.erase(op.seq);
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckShiftCalls(int32_t seq, int64_t begin, int64_t end, bool shifted,
                                      int64_t failed_call) {
  std::vector<ShiftCall> want;
  if (shifted) {
    model_.kv().CellsInto(cells_);
    auto holds = [&](size_t i) {
      const std::vector<SeqId>& seqs = cells_[i].seqs;
      return std::find(seqs.begin(), seqs.end(), S(seq)) != seqs.end();
    };
    size_t first = cells_.size(), last = 0;
    for (size_t i = 0; i < cells_.size(); ++i) {
      if (!holds(i)) continue;
      first = std::min(first, i);
      last = i;
    }
    const auto window = static_cast<size_t>(config_.max_batch);
    for (size_t start = first; start <= last && first < cells_.size(); start += window) {
      ShiftCall call{{}, begin - end};
      for (size_t i = start; i < std::min(last + 1, start + window); ++i) {
        if (holds(i) && cells_[i].pos >= begin) call.cells.push_back(static_cast<int64_t>(i));
      }
      if (!call.cells.empty()) want.push_back(std::move(call));
    }
    // The failing call is made; none after it.
    if (failed_call >= 0 && failed_call + 1 < static_cast<int64_t>(want.size())) {
      want.resize(static_cast<size_t>(failed_call + 1));
    }
  }
  if (*shift_calls_ == want) return std::nullopt;
  auto text = [](const std::vector<ShiftCall>& calls) {
    std::vector<std::string> parts;
    for (const ShiftCall& c : calls) parts.push_back(fmt::format("{} by {}", c.cells, c.delta));
    return fmt::format("[{}]", fmt::join(parts, "; "));
  };
  return Mismatch{fmt::format("RoPE shift calls of Remove(s{}, {}, {}) (cells by delta; groups "
                              "of max_batch {} cells from the sequence's first cell)",
                              seq, begin, End(end), config_.max_batch),
                  text(want), text(*shift_calls_)};
}

Check MultiSeqDriver::ApplyCanResume(const MsOp& op) {
  const bool actual = cache_->CanResume(op.seq, op.begin);
  const bool expected = model_.CanResume(S(op.seq), op.begin);
  Fold(actual);
  ++(expected ? coverage_.can_resume_true : coverage_.can_resume_false);
  if (actual != expected) {
    return Mismatch{fmt::format("CanResume(s{}, {})", op.seq, op.begin),
                    expected ? "true" : "false", actual ? "true" : "false"};
  }
  return std::nullopt;
}

}  // namespace kvtwin::sim
