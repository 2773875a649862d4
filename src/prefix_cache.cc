// PrefixCache (spec §3.4), v1: λ = 0 (a key is the token id), no media, owned snapshots
// (so the trie's byte counter is exact at all times and there are no materialize hooks).
//
// Decisions where the spec leaves room (each also noted at its function):
// * free-all in alignment resets the active path to [root] (spec §8 quirk 1);
// * the clock advances once per spec "now": switch landing, each attached capture node,
//   close frontier; the root starts at tick 0;
// * a pending branch point is sent to the caches only by SchedulePrefillSnapshots; without
//   it Attach still walks the trie to the point (a split) but has no captures to install;
// * a KV capture that starts after its node's edge (the edge's head was evicted between
//   Begin and Attach) is replaced by a slice of the live cache, which holds that edge.
#include "src/prefix_cache.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "src/core/check.h"
#include "src/kv_cache.h"
#include "src/recurrent_cache.h"
#include "src/rotating_cache.h"

namespace kvtwin {
namespace {

// λ = 0: key[i] = effective token i, read as uint32 like Go's effective tokens.
void AppendKeys(std::span<const int32_t> tokens, std::vector<TrieKey>& keys) {
  for (const int32_t t : tokens) keys.push_back(TrieKey{static_cast<uint32_t>(t)});
}

// An owned copy of a snapshot. PrefixTrie can replace a node's whole set but cannot hand
// the set out, so adding a capture beside a snapshot the node keeps (spec
// attachCapturedSnapshots: "start from a copy of the node's current snapshots") re-installs
// a copy of the kept one. Owned snapshots never change, so the copy is indistinguishable.
SnapshotPtr CopySnapshot(const CacheSnapshot& s) {
  if (const auto* kv = dynamic_cast<const KvSnapshot*>(&s)) {
    return KvSnapshot::Make(kv->from(), kv->to(), {kv->k()}, {kv->v()});
  }
  if (const auto* rot = dynamic_cast<const RotatingSnapshot*>(&s)) {
    return std::make_unique<RotatingSnapshot>(rot->from(), rot->to(), rot->idx(), rot->k(),
                                              rot->v());
  }
  const auto* rec = dynamic_cast<const RecurrentSnapshot*>(&s);
  KV_CHECK(rec != nullptr, std::string("cannot copy a ") + CacheKindName(s.kind()) + " snapshot");
  return std::make_unique<RecurrentSnapshot>(rec->offset(), rec->conv(), rec->delta());
}

// Whether `a` is evicted before `b`: older, then deeper, then larger (spec §3.4).
bool EvictsBefore(const TrieNode& a, const TrieNode& b) {
  if (a.last_used() != b.last_used()) return a.last_used() < b.last_used();
  if (a.end_offset() != b.end_offset()) return a.end_offset() > b.end_offset();
  return a.SnapshotBytes() > b.SnapshotBytes();
}

}  // namespace

PrefixCache::PrefixCache(std::vector<LayerCache*> caches, PrefixCacheOptions options)
    : caches_(std::move(caches)), options_(options), trie_(caches_, clock_.Now()) {
  KV_CHECK(std::any_of(caches_.begin(), caches_.end(), [](LayerCache* c) { return c != nullptr; }),
           "PrefixCache needs at least one stateful cache");
  for (LayerCache* c : caches_) {
    KV_CHECK(c == nullptr || !c->ScheduleActive(), "PrefixCache given a cache mid-schedule");
  }
  KV_CHECK(options_.max_paged_out_bytes >= 0, "PrefixCache given a negative byte budget");
  active_path_ = {trie_.root()};
}

void PrefixCache::set_max_paged_out_bytes(int64_t bytes) {
  KV_CHECK(bytes >= 0, "PrefixCache given a negative byte budget");
  options_.max_paged_out_bytes = bytes;
}

Result<BeginReport> PrefixCache::Begin(std::span<const int32_t> inputs) {
  if (open_) return FailedPrecondition("Begin while a session is open");
  if (inputs.empty()) return InvalidArgument("Begin with an empty prompt");
  for (LayerCache* c : caches_) {
    // Attach and Close drain every schedule the manager prepared.
    KV_CHECK(c == nullptr || !c->ScheduleActive(), "a cache holds a schedule between sessions");
  }
  std::vector<TrieKey> keys;
  AppendKeys(inputs, keys);
  PrefixTrie::Match match = trie_.FindBestMatch(trie_.root(), keys);
  const int64_t original_matched = match.matched;
  const int64_t total = static_cast<int64_t>(inputs.size());
  if (match.matched == total) {
    // Hold-back: the last prompt token is always re-evaluated to seed generation.
    match = trie_.FindBestMatch(trie_.root(), std::span(keys).first(keys.size() - 1));
  }
  BeginReport report;
  report.free_all = SwitchToPath(std::move(match.path), match.matched);
  const int64_t prefix = AlignedOffset("after the switch");
  KV_CHECK(prefix <= match.matched && prefix < total, "switch landed at " + std::to_string(prefix) +
                                                          " beyond the match " +
                                                          std::to_string(match.matched));

  open_ = true;
  scheduled_ = attached_ = false;
  cached_ = prefix;
  inputs_.assign(inputs.begin(), inputs.end());
  outputs_.clear();
  // Attach and Close (EndSession) drain the pending captures; no other path ends a session.
  KV_CHECK(pending_.empty(), "a session began with pending captures");
  // Branch point: a later prompt diverging here can restore instead of re-evaluating.
  if (prefix < match.matched) pending_.push_back({match.matched, false});

  report.total = total;
  report.matched = original_matched;
  report.cached = prefix;
  report.left = total - prefix;
  return report;
}

bool PrefixCache::SwitchToPath(std::vector<TrieNode*> path, int64_t matched) {
  KV_CHECK(!path.empty() && path.front() == trie_.root(), "switch path must start at the root");
  size_t common = 0;
  while (common < active_path_.size() && common < path.size() &&
         active_path_[common] == path[common]) {
    ++common;
  }
  const int64_t ancestor = common > 0 ? active_path_[common - 1]->end_offset() : 0;
  const int64_t rewind_target = std::min(ancestor, matched);
  for (LayerCache* c : caches_) {
    if (c != nullptr && !c->Restore(nullptr, rewind_target)) c->Free();
  }
  PageIn(path, matched);

  active_path_ = std::move(path);
  const int64_t min_off = MinOffset();
  bool free_all = false;
  for (LayerCache* c : caches_) {
    if (c == nullptr || c->Offset() == min_off || c->Restore(nullptr, min_off)) continue;
    for (LayerCache* f : caches_) {
      if (f != nullptr) f->Free();
    }
    free_all = true;
    break;
  }
  if (free_all) {
    // Go keeps a path trimmed at the stale offset; with every cache empty only the root
    // is true (spec §8 quirk 1).
    active_path_ = {trie_.root()};
  } else {
    while (active_path_.back()->end_offset() > min_off) active_path_.pop_back();
  }
  // Only the landing node is used now; traversed nodes keep their age.
  active_path_.back()->set_last_used(clock_.Advance());
  EnforceEvictionPolicy();
  return free_all;
}

void PrefixCache::PageIn(const std::vector<TrieNode*>& path, int64_t matched) {
  for (TrieNode* node : path) {
    if (!node->HasSnapshots()) continue;
    const int64_t target = std::min(node->end_offset(), matched);
    for (size_t j = 0; j < caches_.size(); ++j) {
      LayerCache* c = caches_[j];
      if (c == nullptr || node->snapshot(j) == nullptr || c->Offset() >= target) continue;
      // Greedy: the first refusal ends the whole page-in; alignment then levels the caches.
      if (!c->Restore(node->snapshot(j), target)) return;
    }
  }
}

Status PrefixCache::SchedulePrefillSnapshots(std::span<const int64_t> requested) {
  if (!open_) return FailedPrecondition("SchedulePrefillSnapshots without a session");
  if (scheduled_ || attached_) {
    return FailedPrecondition("SchedulePrefillSnapshots twice or after the attach");
  }
  for (LayerCache* c : caches_) {
    if (c != nullptr && c->Offset() != cached_) {
      return FailedPrecondition("SchedulePrefillSnapshots after the prefill started");
    }
  }
  scheduled_ = true;
  const int64_t base = cached_;
  const int64_t len = static_cast<int64_t>(inputs_.size());
  for (const int64_t r : requested) {
    const int64_t o = r;  // λ = 0: r tokens determine the state at r
    if (o <= base || o > len) continue;
    auto it = std::find_if(pending_.begin(), pending_.end(),
                           [o](const Pending& p) { return p.offset == o; });
    if (it != pending_.end()) {
      it->user = true;
    } else {
      pending_.push_back({o, true});
    }
  }
  std::sort(pending_.begin(), pending_.end(),
            [](const Pending& a, const Pending& b) { return a.offset < b.offset; });
  if (pending_.empty()) return Status::Ok();
  std::vector<int64_t> offsets;
  for (const Pending& p : pending_) offsets.push_back(p.offset);
  for (LayerCache* c : caches_) {
    if (c == nullptr) continue;
    const Status s = c->PrepareSnapshots(offsets);
    // Every offset is above the aligned offset and no schedule is left over.
    KV_CHECK(s.ok(), "PrepareSnapshots refused the manager's schedule: " + s.ToString());
  }
  return Status::Ok();
}

Status PrefixCache::AttachPrefillSnapshots() {
  if (!open_) return FailedPrecondition("AttachPrefillSnapshots without a session");
  attached_ = true;
  if (pending_.empty()) return Status::Ok();
  const std::vector<Pending> pending = std::exchange(pending_, {});
  std::vector<std::vector<SnapshotPtr>> rows(pending.size());
  for (std::vector<SnapshotPtr>& row : rows) row.resize(caches_.size());
  for (size_t j = 0; j < caches_.size(); ++j) {
    if (caches_[j] == nullptr) continue;
    std::vector<SnapshotPtr> taken = caches_[j]->TakeSnapshots();
    // Unscheduled (no SchedulePrefillSnapshots): nothing was sent, nothing comes back.
    KV_CHECK(taken.size() == (scheduled_ ? pending.size() : 0),
             "cache " + std::to_string(j) + " returned " + std::to_string(taken.size()) +
                 " captures for " + std::to_string(pending.size()) + " pending offsets");
    for (size_t i = 0; i < taken.size(); ++i) rows[i][j] = std::move(taken[i]);
  }
  const int64_t reached = AlignedOffset("at attach");
  const std::vector<TrieKey> stored = StoredKeys();
  for (size_t i = 0; i < pending.size(); ++i) {
    const Pending& p = pending[i];
    // Never crossed (the seed token is left for decode): its row closes here.
    if (p.offset > reached) continue;
    KV_CHECK(p.offset <= static_cast<int64_t>(stored.size()), "pending offset beyond the keys");
    TrieNode* f = active_path_.back();
    KV_CHECK(f->end_offset() <= p.offset, "frontier passed a pending offset");
    if (f->end_offset() < p.offset) {
      f = AdvancePath(f, std::span(stored).subspan(f->end_offset(), p.offset - f->end_offset()),
                      p.offset);
    }
    if (p.user) f->set_user(true);
    AttachCaptured(f, std::move(rows[i]));
    CompactPath();
  }
  EnforceEvictionPolicy();
  return Status::Ok();
}

void PrefixCache::AttachCaptured(TrieNode* node, std::vector<SnapshotPtr> row) {
  std::vector<SnapshotPtr> set(caches_.size());
  bool added = false;
  for (size_t i = 0; i < caches_.size(); ++i) {
    // An existing snapshot wins: the capture closes at the end of this scope.
    if (caches_[i] == nullptr || row[i] == nullptr || node->snapshot(i) != nullptr) continue;
    // Clips a KV capture that began before the node's edge; whole states pass unchanged.
    SnapshotPtr tail = caches_[i]->Split(std::move(row[i]), node->start_offset()).second;
    KV_CHECK(tail != nullptr && tail->to() == node->end_offset(),
             "capture does not end at its node's end " + std::to_string(node->end_offset()));
    if (tail->kind() == CacheKind::kFullKv && tail->from() > node->start_offset()) {
      // The edge's head was evicted from the trie after Begin, so the node starts below
      // the capture's base. The live cache still holds the whole edge (it holds every
      // stored key below its offset): slice it instead of installing a short edge.
      tail =
          caches_[i]->Split(caches_[i]->Snapshot(node->start_offset()), node->end_offset()).first;
    }
    set[i] = std::move(tail);
    added = true;
  }
  if (added) {
    for (size_t i = 0; i < caches_.size(); ++i) {
      if (set[i] == nullptr && node->snapshot(i) != nullptr) {
        set[i] = CopySnapshot(*node->snapshot(i));
      }
    }
    trie_.SetSnapshots(node, std::move(set));
  }
  node->set_last_used(clock_.Advance());
}

TrieNode* PrefixCache::AdvancePath(TrieNode* from, std::span<const TrieKey> keys,
                                   int64_t end_offset) {
  PrefixTrie::Match m = trie_.FindBestMatch(from, keys);
  if (m.path.size() > 1) {
    TrieNode* last = m.path.back();
    const int64_t in_edge = from->end_offset() + m.matched - last->start_offset();
    if (in_edge > 0 && in_edge < static_cast<int64_t>(last->edge().size())) {
      m.path.back() = trie_.SplitNode(last, in_edge);
    }
  }
  active_path_.insert(active_path_.end(), m.path.begin() + 1, m.path.end());
  if (m.matched < static_cast<int64_t>(keys.size())) {
    active_path_.push_back(
        trie_.AppendChild(active_path_.back(), keys.subspan(m.matched), end_offset));
  }
  KV_CHECK(active_path_.back()->end_offset() == end_offset,
           "advance ended at " + std::to_string(active_path_.back()->end_offset()) + " not " +
               std::to_string(end_offset));
  return active_path_.back();
}

void PrefixCache::CompactPath() {
  // Both callers have just advanced the path past its frontier, so it holds a node below
  // the root.
  KV_CHECK(active_path_.size() >= 2, "CompactPath on a path of the root alone");
  TrieNode* parent = active_path_[active_path_.size() - 2];
  KV_CHECK(active_path_.back()->parent() == parent, "active path is not a parent chain");
  // A user parent is a restore point the caller asked for; only plain segments fold.
  if (parent->is_root() || parent->user() || parent->num_children() != 1) return;
  trie_.MergeWithChild(parent);
  active_path_.pop_back();
}

void PrefixCache::PageOut(TrieNode* node) {
  if (node->HasSnapshots()) return;
  std::vector<SnapshotPtr> set(caches_.size());
  for (size_t i = 0; i < caches_.size(); ++i) {
    if (caches_[i] != nullptr) set[i] = caches_[i]->Snapshot(node->start_offset());
  }
  trie_.SetSnapshots(node, std::move(set));
  EnforceEvictionPolicy();
}

Status PrefixCache::AddOutputs(std::span<const int32_t> tokens) {
  if (!open_) return FailedPrecondition("AddOutputs without a session");
  outputs_.insert(outputs_.end(), tokens.begin(), tokens.end());
  return Status::Ok();
}

Status PrefixCache::Close() {
  if (!open_) return FailedPrecondition("Close without a session");
  // Keeps what a cancelled prefill crossed and drains every cache's schedule.
  const Status attached = AttachPrefillSnapshots();
  KV_CHECK(attached.ok(), attached.ToString());
  const int64_t offset = AlignedOffset("at close");
  if (offset > 0) {
    const std::vector<TrieKey> stored = StoredKeys();
    KV_CHECK(offset <= static_cast<int64_t>(stored.size()),
             "caches at " + std::to_string(offset) + " ran ahead of " +
                 std::to_string(stored.size()) + " stored keys");
    TrieNode* f = active_path_.back();
    KV_CHECK(f->end_offset() <= offset, "frontier beyond the caches at close");
    if (offset > f->end_offset()) {
      TrieNode* n = AdvancePath(
          f, std::span(stored).subspan(f->end_offset(), offset - f->end_offset()), offset);
      PageOut(n);
      CompactPath();
    }
    active_path_.back()->set_last_used(clock_.Advance());
  }
  EndSession();
  return Status::Ok();
}

void PrefixCache::EndSession() {
  open_ = scheduled_ = attached_ = false;
  inputs_.clear();
  outputs_.clear();
  pending_.clear();
}

void PrefixCache::EnforceEvictionPolicy() {
  if (policy_hook_) policy_hook_();
  if (trie_.paged_out_bytes() <= options_.max_paged_out_bytes) return;
  // Read once for the whole pass (spec); eviction never changes the active path anyway.
  // Membership only: pointer order never reaches the choice, which follows the walk.
  const std::set<const TrieNode*> active(active_path_.begin(), active_path_.end());
  if (eviction_hook_) eviction_hook_(false);
  while (trie_.paged_out_bytes() > options_.max_paged_out_bytes) {
    TrieNode* victim = PickVictim(active);
    if (victim == nullptr) break;  // may stay over budget
    const int64_t nodes = trie_.num_nodes();
    if (victim->num_children() == 0) {
      trie_.RemoveNode(victim);
    } else {
      // Its own restore point goes; KV data survives by concatenation into the child.
      trie_.MergeWithChild(victim);
    }
    // Either way one node goes: a pass that removed none would pick the same victim forever.
    KV_CHECK(trie_.num_nodes() == nodes - 1, "an eviction step did not remove its victim");
  }
  if (eviction_hook_) eviction_hook_(true);
}

TrieNode* PrefixCache::PickVictim(const std::set<const TrieNode*>& active) const {
  TrieNode* best = nullptr;
  trie_.Walk([&](TrieNode* n) {
    if (n->is_root() || n->num_children() > 1 || active.count(n) > 0) return;
    // Strictly better only, so ties keep the first node in DFS pre-order.
    if (best == nullptr || EvictsBefore(*n, *best)) best = n;
  });
  return best;
}

int64_t PrefixCache::MinOffset() const {
  int64_t min_off = -1;
  for (const LayerCache* c : caches_) {
    if (c != nullptr && (min_off < 0 || c->Offset() < min_off)) min_off = c->Offset();
  }
  return min_off;
}

int64_t PrefixCache::AlignedOffset(const char* where) const {
  const int64_t min_off = MinOffset();
  for (size_t i = 0; i < caches_.size(); ++i) {
    KV_CHECK(caches_[i] == nullptr || caches_[i]->Offset() == min_off,
             std::string("caches disagree ") + where + ": cache " + std::to_string(i) + " at " +
                 std::to_string(caches_[i]->Offset()) + ", minimum " + std::to_string(min_off));
  }
  return min_off;
}

std::vector<TrieKey> PrefixCache::StoredKeys() const {
  std::vector<TrieKey> keys;
  keys.reserve(inputs_.size() + outputs_.size());
  AppendKeys(inputs_, keys);
  AppendKeys(outputs_, keys);  // generated tokens are never media
  return keys;
}

}  // namespace kvtwin
