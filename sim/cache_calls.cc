#include "sim/cache_calls.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "src/core/check.h"

namespace kvtwin::sim {

CacheCall CacheCall::Restore(int32_t cache, const CacheSnapshot* snap, int64_t target, bool ok) {
  CacheCall c;
  c.op = Op::kRestore;
  c.cache = cache;
  c.snap = snap;
  if (snap != nullptr) {
    c.kind = snap->kind();
    c.from = snap->from();
    c.to = snap->to();
  }
  c.target = target;
  c.ok = ok;
  return c;
}

CacheCall CacheCall::Free(int32_t cache) {
  CacheCall c;
  c.op = Op::kFree;
  c.cache = cache;
  return c;
}

CacheCall CacheCall::Snapshot(int32_t cache, CacheKind kind, int64_t from) {
  CacheCall c;
  c.op = Op::kSnapshot;
  c.cache = cache;
  c.kind = kind;
  c.target = from;
  return c;
}

CacheCall CacheCall::Split(int32_t cache, CacheKind kind, int64_t at, int64_t tail_from,
                           int64_t tail_to) {
  CacheCall c;
  c.op = Op::kSplit;
  c.cache = cache;
  c.kind = kind;
  c.target = at;
  c.from = tail_from;
  c.to = tail_to;
  return c;
}

std::string DescribeCalls(std::span<const CacheCall> calls) {
  if (calls.empty()) return "none";
  std::string out;
  for (const CacheCall& c : calls) {
    if (!out.empty()) out += ", ";
    if (c.op == CacheCall::Op::kFree) {
      out += fmt::format("c{} free", c.cache);
      continue;
    }
    if (c.op == CacheCall::Op::kSnapshot) {
      out += fmt::format("c{} snapshot({})", c.cache, c.target);
      continue;
    }
    if (c.op == CacheCall::Op::kSplit) {
      out += c.from < 0
                 ? fmt::format("c{} split(at {}) -> no tail", c.cache, c.target)
                 : fmt::format("c{} split(at {}) -> tail [{},{})", c.cache, c.target, c.from, c.to);
      continue;
    }
    std::string snap = "-";
    if (c.snap != nullptr) {
      // KV snapshots are edge-local ranges; whole-state snapshots are named by their end.
      snap = c.kind == CacheKind::kFullKv ? fmt::format("kv[{},{})", c.from, c.to)
                                          : fmt::format("{}@{}", CacheKindName(c.kind), c.to);
    }
    out += fmt::format("c{} restore({},{}) {}", c.cache, snap, c.target, c.ok ? "ok" : "refused");
  }
  return out;
}

std::vector<CacheCall> StateMovingCalls(std::span<const CacheCall> calls) {
  std::vector<CacheCall> out;
  for (const CacheCall& c : calls) {
    if (c.moves_state()) out.push_back(c);
  }
  return out;
}

bool SameStateMovingCalls(std::span<const CacheCall> calls, std::span<const CacheCall> want) {
  size_t i = 0;
  for (const CacheCall& c : calls) {
    if (!c.moves_state()) continue;
    if (i == want.size() || !(c == want[i])) return false;
    ++i;
  }
  return i == want.size();
}

Check CheckAttachCalls(std::span<const CacheCall> calls, const char* call) {
  for (size_t j = 0; j < calls.size(); ++j) {
    const CacheCall& c = calls[j];
    if (c.moves_state()) {
      return Mismatch{
          fmt::format("{} cache calls (spec §3.4: an attach neither restores nor frees a cache)",
                      call),
          "no restore or free", DescribeCalls(calls.first(j + 1))};
    }
    if (c.op != CacheCall::Op::kSnapshot) continue;
    const CacheCall* split = j > 0 ? &calls[j - 1] : nullptr;
    const bool justified = split != nullptr && split->op == CacheCall::Op::kSplit &&
                           split->cache == c.cache && c.kind == CacheKind::kFullKv &&
                           split->from > split->target && c.target == split->target;
    if (!justified) {
      return Mismatch{fmt::format("{} cache calls (spec §3.4: one Split per capture; a live KV "
                                  "slice only after a Split whose tail starts past the node)",
                                  call),
                      "no live snapshot here", DescribeCalls(calls.first(j + 1))};
    }
  }
  return std::nullopt;
}

Check CheckCloseCalls(std::span<const CacheCall> calls, std::span<const int32_t> caches,
                      std::optional<int64_t> paged_out_from) {
  const size_t n = paged_out_from ? caches.size() : 0;
  bool same = calls.size() >= n;
  const size_t head = same ? calls.size() - n : 0;
  for (size_t j = 0; same && j < n; ++j) {
    const CacheCall& got = calls[head + j];
    same = got.op == CacheCall::Op::kSnapshot && got.cache == caches[j] &&
           got.target == *paged_out_from;
  }
  if (!same) {
    std::vector<CacheCall> want;  // the kind is not part of the description
    for (size_t j = 0; j < n; ++j) {
      want.push_back(CacheCall::Snapshot(caches[j], CacheKind::kFullKv, *paged_out_from));
    }
    return Mismatch{
        "Close cache calls (spec §3.4 close: pageOut takes one Snapshot per cache "
        "from the new node's start, only when the node has none)",
        n == 0 ? std::string("no pageOut snapshot") : DescribeCalls(want) + " last",
        DescribeCalls(calls)};
  }
  return CheckAttachCalls(calls.first(head), "Close");
}

LoggedCache::LoggedCache(LayerCache* inner, int32_t index, std::vector<CacheCall>* log)
    : inner_(inner), index_(index), log_(log) {
  KV_CHECK(inner_ != nullptr && log_ != nullptr, "a logged cache wraps a cache and a log");
}

void LoggedCache::Free() {
  inner_->Free();
  log_->push_back(CacheCall::Free(index_));
}

bool LoggedCache::Restore(const CacheSnapshot* snap, int64_t target) {
  // Recorded before the call: the snapshot's range is read while it is surely alive.
  CacheCall call = CacheCall::Restore(index_, snap, target, false);
  call.ok = inner_->Restore(snap, target);
  log_->push_back(call);
  return call.ok;
}

SnapshotPtr LoggedCache::Snapshot(int64_t from) {
  log_->push_back(CacheCall::Snapshot(index_, inner_->kind(), from));
  return inner_->Snapshot(from);
}

std::pair<SnapshotPtr, SnapshotPtr> LoggedCache::Split(SnapshotPtr snap, int64_t at) {
  const CacheKind kind = inner_->kind();
  std::pair<SnapshotPtr, SnapshotPtr> halves = inner_->Split(std::move(snap), at);
  const CacheSnapshot* tail = halves.second.get();
  log_->push_back(CacheCall::Split(index_, kind, at, tail != nullptr ? tail->from() : -1,
                                   tail != nullptr ? tail->to() : -1));
  return halves;
}

}  // namespace kvtwin::sim
