// MultiSeqGenerator: seeded workloads for a MultiSeqDriver in the shape that exercises the
// multi-sequence caches: parallel sequences forked from a common prompt (beam search,
// parallel sampling). A prompt is prefilled on one sequence and copied to others
// (sometimes only a prefix of it, which the original hybrid gets wrong on purpose), the
// active sequences decode in lock step (equal tokens per sequence, the hybrid's rule, with
// the occasional unequal batch it must refuse), prefill chunks, SetCausal indices and
// reserve passes mixed in; beams are pruned (tail removes), cut in the middle (a RoPE shift,
// refused when the shifted cells are shared), dropped whole and re-forked into the freed
// ids; CanResume is probed at the boundaries (first held, last + 1, pos − w). The generator
// reads the driver's reference state and never proposes an op Valid() rejects; after a
// refused Remove left a sequence indeterminate it clears it first, as the original runner
// did. DrawMultiSeqConfig picks a cache shape per seed (swarm style). Single-threaded.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/multi_seq_driver.h"
#include "sim/multi_seq_ops.h"
#include "src/core/rng.h"

namespace kvtwin::sim {

// Window unbounded or w in {1,2,3,4,8} (memory w or more), chunk off or {2,4}, 1..8
// sequences, capacity, max_batch, padding {1,4}, permuted V, f32/bf16, 0..2 conv layers,
// d_conv 1..3, a shift callback mostly. `conv` is left as the caller's.
MultiSeqConfig DrawMultiSeqConfig(Rng& rng);

class MultiSeqGenerator {
 public:
  explicit MultiSeqGenerator(Rng rng) : rng_(rng) {}
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
  MsOp Fork(const MultiSeqDriver& driver, const std::vector<SeqState>& active);
  MsOp Prune(const MultiSeqDriver& driver, const SeqState& s);
  MsOp Probe(const MultiSeqDriver& driver, const SeqState& s);
  MsOp Reserve(const MultiSeqDriver& driver, const std::vector<SeqState>& active);
  // A few batch indices for SetCausal, usually none.
  std::vector<int64_t> CausalOff(size_t batch_size);
  int32_t Token() { return static_cast<int32_t>(rng_.Below(1u << 20)); }
  template <typename T>
  const T& PickOf(const std::vector<T>& v) {
    return v[static_cast<size_t>(rng_.Below(v.size()))];
  }

  Rng rng_;
};

}  // namespace kvtwin::sim
