// The common per-layer cache contract (spec §1.1, §1.2), v1 generation: every snapshot is
// owned (eager copy), so a snapshot never aliases a live buffer and never changes after it
// is made. A snapshot is "closed" by destroying its SnapshotPtr; unique ownership makes a
// double close or a use after Merge/Split impossible by construction.
//
// Offsets are token counts; ranges are half-open [a, b). All caches here are B = 1
// (single sequence), as every MLX cache assumes (spec §0).
//
// Boolean outcomes follow spec §1.2 exactly: Restore returns false where the reference API
// does and then leaves the cache unchanged. Capture-schedule misuse (PrepareSnapshots while
// a schedule is active, an offset behind the cache, unsorted or duplicate offsets) is a
// FailedPrecondition / InvalidArgument Status, not a crash, so drivers can compare it with
// the reference. Single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "src/core/status.h"
#include "src/core/tensor.h"

namespace kvtwin {

enum class CacheKind : uint8_t { kFullKv, kRotating, kRecurrent };

const char* CacheKindName(CacheKind kind);

// A captured piece of one layer's state. Concrete kinds (KvSnapshot, RotatingSnapshot,
// RecurrentSnapshot) expose their contents read-only for checkers.
class CacheSnapshot {
 public:
  virtual ~CacheSnapshot() = default;
  virtual CacheKind kind() const = 0;
  // Bytes this snapshot owns (spec §7).
  virtual int64_t SizeBytes() const = 0;
  // The range the snapshot names: KV [from, to) exactly; whole-state kinds report the
  // state's end as to(). A window snapshot's from() is the label spec §2.2 gives its path
  // (restores ignore it); a recurrent snapshot's is its offset (spec §2.3 keeps none).
  virtual int64_t from() const = 0;
  virtual int64_t to() const = 0;
};

using SnapshotPtr = std::unique_ptr<CacheSnapshot>;

class LayerCache {
 public:
  virtual ~LayerCache() = default;

  virtual CacheKind kind() const = 0;
  // Number of tokens represented in the live state.
  virtual int64_t Offset() const = 0;
  // Bytes of live state (buffers as allocated, capacity included).
  virtual int64_t LiveBytes() const = 0;
  // Drops live state, offset := 0, drops the capture schedule (closing its captures).
  virtual void Free() = 0;

  // Captures the live state covering [from, offset) (meaning per kind); may be null.
  virtual SnapshotPtr Snapshot(int64_t from) = 0;
  // Schedules captures at `offsets` (spec §1.3). Errors: a schedule is already active
  // (FailedPrecondition); an offset < Offset() or offsets not strictly ascending
  // (InvalidArgument). On error nothing changes.
  virtual Status PrepareSnapshots(const std::vector<int64_t>& offsets) = 0;
  // One entry per scheduled offset, in scheduled order (null = zero-width / never reached);
  // clears the schedule. With no active schedule returns an empty list.
  virtual std::vector<SnapshotPtr> TakeSnapshots() = 0;
  // True while a prepared schedule has not been taken.
  virtual bool ScheduleActive() const = 0;

  // Brings the live state to `target` (snap == nullptr: rewind using live state only).
  // False = impossible; the cache is then unchanged. The snapshot is not consumed.
  // REQUIRES: snap is null or of this cache's kind.
  [[nodiscard]] virtual bool Restore(const CacheSnapshot* snap, int64_t target) = 0;
  // Combines [a,b) and [b,c) into [a,c); consumes both (either may be null).
  virtual SnapshotPtr Merge(SnapshotPtr parent, SnapshotPtr child) = 0;
  // Divides [a,c) at `at`; consumes the input. Kinds that cannot split return (null, snap).
  virtual std::pair<SnapshotPtr, SnapshotPtr> Split(SnapshotPtr snap, int64_t at) = 0;
};

// What a forward hands to attention: K/V rows [0, length) of the cache's buffers (physical
// order; ring order for a rotating decode write) and, for rotating caches, the applier
// that maps a logical mask into the physical layout. The pointers stay valid until the
// cache is next mutated.
struct RotatingApplier {
  int64_t key_len = 0;    // K: number of history rows
  int64_t query_len = 0;  // L of the write; 1 means "ring layout" (decode or View)
  int64_t window = 0;     // W
  int64_t ring_idx = 0;   // write cursor after the write
};

struct History {
  const Tensor* k = nullptr;
  const Tensor* v = nullptr;
  int64_t length = 0;
  bool has_applier = false;
  RotatingApplier applier;
};

class AttentionCache : public LayerCache {
 public:
  // Writes K/V rows (one row per token, L = k.rows() >= 1) at the current offset, runs the
  // capture schedule, and returns the attention history.
  // REQUIRES: k and v have the same row count, the cache's column counts, and the dtype
  // of the first write.
  virtual History Update(const Tensor& k, const Tensor& v) = 0;
  // Read-only history of the current state (a draft model sharing the target cache).
  virtual History View() const = 0;
};

}  // namespace kvtwin
