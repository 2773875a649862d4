// OpGenerator: seeded adversarial op sequences for a LockstepDriver. It reads the reference
// state (offsets, pool ranges) to aim arguments at boundaries (W-1, W, W+1, snapshot ends,
// one past the offset, negative targets, a held snapshot's end where the layer stands or
// where its schedule names), mixes in malformed capture schedules, runs
// speculation through the capture protocol of spec §2.6 as a macro (schedule
// before+1..before+D, one batched write of D+1 tokens, take, restore the accepted prefix)
// across every layer, and speculation transactions (kSpeculate: D drafts around the
// window size, accepted counts in and out of range, isolated ones). Weights are options so swarm
// runs can switch whole op kinds off. Single-threaded.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <string>

#include "sim/lockstep.h"
#include "sim/ops.h"
#include "src/core/rng.h"

namespace kvtwin::sim {

// Relative weights per op family; 0 switches a family off.
struct OpWeights {
  uint32_t write = 30, snapshot = 10, restore = 18, merge = 6, split = 6, free = 2, prepare = 7,
           take = 7, close = 5, capture_spec = 5, speculate = 6;
  std::string ToString() const;
};

class OpGenerator {
 public:
  OpGenerator(Rng rng, OpWeights weights)
      : rng_(rng),
        padding_rng_(Rng(rng).Fork("padding-alone")),
        bucket_rng_(Rng(rng).Fork("padding-buckets")),
        long_spec_rng_(Rng(rng).Fork("long-speculation")),
        weights_(weights) {}
  // The next valid op for the driver's current state.
  Op Next(const LockstepDriver& driver);

 private:
  struct Pending {
    Op op;
    bool restore_accepted = false;  // resolve the restore target slot when popped
  };
  Op Fresh(const LockstepDriver& driver);
  Op MakeWrite(const LockstepDriver& driver, int64_t length);
  // On a stack of recurrent layers only, sometimes turns a drawn write into one of padding
  // alone (no tokens, pad 1..3): the state then exists at an offset that did not move,
  // offset 0 on a fresh layer. Its own stream decides, so the main stream draws as before.
  Op MaybePaddingAlone(const LockstepDriver& driver, Op write);
  Op MakeRestore(const LockstepDriver& driver, int32_t layer);
  Op MakeMerge(const LockstepDriver& driver, int32_t layer);
  Op MakeSplit(const LockstepDriver& driver, int32_t layer);
  Op MakePrepare(const LockstepDriver& driver, int32_t layer);
  Op MakeSpeculate(const LockstepDriver& driver);
  void PlanSpeculation(const LockstepDriver& driver);
  Op Resolve(const LockstepDriver& driver, Pending pending);
  int64_t WriteLength(const LockstepDriver& driver);
  // A write of the KV growth step or longer: 256 or 512, or 257-600.
  int64_t LongWriteLength();
  int64_t Pick(std::initializer_list<int64_t> values);

  Rng rng_;
  Rng padding_rng_;
  // Pads one write in 24 up to a batch bucket of 64, 128 or 256 rows (a server replaying a
  // captured graph of that size): a short decode then runs as a long, mostly padded forward.
  // Its own stream, so the main stream draws as before.
  Rng bucket_rng_;
  // Makes one speculation in 16 a long one (63-129 drafts, a chunk-sized draft tree or a
  // speculative prefill) whose commit lands on or next to a multiple of 64 tokens, where a
  // kernel's 64-row chunking of a replayed prefix ends. Its own stream, as above.
  Rng long_spec_rng_;
  OpWeights weights_;
  std::deque<Pending> pending_;
};

}  // namespace kvtwin::sim
