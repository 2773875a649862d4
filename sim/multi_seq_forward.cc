// MultiSeqDriver, the forward half: a forward (and a reserve pass) applied to both caches,
// with the checks only a forward allows: its outcome, each conv layer's state as the forward
// reads it and the state it writes back (the forward's own graph), and what every batch
// token sees through Get().
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "sim/multi_seq_driver.h"

namespace kvtwin::sim {
namespace {

SeqId S(int32_t seq) { return SeqId{seq}; }

Mismatch Outcome(const std::string& what, const Status& expected, const Status& actual) {
  return Mismatch{what + " outcome", expected.ToString(), actual.ToString()};
}

}  // namespace

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
  if (actual.ok()) ++coverage_.reserves;
  return std::nullopt;
}

Check MultiSeqDriver::ApplyForward(const MsOp& op) {
  const model::MsBatch batch = Tokens(op);
  const std::vector<int32_t> order = BatchSequences(op.batch);
  std::map<int32_t, std::optional<model::ConvRows>> before;
  for (int32_t seq : order)
    before[seq] = model_.ExpectedConv(S(seq), model::ConvMode::kAsSpecified);
  std::vector<BatchToken> kv;
  for (const MsBatchToken& t : op.batch) kv.push_back({t.seq, t.pos});
  Status actual = cache_->StartForward(kv);
  // Copy-on-write runs at the first ConvState: its failure belongs to the forward's outcome.
  std::vector<int32_t> slots_before = cache_->slots();
  if (actual.ok() && config_.num_conv_layers > 0) {
    if (Result<Tensor> first = cache_->ConvState(0); !first.ok()) actual = first.status();
  }
  const Status expected = model_.Forward(batch);
  Fold(static_cast<uint64_t>(actual.code()));
  if (actual.code() != expected.code()) return Outcome("forward", expected, actual);
  if (expected.code() == StatusCode::kResourceExhausted) ++coverage_.cache_full;
  if (expected.code() == StatusCode::kUnsupported) ++coverage_.unequal_batches;
  if (!actual.ok()) return std::nullopt;
  ++coverage_.forwards;
  const std::vector<int32_t> slots_after = cache_->slots();
  for (size_t i = 0; i < slots_after.size(); ++i) {
    if (slots_after[i] != slots_before[i]) ++coverage_.cow_copies;
  }
  if (Status s = cache_->mutable_kv().SetCausal(op.causal_off); !s.ok()) {
    return Outcome("SetCausal", Status::Ok(), s);
  }
  if (!op.causal_off.empty()) ++coverage_.causal_off;
  if (Status s = PutRows(batch); !s.ok()) return Outcome("Put", Status::Ok(), s);
  if (Check c = RunConv(batch, order, before)) return c;
  return CheckVisible(batch, op.causal_off);
}

Status MultiSeqDriver::PutRows(const model::MsBatch& batch) {
  const auto n = static_cast<int64_t>(batch.size());
  Tensor k(config_.dtype, n, config_.kv_cols), v(config_.dtype, n, config_.kv_cols);
  for (int64_t i = 0; i < n; ++i) {
    const model::MsToken& t = batch[static_cast<size_t>(i)];
    synth_.FillKvRow(k, i, 0, t.pos, t.token.h, false);
    synth_.FillKvRow(v, i, 0, t.pos, t.token.h, true);
  }
  return cache_->Put(k, v);
}

Check MultiSeqDriver::RunConv(const model::MsBatch& batch, const std::vector<int32_t>& order,
                              const std::map<int32_t, std::optional<model::ConvRows>>& before) {
  const int64_t d = config_.d_conv, w = config_.hidden;
  for (int32_t layer = 0; layer < config_.num_conv_layers; ++layer) {
    Result<Tensor> state = cache_->ConvState(layer);
    if (!state.ok())
      return Outcome(fmt::format("ConvState(L{})", layer), Status::Ok(), state.status());
    const MatF rows = state->ToFloat();
    MatF next(static_cast<Eigen::Index>(order.size()), d * w);
    for (size_t i = 0; i < order.size(); ++i) {
      const auto r = static_cast<Eigen::Index>(i);
      const std::optional<model::ConvRows>& want = before.at(order[i]);
      // [old rows ; this forward's inputs of the sequence], keep the newest d rows.
      std::vector<const float*> stack;
      for (int64_t j = 0; j < d; ++j) {
        const float* got = rows.data() + r * d * w + j * w;
        if (want) {
          const float* exp = (*want)[static_cast<size_t>(j)].data() + layer * w;
          if (!std::equal(got, got + w, exp)) {
            return Mismatch{
                fmt::format("ConvState(L{}) of s{} row {} at the forward", layer, order[i], j),
                DescribeConv(layer, exp), DescribeConv(layer, got)};
          }
        }
        stack.push_back(got);
      }
      std::vector<model::ConvRow> inputs;
      for (const model::MsToken& t : batch) {
        if (Raw(t.seq) == order[i]) inputs.push_back(ConvInput(t.pos, t.token.h));
      }
      for (const model::ConvRow& in : inputs) stack.push_back(in.data() + layer * w);
      for (int64_t j = 0; j < d; ++j) {
        const float* src = stack[stack.size() - static_cast<size_t>(d - j)];
        std::copy(src, src + w, next.data() + r * d * w + j * w);
      }
    }
    cache_->UpdateConvState(layer, Tensor::FromFloat(config_.dtype, next));
  }
  return std::nullopt;
}

Check MultiSeqDriver::CheckVisible(const model::MsBatch& batch,
                                   const std::vector<int64_t>& causal_off) {
  const CausalCache::View view = cache_->Get();
  const std::vector<CausalCache::Cell>& cells = cache_->kv().cells();
  for (size_t i = 0; i < batch.size(); ++i) {
    const bool off = std::find(causal_off.begin(), causal_off.end(), static_cast<int64_t>(i)) !=
                     causal_off.end();
    const int32_t seq = Raw(batch[i].seq);
    std::vector<StoredRow> rows;
    std::vector<int64_t> positions;
    for (size_t j = 0; j < view.visible[i].size(); ++j) {
      if (!view.visible[i][j]) continue;
      const int64_t cell = view.range_begin + static_cast<int64_t>(j);
      if (!cells[static_cast<size_t>(cell)].seqs.contains(seq)) {
        return Mismatch{
            fmt::format("batch token {} (s{} pos {}) sees cell {}", i, seq, batch[i].pos, cell),
            fmt::format("a cell of s{}", seq),
            fmt::format("cell of {}", cells[static_cast<size_t>(cell)].seqs)};
      }
      const auto r = static_cast<int64_t>(j);
      rows.push_back(
          {cell, cells[static_cast<size_t>(cell)].pos, view.k.Rows(r, 1), view.v.Rows(r, 1)});
      positions.push_back(rows.back().pos);
      Fold(static_cast<uint64_t>(positions.back()));
    }
    std::vector<int64_t> expected = model_.kv().VisiblePositions(batch, i, off);
    std::sort(positions.begin(), positions.end());
    if (positions != expected) {
      return Mismatch{fmt::format("positions visible to batch token {} (s{} pos {}{})", i, seq,
                                  batch[i].pos, off ? ", causal off" : ""),
                      fmt::format("{}", expected), fmt::format("{}", positions)};
    }
    const std::string where =
        fmt::format("visible to batch token {} (s{} pos {}):", i, seq, batch[i].pos);
    if (Check c = MatchRows(rows, model_.kv().Visible(batch, i, off), where)) {
      return c;
    }
  }
  return std::nullopt;
}

}  // namespace kvtwin::sim
