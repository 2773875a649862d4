#include "sim/manager_reference.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "model/ref_eviction.h"
#include "sim/trie_mirror.h"
#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

std::string Outcome(int64_t matched, int64_t cached, int64_t left, bool free_all) {
  return fmt::format("matched {} cached {} left {}{}", matched, cached, left,
                     free_all ? " after free-all" : "");
}

template <typename PendingList>
std::string RenderPending(const PendingList& pending) {
  std::string s;
  for (const auto& p : pending)
    s += fmt::format("{}{}{}", s.empty() ? "" : " ", p.offset, p.user ? "u" : "");
  return s.empty() ? "none" : s;
}

constexpr const char* kPoints =
    "eviction-policy points (spec §3.4: the end of a switch, of an attach with offsets pending, "
    "a page-out that installs)";

}  // namespace

ManagerReference::ManagerReference(std::vector<std::optional<model::RefCache>> caches,
                                   std::vector<int64_t> unit_bytes)
    : ref_(std::move(caches)), unit_bytes_(std::move(unit_bytes)) {
  ref_.set_policy_hook([this](model::RefNode& root, std::optional<int64_t> paged_out, bool pass) {
    OnReferencePoint(root, paged_out, pass);
  });
}

void ManagerReference::set_budget(int64_t bytes) {
  budget_ = bytes;
  ref_.set_budget(bytes, unit_bytes_);
}

void ManagerReference::OnProductionPoint(const PrefixCache& pc) {
  points_.push_back({pc.trie().paged_out_bytes(), 0, false});
}

void ManagerReference::OnProductionPass(const PrefixCache& pc) {
  if (points_.empty() || points_.back().pass) {
    if (!mismatch_) {
      mismatch_ = Mismatch{"an eviction pass", "one per policy point, after it",
                           "a pass with no policy point of its own"};
    }
    return;
  }
  Point& p = points_.back();
  p.pass = true;
  p.first = nodes_.size();
  pc.trie().Walk([&](TrieNode* n) {
    nodes_.push_back({n->start_offset(), n->end_offset(), static_cast<int64_t>(n->last_used()),
                      n->num_children(), sizes_.size(), n->snapshots().size()});
    for (const SnapshotPtr& s : n->snapshots()) sizes_.push_back(s ? s->SizeBytes() : -1);
  });
  p.first_on_path = path_.size();
  p.on_path = pc.active_path().size();
  for (const TrieNode* n : pc.active_path()) path_.emplace_back(n->start_offset(), n->end_offset());
}

void ManagerReference::StartCall() {
  points_.clear();
  nodes_.clear();
  sizes_.clear();
  path_.clear();
  next_ = 0;
}

const model::RefBeginReport& ManagerReference::Begin(std::span<const model::Token> inputs) {
  KV_CHECK(!begin_point_, "a reference Begin whose policy point never ran");
  begun_ = ref_.Begin(inputs, /*enforce_policy=*/false);
  begin_point_ = true;
  return begun_;
}

Check ManagerReference::AfterBegin(const PrefixCache* pc) {
  KV_CHECK(begin_point_, "AfterBegin without a reference Begin");
  begin_point_ = false;
  ref_.EnforceEvictionPolicy();
  return FinishCall("Begin", pc);
}

Check ManagerReference::FinishCall(const char* call, const PrefixCache* pc) {
  if (!mismatch_ && next_ != points_.size()) {
    mismatch_ = Mismatch{kPoints, std::to_string(next_), std::to_string(points_.size())};
  }
  StartCall();
  Check c = std::exchange(mismatch_, std::nullopt);
  if (c) c->what = fmt::format("{}: {}", call, c->what);
  if (c && std::exchange(counter_differs_, false) && pc != nullptr) {
    if (Check at_end = CheckTrie(*pc, call)) c->what += "; at the call's end, " + at_end->what;
  }
  return c;
}

void ManagerReference::OnReferencePoint(model::RefNode& root, std::optional<int64_t> paged_out,
                                        bool pass) {
  const size_t k = next_++;
  if (mismatch_) return;  // the call already diverged
  if (k >= points_.size()) {
    mismatch_ =
        Mismatch{kPoints, fmt::format("at least {}", k + 1), std::to_string(points_.size())};
    return;
  }
  const Point& p = points_[k];
  // The counter is what production compares; the reference's sum is of its own sizes.
  if (paged_out && *paged_out != p.counter) {
    counter_differs_ = true;
    mismatch_ = Mismatch{fmt::format("paged-out bytes at policy point #{} (the sum of the "
                                     "reference's snapshot sizes, spec §7)",
                                     k + 1),
                         std::to_string(*paged_out), std::to_string(p.counter)};
    return;
  }
  if (p.pass != pass) {
    mismatch_ =
        Mismatch{fmt::format("eviction pass at policy point #{} (paged-out bytes {}, budget {})",
                             k + 1, p.counter, BudgetText()),
                 pass ? "a pass" : "none", p.pass ? "a pass" : "none"};
    return;
  }
  if (pass) mismatch_ = ComparePass(p, k, root);
}

Check ManagerReference::ComparePass(const Point& p, size_t k, const model::RefNode& root) const {
  size_t end = nodes_.size();  // up to the next pass's record
  for (size_t j = k + 1; j < points_.size(); ++j) {
    if (points_[j].pass) {
      end = points_[j].first;
      break;
    }
  }
  size_t i = p.first;
  Check c;
  // The protected set: the active path's ranges (the tries' shapes are compared next).
  // Texts are made only on a difference: this runs at every pass.
  const std::vector<model::RefNode*>& want_path = ref_.active_path();
  for (size_t d = 0; !c && d < std::max(want_path.size(), p.on_path); ++d) {
    const bool have_want = d < want_path.size(), have_got = d < p.on_path;
    const auto& got = have_got ? path_[p.first_on_path + d] : std::pair<int64_t, int64_t>();
    if (have_want && have_got && want_path[d]->start() == got.first &&
        want_path[d]->end == got.second) {
      continue;
    }
    const auto range = [](bool have, int64_t start, int64_t stop) {
      return have ? fmt::format("[{},{})", start, stop) : std::string("none");
    };
    c = Mismatch{
        fmt::format("active path entry {}", d),
        range(have_want, have_want ? want_path[d]->start() : 0, have_want ? want_path[d]->end : 0),
        range(have_got, got.first, got.second)};
  }
  // Pre-order on both sides; the walk stops filling at the first difference. The ages
  // decide the victims, so they are compared here, at every pass, not only at audits.
  model::ForEachRefNode(root, [&](const model::RefNode& n) {
    if (c) return;
    const auto describe = [](int64_t start, int64_t stop, size_t children, int64_t age) {
      return fmt::format("[{},{}) with {} children, age {}", start, stop, children, age);
    };
    const auto want = [&] { return describe(n.start(), n.end, n.children.size(), n.last_used); };
    if (i == end) {
      c = Mismatch{"", want(), "no further node"};
      return;
    }
    const NodeSizes& got = nodes_[i];
    if (got.start != n.start() || got.end != n.end || got.children != n.children.size() ||
        got.last_used != n.last_used) {
      c = Mismatch{fmt::format("node #{} in pre-order", i - p.first), want(),
                   describe(got.start, got.end, got.children, got.last_used)};
      return;
    }
    // The reference charged every slot just before this (RefPrefixCache's policy point).
    for (size_t j = 0; j < std::max(n.snaps.size(), got.slots); ++j) {
      const int64_t size = j < got.slots ? sizes_[got.first_slot + j] : -1;
      const bool has = j < n.snaps.size() && n.snaps[j].has_value();
      const auto slot = [&] {
        return fmt::format("node #{} [{},{}) slot {}", i - p.first, n.start(), n.end, j);
      };
      if (has != (size >= 0)) {
        c = Mismatch{slot(), has ? "a snapshot" : "empty", has ? "empty" : "a snapshot"};
        return;
      }
      if (has && n.bytes[j] != size) {
        c = Mismatch{slot() + " bytes (spec §7)", std::to_string(n.bytes[j]), std::to_string(size)};
        return;
      }
    }
    ++i;
  });
  if (!c && i != end) {
    c = Mismatch{"", "no further node", fmt::format("{} more", end - i)};
  }
  if (c) {
    c->what = fmt::format("trie when the eviction pass of policy point #{} begins{}{}", k + 1,
                          c->what.empty() ? "" : ", ", c->what);
  }
  return c;
}

std::string ManagerReference::BudgetText() const {
  return budget_ == std::numeric_limits<int64_t>::max() ? "unlimited"
                                                        : fmt::format("{} B", budget_);
}

Check ManagerReference::CheckBegin(const PrefixCache& pc, const BeginReport& got) const {
  const model::RefBeginReport& want = begun_;
  if (want.total != got.total || want.matched != got.matched || want.cached != got.cached ||
      want.left != got.left || want.free_all != got.free_all) {
    return Mismatch{"Begin report against the reference manager",
                    Outcome(want.matched, want.cached, want.left, want.free_all),
                    Outcome(got.matched, got.cached, got.left, got.free_all)};
  }
  return CheckPending(pc);
}

Check ManagerReference::CheckPending(const PrefixCache& pc) const {
  // Rendered only on a difference (the rendering is one-to-one, so the verdict is its).
  const auto same = [](const auto& a, const auto& b) {
    return a.offset == b.offset && a.user == b.user;
  };
  if (std::equal(ref_.pending().begin(), ref_.pending().end(), pc.pending().begin(),
                 pc.pending().end(), same)) {
    return std::nullopt;
  }
  const std::string want = RenderPending(ref_.pending());
  const std::string got = RenderPending(pc.pending());
  if (want == got) return std::nullopt;
  return Mismatch{"pending capture offsets (u = user point)", want, got};
}

// Renders only on a difference: the lock-step walk decides equality without the mirror.
// Ages are compared as values: both managers stamp a tick at the same spec "now" events, so
// a missed or extra refresh shows even where it leaves every node's rank unchanged (the
// newest node refreshed again), which a coarse wall clock would turn into different ties.
Check ManagerReference::CheckTrie(const PrefixCache& pc, const char* after) {
  if (SameTrie(pc.trie(), ref_.root(), /*with_bytes=*/true, unit_bytes_) &&
      SamePath(pc.trie(), pc.active_path())) {
    return std::nullopt;
  }
  const TrieMirror got = MirrorTrie(pc.trie(), pc.active_path());
  // Without the sizes first: a trie that differs in shape reads best without them.
  model::ChargeRefSlots(ref_.mutable_root(), unit_bytes_);
  for (const bool with_bytes : {false, true}) {
    const std::string want_text = model::RenderRefTrie(ref_.root(), with_bytes, /*raw_ticks=*/true);
    const std::string got_text = model::RenderRefTrie(*got.root, with_bytes, /*raw_ticks=*/true);
    if (want_text == got_text) continue;
    const std::string budget = budget_ == std::numeric_limits<int64_t>::max()
                                   ? "at an unlimited budget"
                                   : "under a budget of " + BudgetText();
    return Mismatch{fmt::format("trie after {} {}{}, {}", after, budget,
                                with_bytes ? " (snapshot sizes, spec §7)" : "",
                                model::FirstDifference(want_text, got_text)),
                    "the reference manager's trie", "a different trie (the line above)"};
  }
  const std::vector<const model::RefNode*> want_path(ref_.active_path().begin(),
                                                     ref_.active_path().end());
  const std::string want = RenderPath(want_path);
  const std::string have = RenderPath(got.active);
  if (want == have && got.active.size() == pc.active_path().size()) return std::nullopt;
  return Mismatch{fmt::format("active path after {}", after), want, have};
}

// What RenderPath compares (the ranges of the path's nodes), for a path that runs from the
// root through parent -> child links; a pointer is dereferenced only once it is found
// among the children of a node already on that chain, so a freed node reads as "differs".
bool ManagerReference::SamePath(const PrefixTrie& trie, std::span<TrieNode* const> got) const {
  const auto& want = ref_.active_path();
  if (got.size() != want.size() || got.empty() || got[0] != trie.root()) return false;
  for (size_t i = 1; i < got.size(); ++i) {
    const TrieNode* parent = got[i - 1];
    bool child = false;
    for (size_t c = 0; c < parent->num_children() && !child; ++c)
      child = parent->child(c) == got[i];
    if (!child || got[i]->end_offset() != want[i]->end ||
        got[i]->start_offset() != want[i]->start()) {
      return false;
    }
  }
  return true;
}

}  // namespace kvtwin::sim
