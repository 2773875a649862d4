#include "sim/eviction_reference.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "sim/trie_mirror.h"

namespace kvtwin::sim {

Check EvictionReference::TakeMismatch() { return std::exchange(mismatch_, std::nullopt); }

std::string EvictionReference::Victims() const {
  std::string s;
  for (const model::RefEviction& e : victims_) s += (s.empty() ? "" : ", ") + e.ToString();
  return s.empty() ? "none" : s;
}

void EvictionReference::OnPass(bool ended) {
  // The hook's own contract: passes that evict only, so one begins over budget, and a begin
  // and an end alternate.
  const bool was_open = std::exchange(open_, !ended);
  if (!mismatch_ && ended != was_open) {
    mismatch_ = Mismatch{"eviction hook order", ended ? "a begin before the end" : "an end first",
                         ended ? "an end with no pass begun" : "a second begin"};
  }
  if (!ended && !mismatch_) {
    const int64_t bytes = manager_.trie().paged_out_bytes();
    const int64_t budget = manager_.options().max_paged_out_bytes;
    if (bytes <= budget) {
      mismatch_ = Mismatch{"paged-out bytes when an eviction pass begins (hook)",
                           fmt::format("> {} (budget)", budget), std::to_string(bytes)};
    }
  }
  if (ended && !was_open) return;  // no pass to compare (reported above)
  if (!ended) {
    ++passes_;
    budget_ = manager_.options().max_paged_out_bytes;
    pool_.Recycle(std::move(expected_));  // a second begin left the first one's result
    TrieMirror m = MirrorTrie(manager_.trie(), manager_.active_path(), &pool_);
    victims_ = model::RefEvictionPass(*m.root, m.active, budget_);
    evictions_ += static_cast<int64_t>(victims_.size());
    largest_pass_ = std::max(largest_pass_, static_cast<int64_t>(victims_.size()));
    expected_ = std::move(m.root);
    return;
  }
  // Renders only on a difference: the lock-step walk decides equality without the mirror.
  if (mismatch_ || SameTrie(manager_.trie(), *expected_, /*with_bytes=*/true)) {
    pool_.Recycle(std::move(expected_));
    return;
  }
  const TrieMirror got = MirrorTrie(manager_.trie(), manager_.active_path());
  const std::string want =
      model::RenderRefTrie(*expected_, /*with_bytes=*/true, /*raw_ticks=*/true);
  const std::string actual =
      model::RenderRefTrie(*got.root, /*with_bytes=*/true, /*raw_ticks=*/true);
  if (actual == want) return;
  mismatch_ =
      Mismatch{fmt::format("trie after eviction pass #{} under budget {} B, {}", passes_, budget_,
                           model::FirstDifference(want, actual)),
               "the reference pass's victims: " + Victims(), "a different trie (the line above)"};
}

}  // namespace kvtwin::sim
