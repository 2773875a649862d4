#include "sim/manager_reference.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "sim/trie_mirror.h"

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

}  // namespace

ManagerReference::ManagerReference(std::vector<std::optional<model::RefCache>> caches)
    : ref_(std::move(caches)) {}

const model::RefBeginReport& ManagerReference::Begin(const model::TokenLog& inputs) {
  begun_ = ref_.Begin(inputs);
  return begun_;
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
Check ManagerReference::CheckTrie(const PrefixCache& pc, const char* after) const {
  if (SameTrie(pc.trie(), ref_.root(), /*with_bytes=*/false) &&
      SamePath(pc.trie(), pc.active_path())) {
    return std::nullopt;
  }
  const TrieMirror got = MirrorTrie(pc.trie(), pc.active_path());
  const std::string want_text =
      model::RenderRefTrie(ref_.root(), /*with_bytes=*/false, /*raw_ticks=*/true);
  const std::string got_text =
      model::RenderRefTrie(*got.root, /*with_bytes=*/false, /*raw_ticks=*/true);
  if (want_text != got_text) {
    return Mismatch{fmt::format("trie after {} at an unlimited budget, {}", after,
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
