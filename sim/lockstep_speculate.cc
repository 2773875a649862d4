// LockstepDriver::Speculate: one speculative forward over the whole stack through the
// wrappers of src/speculation.h (or two, as SpeculationSplit says), then (unless isolated)
// a commit of current plus the accepted drafts. Checked on the way: the attention history
// each wrapper hands a forward (rows, order and visible positions equal to an ordinary
// forward of the same tokens), each wrapper's own offset and its answers to the rest of
// the cache contract (spec §2.7); after the commit Apply checks every live layer against
// the reference, which commits through RefCache::CommitSpeculation. An abandoned op
// (Op::abandon_after) forwards through the first layers only and drops the transaction,
// so what is checked is its destructor's rollback.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "sim/lockstep.h"
#include "src/core/check.h"
#include "src/speculation.h"

namespace kvtwin::sim {
namespace {

// The §2.7 answers every wrapper gives, whatever it wraps; `offset` is where it must be.
// `offsets` is scratch for the refused schedule.
Check CheckWrapperContract(LayerCache& w, int64_t offset, std::vector<int64_t>& offsets) {
  auto expect = [](bool ok, const char* what, const char* want, const char* got) -> Check {
    if (ok) return std::nullopt;
    return Mismatch{fmt::format("speculation wrapper {}", what), want, got};
  };
  if (w.Offset() != offset) {
    return Mismatch{"speculation wrapper offset", std::to_string(offset),
                    std::to_string(w.Offset())};
  }
  if (Check c = expect(w.Snapshot(0) == nullptr, "Snapshot", "null", "a snapshot")) return c;
  if (Check c = expect(!w.Restore(nullptr, offset), "Restore", "false", "true")) return c;
  if (Check c = expect(w.Merge(nullptr, nullptr) == nullptr, "Merge", "null", "a snapshot")) {
    return c;
  }
  auto [parent, child] = w.Split(nullptr, offset);
  if (Check c = expect(parent == nullptr && child == nullptr, "Split of null", "(null, null)",
                       "a snapshot")) {
    return c;
  }
  // Every list is refused, whatever it holds: an empty one (the rollback points of a step
  // without drafts), one ahead of the offset, and one at it.
  for (const int64_t size : {0, 1, 2}) {
    offsets.clear();
    for (int64_t i = 0; i < size; ++i) offsets.push_back(offset + 1 - i);
    std::sort(offsets.begin(), offsets.end());
    if (Check c = expect(!w.PrepareSnapshots(offsets).ok(),
                         size == 0 ? "PrepareSnapshots of an empty list" : "PrepareSnapshots",
                         "FailedPrecondition", "ok")) {
      return c;
    }
  }
  if (Check c = expect(w.TakeSnapshots().empty() && !w.ScheduleActive(), "capture schedule", "none",
                       "active")) {
    return c;
  }
  w.Free();
  if (w.Offset() != offset) {
    return Mismatch{"speculation wrapper offset after Free (a no-op)", std::to_string(offset),
                    std::to_string(w.Offset())};
  }
  return std::nullopt;
}

// The same answers for a real snapshot of the wrapped kind, one the driver holds (with
// null alone, (snap, null) and (null, snap) look alike): Restore refuses it, and Split
// hands it back whole as the child, as a kind that cannot split does. It goes back to
// `held` whatever the answer, so the run goes on as before.
Check CheckWrapperGivenSnapshot(LayerCache& w, SnapshotPtr& held, int64_t offset) {
  const CacheSnapshot* raw = held.get();
  if (w.Restore(raw, offset)) {
    return Mismatch{"speculation wrapper Restore of a held snapshot", "false", "true"};
  }
  auto [parent, child] = w.Split(std::move(held), offset);
  const bool ok = parent == nullptr && child.get() == raw;
  const std::string got = fmt::format("({}, {})", parent == nullptr ? "null" : "a snapshot",
                                      child == nullptr ? "null" : "a snapshot");
  held = parent != nullptr ? std::move(parent) : std::move(child);
  if (ok) return std::nullopt;
  return Mismatch{"speculation wrapper Split of a held snapshot", "(null, the snapshot)", got};
}

}  // namespace

int64_t SpeculationSplit(const Op& op) {
  const auto n = static_cast<int64_t>(op.tokens.size());
  // The accepted count as the commit clamps it (a trace may carry any value).
  const int64_t v = std::clamp<int64_t>(op.value, 0, n);
  if (n < 2 || (v + n) % 2 == 0) return 0;
  return 1 + (3 * v + n) % (n - 1);
}

Check LockstepDriver::Speculate(const Op& op, int32_t* layer_index) {
  std::vector<LayerCache*>& live = spec_live_;
  live.clear();
  for (Layer& l : layers_) live.push_back(l.cache.get());
  auto begin = [&op](std::span<LayerCache* const> list) {
    return op.isolated ? BeginIsolatedSpeculation(list) : BeginSpeculation(list);
  };
  // Spec §2.7: a layer listed twice is InvalidArgument (two wrappers would commit it twice).
  // The repeat goes at the end, naming a layer that is not the last, so a check that looks
  // only at neighbours lets it through.
  if (live.size() >= 2) {
    const auto k = static_cast<size_t>(op.tokens.size()) % (live.size() - 1);
    live.push_back(live[k]);
    const Result<Speculation> twice = begin(live);
    live.pop_back();
    if (twice.ok() || twice.status().code() != StatusCode::kInvalidArgument) {
      *layer_index = static_cast<int32_t>(k);
      return Mismatch{fmt::format("BeginSpeculation with layer {} listed again at the end", k),
                      "InvalidArgument", twice.ok() ? "ok" : twice.status().ToString()};
    }
  }
  Result<Speculation> spec = begin(live);
  // Every kind a stack can hold is wrappable; a refusal here is a production bug.
  if (!spec.ok()) {
    *layer_index = 0;
    return Mismatch{"BeginSpeculation outcome", "ok", spec.status().ToString()};
  }
  // forwards[i] is layer i's tokens (its buffer kept from earlier speculations).
  std::vector<model::TokenLog>& forwards = spec_forwards_;
  if (forwards.size() < layers_.size()) forwards.resize(layers_.size());
  const bool abandoned = op.abandon_after >= 0;
  // One forward, or two through the same wrappers: a wrapper must carry what it
  // accumulated from one forward into the next. Forward k covers tokens [cuts[k], cuts[k+1]).
  const int64_t split = SpeculationSplit(op);
  const auto n = static_cast<int64_t>(op.tokens.size());
  const std::array<int64_t, 3> cut_at{0, split > 0 ? split : n, n};
  const std::span<const int64_t> cuts(cut_at.data(), split > 0 ? 3 : 2);
  const int32_t forwarded = abandoned ? op.abandon_after : num_layers();
  for (int32_t i = 0; i < forwarded; ++i) {
    Layer& layer = layers_[static_cast<size_t>(i)];
    *layer_index = i;
    TokensInto(layer, op, forwards[static_cast<size_t>(i)]);
    const model::TokenLog& tokens = forwards[static_cast<size_t>(i)];
    LayerCache& w = spec->layer(static_cast<size_t>(i));
    // A wrapper stands in for its layer wherever a model dispatches on the kind (here too).
    if (w.kind() != layer.cache->kind()) {
      return Mismatch{"speculation wrapper kind (its layer's)", CacheKindName(layer.cache->kind()),
                      CacheKindName(w.kind())};
    }
    const bool attention = w.kind() != CacheKind::kRecurrent;
    // A draft model reads the target through the wrapper's View, before and after.
    auto view = [&w] { return static_cast<const AttentionCache&>(w).View(); };
    if (attention) {
      if (Check c = layer.oracle->CheckView(view(), layer.ref.log())) return c;
    }
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const int64_t from = cuts[k], to = cuts[k + 1];
      const std::span<const model::Token> chunk =
          std::span(tokens).subspan(static_cast<size_t>(from), static_cast<size_t>(to - from));
      const History history = Forward(w, op, layer, i, chunk, from);
      model::TokenLog& through = through_;  // scratch: the log plus the forwards so far
      through.assign(layer.ref.log().begin(), layer.ref.log().end());
      const auto start = static_cast<int64_t>(through.size()) + from;
      through.insert(through.end(), tokens.begin(), tokens.begin() + to);
      if (!attention) {
        if (Check c = layer.oracle->CheckRecurrentOutputs(
                scratch_.kernels.conv.out, scratch_.kernels.scan.y, through, start, to - from)) {
          c->what = fmt::format("speculative forward [{}, {}): {}", from, to, c->what);
          return c;
        }
        continue;
      }
      if (Check c = layer.oracle->CheckHistory(history, through, start, to - from, op, 0,
                                               HistorySource::kSpeculation)) {
        c->what = fmt::format("speculative{} {}",
                              split > 0 ? fmt::format(" forward [{}, {})", from, to) : "", c->what);
        return c;
      }
      // The draft model's View must leave the forward's History as it was: it is valid until
      // the wrapper is next written (src/cache.h), and View is read-only.
      const uint64_t held = HashHistory(history);
      if (Check c = layer.oracle->CheckView(view(), through)) {
        c->what =
            fmt::format("after the {}forward, {}", split > 0 && from > 0 ? "second " : "", c->what);
        return c;
      }
      if (HashHistory(history) != held) {
        return Mismatch{fmt::format("the speculative forward [{}, {})'s History after the "
                                    "wrapper's View() (valid until the wrapper is next written)",
                                    from, to),
                        fmt::format("rows hash {:016x}", held),
                        fmt::format("rows hash {:016x}", HashHistory(history))};
      }
    }
    const int64_t end = layer.ref.Offset() + static_cast<int64_t>(tokens.size());
    if (Check c = CheckWrapperContract(w, end, spec_offsets_)) return c;
    for (PoolEntry& e : layer.pool) {
      if (e.prod == nullptr) continue;
      if (Check c = CheckWrapperGivenSnapshot(w, e.prod, end)) return c;
      break;
    }
  }
  if (op.isolated) return std::nullopt;
  if (abandoned) {
    // Dropped without a commit: leaving this scope destroys the transaction, whose rollback
    // must leave every layer as a commit of nothing would (a KV layer keeps the rewound rows
    // reachable); layers the forward never reached are untouched. Apply checks them all.
    for (int32_t i = 0; i < forwarded; ++i) {
      layers_[static_cast<size_t>(i)].ref.CommitSpeculation(forwards[static_cast<size_t>(i)], 0,
                                                            split);
    }
    return std::nullopt;
  }
  // Current plus the accepted drafts; the largest count stays itself (still "everything").
  const int64_t keep = op.value == std::numeric_limits<int64_t>::max() ? op.value : op.value + 1;
  spec->Commit(keep);
  for (int32_t i = 0; i < num_layers(); ++i) {
    layers_[static_cast<size_t>(i)].ref.CommitSpeculation(forwards[static_cast<size_t>(i)], keep,
                                                          split);
  }
  return std::nullopt;
}

}  // namespace kvtwin::sim
