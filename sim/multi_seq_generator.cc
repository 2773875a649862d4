#include "sim/multi_seq_generator.h"

#include <algorithm>
#include <bit>
#include <iterator>
#include <limits>
#include <utility>

#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

SeqId S(int32_t seq) { return SeqId{seq}; }

// The draws both shapes share, in this order: V layout, dtype, K/V row width, conv layers
// and their width, the shift callback.
void DrawRowsAndConv(Rng& rng, int64_t max_d_conv, MultiSeqConfig& c) {
  c.permuted_v = rng.Chance(1, 2);
  c.dtype = rng.Chance(1, 2) ? DType::kFloat32 : DType::kBFloat16;
  c.kv_cols = rng.Chance(1, 2) ? 8 : 12;
  c.num_conv_layers = static_cast<int32_t>(rng.Range(0, 2));
  c.d_conv = rng.Range(1, max_d_conv);
  c.hidden = rng.Chance(1, 2) ? 2 : 4;
  c.shift_supported = !rng.Chance(1, 6);
}

}  // namespace

// The edits and interleave streams are forks of copies: drawing from them leaves every op
// stream as it was (up to the first forward an edit changes).
MultiSeqGenerator::MultiSeqGenerator(Rng rng, int64_t base, bool huge)
    : rng_(rng),
      edits_rng_(Rng(rng).Fork("forward-edits")),
      merge_rng_(Rng(rng).Fork("interleave")),
      base_(base),
      huge_(huge) {
  KV_CHECK(base >= 0 && base <= kMaxBatchPosition - 8, "a run's base position out of range");
}

MultiSeqConfig DrawMultiSeqConfig(Rng& rng) {
  MultiSeqConfig c;
  const int64_t windows[] = {1, 2, 3, 4, 8};
  if (rng.Chance(2, 3)) {
    c.window = windows[rng.Below(5)];
    // The default (= window) or more memory, which may reach the capacity (then unbounded).
    if (rng.Chance(1, 2)) c.memory = c.window + rng.Range(0, 4);
  }
  // Chunk 1 is the boundary (every token its own chunk); 3 is not a power of two.
  const int64_t chunks[] = {1, 2, 3, 4};
  if (rng.Chance(1, 3)) c.chunk = chunks[rng.Below(4)];
  c.max_seqs = static_cast<int32_t>(rng.Range(1, 8));
  // With several sequences Init raises any memory below window + 1 to it (spec §2.8), so a
  // memory drawn equal to the window is stated below it instead, down to half: the cache's
  // shape is the same, and a rescue that only fires at memory == window is refused. Derived
  // from the draws so far, so every seed's stream is what it was.
  if (c.max_seqs > 1 && c.window != kvtwin::kUnbounded && c.memory == c.window && c.window > 1) {
    c.memory = (c.window + 1) / 2;
  }
  const int64_t capacities[] = {6, 8, 12, 16, 32};
  c.capacity = capacities[rng.Below(5)];
  const int64_t batches[] = {1, 2, 4, 8, 8, 16};
  c.max_batch = batches[rng.Below(6)];
  c.padding = rng.Chance(1, 3) ? 4 : 1;
  DrawRowsAndConv(rng, /*max_d_conv=*/3, c);
  // A windowed cache's cells follow its memory, not its capacity (spec §2.8: max_seqs x
  // memory + max_batch), so a capacity whose full layout max_seqs x capacity would pass
  // 2^24 cells is fine there; a size check on the full layout refuses it. One such config
  // in three, where the memory stays below both capacities, so the cache is the same one:
  // derived from the draws, every stream as it was.
  const Result<model::MultiSeqConfig> resolved = model::ResolveMultiSeqConfig(c.ToModelInit());
  if (resolved.ok() && resolved->memory != model::kUnbounded && c.max_seqs > 1 &&
      (c.max_seqs + c.max_batch + c.capacity) % 3 == 0) {
    c.capacity += kMaxCausalCells / c.max_seqs;
  }
  // A ubatch that is not a power of two (a server's n_ubatch is any count; the drawn ones
  // are all powers of two, where a mask instead of a modulo, or a size rounded up, passes):
  // one config in three, derived from the draws, so every stream is what it was.
  if ((c.max_seqs + c.capacity + c.padding) % 3 == 1) {
    constexpr int64_t kOffPowerOfTwo[] = {3, 3, 5, 7, 12};  // for 1, 2, 4, 8, 16
    c.max_batch = kOffPowerOfTwo[std::countr_zero(static_cast<uint64_t>(c.max_batch))];
  }
  return c;
}

MultiSeqConfig DrawHugeMultiSeqConfig(Rng& rng) {
  MultiSeqConfig c;
  // 4,096 is Gemma's window; 4,097 puts the window one past a power of two.
  const int64_t windows[] = {64, 512, 1024, 2048, 4096, 4097};
  if (rng.Chance(3, 4)) {
    c.window = windows[rng.Below(std::size(windows))];
    if (rng.Chance(1, 2)) c.memory = c.window + rng.Range(0, 300);
  }
  const int64_t chunks[] = {256, 1000, 4096};
  if (rng.Chance(1, 4)) c.chunk = chunks[rng.Below(std::size(chunks))];
  c.max_seqs = static_cast<int32_t>(rng.Range(1, 4));
  // A sequence's cells without a window: a context of 4,096 to 12,000 tokens.
  const int64_t capacities[] = {4096, 6144, 8192, 12000};
  c.capacity = capacities[rng.Below(std::size(capacities))];
  const int64_t batches[] = {128, 256, 512};
  c.max_batch = batches[rng.Below(std::size(batches))];
  const int64_t paddings[] = {1, 32, 256};
  c.padding = paddings[rng.Below(std::size(paddings))];
  DrawRowsAndConv(rng, /*max_d_conv=*/4, c);
  // One ubatch in three not a power of two (97, 193, 385), as above.
  if ((c.max_seqs + c.capacity) % 3 == 0) c.max_batch = c.max_batch * 3 / 4 + 1;
  // At most about 10,000 cells: every forward's checks read the visibility of every cell for
  // every batch token (512 x 18,000 cells took 15 s a seed), so fewer sequences where a window
  // of 4,096 or a context of 12,000 would pass it.
  while (c.max_seqs > 1) {
    const Result<model::MultiSeqConfig> m = model::ResolveMultiSeqConfig(c.ToModelInit());
    if (m.ok() && m->cells <= kHugeCells) break;
    --c.max_seqs;
  }
  return c;
}

std::vector<MultiSeqGenerator::SeqState> MultiSeqGenerator::Active(
    const MultiSeqDriver& driver) const {
  std::vector<SeqState> out;
  for (int32_t s = 0; s < driver.config().max_seqs; ++s) {
    const std::vector<model::MsEntry> history = driver.model().kv().History(S(s));
    if (history.empty()) continue;
    const std::vector<int64_t> held = driver.model().kv().RetainedPositions(S(s));
    const int64_t next = history.back().pos + 1;
    out.push_back({s, next, held.empty() ? next : held.front(), !held.empty()});
  }
  return out;
}

std::vector<int32_t> MultiSeqGenerator::FreeIds(const MultiSeqDriver& driver) const {
  std::vector<int32_t> out;
  for (int32_t s = 0; s < driver.config().max_seqs; ++s) {
    if (driver.model().kv().History(S(s)).empty()) out.push_back(s);
  }
  return out;
}

MsOp MultiSeqGenerator::Next(const MultiSeqDriver& driver) {
  const std::vector<SeqState> active = Active(driver);
  const std::vector<int32_t> free = FreeIds(driver);
  std::optional<MsOp> after = AfterRefusal(driver, active);
  if (after) {
    last_ = *after;
  } else if (active.empty()) {
    const int32_t seq = free.empty() ? 0 : PickOf(free);
    // Now and then a probe first, as a server asks whether it can resume a sequence before
    // its prompt: at the start no conv layer has been read yet, so an allocation made
    // before a layer's first use shows here (a forward reads every layer).
    last_ = rng_.Chance(1, 4) ? MsOp::CanResume(seq, base_) : Prompt(driver, seq);
  } else {
    last_ = Choose(driver, active, free);
  }
  // One forward in twelve has another request edit the cache while it is set up.
  if (last_.kind == MsOpKind::kForward && !last_.reserve &&
      driver.config().conv == ConvExpectation::kAsSpecified && edits_rng_.Chance(1, 12)) {
    const int64_t n = edits_rng_.Range(1, 2);
    for (int64_t k = 0; k < n; ++k) last_.edits.push_back(ForwardEdit(driver, last_));
  }
  return last_;
}

MsOp MultiSeqGenerator::ForwardEdit(const MultiSeqDriver& driver, const MsOp& forward) {
  Rng& r = edits_rng_;
  const int32_t seq = forward.batch[static_cast<size_t>(r.Below(forward.batch.size()))].seq;
  int64_t lo = kMaxBatchPosition, hi = 0;  // the sequence's batch positions: [lo, hi)
  for (const MsBatchToken& t : forward.batch) {
    if (t.seq != seq) continue;
    lo = std::min(lo, t.pos);
    hi = std::max(hi, t.pos + 1);
  }
  const auto other = static_cast<int32_t>(r.Below(static_cast<uint64_t>(driver.config().max_seqs)));
  switch (r.Below(6)) {
    case 0: {  // the batch's new cells dropped (the request cancelled), maybe more
      return MsOp::Remove(seq, r.Range(std::max<int64_t>(0, lo - 2), hi), kvtwin::kUnbounded);
    }
    case 1: {  // a gap closed below the batch: its new cells move down (a RoPE shift)
      const int64_t begin = r.Range(std::max<int64_t>(0, lo - 3), lo);
      return MsOp::Remove(seq, begin, r.Range(begin, lo));
    }
    case 2:  // another sequence forked over the batch's (its new cells left behind)
      return MsOp::CopyPrefix(other, seq, r.Range(-1, hi + 1));
    case 3:  // the batch's sequence forked, its new cells shared before they hold data
      return MsOp::CopyPrefix(seq, other, r.Range(lo, hi + 1));
    case 4:  // some other sequence dropped
      return MsOp::Remove(other, 0, kvtwin::kUnbounded);
    default:  // the batch's sequence dropped whole
      return MsOp::Remove(seq, 0, kvtwin::kUnbounded);
  }
}

std::optional<MsOp> MultiSeqGenerator::AfterRefusal(const MultiSeqDriver& driver,
                                                    const std::vector<SeqState>& active) {
  const int64_t refused = driver.coverage().removes_refused_shared;
  const bool just = refused > refused_seen_ && last_.kind == MsOpKind::kRemove;
  refused_seen_ = refused;
  if (!just) return std::nullopt;
  const int32_t seq = last_.seq;
  const auto it =
      std::find_if(active.begin(), active.end(), [seq](const SeqState& s) { return s.seq == seq; });
  // The original runner drops the half-edited sequence at once; otherwise a later op meets
  // the half-edited cells (moved without a key shift, the range left stale).
  if (it == active.end() || rng_.Chance(1, 2)) return MsOp::Remove(seq, 0, kvtwin::kUnbounded);
  if (rng_.Chance(1, 2)) return Probe(driver, *it);
  std::vector<MsBatchToken> batch = {{seq, it->next, Token()}};
  std::vector<int64_t> off = CausalOff(1);
  // Two such forwards in three (by the sequence's next position, after the same draws, so
  // every stream stays) copy the half-edited sequence whole to the next id instead: the
  // copy's range comes from its own cells, never from the source's stale one.
  if (driver.config().max_seqs > 1 && it->next % 3 != 1) {
    return MsOp::CopyPrefix(seq, (seq + 1) % driver.config().max_seqs, it->next + 1);
  }
  return MsOp::Forward(std::move(batch), off);
}

MsOp MultiSeqGenerator::Choose(const MultiSeqDriver& driver, const std::vector<SeqState>& active,
                               const std::vector<int32_t>& free) {
  if (burst_) {
    const int32_t seq = burst_->seq;
    const auto it = std::find_if(active.begin(), active.end(),
                                 [seq](const SeqState& s) { return s.seq == seq; });
    if (--burst_->left <= 0 || it == active.end()) burst_.reset();
    if (it != active.end()) {
      if (std::optional<MsOp> op = Rewrite(driver, *it)) return *op;
    }
  }
  // Past kSeqBitsPerWord sequences, now and then one sequence is forked into every free id
  // in a row (one prompt fanned out to a whole batch for parallel sampling): its conv slot
  // then has as many sharers as the cache has sequences, past a narrow reference count's
  // range (a byte wraps at 256). Drawn only in those runs: every other stream is as it was.
  if (!fanout_ && driver.config().max_seqs > kSeqBitsPerWord && !free.empty() &&
      rng_.Chance(1, 32)) {
    fanout_ = PickOf(active).seq;
  }
  if (fanout_) {
    const int32_t src = *fanout_;
    const auto it = std::find_if(active.begin(), active.end(),
                                 [src](const SeqState& s) { return s.seq == src; });
    if (it != active.end() && !free.empty()) return MsOp::CopyPrefix(src, free.front(), it->next);
    fanout_.reset();
  }
  // Near a full cache, prune more often so runs keep moving.
  const model::MultiSeqConfig& m = driver.model().kv().config();
  const int64_t used = driver.model().kv().UsedCells();
  if (used + driver.config().max_batch > m.cells && rng_.Chance(1, 2)) {
    return Prune(PickOf(active));
  }
  // Huge runs: half the ops are chunks of a chunked prefill, and whole sequences are
  // dropped a quarter as often, so sequences grow past thousands of positions and windows of
  // 4,096 wrap.
  if (huge_ && rng_.Chance(1, 2)) return Step(driver, active, HugeChunk(driver));
  const uint64_t roll = rng_.Below(100);
  if (roll < 34) return Step(driver, active, 1);
  if (roll < 42) {
    if (huge_) return Step(driver, active, HugeChunk(driver));
    return Step(driver, active, rng_.Chance(1, 2) ? 2 : 4);
  }
  if (roll < 46) {
    const SeqState& s = PickOf(active);
    // A burst: the same sequence rewritten over and over, until its duplicates fill the cells.
    if (rng_.Chance(1, 2)) burst_ = Burst{s.seq, rng_.Range(3, 16)};
    if (std::optional<MsOp> op = Rewrite(driver, s)) return *op;
    return Step(driver, active, 1);
  }
  if (roll < 56) return Fork(driver, active);
  if (roll < 62) return Prune(PickOf(active));
  if (roll < 69) return Cut(PickOf(active));
  if (roll < 72 && (!huge_ || rng_.Chance(1, 4))) {
    return MsOp::Remove(PickOf(active).seq, 0, kvtwin::kUnbounded);
  }
  if (roll < 83) return Probe(driver, PickOf(active));
  if (roll < 86) return Reserve(driver, active);
  if (roll < 92 && !free.empty()) return Prompt(driver, PickOf(free));
  return Step(driver, active, -1);  // unequal counts: the hybrid must refuse
}

MsOp MultiSeqGenerator::Prompt(const MultiSeqDriver& driver, int32_t seq) {
  const int64_t max_batch = driver.config().max_batch;
  int64_t len = 0;
  if (huge_) {
    len = rng_.Chance(1, 2) ? max_batch : rng_.Range(1, max_batch);  // a whole ubatch, or less
  } else {
    len = rng_.Range(1, std::min<int64_t>(max_batch, 6));
  }
  std::vector<MsBatchToken> batch;
  for (int64_t p = base_; p < base_ + len; ++p) batch.push_back({seq, p, Token()});
  Scramble(driver, batch);
  return MsOp::Forward(std::move(batch), CausalOff(static_cast<size_t>(len)));
}

int64_t MultiSeqGenerator::HugeChunk(const MultiSeqDriver& driver) {
  // Continuation chunks of a chunked prefill, mostly whole ubatches.
  const int64_t per_seq[] = {4, 64, 256, driver.config().max_batch, driver.config().max_batch};
  return per_seq[rng_.Below(std::size(per_seq))];
}

MsOp MultiSeqGenerator::Step(const MultiSeqDriver& driver, const std::vector<SeqState>& active,
                             int64_t per_seq) {
  const int64_t max_batch = driver.config().max_batch;
  const bool unequal = per_seq < 0;
  if (unequal) per_seq = 1;
  per_seq = std::min(per_seq, max_batch);
  // Beams decode together: usually every active sequence that fits, from a rotating start.
  const auto fit = std::min<int64_t>(static_cast<int64_t>(active.size()), max_batch / per_seq);
  int64_t k = rng_.Chance(3, 4) ? fit : rng_.Range(1, fit);
  if (unequal && k * per_seq >= max_batch) k = std::max<int64_t>(1, k - 1);
  const auto start = static_cast<size_t>(rng_.Below(active.size()));
  std::vector<MsBatchToken> batch;
  for (int64_t j = 0; j < k; ++j) {
    const SeqState& s = active[(start + static_cast<size_t>(j)) % active.size()];
    int64_t n = per_seq + (unequal && j == k - 1 && k > 1 ? 1 : 0);
    if (s.next + n - 1 > kMaxBatchPosition) continue;
    for (int64_t p = s.next; p < s.next + n; ++p) batch.push_back({s.seq, p, Token()});
  }
  // A new sequence joins the running beams with a prompt chunk of the same length.
  const std::vector<int32_t> free = FreeIds(driver);
  // A server's usual unequal batch is a new request's prompt chunk beside running decodes:
  // the hybrid must refuse it before the newcomer holds a slot. The chunk is two tokens, or
  // in half of them as long as makes the total a multiple of the sequence count, so that
  // only the counts themselves say the batch is unequal (the beams carry 1 and 2 tokens, or a
  // lone beam 1 beside a chunk of at least 2).
  if (unequal && !free.empty() && static_cast<int64_t>(batch.size()) + 2 <= max_batch &&
      rng_.Chance(1, 2)) {
    const int32_t seq = PickOf(free);
    int64_t len = 2;
    if (rng_.Chance(1, 2)) {
      const auto total = static_cast<int64_t>(batch.size());
      const int64_t seqs = k + 1;  // the beams with a token in the batch, and the newcomer
      int64_t even = 2;
      while ((total + even) % seqs != 0) ++even;
      if (total + even <= max_batch) len = even;
    }
    for (int64_t p = base_; p < base_ + len; ++p) batch.push_back({seq, p, Token()});
  }
  if (!unequal && !free.empty() && rng_.Chance(1, 5)) {
    if (static_cast<int64_t>(batch.size()) + per_seq > max_batch) {
      batch.resize(batch.size() - static_cast<size_t>(std::min<int64_t>(
                                      per_seq, static_cast<int64_t>(batch.size()))));
    }
    const int32_t seq = PickOf(free);
    for (int64_t p = base_; p < base_ + per_seq; ++p) batch.push_back({seq, p, Token()});
  }
  if (batch.empty()) return MsOp::Remove(active[start].seq, 0, kvtwin::kUnbounded);
  if (!unequal) Scramble(driver, batch);
  // A server lists each sequence as one run; one batch in four interleaves them (spec 2.9.1
  // counts tokens per sequence, wherever they stand).
  if (merge_rng_.Chance(1, 4)) InterleaveSequences(batch, merge_rng_);
  const size_t size = batch.size();
  return MsOp::Forward(std::move(batch), CausalOff(size));
}

std::optional<MsOp> MultiSeqGenerator::Rewrite(const MultiSeqDriver& driver, const SeqState& s) {
  const int64_t most = std::min(s.next - Low(s), driver.config().max_batch);
  if (most < 1) return std::nullopt;
  int64_t k = rng_.Range(1, most);
  if (driver.config().num_conv_layers > 0) {
    // Rewritten inputs shift in on top of the old state: only k >= d_conv replaces it all.
    if (driver.config().d_conv > most) return std::nullopt;
    k = std::max(k, driver.config().d_conv);
  }
  std::vector<MsBatchToken> batch;
  for (int64_t p = s.next - k; p < s.next; ++p) batch.push_back({s.seq, p, Token()});
  Scramble(driver, batch);
  return MsOp::Forward(std::move(batch), CausalOff(static_cast<size_t>(k)));
}

void MultiSeqGenerator::Scramble(const MultiSeqDriver& driver, std::vector<MsBatchToken>& batch) {
  // With conv layers the state takes the tokens in batch order, so order matters to it.
  if (driver.config().num_conv_layers > 0 || batch.size() < 2 || !rng_.Chance(1, 4)) return;
  const int32_t seq = batch[static_cast<size_t>(rng_.Below(batch.size()))].seq;
  size_t first = 0;
  while (batch[first].seq != seq) ++first;
  size_t last = first;
  while (last < batch.size() && batch[last].seq == seq) ++last;
  if (last - first < 2) return;
  // Positions move, tokens stay in place: the run's set of positions is unchanged.
  std::vector<int64_t> positions;
  for (size_t k = first; k < last; ++k) positions.push_back(batch[k].pos);
  if (rng_.Chance(1, 2)) {
    std::reverse(positions.begin(), positions.end());
  } else {
    std::rotate(positions.begin(), positions.begin() + 1, positions.end());
  }
  for (size_t k = first; k < last; ++k) batch[k].pos = positions[k - first];
}

MsOp MultiSeqGenerator::Fork(const MultiSeqDriver& driver, const std::vector<SeqState>& active) {
  const SeqState& src = PickOf(active);
  std::vector<int32_t> free = FreeIds(driver);
  int32_t dst = 0;
  const int32_t partner = (src.seq + kSeqBitsPerWord) % driver.config().max_seqs;
  if (driver.config().max_seqs > kSeqBitsPerWord &&
      std::find(free.begin(), free.end(), partner) != free.end() && rng_.Chance(1, 2)) {
    // Past kSeqBitsPerWord sequences, ids that far apart side by side: one word of
    // sequence bits per cell would alias them.
    dst = partner;
  } else if (!free.empty() && rng_.Chance(4, 5)) {
    dst = PickOf(free);
  } else if (rng_.Chance(1, 10)) {
    dst = src.seq;  // a copy onto itself empties the sequence
  } else {
    dst = static_cast<int32_t>(rng_.Below(static_cast<uint64_t>(driver.config().max_seqs)));
  }
  // Mostly the whole source; sometimes a prefix (the hybrid's conv state ignores len), from
  // -1 up: a negative length copies nothing (spec §2.8: no cell has pos < len), where
  // llama.cpp's seq_cp would read it as "to the end".
  const int64_t len = rng_.Chance(2, 3) ? src.next : rng_.Range(Low(src) - 1, src.next);
  return MsOp::CopyPrefix(src.seq, dst, len);
}

MsOp MultiSeqGenerator::Prune(const SeqState& s) {
  // Beam pruning drops the last few tokens; sometimes the whole sequence, sometimes nothing
  // (a begin past the end).
  if (rng_.Chance(1, 4) && (!huge_ || rng_.Chance(1, 4))) {
    return MsOp::Remove(s.seq, 0, kvtwin::kUnbounded);
  }
  if (rng_.Chance(1, 10)) return MsOp::Remove(s.seq, s.next + rng_.Range(0, 1), kvtwin::kUnbounded);
  const int64_t begin = rng_.Range(std::max(Low(s), s.next - 3), std::max(Low(s), s.next - 1));
  return MsOp::Remove(s.seq, begin, kvtwin::kUnbounded);
}

MsOp MultiSeqGenerator::Cut(const SeqState& s) {
  // A finite range: a gap closed by a shift, and the shapes at its edges.
  switch (rng_.Below(6)) {
    case 0: {  // begin == end: removes nothing, still shifts (by 0) what follows
      const int64_t at = rng_.Range(Low(s), s.next);
      return MsOp::Remove(s.seq, at, at);
    }
    case 1: {  // past the last position: a tail remove with a shift of nothing
      const int64_t begin = rng_.Range(Low(s), std::max(Low(s), s.next - 1));
      const int64_t past = rng_.Range(1, 3);
      // The farthest draws end far out instead: at int32's and the tag's bounds, or
      // just short of kUnbounded. Still finite (spec §2.8), so the shift step runs (and is
      // refused without a callback), though nothing is left to shift. Derived from the
      // draws, so every stream is what it was.
      if (past == 3) {
        return MsOp::Remove(s.seq, begin,
                            std::max(begin, kFarRemoveEnds[static_cast<size_t>(begin % 4)]));
      }
      return MsOp::Remove(s.seq, begin, s.next + past);
    }
    case 2: {  // entirely after the end
      const int64_t begin = s.next + rng_.Range(0, 2);
      return MsOp::Remove(s.seq, begin, begin + rng_.Range(0, 3));
    }
    default: {
      const int64_t begin = rng_.Range(Low(s), std::max(Low(s), s.next - 1));
      return MsOp::Remove(s.seq, begin, rng_.Range(begin + 1, s.next + 1));
    }
  }
}

MsOp MultiSeqGenerator::Probe(const MultiSeqDriver& driver, const SeqState& s) {
  const int64_t w = driver.config().window;
  std::vector<int64_t> at = {s.first, s.next, s.next + 1, std::max<int64_t>(0, s.first - 1),
                             rng_.Range(Low(s), s.next + 2)};
  if (w != kvtwin::kUnbounded) {
    at.push_back(std::max<int64_t>(0, s.next - w));
    at.push_back(s.first + w);
  }
  return MsOp::CanResume(s.seq, PickOf(at));
}

MsOp MultiSeqGenerator::Reserve(const MultiSeqDriver& driver, const std::vector<SeqState>& active) {
  // A worst-case batch (one sequence's prompt chunk, as a server reserves its ubatch) of
  // exactly the cache's cells, one fewer or one more: the refusal's boundary, which beam
  // steps never reach (their batches hold one token per sequence). Only a cache of at most
  // max_batch + 1 cells has such a batch within max_batch (unbounded memory, few sequences).
  const int64_t cells = driver.model().kv().config().cells;
  if (cells <= driver.config().max_batch + 1 && rng_.Chance(1, 3)) {
    const int64_t len = std::clamp<int64_t>(cells - 1 + static_cast<int64_t>(rng_.Below(3)), 1,
                                            driver.config().max_batch);
    const SeqState& s = PickOf(active);
    if (s.next + len - 1 <= kMaxBatchPosition) {
      std::vector<MsBatchToken> batch;
      for (int64_t p = s.next; p < s.next + len; ++p) batch.push_back({s.seq, p, Token()});
      MsOp op = MsOp::Forward(std::move(batch), {});
      op.reserve = true;
      return op;
    }
  }
  MsOp op = Step(driver, active, rng_.Chance(1, 4) ? -1 : 1);
  if (op.kind != MsOpKind::kForward) return op;
  op.reserve = true;  // its SetCausal list, if it drew one, runs on the reserve pass
  if (rng_.Chance(1, 2)) {
    // As a runner builds its worst-case graph: each sequence's run from position 0, below
    // what the cache holds of it, so the causal condition (or a SetCausal list lifting it)
    // shapes the mask over the cells the sequence already has.
    std::vector<std::pair<int32_t, int64_t>> first;  // (sequence, its lowest batch position)
    for (const MsBatchToken& t : op.batch) {
      auto it = std::find_if(first.begin(), first.end(),
                             [&t](const auto& f) { return f.first == t.seq; });
      if (it == first.end()) {
        first.emplace_back(t.seq, t.pos);
      } else {
        it->second = std::min(it->second, t.pos);
      }
    }
    for (MsBatchToken& t : op.batch) {
      t.pos -= std::find_if(first.begin(), first.end(), [&t](const auto& f) {
                 return f.first == t.seq;
               })->second;
    }
  }
  return op;
}

std::vector<int64_t> MultiSeqGenerator::CausalOff(size_t batch_size) {
  std::vector<int64_t> off;
  if (!rng_.Chance(1, 8)) return off;
  const int64_t n = rng_.Range(1, std::min<int64_t>(2, static_cast<int64_t>(batch_size)));
  for (int64_t j = 0; j < n; ++j) {
    off.push_back(static_cast<int64_t>(rng_.Below(batch_size)));
  }
  return off;
}

}  // namespace kvtwin::sim
