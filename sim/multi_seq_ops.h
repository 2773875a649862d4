// MsOp: one operation of a multi-sequence lock-step run (spec §2.8, §2.9.1) on the LFM2
// hybrid cache and its reference. A forward is one batch of {sequence, position, token}
// (kept in batch order: a sequence's tokens reach the conv state in that order, and the
// sequences may interleave), optionally a reserve (worst-case sizing, nothing written), and the
// batch indices whose causal condition is disabled by SetCausal right after StartForward, and the
// sequence edits another request makes while the forward is set up (below). The other ops
// are the sequence edits and the CanResume probe. Value type.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "sim/synthetic.h"
#include "src/causal_cache.h"
#include "src/core/rng.h"

namespace kvtwin::sim {

// Finite Remove ends far past the positions the drivers write (most runs stay below
// kMaxPosition): int32's largest value (Go's math.MaxInt32 sentinel), one past it, one past
// the tag's range (inside a run whose positions start far up), and just short of kUnbounded. The
// tail goes and the shift step still runs (spec §2.8), refused without a callback. Drawn by the
// generator and the hybrid fuzz records.
inline constexpr std::array<int64_t, 4> kFarRemoveEnds = {
    std::numeric_limits<int32_t>::max(), int64_t{std::numeric_limits<int32_t>::max()} + 1,
    kMaxPosition + 1, kvtwin::kUnbounded - 1};

enum class MsOpKind : uint8_t { kForward, kCopyPrefix, kRemove, kCanResume };

struct MsBatchToken {
  int32_t seq = 0;
  int64_t pos = 0;
  int32_t token = 0;
  friend bool operator==(const MsBatchToken&, const MsBatchToken&) = default;
};

struct MsOp {
  MsOpKind kind = MsOpKind::kForward;
  // kForward
  std::vector<MsBatchToken> batch;
  bool reserve = false;
  std::vector<int64_t> causal_off;  // batch indices passed to SetCausal
  // kForward, not reserving: CopyPrefix / Remove ops on the embedded causal cache between
  // StartForward and Put (spec §2.8 builds the mask in StartForward and SetCausal, and Put
  // scatters into the cells StartForward chose whatever their metadata became). A plain
  // transformer's server edits the §2.8 cache directly; the hybrid's slots are not involved.
  // A forward StartForward refuses applies none of them.
  std::vector<MsOp> edits;
  // kCopyPrefix: src, dst, len. kRemove: seq, begin, end. kCanResume: seq, pos (= begin).
  int32_t seq = 0;  // kRemove / kCanResume; kCopyPrefix: src
  int32_t dst = 0;
  int64_t begin = 0;  // kRemove: begin; kCopyPrefix: len; kCanResume: pos
  int64_t end = kvtwin::kUnbounded;

  static MsOp Forward(std::vector<MsBatchToken> batch, std::vector<int64_t> causal_off = {},
                      bool reserve = false);
  static MsOp CopyPrefix(int32_t src, int32_t dst, int64_t len);
  static MsOp Remove(int32_t seq, int64_t begin, int64_t end);
  static MsOp CanResume(int32_t seq, int64_t pos);

  // "forward [s0@4:17 s0@5:3 | s1@4:9] causal_off=[1]", "remove s2 [3, inf)", ...; a
  // sequence's run of more than kRunShown consecutive positions (either way) shows its first and
  // last tokens only ("s1@0:5 s1@1:9 ... s1@511:4 (512 tokens)"): a huge run's ubatch is 512.
  std::string ToString() const;
  friend bool operator==(const MsOp&, const MsOp&) = default;
};

const char* MsOpKindName(MsOpKind kind);

// Tokens of a consecutive run that ToString prints in full.
inline constexpr size_t kRunShown = 8;

// "[0, 4..9, 12]": ascending runs of three or more consecutive values written first..last,
// so a list of thousands of cells or positions stays readable in a report (lossless).
std::string IntRuns(const std::vector<int64_t>& values);

// The batch's sequences in first-appearance order (the hybrid's current sequences).
std::vector<int32_t> BatchSequences(const std::vector<MsBatchToken>& batch);
// Whether every sequence of the batch brings the same number of tokens (the hybrid's rule).
bool EqualTokenCounts(const std::vector<MsBatchToken>& batch);
// Reorders the batch into a random merge of its sequences' runs: each sequence keeps its
// tokens' relative order (what its conv state sees), while the sequences interleave, so the
// first-appearance order and which batch index lands in which cell change. Spec 2.9.1 takes
// the batch's unique sequences in first-appearance order and asks only for equal counts; a
// server lists each sequence as one run, which a cache deriving sequences from runs would
// wrongly rely on.
void InterleaveSequences(std::vector<MsBatchToken>& batch, Rng& rng);

}  // namespace kvtwin::sim
