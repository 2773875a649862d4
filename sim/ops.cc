#include "sim/ops.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kvtwin::sim {

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kWrite:
      return "write";
    case OpKind::kSnapshot:
      return "snapshot";
    case OpKind::kRestore:
      return "restore";
    case OpKind::kMerge:
      return "merge";
    case OpKind::kSplit:
      return "split";
    case OpKind::kFree:
      return "free";
    case OpKind::kPrepare:
      return "prepare";
    case OpKind::kTake:
      return "take";
    case OpKind::kClose:
      return "close";
    case OpKind::kSpeculate:
      return "speculate";
  }
  return "?";
}

std::string Op::ToString() const {
  switch (kind) {
    case OpKind::kWrite:
    case OpKind::kSpeculate: {
      std::string s = kind == OpKind::kWrite ? fmt::format("write L={}", tokens.size())
                      : isolated
                          ? fmt::format("speculate isolated drafts={}", tokens.size() - 1)
                          : fmt::format("speculate drafts={} accept={}", tokens.size() - 1, value);
      if (abandon_after >= 0) s += fmt::format(" abandoned after {} layers", abandon_after);
      if (pad > 0) s += fmt::format(" pad={}", pad);
      if (segmented) s += " segmented";
      if (mask == MaskForm::kZero) s += " mask=zero";
      if (HasRect(mask)) {
        s += fmt::format(" mask={}(q[{},{}) k[{},{}))", MaskFormName(mask), rect.q_lo, rect.q_hi,
                         rect.k_lo, rect.k_hi);
      }
      if (HasBlockRect(mask)) {
        s += fmt::format(" block(q[{},{}) k[{},{}))", block.q_lo, block.q_hi, block.k_lo,
                         block.k_hi);
      }
      return s;
    }
    case OpKind::kSnapshot:
      return fmt::format("snapshot layer={} from={}", layer, value);
    case OpKind::kRestore:
      return fmt::format("restore layer={} snap={} target={}", layer,
                         slot < 0 ? std::string("null") : fmt::format("#{}", slot), value);
    case OpKind::kMerge:
      return fmt::format("merge layer={} #{} #{}", layer, slot, slot2);
    case OpKind::kSplit:
      return fmt::format("split layer={} #{} at={}", layer, slot, value);
    case OpKind::kFree:
      return fmt::format("free layer={}", layer);
    case OpKind::kPrepare:
      return fmt::format("prepare layer={} offsets={}", layer, offsets);
    case OpKind::kTake:
      return fmt::format("take layer={}", layer);
    case OpKind::kClose:
      return fmt::format("close layer={} #{}", layer, slot);
  }
  return "?";
}

const char* MaskFormName(MaskForm mask) {
  switch (mask) {
    case MaskForm::kCausal:
      return "causal";
    case MaskForm::kZero:
      return "zero";
    case MaskForm::kRelax:
      return "relax";
    case MaskForm::kBlock:
      return "block";
    case MaskForm::kRelaxBlock:
      return "relax_block";
    case MaskForm::kArray:
      return "array";
  }
  return "?";
}

std::optional<MaskForm> ParseMaskForm(std::string_view name) {
  for (const MaskForm m : {MaskForm::kCausal, MaskForm::kZero, MaskForm::kRelax, MaskForm::kBlock,
                           MaskForm::kRelaxBlock, MaskForm::kArray}) {
    if (name == MaskFormName(m)) return m;
  }
  return std::nullopt;
}

}  // namespace kvtwin::sim
