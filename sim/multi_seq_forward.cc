// MultiSeqDriver, the forward half: a forward (and a reserve pass) applied to both caches,
// with the checks only a forward allows: its outcome, where StartForward placed the batch,
// the slots before and after the first ConvState (copy-on-write is lazy, §2.9.1), each conv
// layer's state as the forward reads it and the state it writes back (the forward's own
// graph), and what Get() shows: the current range, every row of the view in cell order, and
// the cells each batch token sees.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>

#include "sim/multi_seq_driver.h"
#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

SeqId S(int32_t seq) { return SeqId{seq}; }

Mismatch Outcome(const std::string& what, const Status& expected, const Status& actual) {
  return Mismatch{what + " outcome", expected.ToString(), actual.ToString()};
}

// "[3 (pos 2), 0 (pos 4)]": cell indices with the positions they hold.
std::string CellList(const std::vector<int64_t>& cells, const std::vector<int64_t>& positions) {
  std::vector<std::string> parts;
  size_t k = 0;
  while (k < cells.size()) {
    // Three or more cells in a row holding consecutive positions: "4..9 (pos 10..15)".
    size_t end = k + 1;
    while (end < cells.size() && cells[end] == cells[end - 1] + 1 &&
           positions[end] == positions[end - 1] + 1) {
      ++end;
    }
    if (end - k >= 3) {
      parts.push_back(fmt::format("{}..{} (pos {}..{})", cells[k], cells[end - 1], positions[k],
                                  positions[end - 1]));
    } else {
      parts.push_back(fmt::format("{} (pos {})", cells[k], positions[k]));
      end = k + 1;
    }
    k = end;
  }
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

// The rows a forward hands UpdateConvState for the new conv states `next`, whose values are
// exact in the cache dtype. An f32 cache gets them as they are. A narrower cache gets f32
// values off its grid that only round-to-nearest-even brings back (UnroundedConvValue, the
// variant rotating with the element, the layer and the step, so every shape occurs in a
// row); one step in eight it gets the cache dtype itself, the other kind of input
// UpdateConvState takes. `next` is overwritten.
Tensor ConvUpdateRows(DType dtype, int64_t step, int32_t layer, MatF& next) {
  if (dtype == DType::kFloat32 || step % 8 == 7) return Tensor::FromFloat(dtype, next);
  for (Eigen::Index i = 0; i < next.size(); ++i) {
    const auto variant = static_cast<uint32_t>(step + layer + i);
    next.data()[i] = UnroundedConvValue(dtype, next.data()[i], variant);
  }
  return Tensor::FromFloat(DType::kFloat32, next);
}

// The forward's SetCausal calls. The op's list goes in when it is non-empty, and an empty one
// when `empty_too` (so a StartForward that keeps the last list shows); a CausalDecoy first
// forces the call, the op's list then replacing the decoy. Before a non-empty list, one
// forward in two also hands over that list with an index past the batch appended: refused
// with InvalidArgument, and nothing changes, so the list itself is still a change (a
// refusal that kept the indices before the bad one would pass it as unchanged).
Check SetCausalLists(CausalCache& kv, const MsOp& op, bool empty_too, MsCoverage& coverage) {
  const std::optional<std::vector<int64_t>> decoy = CausalDecoy(op);
  if (Status s = decoy ? kv.SetCausal(*decoy) : Status::Ok(); !s.ok()) {
    return Outcome("decoy SetCausal", Status::Ok(), s);
  }
  if (!op.causal_off.empty() && (op.batch.size() + op.causal_off.front()) % 2 == 0) {
    std::vector<int64_t> refused = op.causal_off;
    refused.push_back(static_cast<int64_t>(op.batch.size()));
    const Status want = InvalidArgument("an index past the batch");
    if (Status s = kv.SetCausal(refused); s.code() != want.code()) {
      return Outcome("SetCausal with an index past the batch", want, s);
    }
  }
  if (!decoy && op.causal_off.empty() && !empty_too) return std::nullopt;
  if (Status s = kv.SetCausal(op.causal_off); !s.ok()) return Outcome("SetCausal", Status::Ok(), s);
  ++(op.causal_off.empty() ? coverage.causal_reset_calls : coverage.causal_off);
  return std::nullopt;
}

// The mask's shape (spec §2.8, [range x batch]): a row per batch token, each with a column
// per cell of the current range.
Check CheckMaskShape(const CausalCache::View& view, size_t tokens, int64_t columns,
                     const char* pass) {
  if (view.visible.size() != tokens) {
    return Mismatch{fmt::format("mask rows of {}", pass), std::to_string(tokens),
                    std::to_string(view.visible.size())};
  }
  for (size_t i = 0; i < tokens; ++i) {
    if (static_cast<int64_t>(view.visible[i].size()) != columns) {
      return Mismatch{fmt::format("mask columns of batch token {} of {}", i, pass),
                      std::to_string(columns), std::to_string(view.visible[i].size())};
    }
  }
  return std::nullopt;
}

}  // namespace

float UnroundedConvValue(DType dtype, float exact, uint32_t variant) {
  if (dtype == DType::kFloat32 || exact == 0.0f || !std::isfinite(exact)) return exact;
  // bf16 keeps the top 16 bits of an f32; the bottom 16 are what rounding decides about.
  // On the bit pattern, +/- moves away from / toward zero whatever the sign, and stays on
  // the same side of zero (|exact| is at least one bf16 ulp, 0x10000).
  auto bits = std::bit_cast<uint32_t>(exact);
  KV_CHECK((bits & 0xFFFFu) == 0, fmt::format("conv value {} is not exact in bf16", exact));
  const bool odd = (bits & 0x10000u) != 0;  // the last kept bit: where a tie goes
  switch (variant % 4) {
    case 0:  // a quarter ulp toward zero: rounds back up
      bits -= 0x4000u;
      break;
    case 1:  // a quarter ulp away from zero: rounds back down
      bits += 0x4000u;
      break;
    case 2:  // even: the tie below it; odd: one bit above that tie
      bits -= odd ? 0x7FFFu : 0x8000u;
      break;
    default:  // even: the tie above it; odd: one bit below that tie
      bits += odd ? 0x7FFFu : 0x8000u;
      break;
  }
  return std::bit_cast<float>(bits);
}

// What the hybrid says about the forward StartForward just began or refused: the batch's
// sequences in first-appearance order, its tokens per sequence and whether the batched
// path applies; after a refusal, no forward at all (a model consults these to pick its
// path, and a refused batch must not be described as the current one).
Check MultiSeqDriver::CheckForwardDescriptors(const MsOp& op, bool started) const {
  std::vector<int32_t> seqs;
  int64_t tokens = 0;
  if (started) {
    seqs = BatchSequences(op.batch);
    if (!seqs.empty()) tokens = static_cast<int64_t>(op.batch.size() / seqs.size());
  }
  const char* when = started ? "" : " after a refused StartForward";
  if (cache_->seqs() != seqs) {
    return Mismatch{fmt::format("the forward's sequences{}", when), fmt::format("{}", seqs),
                    fmt::format("{}", cache_->seqs())};
  }
  if (cache_->num_seqs() != static_cast<int64_t>(seqs.size())) {
    return Mismatch{fmt::format("num_seqs(){}", when), std::to_string(seqs.size()),
                    std::to_string(cache_->num_seqs())};
  }
  if (cache_->seq_tokens() != tokens) {
    return Mismatch{fmt::format("seq_tokens(){}", when), std::to_string(tokens),
                    std::to_string(cache_->seq_tokens())};
  }
  if (!started && !cache_->slots().empty()) {
    return Mismatch{"the forward's slots after a refused StartForward", "[]",
                    fmt::format("{}", cache_->slots())};
  }
  const bool batched = tokens > 0 && !seqs.empty();
  if (cache_->supported_for_batch() != batched) {
    return Mismatch{fmt::format("supported_for_batch(){}", when), batched ? "true" : "false",
                    cache_->supported_for_batch() ? "true" : "false"};
  }
  return std::nullopt;
}

Check MultiSeqDriver::ApplyReserve(const MsOp& op) {
  // Worst-case sizing: nothing is stored and the model does not move. The hybrid still
  // refuses unequal counts, and a batch beyond the cell count cannot be placed.
  std::vector<BatchToken> kv;
  for (const MsBatchToken& t : op.batch) kv.push_back({t.seq, t.pos});
  const Status actual = cache_->StartForward(kv, /*reserve=*/true);
  Status expected;
  if (static_cast<int64_t>(kv.size()) > model_.kv().config().cells) {
    expected = ResourceExhausted("reserving more tokens than cells");
  } else if (!EqualTokenCounts(op.batch)) {
    expected = Unsupported("unequal token counts");
  }
  Fold(static_cast<uint64_t>(actual.code()));
  if (actual.code() != expected.code()) return Outcome("reserve StartForward", expected, actual);
  if (Check c = CheckForwardDescriptors(op, actual.ok())) return c;
  if (!actual.ok()) return std::nullopt;
  ++coverage_.reserves;
  // The worst-case graph is the model's forward, so its SetCausal calls run too (spec §2.8:
  // each rebuilds the mask, over the whole cache here).
  if (Check c = SetCausalLists(cache_->mutable_kv(), op, false, coverage_)) return c;
  // Locations 0..n-1, the whole cache as range, fake slots 0..num_seqs-1.
  const auto n = static_cast<int64_t>(kv.size());
  std::vector<int64_t> locations(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) locations[static_cast<size_t>(i)] = i;
  if (cache_->kv().locations() != locations) {
    return ListMismatch("cells of a reserve pass", locations, cache_->kv().locations());
  }
  std::vector<int32_t> fake(BatchSequences(op.batch).size());
  for (size_t i = 0; i < fake.size(); ++i) fake[i] = static_cast<int32_t>(i);
  if (cache_->slots() != fake) {
    return Mismatch{"slots of a reserve pass", fmt::format("{}", fake),
                    fmt::format("{}", cache_->slots())};
  }
  const CausalCache::View view = cache_->Get();
  if (view.range_begin != 0 || view.range_end != cache_->kv().num_cells()) {
    return Mismatch{"current cell range of a reserve pass",
                    fmt::format("[0, {})", cache_->kv().num_cells()),
                    fmt::format("[{}, {})", view.range_begin, view.range_end)};
  }
  // The worst-case graph reads the whole cache: every row as it stands (nothing was placed)
  // and a mask row per batch token over all of them, by the forward's conditions.
  if (Check c = CheckViewRows(view)) return c;
  if (Check c = CheckReserveMask(Tokens(op), op.causal_off, view)) return c;
  // One pass in two (by its batch alone, so a replay makes the same choice) has its graph
  // run. Its Put scatters the batch's K/V rows into locations 0..n-1 (spec §2.8: Put writes
  // the chosen cells, and reserving chooses those without touching the metadata), over
  // whatever sequences hold them, which every later view then reads.
  const bool graph_runs = !op.batch.empty() && (op.batch.size() + op.batch.front().pos) % 2 == 0;
  if (graph_runs) {
    const model::MsBatch batch = Tokens(op);
    if (Check c = PutRows(batch, "Put of a reserve pass")) return c;
    model_.mutable_kv().ReservePut(batch);
    ++coverage_.reserve_puts;
    if (Check c = CheckViewRows(cache_->Get())) return c;
  }
  // A worst-case pass builds the whole graph, so its conv layers read their state too. The
  // pass maps nothing, so those reads must not unshare (copy-on-write) or move anything:
  // every slot, refcount and free-list entry stays what the model holds. When the graph
  // runs, each conv layer reads the fake slots' rows and writes them back shifted (spec
  // 2.9.1: the update writes the current slots), over whatever sequences hold slots 0..n-1.
  if (config_.num_conv_layers > 0 && graph_runs) {
    const std::vector<int32_t> order = BatchSequences(op.batch);
    before_rows_.resize(order.size());
    before_known_.resize(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      before_known_[i] = model_.SlotRowsInto(static_cast<int32_t>(i), before_rows_[i]);
    }
    const model::MsBatch batch = Tokens(op);
    if (Check c = RunConv(batch, order, /*reserve=*/true)) return c;
    model_.ReserveConvWrite(batch);
    ++coverage_.reserve_conv_writes;
  } else {
    for (int32_t layer = 0; layer < config_.num_conv_layers; ++layer) {
      const Result<Tensor> state = cache_->ConvState(layer);
      if (!state.ok()) {
        return Outcome(fmt::format("ConvState L{} of a reserve pass", layer), Status::Ok(),
                       state.status());
      }
      conv_allocated_[static_cast<size_t>(layer)] = 1;
      if (Check c = CheckConvStateShape(*state, static_cast<int64_t>(fake.size()), layer, true)) {
        return c;
      }
    }
  }
  if (config_.num_conv_layers > 0) {
    if (Check c = CheckSlots(/*current=*/false)) return c;
    if (Check c = CheckConv()) return c;
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckViewRows(const CausalCache::View& view) {
  // The view is the range in cell order: row j is cell begin + j, free cells included.
  const int64_t len = view.range_end - view.range_begin;
  if (view.k.rows() != len || view.v.rows() != len) {
    return Mismatch{"K/V rows of the view (Get)", fmt::format("{} each", len),
                    fmt::format("{} K, {} V", view.k.rows(), view.v.rows())};
  }
  model_.kv().CellsInto(cells_);
  const std::vector<model::MsCell>& cells = cells_;
  for (int64_t j = 0; j < len; ++j) {
    const int64_t index = view.range_begin + j;
    if (Check c =
            CheckRow(j, index, cells[static_cast<size_t>(index)].rows, view.k, j, view.v, j)) {
      return c;
    }
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckReserveMask(const model::MsBatch& batch,
                                       const std::vector<int64_t>& causal_off,
                                       const CausalCache::View& view) {
  const int64_t cells = cache_->kv().num_cells();
  if (Check c = CheckMaskShape(view, batch.size(), cells, "a reserve pass")) return c;
  for (size_t i = 0; i < batch.size(); ++i) {
    std::vector<int64_t>&got = got_, &want = want_;
    got.clear();
    want.clear();
    for (int64_t j = 0; j < cells; ++j) {
      if (view.visible[i][static_cast<size_t>(j)]) got.push_back(j);
    }
    const bool off = std::find(causal_off.begin(), causal_off.end(), static_cast<int64_t>(i)) !=
                     causal_off.end();
    model_.kv().ReserveVisibleInto(batch, i, off, entries_);
    for (const model::MsEntry& e : entries_) want.push_back(e.index);
    if (got != want) {
      return ListMismatch(fmt::format("cells visible to reserve batch token {} (s{} pos {})", i,
                                      Raw(batch[i].seq), batch[i].pos),
                          want, got);
    }
  }
  return std::nullopt;
}

void MultiSeqDriver::CountForward(const MsOp& op) {
  // Before the forward: what it writes over, whether its runs ascend, who joins.
  bool rewrites = false, unordered = false, joins = false, far = false, last = false,
       high_id = false, deep = false, interleaved = false;
  last_.clear();  // (sequence, its last position so far in the batch)
  for (const MsBatchToken& t : op.batch) {
    std::vector<int64_t>& held = held_;
    model_.kv().RetainedPositionsInto(S(t.seq), held);
    rewrites |= std::find(held.begin(), held.end(), t.pos) != held.end();
    far |= t.pos > kMaxPosition;
    last |= t.pos == kMaxBatchPosition;
    high_id |= t.seq >= kSeqBitsPerWord;
    deep |= t.pos >= kBigCells;
    if (held.empty()) {
      model_.kv().HistoryInto(S(t.seq), entries_);
      joins |= entries_.empty();
    }
    auto it = std::find_if(last_.begin(), last_.end(),
                           [&t](const std::pair<int32_t, int64_t>& l) { return l.first == t.seq; });
    if (it == last_.end()) {
      last_.emplace_back(t.seq, t.pos);
    } else {
      unordered |= t.pos < it->second;
      // The sequence came back after another one's token: its run is split.
      interleaved |= last_.back().first != t.seq;
      it->second = t.pos;
    }
  }
  coverage_.rewrites += rewrites;
  coverage_.interleaved_batches += interleaved;
  coverage_.unordered_batches += unordered;
  coverage_.joins += joins && last_.size() > 1;
  coverage_.far_batches += far;
  coverage_.last_position_batches += last;
  coverage_.high_id_batches += high_id;
  coverage_.deep_batches += deep;
  coverage_.big_cache_forwards += model_.kv().UsedCells() >= kBigCells;
}

Check MultiSeqDriver::ApplyForward(const MsOp& op) {
  const model::MsBatch batch = Tokens(op);
  CountForward(op);
  const int64_t used_before = model_.kv().UsedCells();
  kv_batch_.clear();
  for (const MsBatchToken& t : op.batch) kv_batch_.push_back({t.seq, t.pos});
  const Status actual = cache_->StartForward(kv_batch_);
  const Status expected = model_.StartForward(batch);
  Fold(static_cast<uint64_t>(actual.code()));
  if (actual.code() != expected.code()) return Outcome("StartForward", expected, actual);
  if (Check c = CheckForwardDescriptors(op, expected.ok())) return c;
  if (expected.ok()) return RunForward(op, batch);
  if (expected.code() == StatusCode::kResourceExhausted) {
    ++coverage_.cache_full;
    // Window maintenance ran before the cells ran out, and its pruning stays.
    if (model_.kv().UsedCells() < used_before) ++coverage_.cache_full_pruned;
  }
  if (expected.code() == StatusCode::kUnsupported) {
    ++coverage_.unequal_batches;
    const std::vector<int32_t> seqs = BatchSequences(op.batch);
    // Equal counts would divide the total: a refusal here says the counts were read.
    if (op.batch.size() % seqs.size() == 0) ++coverage_.unequal_even_totals;
    // A refused batch assigns no slot (spec §2.9.1): only a newcomer shows one taken early.
    for (const int32_t seq : seqs) {
      if (model_.SlotOf(SeqId{seq}).has_value()) continue;
      ++coverage_.unequal_newcomers;
      break;
    }
  }
  // The KV side may have committed before the hybrid refused: its placement is checkable.
  if (model_.kv().InForward()) return CheckPlacement();
  return std::nullopt;
}

Check MultiSeqDriver::RunForward(const MsOp& op, const model::MsBatch& batch) {
  if (Check c = CheckPlacement()) return c;
  // Copy-on-write belongs to the first ConvState: nothing may be unshared yet.
  if (Check c = CheckSlots(/*current=*/true)) return c;
  if (config_.num_conv_layers > 0) {
    std::vector<int32_t>& before_cow = before_cow_;
    before_cow = model_.CurrentSlots();
    Status actual = Status::Ok();
    if (Result<Tensor> first = cache_->ConvState(0); !first.ok()) {
      actual = first.status();
    } else {
      conv_allocated_[0] = 1;
    }
    const Status expected = model_.ConvState();
    Fold(static_cast<uint64_t>(actual.code()));
    if (actual.code() != expected.code()) return Outcome("first ConvState", expected, actual);
    if (!expected.ok()) {
      ++coverage_.cache_full;
      return std::nullopt;
    }
    for (size_t i = 0; i < before_cow.size(); ++i) {
      coverage_.cow_copies += model_.CurrentSlots()[i] != before_cow[i];
    }
    if (Check c = CheckSlots(/*current=*/true)) return c;
  }
  ++coverage_.forwards;
  const std::vector<int32_t> order = BatchSequences(op.batch);
  // Each sequence's state before the forward, by its index in `order` (its sequences are
  // distinct): known or not, and the rows.
  before_rows_.resize(order.size());
  before_known_.resize(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    before_known_[i] =
        model_.ExpectedConvInto(S(order[i]), model::ConvMode::kAsSpecified, before_rows_[i]);
  }
  // The forward's edits (another request's CopyPrefix or Remove while this one is set up)
  // go before the SetCausal calls when those rebuild the mask (a decoy or a list of its
  // own), for about half of such forwards: the mask Get shows is then built over the edited
  // metadata. Otherwise they go after them, just before Put, and Get must show the mask
  // as it was built before them. (A SetCausal that keeps the list rebuilds nothing in Go,
  // while the spec's wording says it rebuilds, so no edit goes before one of those.)
  const bool edits_first = !op.edits.empty() &&
                           (op.edits.size() + static_cast<size_t>(op.batch.front().pos)) % 2 == 0 &&
                           (!op.causal_off.empty() || CausalDecoy(op).has_value());
  if (edits_first) {
    if (Check c = ApplyForwardEdits(op)) return c;
  }
  // SetCausal only when asked, so a StartForward that keeps the last list shows; on every
  // fourth step an explicit empty list exercises the other path.
  if (Check c = SetCausalLists(cache_->mutable_kv(), op, steps_ % 4 == 0, coverage_)) return c;
  const bool masked_before = !op.edits.empty() && !edits_first;
  if (masked_before) {
    model_.kv().VisibleCellsInto(batch, op.causal_off, masked_);
    if (Check c = ApplyForwardEdits(op)) return c;
  }
  if (Check c = PutRows(batch, "Put")) return c;
  if (Check c = RunConv(batch, order)) return c;
  model_.FinishForward();
  return CheckVisible(batch, op.causal_off, masked_before ? &masked_ : nullptr);
}

Check MultiSeqDriver::ApplyForwardEdits(const MsOp& op) {
  for (const MsOp& edit : op.edits) {
    Fold(static_cast<uint64_t>(edit.kind));
    const int32_t target = edit.kind == MsOpKind::kCopyPrefix ? edit.dst : edit.seq;
    const bool on_batch = std::any_of(op.batch.begin(), op.batch.end(),
                                      [target](const MsBatchToken& t) { return t.seq == target; });
    ++coverage_.forward_edits;
    coverage_.forward_edits_on_batch += on_batch;
    Check c = edit.kind == MsOpKind::kCopyPrefix ? ApplyCopyPrefix(edit, /*in_forward=*/true)
                                                 : ApplyRemove(edit, /*in_forward=*/true);
    if (c) {
      c->what = fmt::format("{} (between StartForward and Put: {})", c->what, edit.ToString());
      return c;
    }
  }
  // Where the batch went stays StartForward's (the range Get reads is checked there).
  return CheckPlacement();
}

Check MultiSeqDriver::CheckConvStateShape(const Tensor& state, int64_t rows, int32_t layer,
                                          bool reserve) const {
  const int64_t cols = config_.d_conv * config_.hidden;
  if (state.dtype() == config_.dtype && state.rows() == rows && state.cols() == cols) {
    return std::nullopt;
  }
  return Mismatch{fmt::format("ConvState(L{}) shape{}", layer, reserve ? " of a reserve pass" : ""),
                  fmt::format("{}[{}x{}]", DTypeName(config_.dtype), rows, cols),
                  state.ShapeString()};
}

Check MultiSeqDriver::RunConv(const model::MsBatch& batch, const std::vector<int32_t>& order,
                              bool reserve) {
  const int64_t d = config_.d_conv, w = config_.hidden;
  // Every batch token's conv input, all layers side by side: a pure function of (pos, h),
  // so one computation per forward serves every layer.
  if (config_.num_conv_layers > 0) {
    inputs_.resize(batch.size());
    for (size_t k = 0; k < batch.size(); ++k) {
      ConvInputInto(batch[k].pos, batch[k].token.h, inputs_[k]);
    }
  }
  for (int32_t layer = 0; layer < config_.num_conv_layers; ++layer) {
    Result<Tensor> state = cache_->ConvState(layer);
    if (!state.ok())
      return Outcome(fmt::format("ConvState(L{})", layer), Status::Ok(), state.status());
    conv_allocated_[static_cast<size_t>(layer)] = 1;
    // The values below are read as floats, so a wider dtype or extra rows would pass there.
    if (Check c = CheckConvStateShape(*state, static_cast<int64_t>(order.size()), layer, reserve)) {
      return c;
    }
    state->Visit([this](const auto& m) { conv_got_ = m.template cast<float>(); });
    const MatF& rows = conv_got_;
    MatF& next = conv_next_;
    next.resize(static_cast<Eigen::Index>(order.size()), d * w);
    for (size_t i = 0; i < order.size(); ++i) {
      const auto r = static_cast<Eigen::Index>(i);
      const model::ConvRows* want = before_known_[i] != 0 ? &before_rows_[i] : nullptr;
      // [old rows ; this forward's inputs of the sequence], keep the newest d rows.
      std::vector<const float*>& stack = stack_;
      stack.clear();
      for (int64_t j = 0; j < d; ++j) {
        const float* got = rows.data() + r * d * w + j * w;
        if (want) {
          const float* exp = (*want)[static_cast<size_t>(j)].data() + layer * w;
          if (!std::equal(got, got + w, exp)) {
            return Mismatch{
                reserve ? fmt::format("ConvState(L{}) of fake slot {} (s{}) row {} at a reserve "
                                      "pass",
                                      layer, i, order[i], j)
                        : fmt::format("ConvState(L{}) of s{} row {} at the forward", layer,
                                      order[i], j),
                DescribeConv(layer, exp), DescribeConv(layer, got)};
          }
        }
        stack.push_back(got);
      }
      for (size_t k = 0; k < batch.size(); ++k) {
        if (Raw(batch[k].seq) == order[i]) stack.push_back(inputs_[k].data() + layer * w);
      }
      for (int64_t j = 0; j < d; ++j) {
        const float* src = stack[stack.size() - static_cast<size_t>(d - j)];
        std::copy(src, src + w, next.data() + r * d * w + j * w);
      }
    }
    cache_->UpdateConvState(layer, ConvUpdateRows(config_.dtype, steps_, layer, next));
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckPlacement() const {
  const std::vector<int64_t>& want = model_.kv().Locations();
  const std::vector<int64_t>& got = cache_->kv().locations();
  if (want != got) {
    return ListMismatch("cells the batch was placed in (token i -> the i-th free cell)", want, got);
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckVisible(const model::MsBatch& batch,
                                   const std::vector<int64_t>& causal_off,
                                   const std::vector<std::vector<model::MsVisibleCell>>* masked) {
  const CausalCache::View view = cache_->Get();
  const model::MsSpan range = model_.kv().CurrentRange();
  Fold(static_cast<uint64_t>(view.range_begin));
  Fold(static_cast<uint64_t>(view.range_end));
  const int64_t len = range.second - range.first;
  if (view.range_begin != range.first || view.range_end != range.second || view.k.rows() != len ||
      view.v.rows() != len) {
    return Mismatch{
        "current cell range of the forward (Get)",
        fmt::format("[{}, {})", range.first, range.second),
        fmt::format("[{}, {}) with {} K rows", view.range_begin, view.range_end, view.k.rows())};
  }
  if (Check c = CheckViewRows(view)) return c;
  if (Check c = CheckMaskShape(view, batch.size(), len, "the forward")) return c;
  if (masked == nullptr) {
    model_.kv().VisibleCellsInto(batch, causal_off, visible_);
    masked = &visible_;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const bool off = std::find(causal_off.begin(), causal_off.end(), static_cast<int64_t>(i)) !=
                     causal_off.end();
    std::vector<int64_t>&got = got_, &got_pos = got_pos_, &want = want_, &want_pos = want_pos_;
    for (auto* v : {&got, &got_pos, &want, &want_pos}) v->clear();
    for (size_t j = 0; j < view.visible[i].size(); ++j) {
      if (!view.visible[i][j]) continue;
      got.push_back(range.first + static_cast<int64_t>(j));
      got_pos.push_back(cache_->kv().cells()[static_cast<size_t>(got.back())].pos);
      Fold(static_cast<uint64_t>(got.back()));
    }
    for (const model::MsVisibleCell& e : (*masked)[i]) {
      want.push_back(e.index);
      want_pos.push_back(e.pos);
    }
    if (got != want) {
      return Mismatch{fmt::format("cells visible to batch token {} (s{} pos {}{}), in cell order",
                                  i, Raw(batch[i].seq), batch[i].pos, off ? ", causal off" : ""),
                      CellList(want, want_pos), CellList(got, got_pos)};
    }
  }
  return std::nullopt;
}

}  // namespace kvtwin::sim
