// CacheCall and LoggedCache: the state-moving calls a PrefixCache makes on its caches
// outside a write (Restore and Free), in the order it makes them. Why: spec §3.4 fixes that
// order (rewind every cache, page in node by node and cache by cache until the first
// refusal, align), and a call that the spec does not make can leave every state equal —
// a restore into a cache already at its target rewrites identical rows — so comparing
// states alone misses it (mutant 97). The request driver hands the manager LoggedCaches
// around its real caches, compares Begin's log with the calls ExpectBegin made, and holds
// the attach's and Close's logs to the spec's discipline (CheckAttachCalls, CheckCloseCalls).
// Single-threaded.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sim/checks.h"
#include "src/cache.h"

namespace kvtwin::sim {

struct CacheCall {
  // Restore and Free move state; Snapshot and Split are logged too, for the attach
  // discipline (RequestDriver's Attach check).
  enum class Op : uint8_t { kRestore, kFree, kSnapshot, kSplit };
  Op op = Op::kRestore;
  int32_t cache = 0;  // index in the manager's cache list
  // Restore only: the snapshot handed over (null = a live rewind), compared by identity and
  // never dereferenced after the call; its kind and range as they were at the call.
  const CacheSnapshot* snap = nullptr;
  CacheKind kind = CacheKind::kFullKv;
  // Split: the range of the tail it returned (from = to = -1 for a null tail).
  int64_t from = 0, to = 0;
  int64_t target = 0;  // Restore: the target; Snapshot: `from`; Split: `at`
  bool ok = true;      // what Restore returned (Free: true)

  static CacheCall Restore(int32_t cache, const CacheSnapshot* snap, int64_t target, bool ok);
  static CacheCall Free(int32_t cache);
  static CacheCall Snapshot(int32_t cache, CacheKind kind, int64_t from);
  // The tail's range [tail_from, tail_to), or -1, -1 for a null tail.
  static CacheCall Split(int32_t cache, CacheKind kind, int64_t at, int64_t tail_from,
                         int64_t tail_to);
  bool moves_state() const { return op == Op::kRestore || op == Op::kFree; }
  bool operator==(const CacheCall&) const = default;
};

// "c0 restore(-,5) ok, c1 restore(kv[0,9),5) refused, c2 free" ("none" for no call).
std::string DescribeCalls(std::span<const CacheCall> calls);
// The Restore and Free calls of `calls`, in order.
std::vector<CacheCall> StateMovingCalls(std::span<const CacheCall> calls);
// StateMovingCalls(calls) == want, without building the list (every Begin compares).
bool SameStateMovingCalls(std::span<const CacheCall> calls, std::span<const CacheCall> want);

// Spec §3.4 attachCapturedSnapshots over one session call's log (`call` names the call in
// a report): nothing restores or frees a cache, and a live Snapshot comes only right after
// a Split of the same KV cache whose tail starts past the split point (the documented
// evicted-head re-slice, src/prefix_cache.h). Why: a rewind to where a cache already is,
// or a capture re-copied from the live cache, leaves every state equal, so only the calls
// show it (mutant 104).
Check CheckAttachCalls(std::span<const CacheCall> calls, const char* call);
// Spec §3.4 close over its log: the attach's calls (CheckAttachCalls), the frontier's
// advance (Splits only), then, when pageOut installed (`paged_out_from` = the node's start,
// from the reference), one Snapshot(paged_out_from) per cache of `caches` (the non-null
// cache indexes, ascending) as the last calls; nullopt = no pageOut, so no trailing
// Snapshot. The eviction and compactPath after pageOut only merge.
Check CheckCloseCalls(std::span<const CacheCall> calls, std::span<const int32_t> caches,
                      std::optional<int64_t> paged_out_from);

// Forwards every call to `inner` and appends each Restore, Free, Snapshot and Split to `log`.
class LoggedCache final : public LayerCache {
 public:
  // REQUIRES: inner and log non-null and outliving this.
  LoggedCache(LayerCache* inner, int32_t index, std::vector<CacheCall>* log);

  CacheKind kind() const override { return inner_->kind(); }
  int64_t Offset() const override { return inner_->Offset(); }
  int64_t LiveBytes() const override { return inner_->LiveBytes(); }
  void Free() override;
  SnapshotPtr Snapshot(int64_t from) override;
  Status PrepareSnapshots(const std::vector<int64_t>& offsets) override {
    return inner_->PrepareSnapshots(offsets);
  }
  std::vector<SnapshotPtr> TakeSnapshots() override { return inner_->TakeSnapshots(); }
  bool ScheduleActive() const override { return inner_->ScheduleActive(); }
  [[nodiscard]] bool Restore(const CacheSnapshot* snap, int64_t target) override;
  SnapshotPtr Merge(SnapshotPtr parent, SnapshotPtr child) override {
    return inner_->Merge(std::move(parent), std::move(child));
  }
  std::pair<SnapshotPtr, SnapshotPtr> Split(SnapshotPtr snap, int64_t at) override;

 private:
  LayerCache* inner_;
  int32_t index_;
  std::vector<CacheCall>* log_;
};

}  // namespace kvtwin::sim
