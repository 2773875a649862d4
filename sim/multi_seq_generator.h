// MultiSeqGenerator: seeded workloads for a MultiSeqDriver in the shape that exercises the
// multi-sequence caches: parallel sequences forked from a common prompt (beam search,
// parallel sampling). A prompt is prefilled on one sequence and copied to others
// (sometimes only a prefix of it, which the original hybrid gets wrong on purpose), the
// active sequences decode in lock step (equal tokens per sequence, the hybrid's rule, with
// the occasional unequal batch it must refuse), new sequences join running batches, prefill
// chunks, SetCausal indices and reserve passes mixed in; beams are pruned (tail removes), cut
// in the middle (a RoPE shift, refused when the shifted cells are shared), dropped whole and
// re-forked into the freed ids; CanResume is probed at the boundaries (first held, last + 1,
// pos − w). Shapes a plain decoder never makes, because the spec gives them meaning: bursts
// of rewrites of a sequence's last positions without a Remove (which fill a cache with
// finite memory until StartForward reports it full after pruning), runs whose positions
// descend within a batch (only without conv layers, whose state would take them in batch
// order), Removes with begin == end or reaching past the last position, and, after a Remove
// refused half-way on a shared cell, sometimes a forward or probe on the half-edited
// sequence instead of the original runner's clearing Remove. The generator reads the
// driver's reference state and never proposes an op Valid() rejects. DrawMultiSeqConfig
// picks a cache shape per seed (swarm style). A run may start its sequences far up (`base`),
// and past kSeqBitsPerWord sequences forks ids that far apart and, now and then, one
// sequence into every free id (hundreds of sharers of one conv slot). One forward in twelve
// of an as-specified run carries edits another request makes between its StartForward and
// Put (MsOp::edits). Single-threaded.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "sim/multi_seq_driver.h"
#include "sim/multi_seq_ops.h"
#include "src/core/rng.h"

namespace kvtwin::sim {

// Window unbounded or w in {1,2,3,4,8} (memory w or more), chunk off or {2,4}, 1..8
// sequences, capacity, max_batch, padding {1,4}, permuted V, f32/bf16, 0..2 conv layers,
// d_conv 1..3, a shift callback mostly. `conv` is left as the caller's.
MultiSeqConfig DrawMultiSeqConfig(Rng& rng);
// A production-sized shape (`kvtwin multiseq --huge`): llama.cpp's contexts of thousands of
// cells per sequence, sliding windows of 64 to 4,097 (Gemma's 4,096 among them), ubatches of
// 128-512 rows, cells padded to 32 or 256, attention chunks of 256-4,096 (Llama 4's idea).
// The default draw stops at windows of 8 and 32 cells a sequence, where a path a cache takes
// only for thousands of cells (a scan that starts from a hint, a bulk copy of a long run) and
// a window's wrap past its first thousand rows never run.
// Its caches hold at most kHugeCells cells (fewer sequences where more would pass it).
MultiSeqConfig DrawHugeMultiSeqConfig(Rng& rng);
inline constexpr int64_t kHugeCells = 10'000;

class MultiSeqGenerator {
 public:
  // Sequences start at position `base` (a runner's positions need not start at 0; far up,
  // float and int32 arithmetic on positions show). REQUIRES: 0 <= base, and room for a
  // prompt below kMaxBatchPosition.
  // `huge`: prompts and continuation chunks up to the ubatch (max_batch) instead of a few
  // tokens, for the shapes of DrawHugeMultiSeqConfig.
  explicit MultiSeqGenerator(Rng rng, int64_t base = 0, bool huge = false);
  // The next op for the driver's current state. REQUIRES: no divergence.
  MsOp Next(const MultiSeqDriver& driver);

 private:
  // What the generator knows of a sequence, from the reference.
  struct SeqState {
    int32_t seq = 0;
    int64_t next = 0;   // one past its newest position
    int64_t first = 0;  // lowest held position (next when it holds none)
    bool holds = false;
  };
  std::vector<SeqState> Active(const MultiSeqDriver& driver) const;
  std::vector<int32_t> FreeIds(const MultiSeqDriver& driver) const;

  MsOp Prompt(const MultiSeqDriver& driver, int32_t seq);
  MsOp Step(const MultiSeqDriver& driver, const std::vector<SeqState>& active, int64_t per_seq);
  // Re-forwards the last k positions of `s` without a Remove; nullopt when the shape cannot
  // keep the conv state equal to the ideal one (k >= d_conv is needed with conv layers).
  // A huge run's tokens per sequence for a chunk step: 4 to the whole ubatch.
  int64_t HugeChunk(const MultiSeqDriver& driver);
  std::optional<MsOp> Rewrite(const MultiSeqDriver& driver, const SeqState& s);
  MsOp Fork(const MultiSeqDriver& driver, const std::vector<SeqState>& active);
  MsOp Prune(const SeqState& s);
  MsOp Cut(const SeqState& s);
  MsOp Probe(const MultiSeqDriver& driver, const SeqState& s);
  MsOp Reserve(const MultiSeqDriver& driver, const std::vector<SeqState>& active);
  // The op after a Remove refused half-way, if the last op was one.
  std::optional<MsOp> AfterRefusal(const MultiSeqDriver& driver,
                                   const std::vector<SeqState>& active);
  MsOp Choose(const MultiSeqDriver& driver, const std::vector<SeqState>& active,
              const std::vector<int32_t>& free);
  // A CopyPrefix or Remove for between `forward`'s StartForward and Put, mostly on one of
  // its sequences (drawn from edits_rng_).
  MsOp ForwardEdit(const MultiSeqDriver& driver, const MsOp& forward);
  // Sometimes reverses or rotates one sequence's run (no conv layers only).
  void Scramble(const MultiSeqDriver& driver, std::vector<MsBatchToken>& batch);
  // A few batch indices for SetCausal, usually none.
  std::vector<int64_t> CausalOff(size_t batch_size);
  int32_t Token() { return static_cast<int32_t>(rng_.Below(1u << 20)); }
  // The lowest position worth drawing for `s`: the run's base, or lower where a shift took
  // the sequence below it.
  int64_t Low(const SeqState& s) const { return std::min(base_, s.first); }
  template <typename T>
  const T& PickOf(const std::vector<T>& v) {
    return v[static_cast<size_t>(rng_.Below(v.size()))];
  }

  struct Burst {
    int32_t seq = 0;
    int64_t left = 0;
  };
  Rng rng_;
  Rng edits_rng_;                  // the forwards' edits (ForwardEdit)
  Rng merge_rng_;                  // which batches interleave their sequences, and how
  int64_t base_ = 0;               // where sequences start
  bool huge_ = false;              // production-length prompts and chunks
  std::optional<Burst> burst_;     // rewrites still to come
  std::optional<int32_t> fanout_;  // the sequence being forked into every free id
  MsOp last_;                      // the op Next returned last
  int64_t refused_seen_ = 0;       // the driver's refused-shared count at the last Next
};

}  // namespace kvtwin::sim
