// RecurrentCache (spec §2.3), generation v1: every snapshot is an owned copy of the whole
// state (conv tail + delta) tagged with the offset it represents. Because the state is a
// fold over the whole history it cannot be rewound; a snapshot is self-contained, so it can
// be restored from any offset (including a freed cache) but only to its own offset.
#include "src/recurrent_cache.h"

#include <memory>
#include <string>
#include <utility>

#include "src/core/check.h"

namespace kvtwin {
namespace {

// Bytes of a float32 delta state (spec §7: delta is always float32).
int64_t DeltaBytes(const MatF& delta) {
  return static_cast<int64_t>(delta.size()) * static_cast<int64_t>(sizeof(float));
}

const RecurrentSnapshot& AsRecurrent(const CacheSnapshot& snap) {
  KV_CHECK(snap.kind() == CacheKind::kRecurrent,
           std::string("recurrent cache given a ") + CacheKindName(snap.kind()) + " snapshot");
  return static_cast<const RecurrentSnapshot&>(snap);
}

// REQUIRES of Put: every state pair has the cache's shapes and the live conv dtype.
void CheckState(const RecurrentDims& dims, DType conv_dtype, const Tensor& conv,
                const MatF& delta) {
  KV_CHECK(
      conv.dtype() == conv_dtype && conv.rows() == dims.conv_tail && conv.cols() == dims.conv_dim(),
      "Put conv state " + conv.ShapeString() + " does not match " + DTypeName(conv_dtype) + "[" +
          std::to_string(dims.conv_tail) + "x" + std::to_string(dims.conv_dim()) + "]");
  KV_CHECK(delta.rows() == dims.delta_rows() && delta.cols() == dims.head_k_dim,
           "Put delta state [" + std::to_string(delta.rows()) + "x" + std::to_string(delta.cols()) +
               "] does not match the cache dims");
}

}  // namespace

RecurrentSnapshot::RecurrentSnapshot(int64_t offset, Tensor conv, MatF delta)
    : offset_(offset), conv_(std::move(conv)), delta_(std::move(delta)) {
  KV_CHECK(offset >= 0, "recurrent snapshot at a negative offset");
}

int64_t RecurrentSnapshot::SizeBytes() const { return conv_.Bytes() + DeltaBytes(delta_); }

RecurrentCache::RecurrentCache(RecurrentDims dims) : dims_(dims) {
  KV_CHECK(dims_.conv_tail >= 0, "negative conv tail");
  KV_CHECK(dims_.num_k_heads > 0 && dims_.num_v_heads > 0, "head counts must be positive");
  KV_CHECK(dims_.head_k_dim > 0 && dims_.head_v_dim > 0, "head dims must be positive");
  KV_CHECK(dims_.num_v_heads % dims_.num_k_heads == 0, "Hv must be a multiple of Hk");
}

int64_t RecurrentCache::LiveBytes() const {
  if (!has_state_) return 0;
  return conv_.Bytes() + DeltaBytes(delta_);
}

void RecurrentCache::Free() {
  has_state_ = false;
  conv_ = Tensor();
  delta_ = MatF();
  offset_ = 0;
  // Reset closes the captures still held; Go leaks them instead (spec §8.2).
  schedule_.Reset();
}

SnapshotPtr RecurrentCache::Snapshot(int64_t /*from*/) {
  // The state is a fold over the whole history, so `from` has no meaning here.
  if (!has_state_) return nullptr;
  return std::make_unique<RecurrentSnapshot>(offset_, conv_, delta_);
}

Status RecurrentCache::PrepareSnapshots(const std::vector<int64_t>& offsets) {
  KV_RETURN_IF_ERROR(schedule_.Prepare(offset_, offsets));
  // Put captures only offsets after its start, so an offset equal to the current position
  // is captured now (null if no state exists yet).
  CaptureBoundary(offset_, conv_, delta_);
  return Status::Ok();
}

std::vector<SnapshotPtr> RecurrentCache::TakeSnapshots() { return schedule_.Take(); }

bool RecurrentCache::Restore(const CacheSnapshot* snap, int64_t target) {
  // Without a snapshot the state cannot rewind: only the no-op succeeds.
  if (snap == nullptr) return target == offset_;
  const RecurrentSnapshot& rs = AsRecurrent(*snap);
  if (target != rs.offset()) return false;
  KV_CHECK(rs.conv().rows() == dims_.conv_tail && rs.conv().cols() == dims_.conv_dim(),
           "snapshot conv shape " + rs.conv().ShapeString() + " does not fit this cache");
  KV_CHECK(rs.delta().rows() == dims_.delta_rows() && rs.delta().cols() == dims_.head_k_dim,
           "snapshot delta shape does not fit this cache");
  // The conv dtype comes from the snapshot: a later Get must then ask for that dtype.
  conv_ = rs.conv();
  delta_ = rs.delta();
  offset_ = rs.offset();
  has_state_ = true;
  return true;
}

SnapshotPtr RecurrentCache::Merge(SnapshotPtr parent, SnapshotPtr child) {
  // AsRecurrent only checks the kinds (REQUIRES of the contract).
  if (parent != nullptr) AsRecurrent(*parent);
  if (child != nullptr) AsRecurrent(*child);
  // The child's whole state supersedes the parent's; the parent is closed on return
  // (a null child therefore yields null, as in Go — spec §8.4).
  return child;
}

std::pair<SnapshotPtr, SnapshotPtr> RecurrentCache::Split(SnapshotPtr snap, int64_t /*at*/) {
  if (snap != nullptr) AsRecurrent(*snap);
  // A whole-state snapshot has no prefix part to give the parent.
  return {nullptr, std::move(snap)};
}

RecurrentCache::StateView RecurrentCache::Get(DType activation) {
  if (has_state_) {
    // One layer sees one activation dtype for its whole life (until Free).
    KV_CHECK(conv_.dtype() == activation, std::string("recurrent Get with ") +
                                              DTypeName(activation) + " but the conv state is " +
                                              DTypeName(conv_.dtype()));
  } else {
    conv_ = Tensor(activation, dims_.conv_tail, dims_.conv_dim());
    delta_ = MatF::Zero(dims_.delta_rows(), dims_.head_k_dim);
    has_state_ = true;
  }
  return StateView{&conv_, &delta_};
}

std::vector<int64_t> RecurrentCache::SnapshotSplits(int64_t forward_len) const {
  // Strictly inside: the start was captured before (Prepare or the previous Put) and the
  // end is captured from the live state by Put itself.
  std::vector<int64_t> splits;
  for (const int64_t o : schedule_.ScheduledIn(offset_ + 1, offset_ + forward_len - 1)) {
    splits.push_back(o - offset_);
  }
  return splits;
}

void RecurrentCache::Put(int64_t real_len, std::vector<Tensor>& conv_states,
                         std::vector<MatF>& delta_states) {
  KV_CHECK(has_state_, "recurrent Put before Get");
  KV_CHECK(real_len >= 0, "negative real length " + std::to_string(real_len));
  KV_CHECK(!conv_states.empty() && conv_states.size() == delta_states.size(),
           "Put needs equal non-empty conv and delta state lists");
  const std::vector<int64_t> splits = SnapshotSplits(real_len);
  KV_CHECK(conv_states.size() == splits.size() + 1,
           "Put got " + std::to_string(conv_states.size()) + " states for " +
               std::to_string(splits.size()) + " snapshot splits");
  for (size_t i = 0; i < conv_states.size(); ++i) {
    CheckState(dims_, conv_.dtype(), conv_states[i], delta_states[i]);
  }

  const int64_t start = offset_;
  for (size_t i = 0; i < splits.size(); ++i) {
    CaptureBoundary(start + splits[i], conv_states[i], delta_states[i]);
  }
  std::swap(conv_, conv_states.back());
  std::swap(delta_, delta_states.back());
  // Padding does not advance: the kernels made padded rows identity steps.
  offset_ += real_len;
  CaptureBoundary(offset_, conv_, delta_);
}

void RecurrentCache::CaptureBoundary(int64_t reached, const Tensor& conv, const MatF& delta) {
  schedule_.CaptureReached(reached, [&](int64_t /*base*/) -> SnapshotPtr {
    // A whole-state capture ignores base; before the first Get there is nothing to copy.
    if (!has_state_) return nullptr;
    return std::make_unique<RecurrentSnapshot>(reached, conv, delta);
  });
}

}  // namespace kvtwin
