#include "sim/multi_seq_ops.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

namespace kvtwin::sim {
namespace {

std::string End(int64_t end) {
  return end == kvtwin::kUnbounded ? std::string("inf") : std::to_string(end);
}

std::string TokenText(const MsBatchToken& t) {
  return fmt::format("s{}@{}:{}", t.seq, t.pos, t.token);
}

// Tokens grouped by sequence run: "s0@4:17 s0@5:3 | s1@4:9". A run of more than kRunShown
// consecutive positions of one sequence, ascending or descending, keeps its first two and
// last two tokens.
std::string BatchText(const std::vector<MsBatchToken>& batch) {
  std::string out;
  size_t i = 0;
  while (i < batch.size()) {
    if (i > 0) out += batch[i].seq == batch[i - 1].seq ? " " : " | ";
    // One past the consecutive run starting at i, ascending or (a scrambled run) descending.
    size_t end = i + 1;
    const int64_t step = i + 1 < batch.size() && batch[i + 1].pos < batch[i].pos ? -1 : 1;
    while (end < batch.size() && batch[end].seq == batch[i].seq &&
           batch[end].pos == batch[end - 1].pos + step) {
      ++end;
    }
    if (end - i <= kRunShown) {
      for (size_t j = i; j < end; ++j) out += (j > i ? " " : "") + TokenText(batch[j]);
    } else {
      out +=
          fmt::format("{} {} ... {} {} ({} tokens)", TokenText(batch[i]), TokenText(batch[i + 1]),
                      TokenText(batch[end - 2]), TokenText(batch[end - 1]), end - i);
    }
    i = end;
  }
  return out;
}

}  // namespace

std::string IntRuns(const std::vector<int64_t>& values) {
  std::string out = "[";
  size_t i = 0;
  while (i < values.size()) {
    size_t end = i + 1;
    while (end < values.size() && values[end] == values[end - 1] + 1) ++end;
    if (i > 0) out += ", ";
    if (end - i >= 3) {
      out += fmt::format("{}..{}", values[i], values[end - 1]);
    } else {
      out += fmt::format("{}", values[i]);
      end = i + 1;
    }
    i = end;
  }
  return out + "]";
}

const char* MsOpKindName(MsOpKind kind) {
  switch (kind) {
    case MsOpKind::kForward:
      return "forward";
    case MsOpKind::kCopyPrefix:
      return "copy_prefix";
    case MsOpKind::kRemove:
      return "remove";
    case MsOpKind::kCanResume:
      return "can_resume";
  }
  return "?";
}

MsOp MsOp::Forward(std::vector<MsBatchToken> batch, std::vector<int64_t> causal_off, bool reserve) {
  MsOp op;
  op.kind = MsOpKind::kForward;
  op.batch = std::move(batch);
  op.causal_off = std::move(causal_off);
  op.reserve = reserve;
  return op;
}

MsOp MsOp::CopyPrefix(int32_t src, int32_t dst, int64_t len) {
  MsOp op;
  op.kind = MsOpKind::kCopyPrefix;
  op.seq = src;
  op.dst = dst;
  op.begin = len;
  return op;
}

MsOp MsOp::Remove(int32_t seq, int64_t begin, int64_t end) {
  MsOp op;
  op.kind = MsOpKind::kRemove;
  op.seq = seq;
  op.begin = begin;
  op.end = end;
  return op;
}

MsOp MsOp::CanResume(int32_t seq, int64_t pos) {
  MsOp op;
  op.kind = MsOpKind::kCanResume;
  op.seq = seq;
  op.begin = pos;
  return op;
}

std::vector<int32_t> BatchSequences(const std::vector<MsBatchToken>& batch) {
  std::vector<int32_t> order;
  for (const MsBatchToken& t : batch) {
    if (std::find(order.begin(), order.end(), t.seq) == order.end()) order.push_back(t.seq);
  }
  return order;
}

bool EqualTokenCounts(const std::vector<MsBatchToken>& batch) {
  const std::vector<int32_t> order = BatchSequences(batch);
  for (int32_t seq : order) {
    const auto n = std::count_if(batch.begin(), batch.end(),
                                 [seq](const MsBatchToken& t) { return t.seq == seq; });
    if (static_cast<size_t>(n) * order.size() != batch.size()) return false;
  }
  return true;
}

void InterleaveSequences(std::vector<MsBatchToken>& batch, Rng& rng) {
  const std::vector<int32_t> order = BatchSequences(batch);
  if (order.size() < 2) return;
  std::vector<std::vector<MsBatchToken>> runs(order.size());
  for (const MsBatchToken& t : batch) {
    const auto i = std::find(order.begin(), order.end(), t.seq) - order.begin();
    runs[static_cast<size_t>(i)].push_back(t);
  }
  std::vector<size_t> next(runs.size(), 0);
  std::vector<size_t> open;  // runs with tokens left
  for (size_t k = 0; k < batch.size(); ++k) {
    open.clear();
    for (size_t i = 0; i < runs.size(); ++i) {
      if (next[i] < runs[i].size()) open.push_back(i);
    }
    const size_t i = open[static_cast<size_t>(rng.Below(open.size()))];
    batch[k] = runs[i][next[i]++];
  }
}

std::string MsOp::ToString() const {
  switch (kind) {
    case MsOpKind::kForward: {
      std::string s = fmt::format("{} [{}]", reserve ? "reserve" : "forward", BatchText(batch));
      if (!causal_off.empty()) s += fmt::format(" causal_off={}", causal_off);
      std::vector<std::string> edited;
      for (const MsOp& e : edits) edited.push_back(e.ToString());
      if (!edits.empty()) s += fmt::format(" edits=[{}]", fmt::join(edited, "; "));
      return s;
    }
    case MsOpKind::kCopyPrefix:
      return fmt::format("copy_prefix s{} -> s{} len={}", seq, dst, begin);
    case MsOpKind::kRemove:
      return fmt::format("remove s{} [{}, {})", seq, begin, End(end));
    case MsOpKind::kCanResume:
      return fmt::format("can_resume s{} pos={}", seq, begin);
  }
  return "?";
}

}  // namespace kvtwin::sim
