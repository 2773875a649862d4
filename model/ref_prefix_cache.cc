// The reference prefix-sharing manager: spec §3.2 (trie primitives) and §3.4 (session
// lifecycle) transcribed step by step over RefCache and RefNode, at λ = 0 without media
// (key = token id). Eviction is the pass of ref_eviction.cc at each of the spec's policy
// points, over the reference's own snapshot sizes (ChargeRefSlots).
//
// Decisions the spec leaves to the C++ side (§8 quirk 1, §3.4 switchToPath step 5): when
// the align step's rewind fails, every cache is freed and the active path is reset to
// [root], so the prefix is 0 and the landing tick goes to the root. A KV capture that
// begins after its node's start (eviction removed the edge's head after Begin) is replaced
// by a slice of the live cache over the whole edge (AttachCaptured). A node's `snaps` stays
// empty until something is installed on it, so "never held a snapshot" is visible.
#include "model/ref_prefix_cache.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "model/ref_eviction.h"
#include "src/core/check.h"

namespace kvtwin::model {
namespace {

using Caches = std::vector<std::optional<RefCache>>;
using Keys = std::vector<int32_t>;

int64_t MinOffset(const Caches& caches) {
  int64_t min = std::numeric_limits<int64_t>::max();
  for (const auto& c : caches) {
    if (c) min = std::min(min, c->Offset());
  }
  return min;
}

Keys KeysOf(std::span<const Token> log) {
  Keys keys;
  for (const Token& t : log) keys.push_back(t.id);
  return keys;
}

// Stored keys (§3.4): prompt keys followed by the generated ones.
Keys StoredKeys(const TokenLog& inputs, const TokenLog& outputs) {
  Keys keys = KeysOf(inputs);
  for (const Token& t : outputs) keys.push_back(t.id);
  return keys;
}

Keys SliceKeys(const Keys& keys, int64_t begin, int64_t end) {
  KV_CHECK(0 <= begin && begin <= end && end <= static_cast<int64_t>(keys.size()),
           "key slice out of range");
  return Keys(keys.begin() + begin, keys.begin() + end);
}

RefSnap SlotOf(const RefNode& node, size_t i) {
  return i < node.snaps.size() ? node.snaps[i] : std::nullopt;
}

struct Match {
  std::vector<RefNode*> path;    // starts with the `from` node
  std::vector<size_t> position;  // path[d + 1] is path[d]->children[position[d]]
  int64_t matched = 0;
};

// findBestMatch (§3.2): prefer a fully matched edge, then the longer partial, then the
// earlier child; stop after a partial edge or when no child continues the keys.
Match FindBestMatch(RefNode* from, std::span<const int32_t> keys) {
  Match m{{from}, {}, 0};
  RefNode* node = from;
  size_t pos = 0;
  while (pos < keys.size()) {
    RefNode* best = nullptr;
    size_t best_len = 0, best_at = 0;
    KV_CHECK(node->child_keys.size() == node->children.size(), "one cached key per child");
    for (size_t c = NextChildWithKey(*node, keys[pos], 0); c < node->child_keys.size();
         c = NextChildWithKey(*node, keys[pos], c + 1)) {
      RefNode* child = node->children[c].get();
      size_t j = 0;
      while (j < child->edge.size() && pos + j < keys.size() && child->edge[j] == keys[pos + j]) {
        ++j;
      }
      const bool full = j == child->edge.size();
      const bool best_full = best != nullptr && best_len == best->edge.size();
      if (best == nullptr || (full && !best_full) || (full == best_full && j > best_len)) {
        best = child;
        best_len = j;
        best_at = c;
      }
    }
    if (best == nullptr) break;
    m.path.push_back(best);
    m.position.push_back(best_at);
    pos += best_len;
    node = best;
    if (best_len < best->edge.size()) break;
  }
  m.matched = static_cast<int64_t>(pos);
  return m;
}

// splitNode (§3.2): a new parent P takes the first `at` keys and the head halves of the
// snapshots and replaces `node` among its parent's children; `node` keeps the rest.
RefNode* SplitNode(RefNode* node, int64_t at, const Caches& caches) {
  KV_CHECK(!node->is_root() && 0 < at && at < static_cast<int64_t>(node->edge.size()),
           "split point must fall strictly inside the edge");
  auto p = std::make_unique<RefNode>();
  p->edge.assign(node->edge.begin(), node->edge.begin() + at);
  p->end = node->start() + at;
  p->last_used = node->last_used;
  p->parent = node->parent;
  node->edge.erase(node->edge.begin(), node->edge.begin() + at);
  if (node->HasSnapshots()) {
    KV_CHECK(node->snaps.size() == caches.size(), "one slot per cache");
    std::vector<RefSnap> heads(caches.size());
    for (size_t i = 0; i < caches.size(); ++i) {
      if (!caches[i]) continue;
      auto [head, tail] = caches[i]->Split(std::move(node->snaps[i]), p->end);
      heads[i] = std::move(head);
      node->snaps[i] = std::move(tail);
    }
    p->snaps = std::move(heads);
    p->bytes.assign(caches.size(), 0);
  }
  RefNode* parent = p.get();
  std::unique_ptr<RefNode> owned = ReplaceRefChild(node, std::move(p));
  AdoptRefChild(*parent, std::move(owned));
  return parent;
}

// mergeWithChild (§3.2): `node` absorbs its only child; the child's flag wins, the newer
// tick wins, and the snapshots go through the cache's own Merge.
void MergeWithChild(RefNode* node, const Caches& caches) {
  KV_CHECK(node->children.size() == 1, "merge needs exactly one child");
  std::unique_ptr<RefNode> child = std::move(node->children.front());
  if (node->HasSnapshots() || child->HasSnapshots()) {
    std::vector<RefSnap> merged(caches.size());
    for (size_t i = 0; i < caches.size(); ++i) {
      if (caches[i]) merged[i] = caches[i]->Merge(SlotOf(*node, i), SlotOf(*child, i));
    }
    node->snaps = std::move(merged);
    node->bytes.assign(caches.size(), 0);
  }
  node->edge.insert(node->edge.end(), child->edge.begin(), child->edge.end());
  node->end = child->end;
  node->user = child->user;
  node->last_used = std::max(node->last_used, child->last_used);
  TakeRefChildren(*node, *child);
}

// advancePath (§3.4): follow `keys` below F, split a partially matched last node, append
// the unmatched rest as a new child, and extend the active path to the result.
RefNode* AdvancePath(std::vector<RefNode*>& active, RefNode* from, const Keys& keys, int64_t end,
                     const Caches& caches) {
  Match m = FindBestMatch(from, keys);
  RefNode* last = m.path.back();
  if (last != from) {
    const int64_t cut = from->end + m.matched - last->start();
    if (0 < cut && cut < static_cast<int64_t>(last->edge.size())) {
      last = SplitNode(last, cut, caches);
      m.path.back() = last;
    }
  }
  active.insert(active.end(), m.path.begin() + 1, m.path.end());
  if (m.matched < static_cast<int64_t>(keys.size())) {
    last = AppendRefChild(last, SliceKeys(keys, m.matched, static_cast<int64_t>(keys.size())), end);
    active.push_back(last);
  }
  KV_CHECK(last->end == end, "advancePath must land exactly on the requested offset");
  return last;
}

// compactPath (§3.4): one merge of the last node's parent when it is an ordinary
// (non-root, non-user) node with a single child.
void CompactPath(std::vector<RefNode*>& active, const Caches& caches) {
  if (active.size() < 2) return;
  RefNode* parent = active.back()->parent;
  if (parent->is_root() || parent->user || parent->children.size() != 1) return;
  KV_CHECK(active[active.size() - 2] == parent, "the active path is a parent chain");
  MergeWithChild(parent, caches);
  active.pop_back();
}

// attachCapturedSnapshots (§3.4): an existing slot wins; otherwise the capture is clipped
// to the node's edge (the head before node.start is dropped). Refreshes the node. Counts
// into `kept_whole` the rotating and recurrent slots a node keeps beside an installed
// capture, which production re-installs as copies (a coverage count: seeded streams rarely
// build such a node).
void AttachCaptured(RefNode* node, std::vector<RefSnap> row, const Caches& caches, int64_t& clock,
                    int64_t& kept_whole) {
  std::vector<RefSnap> next = node->snaps;
  next.resize(caches.size());
  bool installed = false;
  for (size_t i = 0; i < caches.size(); ++i) {
    if (!caches[i] || !row[i] || next[i]) continue;
    next[i] = caches[i]->Split(std::move(row[i]), node->start()).second;
    if (next[i] && next[i]->kind == RefKind::kKv && next[i]->from > node->start()) {
      // The capture began after the node's start: the edge's head was evicted between
      // Begin and this attach, and the node now starts below the prefix the captures
      // began at. The literal clip would leave a KV slot short of its edge, against the
      // placement convention (spec §3.1: a KV slot covers exactly the node's edge); the
      // live cache holds every stored key below its offset, so the edge is sliced from it.
      next[i] = caches[i]->Split(caches[i]->Snapshot(node->start()), node->end).first;
    }
    installed = installed || next[i].has_value();
  }
  if (installed) {
    for (const RefSnap& kept : node->snaps) kept_whole += kept && kept->kind != RefKind::kKv;
    node->snaps = std::move(next);
    node->bytes.assign(caches.size(), 0);
  }
  node->last_used = ++clock;
}

// pageOut (§3.4): only a node without any snapshot takes one from the live caches.
// Returns whether it installed (the caller then runs the eviction policy, as pageOut does).
bool PageOut(RefNode* node, const Caches& caches) {
  if (node->HasSnapshots()) return false;
  node->snaps.assign(caches.size(), std::nullopt);
  for (size_t i = 0; i < caches.size(); ++i) {
    if (caches[i]) node->snaps[i] = caches[i]->Snapshot(node->start());
  }
  node->bytes.assign(caches.size(), 0);
  return true;
}

// switchToPath steps 1-2: rewind every cache to min(common ancestor end, matched); a
// cache that cannot rewind is freed.
void RewindToAncestor(Caches& caches, const std::vector<RefNode*>& active,
                      const std::vector<RefNode*>& path, int64_t matched) {
  size_t common = 0;
  while (common < active.size() && common < path.size() && active[common] == path[common]) {
    ++common;
  }
  const int64_t ancestor = common == 0 ? 0 : path[common - 1]->end;
  const int64_t target = std::min(ancestor, matched);
  for (auto& c : caches) {
    if (c && !c->Restore(nullptr, target)) c->Free();
  }
}

// switchToPath step 3: greedy page-in along the path; the first refusal ends it all.
void PageIn(Caches& caches, const std::vector<RefNode*>& path, int64_t matched) {
  for (const RefNode* node : path) {
    if (!node->HasSnapshots()) continue;
    const int64_t target = std::min(node->end, matched);
    for (size_t j = 0; j < caches.size(); ++j) {
      const RefSnapshot* slot =
          j < node->snaps.size() && node->snaps[j] ? &*node->snaps[j] : nullptr;
      if (!caches[j] || slot == nullptr || caches[j]->Offset() >= target) continue;
      if (!caches[j]->Restore(slot, target)) return;
    }
  }
}

// switchToPath step 4: rewind every cache to the minimum offset; if any rewind fails,
// free all caches. Returns whether the free-all fallback ran.
bool AlignOrFreeAll(Caches& caches) {
  const int64_t min = MinOffset(caches);
  for (auto& c : caches) {
    if (!c || c->Offset() == min || c->Restore(nullptr, min)) continue;
    for (auto& other : caches) {
      if (other) other->Free();
    }
    return true;
  }
  return false;
}

// switchToPath (§3.4). Returns whether the free-all fallback ran.
bool SwitchToPath(Caches& caches, std::vector<RefNode*>& active, RefNode* root,
                  const std::vector<RefNode*>& path, int64_t matched, int64_t& clock) {
  RewindToAncestor(caches, active, path, matched);
  PageIn(caches, path, matched);
  active = path;
  const bool free_all = AlignOrFreeAll(caches);
  if (free_all) {
    active = {root};  // §8 quirk 1: the caches are empty, so is the path
  } else {
    const int64_t min = MinOffset(caches);
    while (active.back()->end > min) active.pop_back();
  }
  // Only the landing node is refreshed; traversed nodes keep their age.
  active.back()->last_used = ++clock;
  return free_all;
}

}  // namespace

RefPrefixCache::RefPrefixCache(std::vector<std::optional<RefCache>> caches)
    : caches_(std::move(caches)), root_(std::make_unique<RefNode>()) {
  bool any = false;
  for (const auto& c : caches_) {
    if (!c) continue;
    any = true;
    KV_CHECK(!c->ScheduleActive(), "a manager cache starts without a capture schedule");
  }
  KV_CHECK(any, "the manager needs at least one non-null cache");
  active_path_ = {root_.get()};
}

RefBeginReport RefPrefixCache::Begin(std::span<const Token> inputs, bool enforce_policy) {
  KV_CHECK(!open_, "Begin while a session is open");
  KV_CHECK(!inputs.empty(), "Begin with an empty prompt");
  open_ = true;
  inputs_.assign(inputs.begin(), inputs.end());
  outputs_.clear();
  pending_.clear();
  const Keys keys = KeysOf(inputs);
  Match m = FindBestMatch(root_.get(), keys);
  const int64_t original_matched = m.matched;
  std::vector<size_t> positions = std::move(m.position);
  const int64_t total = static_cast<int64_t>(inputs.size());
  // Hold-back: at least one prompt token is always evaluated to seed generation.
  if (m.matched == total && m.matched > 0) {
    m = FindBestMatch(root_.get(), SliceKeys(keys, 0, total - 1));
  }
  const bool free_all = SwitchToPath(caches_, active_path_, root_.get(), m.path, m.matched, clock_);
  if (enforce_policy) EnforceEvictionPolicy();  // switchToPath step 7
  const int64_t prefix = MinOffset(caches_);
  // Branch point: lets a later prompt that diverges here restore this far.
  if (prefix < m.matched) pending_.push_back({m.matched, false});
  return RefBeginReport{total,          original_matched, prefix,
                        total - prefix, free_all,         std::move(positions)};
}

void RefPrefixCache::SchedulePrefillSnapshots(const std::vector<int64_t>& requested) {
  KV_CHECK(open_, "SchedulePrefillSnapshots without an open session");
  KV_CHECK(!scheduled_, "SchedulePrefillSnapshots called twice in one session");
  scheduled_ = true;
  const int64_t base = MinOffset(caches_);
  const int64_t len = static_cast<int64_t>(inputs_.size());
  for (int64_t o : requested) {  // λ = 0: o = r
    if (o <= base || o > len) continue;
    auto it = std::find_if(pending_.begin(), pending_.end(),
                           [&](const Pending& p) { return p.offset == o; });
    if (it != pending_.end()) {
      it->user = true;
    } else {
      pending_.push_back({o, true});
    }
  }
  std::sort(pending_.begin(), pending_.end(),
            [](const Pending& a, const Pending& b) { return a.offset < b.offset; });
  if (pending_.empty()) return;
  std::vector<int64_t> offsets;
  for (const Pending& p : pending_) offsets.push_back(p.offset);
  for (auto& c : caches_) {
    if (!c) continue;
    const Status s = c->PrepareSnapshots(offsets);
    KV_CHECK(s.ok(), "PrepareSnapshots refused the manager's schedule: " + s.ToString());
  }
}

void RefPrefixCache::Forward(std::span<const Token> tokens) {
  KV_CHECK(open_, "Forward without an open session");
  KV_CHECK(!tokens.empty(), "a forward writes at least one token");
  // Every layer writes the same tokens, so a layer whose log holds what an earlier layer's
  // holds takes that layer's log after the write instead of copying its own: one buffer per
  // conversation turn for the whole stack. Transparent: the tokens are equal either way.
  leader_.assign(caches_.size(), -1);
  for (size_t i = 0; i < caches_.size(); ++i) {
    for (size_t j = 0; caches_[i] && j < i; ++j) {
      if (caches_[j] && leader_[j] < 0 && caches_[i]->LogSameAs(*caches_[j])) {
        leader_[i] = static_cast<int64_t>(j);
        break;
      }
    }
  }
  for (size_t i = 0; i < caches_.size(); ++i) {
    if (!caches_[i]) continue;
    const int64_t l = leader_[i];
    caches_[i]->Write(tokens, l < 0 ? nullptr : &*caches_[static_cast<size_t>(l)]);
  }
}

void RefPrefixCache::CommitSpeculation(const TokenLog& forward, int64_t accepted) {
  KV_CHECK(open_, "CommitSpeculation without an open session");
  for (auto& c : caches_) {
    if (c) c->CommitSpeculation(forward, accepted);
  }
}

void RefPrefixCache::AddOutputs(std::span<const Token> tokens) {
  KV_CHECK(open_, "AddOutputs without an open session");
  outputs_.insert(outputs_.end(), tokens.begin(), tokens.end());
}

void RefPrefixCache::AttachPrefillSnapshots() {
  KV_CHECK(open_, "AttachPrefillSnapshots without an open session");
  if (pending_.empty()) return;
  const std::vector<Pending> pending = std::move(pending_);
  pending_.clear();
  // rows[i][j]: capture i of cache j (nullopt for a stateless hole).
  std::vector<std::vector<RefSnap>> rows(pending.size(), std::vector<RefSnap>(caches_.size()));
  for (size_t j = 0; j < caches_.size(); ++j) {
    if (!caches_[j]) continue;
    std::vector<RefSnap> taken = caches_[j]->TakeSnapshots();
    // A branch point is pending from Begin even when the caller never scheduled captures:
    // the cache then has no schedule, hands back nothing, and the row stays null.
    if (taken.empty()) continue;
    KV_CHECK(taken.size() == pending.size(), "one capture per pending offset");
    for (size_t i = 0; i < pending.size(); ++i) rows[i][j] = std::move(taken[i]);
  }
  const int64_t reached = MinOffset(caches_);
  const Keys stored = StoredKeys(inputs_, outputs_);
  for (size_t i = 0; i < pending.size(); ++i) {
    const Pending& p = pending[i];
    if (p.offset > reached) continue;  // never crossed: the captures are dropped
    RefNode* f = active_path_.back();
    if (f->end < p.offset) {
      f = AdvancePath(active_path_, f, SliceKeys(stored, f->end, p.offset), p.offset, caches_);
    }
    KV_CHECK(f->end == p.offset, "a capture lands on the node ending at its offset");
    if (p.user) f->user = true;
    AttachCaptured(f, std::move(rows[i]), caches_, clock_, kept_whole_states_);
    CompactPath(active_path_, caches_);
  }
  EnforceEvictionPolicy();
}

std::optional<int64_t> RefPrefixCache::Close() {
  KV_CHECK(open_, "Close without an open session");
  AttachPrefillSnapshots();
  std::optional<int64_t> paged_out_from;
  const int64_t offset = MinOffset(caches_);
  if (offset > 0) {
    const Keys stored = StoredKeys(inputs_, outputs_);
    KV_CHECK(offset <= static_cast<int64_t>(stored.size()),
             "the caches ran ahead of the recorded tokens");
    RefNode* f = active_path_.back();
    KV_CHECK(f->end <= offset, "the active path ends beyond the caches");
    if (offset > f->end) {
      RefNode* n = AdvancePath(active_path_, f, SliceKeys(stored, f->end, offset), offset, caches_);
      if (PageOut(n, caches_)) {
        paged_out_from = n->start();
        EnforceEvictionPolicy();
      }
      CompactPath(active_path_, caches_);
    }
    active_path_.back()->last_used = ++clock_;
  }
  open_ = false;
  scheduled_ = false;
  inputs_.clear();
  outputs_.clear();
  return paged_out_from;
}

void RefPrefixCache::set_budget(int64_t budget, std::vector<int64_t> unit_bytes) {
  KV_CHECK(unit_bytes.size() == caches_.size(), "one unit size per manager cache");
  budget_ = budget;
  unit_bytes_ = std::move(unit_bytes);
}

void RefPrefixCache::EnforceEvictionPolicy() {
  std::optional<int64_t> paged_out;
  if (budget_ != kUnlimited) paged_out = ChargeRefSlots(*root_, unit_bytes_);
  const bool pass = paged_out && *paged_out > budget_;
  if (policy_hook_) policy_hook_(*root_, paged_out, pass);
  if (!pass) return;
  // The active path as the pass begins: it never changes during a pass (its nodes are
  // never victims, and a victim off the path has no descendant on it).
  const std::vector<const RefNode*> active(active_path_.begin(), active_path_.end());
  RefEvictionPass(*root_, active, budget_);
}

}  // namespace kvtwin::model
