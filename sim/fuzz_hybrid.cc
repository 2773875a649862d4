// The kHybrid fuzz family (contract: sim/fuzz_input.h): bytes -> a MultiSeqConfig and a run
// of MsOps on the multi-sequence hybrid cache, in lock step through the MultiSeqDriver.
//
// Goal: let coverage guidance find op sequences the seeded MultiSeqGenerator does not
// propose (forks of a fork, cuts at window edges, forwards that rewrite or skip positions,
// copies onto the sequence itself) while every input stays a run a correct runner could
// issue, so a reported divergence is a production bug, not a misuse.
// Method: the header picks the cache shape from small tables that only hold legal shapes,
// so Validate() passes by construction and no input is wasted on a refused shape. Each
// record is one op; its fields are read by their own FuzzedDataProvider, one byte each with
// the full 0..255 range (field k is byte kRecordBytes - 1 - k), and resolved against the
// reference state: sequence fields index the sequences that hold something, position fields
// are value fields (ResolveValue) anchored at the sequence's next position with its retained
// range as the snapshot ends, and a negative or inverted result is clamped rather than
// dropped. The conv expectation is kAsSpecified: the two documented weaknesses of the
// original hybrid are counted, not reported, so a divergence means a real bug.
//
// Record fields (forward / copy_prefix / remove / can_resume):
//    0  kind: % 16 < 9 forward, < 11 copy_prefix, < 14 remove, else can_resume
//    1  forward: sequence bitmask; others: the sequence (src) as an index into the
//       sequences holding something (any id when none does)
//    2  forward: selection (even: every sequence holding something; odd: the bitmask);
//       bits 1-3 all set (not reserving): an edit between StartForward and Put on the
//       batch's first sequence s around its lowest batch position p, d = bits 6-7, by bits
//       4-5: remove [p - d, inf), remove [p - 1 - d, p), copy_prefix other -> s len
//       p + d - 1, copy_prefix s -> other len p + d (other: field 10 % max_seqs);
//       copy_prefix: dst (any id); remove: % 4 == 0 whole, 1 tail [begin, inf), else [begin, end)
//       with end, when bits 2-5 are all set, far out instead: {2^31 - 1, 2^31, 2^24, 2^63 - 2}
//       by bits 6-7
//    3  forward: tokens per sequence {1,1,2,2,3,4,8,16}[% 8], at most max_batch
//    4  forward: % 6 == 0 unequal counts: one token more, or fewer, on the last sequence, or
//       (odd b / 6, more than one token each) one moved from the first sequence to the last
//    5  forward: % 8 == 0 reserve
//    6  forward: rotation of the batch order
//    7  forward: causal_off count (% 8 >= 6: 1 or 2)   8, 9: causal_off indices (% batch)
//   10  forward: token ids (byte * 256 + batch index)
//   11  forward: even: every sequence continues at its next position (decoding); odd: at
//       the value fields below
//   12  forward: % 8 == 0 each sequence's run descends (positions written high to low);
//       bits 3-4 set: the sequences interleave (a merge drawn from bits 5-7 and field 10)
//   13+2s, 14+2s (s = 0..7): value field; forward: sequence s's first position;
//       copy_prefix: len (s = 0); remove: begin (s = 0), end (s = 1); can_resume: pos (s = 0)
// A record the driver rejects is skipped; with the clamps above none is (ValidMsOp asks only
// for ids, sizes and positions in range), so every record is an event.

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "sim/fuzz_families.h"
#include "sim/multi_seq_driver.h"
#include "sim/replay.h"
#include "sim/synthetic.h"
#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

constexpr size_t kHeaderBytes = 16;
constexpr size_t kRecordBytes = 29;
// The driver re-checks every cell after every op, so an execution costs about records x
// cells (measured before the in-place row compares: 8 records ran at ~1,000 exec/s, 16 at
// ~430, 48 at ~120; 16 now run at ~1,250). Sixteen ops still prompt, fork, decode past a
// window, cut and fill a small cache; longer tails are ignored.
constexpr size_t kMaxRecords = 16;
constexpr int32_t kMaxSeqs = 8;
constexpr size_t kFirstValueField = 13;
// ValueContext::window when the cache has no window: a short characteristic length, so
// kWindow / kBehindWindow still aim a few positions from the anchor.
constexpr int64_t kUnboundedWindowLength = 4;

enum Field : size_t {
  kKind = 0,
  kSeq = 1,
  kMode = 2,  // forward selection; copy_prefix dst; remove range kind
  kPerSeq = 3,
  kUnequal = 4,
  kReserve = 5,
  kRotate = 6,
  kCausalCount = 7,
  kCausalA = 8,
  kCausalB = 9,
  kTokens = 10,
  kContinue = 11,
  kDescend = 12,
};

template <typename T, size_t N>
T Pick(const std::array<T, N>& table, uint8_t b) {
  return table[b % N];
}

// Header fields (field k is byte kHeaderBytes - 1 - k, as in records): 0 window, 1 memory,
// 2 chunk, 3 max_seqs, 4 capacity, 5 max_batch, 6 padding, 7 permuted V, 8 dtype, 9 conv
// layers, 10 d_conv, 11 hidden, 12 shift, 13 kv_cols, 14-15 run seed. Every table entry is
// legal. The spare high bits of the memory, capacity, max_batch and padding bytes pick, one
// value in eight, the shapes at the rare branches of spec §2.8 Init (a capacity at window +
// 1, where the stop-token cell makes the memory unbounded; a stated memory below the window
// or at the capacity, over any window; capacities of 1-3) and sizes no power of two; a
// memory Init would refuse falls back to the default (= window), so Validate() passes for
// every header. The driver checks every cell after every op, so its cost grows
// with max_seqs x capacity: the tables lean to the few sequences and small capacities that
// fork, share and fill up within a short run, and reach 8 sequences only now and then.
MultiSeqConfig DecodeConfig(const std::array<uint8_t, kHeaderBytes>& h) {
  MultiSeqConfig c;
  c.window = Pick<int64_t, 8>({kvtwin::kUnbounded, kvtwin::kUnbounded, 1, 2, 3, 4, 5, 8}, h[0]);
  const bool windowed = c.window != kvtwin::kUnbounded;
  c.chunk = Pick<int64_t, 8>({0, 0, 0, 0, 1, 2, 3, 4}, h[2]);
  c.max_seqs = Pick<int32_t, 8>({1, 2, 2, 3, 3, 4, 6, kMaxSeqs}, h[3]);
  c.capacity = Pick<int64_t, 5>({4, 6, 8, 12, 16}, h[4]);
  if ((h[4] / 5) % 8 == 7) c.capacity = windowed ? c.window + 1 : 1 + (h[4] / 40) % 3;
  if (windowed && h[1] % 2 == 1) {
    c.memory = c.window + (h[1] / 2) % 5;
  } else if ((h[1] / 2) % 8 == 7) {
    c.memory = c.capacity + (h[1] / 16) % 2;  // at or past the capacity: unbounded
  } else if ((h[1] / 2) % 8 == 6 && windowed && c.window > 1) {
    c.memory = 1 + (h[1] / 16) % (c.window - 1);  // below the window
  }
  c.max_batch = Pick<int64_t, 6>({1, 2, 4, 8, 8, 16}, h[5]);
  if ((h[5] / 6) % 8 == 7) c.max_batch = (h[5] / 48) % 2 == 0 ? 3 : 5;
  c.padding = h[6] % 3 == 0 ? 4 : 1;
  if ((h[6] / 3) % 8 == 7) c.padding = 2 + (h[6] / 24) % 2;
  c.permuted_v = h[7] % 2 == 1;
  c.dtype = h[8] % 2 == 0 ? DType::kFloat32 : DType::kBFloat16;
  c.num_conv_layers = h[9] % 3;
  c.d_conv = 1 + h[10] % 3;
  c.hidden = 1 + h[11] % 4;
  c.shift_supported = h[12] % 6 != 0;
  c.kv_cols = h[13] % 2 == 0 ? 8 : 12;
  c.conv = ConvExpectation::kAsSpecified;
  if (!c.Validate().ok()) c.memory = kvtwin::kUnbounded;  // the default, always accepted
  const Status valid = c.Validate();
  KV_CHECK(valid.ok(), "the header tables produced an illegal shape: " + valid.ToString());
  return c;
}

// What a record reads of the reference: per sequence, whether it holds anything, its next
// position and its retained range.
struct SeqView {
  bool holds = false;  // a history, even if nothing of it is retained
  int64_t next = 0;
  std::optional<int64_t> first, last;
};

// `history` and `held` are scratch (replaced).
SeqView ViewOf(const MultiSeqDriver& driver, int32_t seq, std::vector<model::MsEntry>& history,
               std::vector<int64_t>& held) {
  SeqView v;
  const model::RefMultiSeqCache& kv = driver.model().kv();
  kv.HistoryInto(SeqId{seq}, history);
  if (history.empty()) return v;
  v.holds = true;
  v.next = history.back().pos + 1;
  kv.RetainedPositionsInto(SeqId{seq}, held);
  if (!held.empty()) {
    v.first = held.front();
    v.last = held.back();
  }
  return v;
}

// One per run; Refresh() before each record re-reads the reference state it resolves against
// (the buffers are reused, nothing else is kept from one record to the next).
class Decoder {
 public:
  explicit Decoder(const MultiSeqDriver& driver) : driver_(driver) {}
  void Refresh() {
    views_.clear();
    holding_.clear();
    for (int32_t s = 0; s < driver_.config().max_seqs; ++s) {
      views_.push_back(ViewOf(driver_, s, history_, held_));
      if (views_.back().holds) holding_.push_back(s);
    }
  }

  MsOp Decode(const std::array<uint8_t, kRecordBytes>& f) const {
    const uint8_t kind = f[kKind] % 16;
    if (kind < 9) return Forward(f);
    if (kind >= 11 && kind < 14) return Remove(f);
    const int32_t seq = HeldSeq(f[kSeq]);
    if (kind < 11) return MsOp::CopyPrefix(seq, AnySeq(f[kMode]), Value(f, 0, seq));
    return MsOp::CanResume(seq, Value(f, 0, seq));
  }

 private:
  int32_t AnySeq(uint8_t b) const { return b % driver_.config().max_seqs; }
  // An index into the sequences holding something: ops on empty ones are mostly no-ops.
  int32_t HeldSeq(uint8_t b) const {
    if (holding_.empty()) return AnySeq(b);
    return holding_[b % holding_.size()];
  }

  ValueContext Context(int32_t seq) const {
    const SeqView& v = views_[static_cast<size_t>(seq)];
    const int64_t w = driver_.config().window;
    return ValueContext{v.next, w == kvtwin::kUnbounded ? kUnboundedWindowLength : w, v.first,
                        v.last};
  }
  // Value field `i` (mode byte at kFirstValueField + 2i) against `seq`, clamped to the legal
  // positions: a negative length or position is the lowest legal one, not a skipped record.
  int64_t Value(const std::array<uint8_t, kRecordBytes>& f, size_t i, int32_t seq) const {
    const size_t k = kFirstValueField + 2 * i;
    return std::clamp<int64_t>(ResolveValue(f[k], f[k + 1], Context(seq)), 0, kMaxPosition);
  }

  // Where sequence `seq`'s tokens of a forward start.
  int64_t First(const std::array<uint8_t, kRecordBytes>& f, int32_t seq) const {
    if (f[kContinue] % 2 == 0) return views_[static_cast<size_t>(seq)].next;
    return Value(f, static_cast<size_t>(seq), seq);
  }
  std::vector<int32_t> Selected(const std::array<uint8_t, kRecordBytes>& f) const;
  MsOp Forward(const std::array<uint8_t, kRecordBytes>& f) const;
  // The CopyPrefix or Remove a forward's record asks for between its StartForward and Put.
  MsOp ForwardEdit(const std::array<uint8_t, kRecordBytes>& f, const MsOp& forward) const;
  MsOp Remove(const std::array<uint8_t, kRecordBytes>& f) const;

  const MultiSeqDriver& driver_;
  std::vector<SeqView> views_;
  std::vector<int32_t> holding_;         // ascending
  std::vector<model::MsEntry> history_;  // ViewOf's scratch
  std::vector<int64_t> held_;            // ViewOf's scratch
};

// The batch's sequences in batch order: the bitmask's ids (or every sequence holding
// something: the beams decoding together), rotated, at least one.
std::vector<int32_t> Decoder::Selected(const std::array<uint8_t, kRecordBytes>& f) const {
  std::vector<int32_t> out;
  if (f[kMode] % 2 == 0) out = holding_;
  if (out.empty()) {
    for (int32_t s = 0; s < driver_.config().max_seqs; ++s) {
      if ((f[kSeq] >> s) & 1) out.push_back(s);
    }
  }
  if (out.empty()) out.push_back(AnySeq(f[kSeq]));
  std::rotate(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(f[kRotate] % out.size()),
              out.end());
  return out;
}

MsOp Decoder::Forward(const std::array<uint8_t, kRecordBytes>& f) const {
  const int64_t max_batch = driver_.config().max_batch;
  const int64_t per =
      std::min<int64_t>(Pick<int64_t, 8>({1, 1, 2, 2, 3, 4, 8, 16}, f[kPerSeq]), max_batch);
  std::vector<int32_t> seqs = Selected(f);
  seqs.resize(std::min(seqs.size(), static_cast<size_t>(max_batch / per)));
  std::vector<int64_t> counts(seqs.size(), per);
  // The hybrid refuses unequal counts after committing the KV side (spec §2.9.1): worth
  // hitting, but rarely, since the refused forward teaches nothing else.
  // Either the last sequence carries one token more or fewer, or (odd f / 6) one token moves
  // from the first sequence to the last, so the total stays a multiple of the count.
  if (f[kUnequal] % 6 == 0 && seqs.size() > 1) {
    const auto total = static_cast<int64_t>(seqs.size()) * per;
    if ((f[kUnequal] / 6) % 2 == 1 && per > 1) {
      --counts.front();
      ++counts.back();
    } else {
      counts.back() += total < max_batch ? 1 : (per > 1 ? -1 : 0);
    }
  }
  std::vector<MsBatchToken> batch;
  for (size_t j = 0; j < seqs.size(); ++j) {
    const int64_t n = counts[j];
    const int64_t base = std::min(First(f, seqs[j]), kMaxPosition - n + 1);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t p = f[kDescend] % 8 == 0 ? base + n - 1 - t : base + t;
      const auto i = static_cast<int32_t>(batch.size());
      batch.push_back({seqs[j], p, static_cast<int32_t>(f[kTokens]) * 256 + i});
    }
  }
  if ((f[kDescend] >> 3) % 4 == 3) {
    Rng merge(static_cast<uint64_t>(f[kDescend] >> 5) | static_cast<uint64_t>(f[kTokens]) << 3);
    InterleaveSequences(batch, merge);
  }
  std::vector<int64_t> off;
  const uint8_t count = f[kCausalCount] % 8;
  const auto size = static_cast<int64_t>(batch.size());
  if (count >= 6) off.push_back(f[kCausalA] % size);
  if (count == 7) off.push_back(f[kCausalB] % size);
  const bool reserve = f[kReserve] % 8 == 0;
  MsOp op = MsOp::Forward(std::move(batch), off, reserve);
  if (!reserve && (f[kMode] >> 1) % 8 == 7) op.edits.push_back(ForwardEdit(f, op));
  return op;
}

MsOp Decoder::ForwardEdit(const std::array<uint8_t, kRecordBytes>& f, const MsOp& forward) const {
  // On the batch's first sequence, around its lowest batch position (its first new cell).
  const int32_t seq = forward.batch.front().seq;
  int64_t lo = kMaxPosition;
  for (const MsBatchToken& t : forward.batch) {
    if (t.seq == seq) lo = std::min(lo, t.pos);
  }
  const int64_t d = f[kMode] >> 6;
  const int32_t other = AnySeq(f[kTokens]);
  switch ((f[kMode] >> 4) % 4) {
    case 0:  // its new cells dropped, and up to 3 below them
      return MsOp::Remove(seq, std::max<int64_t>(0, lo - d), kvtwin::kUnbounded);
    case 1:  // a gap of up to 4 closed just below them: they move down
      return MsOp::Remove(seq, std::max<int64_t>(0, lo - 1 - d), lo);
    case 2:  // another sequence forked over it
      return MsOp::CopyPrefix(other, seq, lo + d - 1);
    default:  // forked, sharing its new cells before they hold data
      return MsOp::CopyPrefix(seq, other, lo + d);
  }
}

MsOp Decoder::Remove(const std::array<uint8_t, kRecordBytes>& f) const {
  const int32_t seq = HeldSeq(f[kSeq]);
  switch (f[kMode] % 4) {
    case 0:
      return MsOp::Remove(seq, 0, kvtwin::kUnbounded);
    case 1:
      return MsOp::Remove(seq, Value(f, 0, seq), kvtwin::kUnbounded);
    default:
      break;
  }
  const int64_t a = Value(f, 0, seq), b = Value(f, 1, seq);
  if ((f[kMode] >> 2) % 16 == 15) {
    // A finite end far past every position (int32's bounds, the tag's, just short of
    // kUnbounded): the tail goes, and the shift step still runs on nothing.
    return MsOp::Remove(seq, std::min(a, b), kFarRemoveEnds[f[kMode] >> 6]);
  }
  return MsOp::Remove(seq, std::min(a, b), std::max(a, b));
}

// The op a record applies, or nullopt when the driver rejects it.
std::optional<MsOp> ResolveRecord(const MultiSeqDriver& driver, Decoder& decoder,
                                  const std::array<uint8_t, kRecordBytes>& f) {
  decoder.Refresh();
  MsOp op = decoder.Decode(f);
  if (!driver.Valid(op)) return std::nullopt;
  return op;
}

}  // namespace

FuzzLayout HybridFuzzLayout() {
  FuzzLayout layout;
  layout.header_bytes = kHeaderBytes;
  layout.record_bytes = kRecordBytes;
  for (size_t s = 0; s < size_t{kMaxSeqs}; ++s) {
    layout.value_fields.push_back(kFirstValueField + 2 * s);
  }
  layout.max_records = kMaxRecords;
  return layout;
}

FuzzRun RunHybridFuzz(const FuzzParts& parts, bool record_trace) {
  const std::array<uint8_t, kHeaderBytes> h = ReadFields<kHeaderBytes>(parts.header);
  FuzzRun run;
  TraceHeader& header = run.trace.header;
  header.kind = TraceKind::kMultiSeq;
  header.multiseq = DecodeConfig(h);
  header.seed = 1 + h[14] + 256 * uint64_t{h[15]};
  header.source = "fuzz target hybrid";
  // The replay's value seed, so ReplayTrace(run.trace) reaches this digest and verdict.
  MultiSeqDriver driver(header.multiseq, TraceValueSeed(header));
  std::optional<MsDivergence> divergence = driver.divergence();  // the derived shape
  Decoder decoder(driver);
  for (size_t i = 0; i < parts.records.size() && !divergence; ++i) {
    const std::optional<MsOp> op =
        ResolveRecord(driver, decoder, ReadFields<kRecordBytes>(parts.records[i]));
    if (!op) continue;
    if (record_trace) run.trace.events.emplace_back(*op);
    ++run.events;
    divergence = driver.Apply(*op);
  }
  if (divergence) {
    run.divergence = divergence->ToString();
    run.divergence_kind = DivergenceKind(divergence->mismatch.what);
  }
  run.digest = driver.digest();
  return run;
}

}  // namespace kvtwin::sim
