// Op: one operation of an op-level lock-step run on a layer stack. A write or a
// speculation goes to every layer (each at its own offset, with each layer's own history);
// every other op targets one layer. A speculation runs one forward of `tokens` ([current,
// d1..dD]) through the wrappers of BeginSpeculation and commits current plus `value` accepted
// drafts (value + 1 tokens; out-of-range values test the clamp), or through
// BeginIsolatedSpeculation and commits nothing; an abandoned speculation stops after its
// forward reached `abandon_after` layers and is dropped without a commit (an error or a
// cancellation between the forward and the acceptance), so the transaction's destructor must
// roll every wrapped layer back (spec §2.6 step 5). Snapshots live in a per-layer pool and are
// named by their index in it; -1 names the null snapshot. Merge and Split consume their inputs
// (removed from the pool) and append their non-null outputs; Take appends the non-null captures.
// Value type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvtwin::sim {

enum class OpKind : uint8_t {
  kWrite,
  kSnapshot,
  kRestore,
  kMerge,
  kSplit,
  kFree,
  kPrepare,
  kTake,
  kClose,
  kSpeculate
};

// Logical attention mask of a write (checked against what attention must see).
// kBlock: causal plus an additive array mask whose -inf cells are the rectangle (a padding
// or document-boundary mask: keys blocked whatever else would allow them).
// kRelaxBlock: both in one mask, `rect` relaxed and `block` blocked
// (a tree-attention relaxation inside a padded batch): blocked cells stay blocked even where
// the relaxation reopens them, which only a mask holding both can get wrong.
// kArray: a pure additive array (no causal flag) whose -inf cells are the rectangle: every
// other key of the history is visible, later ones too (a bidirectional span with padding).
// The one form a rotating decode must gather as an array of its own, not rebuild from causal.
enum class MaskForm : uint8_t { kCausal, kZero, kRelax, kBlock, kRelaxBlock, kArray };

// A mask rectangle in absolute positions: queries [q_lo, q_hi) x keys [k_lo, k_hi).
struct MaskRect {
  int64_t q_lo = 0, q_hi = 0, k_lo = 0, k_hi = 0;
  // What the trace format accepts: non-negative, each range ordered.
  bool Valid() const { return q_lo >= 0 && k_lo >= 0 && q_hi >= q_lo && k_hi >= k_lo; }
  friend bool operator==(const MaskRect&, const MaskRect&) = default;
};

struct Op {
  OpKind kind = OpKind::kWrite;
  int32_t layer = 0;
  // kWrite, kSpeculate
  std::vector<int32_t> tokens;  // the real token ids (>= 0; the reader takes any int32 >= 0)
  int64_t pad = 0;              // padding rows recurrent layers also receive
  bool segmented = false;       // recurrent: segmented gated-delta form
  MaskForm mask = MaskForm::kCausal;
  MaskRect rect;   // HasRect
  MaskRect block;  // HasBlockRect
  // kSnapshot: from; kRestore: target; kSplit: at; kSpeculate: accepted drafts
  int64_t value = 0;
  bool isolated = false;  // kSpeculate
  // kSpeculate: -1 = runs to its commit; 0..layers = dropped after forwarding that many layers
  int32_t abandon_after = -1;
  // kRestore / kSplit / kClose: slot; kMerge: slot (parent) and slot2 (child)
  int32_t slot = -1;
  int32_t slot2 = -1;
  // kPrepare
  std::vector<int64_t> offsets;

  std::string ToString() const;
};

// How LockstepDriver::Speculate forwards a kSpeculate op's n = D + 1 tokens: 0 = as one
// forward; s in [1, n) = as two forwards through the same wrappers, [0, s) then [s, n).
// A function of the op alone (so traces replay alike): with v = value clamped to [0, n],
// two forwards when v + n is odd, cut at 1 + (3v + n) mod (n - 1), which lands before, at
// and after the commit point. The reference commits the same tokens either way.
int64_t SpeculationSplit(const Op& op);

const char* OpKindName(OpKind kind);
// "causal", "zero", "relax", "block", "relax_block", "array" (the trace format's names), and
// back.
const char* MaskFormName(MaskForm mask);
// Whether the form carries the op's `rect`: relax and relax_block reopen it,
// block and array block it.
inline bool HasRect(MaskForm mask) { return mask != MaskForm::kCausal && mask != MaskForm::kZero; }
// Whether the form carries a second, blocked rectangle (`block`).
inline bool HasBlockRect(MaskForm mask) { return mask == MaskForm::kRelaxBlock; }
// Whether the form has no causal flag: every key of the history is open unless blocked.
inline bool IsNonCausal(MaskForm mask) {
  return mask == MaskForm::kZero || mask == MaskForm::kArray;
}
std::optional<MaskForm> ParseMaskForm(std::string_view name);

}  // namespace kvtwin::sim
