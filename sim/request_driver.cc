// RequestDriver: the stack, the reference side (oracles, shadows) and the bookkeeping
// between requests. One request's session lives in request_session.cc.
#include "sim/request_driver.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <limits>
#include <utility>

#include "sim/forward.h"
#include "sim/trie_checks.h"
#include "src/core/check.h"
#include "src/trie_export.h"

namespace kvtwin::sim {

std::string RequestDivergence::ToString() const {
  return fmt::format(
      "divergence at step {}, request #{} ({}):\n  request:  {}\n  {}\n  expected: {}\n"
      "  actual:   {}{}{}",
      step, request, phase, request_summary, mismatch.what, mismatch.expected, mismatch.actual,
      note.empty() ? "" : "\n  ", note);
}

std::string LocalizedNote(int64_t found_at, int64_t unaudited_calls) {
  return fmt::format(
      "(localized: the amortized audit first failed at request #{} after {} unaudited session "
      "call(s) or forward(s); this is the first failure with every call audited)",
      found_at, unaudited_calls);
}

std::string RequestCoverage::ToString() const {
  return fmt::format(
      "completed {}, cancelled {}, cache hits {}, extensions {} (dropped tails {}), "
      "continuations {} (resumed exactly {}), divergent {}, new {}, repeats {}, retries {}, "
      "user offsets {}, unscheduled {}, speculative {} (isolated probes {}, abandoned {}), "
      "forwarded last {}, past stop {}, budgets moved mid-session {}, "
      "branch points {}, splits {}, "
      "evictions {} (checked passes {}, largest {}), free-all {}, kv gaps {} (cut page-ins {}, at "
      "KV {}), "
      "whole-state copies {}, "
      "audited calls {}/{}, "
      "forwards reading every history row {}/{}",
      completed, cancelled, cache_hits, extensions, dropped_tails, continuations, resumed_exactly,
      divergent, new_conversations, repeats, retries, user_offsets, unscheduled, speculative,
      isolated_probes, abandoned_steps, forwarded_last, past_stop, session_budgets, branch_points,
      splits, evictions, eviction_passes, largest_eviction_pass, free_all, kv_gaps, cut_pageins,
      kv_cut_pageins, whole_state_copies, audited_calls, calls, forwards - trusting_forwards,
      forwards);
}

std::string RequestCoverage::Counters() const {
  std::string out;
  for (const auto& [name, member] : Fields())
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", name, this->*member);
  return out;
}

const std::vector<RequestCoverage::Field>& RequestCoverage::Fields() {
  // Every counter, in declaration order: Counters, += and the header's reach claims walk this
  // list.
  static const std::vector<Field> fields = {
      {"completed", &RequestCoverage::completed},
      {"cancelled", &RequestCoverage::cancelled},
      {"cache_hits", &RequestCoverage::cache_hits},
      {"extensions", &RequestCoverage::extensions},
      {"dropped_tails", &RequestCoverage::dropped_tails},
      {"divergent", &RequestCoverage::divergent},
      {"new_conversations", &RequestCoverage::new_conversations},
      {"repeats", &RequestCoverage::repeats},
      {"retries", &RequestCoverage::retries},
      {"user_offsets", &RequestCoverage::user_offsets},
      {"unscheduled", &RequestCoverage::unscheduled},
      {"speculative", &RequestCoverage::speculative},
      {"isolated_probes", &RequestCoverage::isolated_probes},
      {"abandoned_steps", &RequestCoverage::abandoned_steps},
      {"session_budgets", &RequestCoverage::session_budgets},
      {"forwarded_last", &RequestCoverage::forwarded_last},
      {"past_stop", &RequestCoverage::past_stop},
      {"continuations", &RequestCoverage::continuations},
      {"resumed_exactly", &RequestCoverage::resumed_exactly},
      {"branch_points", &RequestCoverage::branch_points},
      {"free_all", &RequestCoverage::free_all},
      {"kv_gaps", &RequestCoverage::kv_gaps},
      {"cut_pageins", &RequestCoverage::cut_pageins},
      {"kv_cut_pageins", &RequestCoverage::kv_cut_pageins},
      {"whole_state_copies", &RequestCoverage::whole_state_copies},
      {"splits", &RequestCoverage::splits},
      {"evictions", &RequestCoverage::evictions},
      {"eviction_passes", &RequestCoverage::eviction_passes},
      {"largest_eviction_pass", &RequestCoverage::largest_eviction_pass},
      {"calls", &RequestCoverage::calls},
      {"audited_calls", &RequestCoverage::audited_calls},
      {"forwards", &RequestCoverage::forwards},
      {"trusting_forwards", &RequestCoverage::trusting_forwards},
  };
  return fields;
}

RequestCoverage& RequestCoverage::operator+=(const RequestCoverage& o) {
  for (const auto& [name, member] : Fields()) {
    // largest_eviction_pass is a maximum over the runs, not a count.
    this->*member = member == &RequestCoverage::largest_eviction_pass
                        ? std::max(this->*member, o.*member)
                        : this->*member + o.*member;
  }
  return *this;
}

int64_t RequestDriver::attention_checks() const {
  int64_t n = 0;
  for (const auto& oracle : oracles_) n += oracle->attention_checks();
  return n;
}

RequestDriver::RequestDriver(StackConfig config, RequestDriverOptions options, uint64_t value_seed)
    : config_(std::move(config)), options_(options), synth_(value_seed) {
  const Status valid = config_.Validate();
  KV_CHECK(valid.ok(), valid.ToString());
  KV_CHECK(options_.chunk >= 1, "prefill chunks hold at least one token");
  caches_ = BuildCaches(config_);
  for (const auto& c : caches_) cache_ptrs_.push_back(c.get());
  for (size_t i = 0; i < caches_.size(); ++i) {
    const auto layer = static_cast<int32_t>(i);
    oracles_.push_back(std::make_unique<LayerOracle>(synth_, config_, layer));
    oracles_.back()->set_shape_run_counts(options_.shape_run_counts);
    oracle_ptrs_.push_back(oracles_.back().get());
  }
  LayerKernels kernels = DeriveLayerKernels(synth_, config_);
  conv_weights_ = std::move(kernels.conv);
  gdn_params_ = std::move(kernels.gdn);
  for (size_t i = 0; i < caches_.size(); ++i) {
    logged_.push_back(caches_[i] == nullptr
                          ? nullptr
                          : std::make_unique<LoggedCache>(caches_[i].get(), static_cast<int32_t>(i),
                                                          &manager_calls_));
  }
  manager_ = std::make_unique<PrefixCache>(ManagerCaches());
  std::vector<int64_t> unit_bytes;
  for (size_t i = 0; i < caches_.size(); ++i) {
    unit_bytes.push_back(caches_[i] != nullptr ? oracles_[i]->SnapshotUnitBytes() : 0);
  }
  reference_ = std::make_unique<ManagerReference>(Shadows(), std::move(unit_bytes));
  // 0 = unlimited: the counter can never exceed the largest int64.
  SetBudget(options_.budget_bytes > 0 ? options_.budget_bytes
                                      : std::numeric_limits<int64_t>::max());
  if (options_.budget_bytes > 0) eviction_ref_ = std::make_unique<EvictionReference>(*manager_);
  manager_->set_policy_hook([this] {
    point_budget_ = budget_;
    reference_->OnProductionPoint(*manager_);
  });
  manager_->set_eviction_hook([this](bool ended) {
    if (!ended) reference_->OnProductionPass(*manager_);
    if (eviction_ref_) eviction_ref_->OnPass(ended);
  });
}

// The manager holds raw pointers into caches_, and its hooks into the references.
RequestDriver::~RequestDriver() { manager_.reset(); }

void RequestDriver::SetBudget(int64_t bytes) {
  budget_ = bytes;
  manager_->set_max_paged_out_bytes(bytes);
  reference_->set_budget(bytes);
}

std::vector<LayerCache*> RequestDriver::ManagerCaches() const {
  std::vector<LayerCache*> out;
  for (const auto& c : logged_) out.push_back(c.get());
  return out;
}

std::vector<std::optional<model::RefCache>> RequestDriver::Shadows() const {
  std::vector<std::optional<model::RefCache>> out;
  out.reserve(caches_.size());
  for (size_t i = 0; i < caches_.size(); ++i) {
    if (caches_[i] == nullptr) {
      out.emplace_back();
      continue;
    }
    const LayerSpec& spec = config_.layers[i];
    // A layer of the same kind and window as an earlier one gets a copy of its shadow: a
    // RefCache is a value whose log copies share their buffer, so the live tokens are
    // copied once per distinct layer rather than once per layer.
    size_t same = 0;
    while (same < i && !(out[same].has_value() && config_.layers[same].kind == spec.kind &&
                         config_.layers[same].window == spec.window)) {
      ++same;
    }
    if (same < i) {
      out.push_back(out[same]);
      continue;
    }
    model::RefCache ref = spec.kind == CacheKind::kFullKv ? model::RefCache::Kv()
                          : spec.kind == CacheKind::kRotating
                              ? model::RefCache::Rotating(spec.window)
                              : model::RefCache::Recurrent();
    if (!live_.empty()) ref.Write(live_);
    out.emplace_back(std::move(ref));
  }
  return out;
}

int64_t RequestDriver::MinCacheOffset() const {
  int64_t min_offset = -1;
  for (const auto& c : caches_) {
    if (c != nullptr && (min_offset < 0 || c->Offset() < min_offset)) min_offset = c->Offset();
  }
  return min_offset;
}

Check RequestDriver::CheckWholeTrie() {
  census_walked_ = false;
  Check c = AuditTrie(manager_->trie(), manager_->active_path(), MinCacheOffset(), oracle_ptrs_,
                      synth_.seed(), audit_scratch_, &census_next_.start_by_end);
  census_walked_ = !c;
  return c;
}

void RequestDriver::TakeCensus() {
  // Every session call that updates the census audited the trie first, and the checks in
  // between only read it.
  KV_CHECK(census_walked_, "a census without this call's audit walk");
  census_walked_ = false;
  Census& census = census_next_;
  std::sort(census.start_by_end.begin(), census.start_by_end.end());
  // Every position of the active key path, not only node ends: a node compaction folded
  // into the path ended at what is now an interior position of the merged node. The path
  // starts at the root, so hashing its edges in order gives PathLog's hashes.
  census.active_key_path.clear();
  uint64_t h = synth_.seed();
  for (const TrieNode* n : manager_->active_path()) {
    for (const TrieKey k : n->edge()) {
      h = NextHash(h, KeyToken(k));
      census.active_key_path.push_back(h);
    }
  }
  std::sort(census.active_key_path.begin(), census.active_key_path.end());
}

void RequestDriver::UpdateCensus() {
  // Double-buffered: the previous census's vectors become the next one's, so a census
  // allocates only while the trie grows.
  TakeCensus();
  if (has_census_) CountChanges(census_, census_next_);
  std::swap(census_, census_next_);
  has_census_ = true;
}

void RequestDriver::CountChanges(const Census& before, const Census& after) {
  const auto& ends = after.start_by_end;
  for (const auto& [end_hash, start] : before.start_by_end) {
    auto it = std::lower_bound(ends.begin(), ends.end(),
                               std::make_pair(end_hash, std::numeric_limits<int64_t>::min()));
    if (it == ends.end() || it->first != end_hash) {
      // Compaction folds active nodes into the path; eviction never touches it.
      if (!std::binary_search(after.active_key_path.begin(), after.active_key_path.end(),
                              end_hash)) {
        ++coverage_.evictions;
      }
    } else if (it->second > start) {
      ++coverage_.splits;
    }
  }
}

bool RequestDriver::StartCall() {
  const int64_t nodes = manager_->trie().num_nodes();
  // The previous call, if audited, passed (the driver is not used after a divergence).
  if (audit_) unaudited_calls_ = 0;
  // A call under a budget of exactly 0 is audited at any trie size: its pass must take every
  // evictable node (where a cap on one pass's victims shows), and the trie it leaves is small.
  if (options_.audit_every_call || nodes <= kAuditAlwaysNodes || budget_ == 0) {
    audit_ = true;
  } else {
    // Credit accrues per call and is capped, so the first call past a long gap is not
    // followed by a burst of audits.
    const int64_t cost = kAuditTokensPerNode * nodes;
    const int64_t earned = kAuditTokensPerCall + forwarded_tokens_;
    audit_credit_ = std::min(audit_credit_ + earned, cost + earned);
    audit_ = audit_credit_ >= cost;
    if (audit_) audit_credit_ -= cost;
  }
  unaudited_calls_ += !audit_;
  forwarded_tokens_ = 0;
  ++coverage_.calls;
  coverage_.audited_calls += audit_;
  reference_->StartCall();
  return audit_;
}

int64_t RequestDriver::TrustedHistoryRows(int64_t start, int64_t n) {
  const int64_t rows = start + n;  // a full KV layer's history after the forward
  if (options_.audit_every_call || rows <= kHistoryAlwaysRows) return 0;
  // Capped like the audit credit: a long decode after a long prefill is not followed by a
  // burst of full checks.
  history_credit_ = std::min(history_credit_ + kHistoryRowsPerToken * n, 2 * rows);
  if (history_credit_ >= rows) {
    history_credit_ -= rows;
    return 0;
  }
  ++history_skips_;
  ++coverage_.trusting_forwards;
  return start;
}

RequestDriver::TrieDumps RequestDriver::DumpTries(bool diverged) const {
  const std::span<TrieNode* const> path =
      diverged ? std::span<TrieNode* const>() : std::span(manager_->active_path());
  return {DumpTrie(manager_->trie(), path), TrieToDot(manager_->trie(), path)};
}

uint64_t RequestDriver::TrieDigest() const {
  const PrefixTrie& trie = manager_->trie();
  uint64_t h = XXH3_64bits_withSeed(nullptr, 0, static_cast<uint64_t>(trie.paged_out_bytes()));
  auto fold = [&h](const void* data, size_t bytes) { h = XXH3_64bits_withSeed(data, bytes, h); };
  trie.Walk([&](TrieNode* n) {
    const int64_t fields[6] = {n->start_offset(),
                               n->end_offset(),
                               static_cast<int64_t>(n->num_children()),
                               static_cast<int64_t>(n->last_used()),
                               n->SnapshotBytes(),
                               n->user() ? 1 : 0};
    fold(fields, sizeof(fields));
    fold(n->edge().data(), n->edge().size() * sizeof(TrieKey));
    for (const SnapshotPtr& s : n->snapshots()) {
      const int64_t slot[3] = {s == nullptr ? -1 : static_cast<int64_t>(s->kind()),
                               s == nullptr ? 0 : s->from(), s == nullptr ? 0 : s->to()};
      fold(slot, sizeof(slot));
    }
  });
  for (const TrieNode* n : manager_->active_path()) {
    const int64_t range[2] = {n->start_offset(), n->end_offset()};
    fold(range, sizeof(range));
  }
  return h;
}

void RequestDriver::Fold(uint64_t value) {
  digest_ = XXH3_64bits_withSeed(&value, sizeof(value), digest_);
}

}  // namespace kvtwin::sim
