// RequestDriver::Session: one request through the manager, in the order of spec §3.4, with
// the checks of request_driver.h after every call. Forwards write synthetic rows whose
// provenance hashes continue the request's stored tokens (inputs then outputs); the
// rejected drafts of a speculative step continue the chain of the drafts before them.
#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "model/ref_session.h"
#include "sim/cache_calls.h"
#include "sim/request_driver.h"
#include "sim/switch_reference.h"
#include "sim/trie_checks.h"
#include "src/core/check.h"
#include "src/speculation.h"

namespace kvtwin::sim {
namespace {

// How far ahead of the manager's clock a squeeze stamps the nodes it moves there.
constexpr uint64_t kClockStepBack = uint64_t{1} << 20;
// Beyond kAuditAlwaysNodes, the squeeze's clock edits run on the requests whose index is
// below 4 modulo this: one in 16 of the squeezes that ask for each edit.
constexpr int64_t kSparseClockEdits = 64;

std::string DescribePath(std::span<const NodeSketch> path) {
  std::string s;
  for (const NodeSketch& n : path) s += (s.empty() ? "" : " -> ") + DescribeNode(n);
  return s;
}

Check StatusIsOk(const Status& s, const char* call) {
  if (s.ok()) return std::nullopt;
  return Mismatch{std::string(call) + " status", "OK", s.ToString()};
}

}  // namespace

class RequestDriver::Session {
 public:
  Session(RequestDriver& driver, const RequestPlan& plan)
      : d_(driver),
        plan_(plan),
        capture_offsets_(d_.session_capture_offsets_),
        stored_(d_.session_stored_),
        probe_before_(d_.probe_before_),
        probe_after_(d_.probe_after_) {
    PrefillCaptureOffsetsInto(d_.options_, plan, capture_offsets_);
    StoredTokensInto(plan, d_.synth_.seed(), stored_);
  }

  std::optional<RequestDivergence> Run() {
    Check c = ProbeMisuse("before Begin");
    if (!c) c = Begin();
    if (!c) c = Prefill();
    if (!c && !cancelled_) c = Attach();
    if (!c && !cancelled_) c = Decode();
    if (!c) c = Close();
    if (!c && d_.options_.budget_bytes > 0) c = Squeeze();
    if (!c) return std::nullopt;
    return RequestDivergence{d_.steps_,
                             plan_.index,
                             phase_.Render(),
                             plan_.ToString(),
                             *c,
                             d_.unaudited_calls_ + d_.history_skips_,
                             ""};
  }

 private:
  int64_t len() const { return static_cast<int64_t>(plan_.inputs.size()); }
  const PrefixCache& pc() const { return *d_.manager_; }

  // What an illegal session call must leave as it was: the pending captures, every cache's
  // offset and schedule, the trie's size and bytes, the active path and the cache calls.
  // Into `m`, whose vectors keep their capacity: the probes observe twice per refused call.
  void Observe(ManagerState& m) const {
    m.pending.clear();
    m.caches.clear();
    for (const PrefixCache::Pending& p : pc().pending()) m.pending.emplace_back(p.offset, p.user);
    for (const auto& c : d_.caches_) {
      if (c != nullptr) m.caches.emplace_back(c->Offset(), c->ScheduleActive());
    }
    m.nodes = pc().trie().num_nodes();
    m.bytes = pc().trie().paged_out_bytes();
    m.path = pc().active_path().size();
    m.calls = d_.manager_calls_.size();
  }

  Status Call(model::SessionCall call) {
    switch (call) {
      case model::SessionCall::kBegin:
        return d_.manager_->Begin(plan_.inputs).status();
      case model::SessionCall::kBeginEmpty:
        return d_.manager_->Begin({}).status();
      case model::SessionCall::kSchedule:
        return d_.manager_->SchedulePrefillSnapshots(capture_offsets_);
      case model::SessionCall::kAttach:
        return d_.manager_->AttachPrefillSnapshots();
      case model::SessionCall::kAddOutputs:
        return d_.manager_->AddOutputs({});
      case model::SessionCall::kClose:
        return d_.manager_->Close();
    }
    return Status::Ok();
  }

  // The session contract (model/ref_session.h): every call it refuses in the current state
  // is made on the manager, which must refuse it with the same status class and change
  // nothing. The drivers' own calls are always legal, so without this an out-of-order call
  // the manager wrongly accepts would never be made (mutant 102). Not a step: it moves no
  // state, and the digest does not see it.
  Check ProbeMisuse(const char* where) {
    const bool moved = rules_.open() && static_cast<int64_t>(d_.live_.size()) != report_.cached;
    for (model::SessionCall call : model::kSessionCalls) {
      const StatusCode want = rules_.Expect(call, moved);
      if (want == StatusCode::kOk) continue;
      Observe(probe_before_);
      const Status got = Call(call);
      // Named only on a failure: this runs six times per request on passing runs.
      auto what = [&] {
        return fmt::format("{} {} (session contract)", model::SessionCallName(call), where);
      };
      if (got.code() != want) return Mismatch{what(), StatusCodeName(want), got.ToString()};
      Observe(probe_after_);
      if (!(probe_after_ == probe_before_)) {
        return Mismatch{what(), "refused, the manager unchanged", "refused, the manager changed"};
      }
    }
    return std::nullopt;
  }

  Check Begin() {
    phase_ = "Begin";
    // Memory pressure takes effect at the manager's next eviction pass (end of the switch).
    if (d_.options_.budget_bytes > 0) {
      // A pressure of 0 % is a budget of exactly 0: every evictable node goes (spec: a pass
      // runs while the counter is strictly greater), not "no budget".
      budget_bytes_ = d_.options_.budget_bytes * plan_.budget_pct / 100;
      d_.SetBudget(budget_bytes_);
    }
    const std::span<const size_t> positions =
        d_.reference_->Begin(std::span(stored_).first(static_cast<size_t>(len())))
            .matched_positions;
    const BeginExpectation want = ExpectBegin(pc().trie(), pc().active_path(), d_.Shadows(),
                                              plan_.inputs, d_.synth_.seed(), positions);
    // Sketched now (rendered only on a failure): a faulty eviction inside Begin may free
    // these nodes.
    std::vector<NodeSketch>& want_path = d_.begin_path_sketch_;
    want_path.clear();
    for (const TrieNode* n : want.active_path) want_path.push_back(SketchNode(*n));
    // Counted before the checks, so a divergence at this very Begin counts its page-in's
    // shape (a shrink keeping a cut page-in, `--keep-reach cut_pageins`, needs that).
    d_.coverage_.kv_gaps += !want.kv_chain;
    d_.coverage_.cut_pageins += want.pagein_cut;
    d_.coverage_.kv_cut_pageins += want.pagein_cut_at_kv;
    const bool audit = d_.StartCall();
    d_.last_outcome_ = "(no Begin report)";
    ++d_.steps_;
    d_.manager_calls_.clear();
    Result<BeginReport> begun = d_.manager_->Begin(plan_.inputs);
    if (!begun.ok()) return StatusIsOk(begun.status(), "Begin");
    report_ = *begun;
    d_.last_report_ = report_;
    for (int64_t v : {report_.total, report_.matched, report_.cached, report_.left}) d_.Fold(v);
    d_.Fold(report_.free_all);
    d_.last_outcome_ = fmt::format("cached {}/{} matched {}{}", report_.cached, report_.total,
                                   report_.matched, report_.free_all ? " FREE-ALL" : "");
    phase_ = "after Begin";
    rules_.Begun();
    if (Check c = CheckReport()) return c;
    if (Check c = AfterEvictionPoint(audit)) return c;
    if (Check c = CheckExpectation(want, want_path)) return c;
    if (!SameStateMovingCalls(d_.manager_calls_, want.calls)) {
      return Mismatch{"Begin cache calls (rewind, page-in, align; spec §3.4)",
                      DescribeCalls(want.calls),
                      DescribeCalls(StateMovingCalls(d_.manager_calls_))};
    }
    // Nor does a switch (or the eviction at its end) snapshot or split a live cache.
    if (d_.manager_calls_.size() != want.calls.size()) {
      return Mismatch{"Begin cache calls (spec §3.4: a switch takes no snapshot and splits none)",
                      DescribeCalls(want.calls), DescribeCalls(d_.manager_calls_)};
    }
    d_.live_.assign(stored_.begin(), stored_.begin() + report_.cached);
    if (Check c = CheckLive()) return c;
    if (Check c = CheckContinuation(want)) return c;
    if (Check c = d_.reference_->AfterBegin(&pc())) return c;
    if (Check c = d_.reference_->CheckBegin(pc(), report_)) return c;
    if (audit) {
      if (Check c = d_.reference_->CheckTrie(pc(), "Begin")) return c;
    }
    if (audit) d_.UpdateCensus();
    Count();
    return ProbeMisuse("after Begin");
  }

  Check CheckReport() const {
    const BeginReport& r = report_;
    const bool ok = r.total == len() && 0 <= r.cached && r.cached <= r.matched &&
                    r.matched <= r.total && r.cached <= r.total - 1 && r.left == r.total - r.cached;
    if (ok) return std::nullopt;
    return Mismatch{
        "Begin report",
        fmt::format("total {}, 0 <= cached <= matched <= total, cached <= total - 1, "
                    "left == total - cached",
                    len()),
        fmt::format("total {} matched {} cached {} left {}", r.total, r.matched, r.cached, r.left)};
  }

  Check CheckExpectation(const BeginExpectation& want,
                         std::span<const NodeSketch> want_path) const {
    auto differs = [](const char* what, int64_t expected, int64_t actual) -> Check {
      if (expected == actual) return std::nullopt;
      return Mismatch{what, std::to_string(expected), std::to_string(actual)};
    };
    if (Check c = differs("Begin matched (keys found in the trie)", want.matched, report_.matched))
      return c;
    if (want.free_all != report_.free_all || want.cached != report_.cached) {
      auto outcome = [](int64_t cached, bool free_all) {
        return fmt::format("cached {}{}", cached, free_all ? " after free-all" : "");
      };
      return Mismatch{"Begin outcome (the greedy switch of spec §3.4)",
                      outcome(want.cached, want.free_all),
                      outcome(report_.cached, report_.free_all)};
    }
    const std::vector<TrieNode*>& got = pc().active_path();
    if (!std::equal(got.begin(), got.end(), want.active_path.begin(), want.active_path.end())) {
      std::vector<NodeSketch> shown;
      for (const TrieNode* n : got) shown.push_back(SketchNode(*n));
      return Mismatch{"active path after Begin", DescribePath(want_path), DescribePath(shown)};
    }
    return std::nullopt;
  }

  // Spec §5.4: a request whose prompt continues what the previous session stored resumes
  // at least at that session's frontier, exactly at the match when it ends there. Holds
  // when the KV chain of the matched path is whole (else a page-in may stop early).
  Check CheckContinuation(const BeginExpectation& want) {
    const int64_t o = d_.previous_offset_;
    const std::vector<int32_t>& prev = d_.previous_stored_;
    if (o == 0 || len() <= o || !want.kv_chain ||
        !std::equal(prev.begin(), prev.begin() + o, plan_.inputs.begin())) {
      return std::nullopt;
    }
    ++d_.coverage_.continuations;
    if (report_.cached < o || (report_.matched == o && report_.cached != o)) {
      return Mismatch{
          fmt::format("continuation of the previous session (it closed at {}), matched {}", o,
                      report_.matched),
          fmt::format("cached >= {}{}", o, report_.matched == o ? " and == matched" : ""),
          fmt::format("cached {}", report_.cached)};
    }
    if (report_.cached == report_.matched) ++d_.coverage_.resumed_exactly;
    return std::nullopt;
  }

  // Structure, soundness and the eviction bound after every audited call that may have
  // evicted (RequestDriver::StartCall), then the eviction reference's verdict on the call's
  // passes, which it checks on every call (sim/eviction_reference.h).
  Check AfterEvictionPoint(bool audit) const {
    if (audit) {
      if (Check c = d_.CheckWholeTrie()) return c;
      // The bound holds from a policy point on, under the budget of that point: a budget
      // lowered inside a session binds from the next point (a call without one, such as an
      // attach with nothing pending, leaves the counter as it was). Whether each call has its
      // points is the reference's to judge (ManagerReference pairs them).
      if (Check c = CheckEvictionBound(pc().trie(), pc().active_path(), d_.point_budget_)) {
        return c;
      }
    }
    if (d_.eviction_ref_) {
      d_.coverage_.eviction_passes = d_.eviction_ref_->passes();
      d_.coverage_.largest_eviction_pass = d_.eviction_ref_->largest_pass();
      return d_.eviction_ref_->TakeMismatch();
    }
    return std::nullopt;
  }

  void Count() {
    RequestCoverage& cov = d_.coverage_;
    cov.cache_hits += report_.cached > 0;
    cov.free_all += report_.free_all;
    cov.extensions += plan_.kind == RequestKind::kExtend;
    cov.dropped_tails += plan_.dropped > 0;
    cov.divergent += plan_.kind == RequestKind::kDiverge;
    cov.new_conversations += plan_.kind == RequestKind::kNew;
    cov.repeats += plan_.kind == RequestKind::kRepeat;
    cov.retries += plan_.kind == RequestKind::kRetry;
    cov.user_offsets += !plan_.user_offsets.empty();
    cov.unscheduled += !plan_.schedule;
    cov.speculative += !plan_.speculation.empty() && plan_.cancel_after_tokens < 0;
    cov.branch_points += !pc().pending().empty();
  }

  Check Prefill() {
    if (plan_.schedule) {
      const std::vector<int64_t>& requested = capture_offsets_;
      phase_ = "SchedulePrefillSnapshots";
      ++d_.steps_;
      if (Check c = StatusIsOk(d_.manager_->SchedulePrefillSnapshots(requested),
                               "SchedulePrefillSnapshots")) {
        return c;
      }
      d_.Fold(pc().pending().size());
      rules_.Scheduled();
      d_.reference_->manager().SchedulePrefillSnapshots(requested);
      if (Check c = d_.reference_->FinishCall("SchedulePrefillSnapshots", &pc())) return c;
      if (Check c = d_.reference_->CheckPending(pc())) return c;
      if (Check c = ProbeMisuse("after SchedulePrefillSnapshots")) return c;
    }
    cancelled_ = plan_.cancel_after_tokens >= 0;
    int64_t chunks = 0;
    for (int64_t pos = report_.cached; pos < len() - 1; ++chunks) {
      const int64_t done = pos - report_.cached;
      if (cancelled_ && done == plan_.cancel_after_tokens) break;
      int64_t n = std::min(d_.options_.chunk, len() - 1 - pos);
      if (cancelled_) n = std::min(n, plan_.cancel_after_tokens - done);
      phase_ = {"prefill chunk {} [{},{})", {chunks, pos, pos + n}};
      if (Check c = ForwardLive(pos, n)) return c;
      pos += n;
      if (chunks == 0) {
        if (Check c = ProbeMisuse("after the first prefill chunk")) return c;
      }
    }
    // A budget moved inside the open session: the attach's pass (or, cancelled, the close's
    // page-out) must run under the budget of that moment (spec §3.4 reads it per pass).
    if (plan_.budget_pct_after_prefill >= 0 && d_.options_.budget_bytes > 0) {
      budget_bytes_ = d_.options_.budget_bytes * plan_.budget_pct_after_prefill / 100;
      d_.SetBudget(budget_bytes_);
      ++d_.coverage_.session_budgets;
    }
    return std::nullopt;
  }

  Check Attach() {
    phase_ = "AttachPrefillSnapshots";
    const bool audit = d_.StartCall();
    ++d_.steps_;
    d_.manager_calls_.clear();
    if (Check c = StatusIsOk(d_.manager_->AttachPrefillSnapshots(), "AttachPrefillSnapshots")) {
      return c;
    }
    phase_ = "after AttachPrefillSnapshots";
    if (Check c = CheckAttachCalls(d_.manager_calls_, "AttachPrefillSnapshots")) return c;
    rules_.Attached();
    if (Check c = AfterEvictionPoint(audit)) return c;
    const int64_t kept = d_.reference_->manager().kept_whole_states();
    d_.reference_->manager().AttachPrefillSnapshots();
    d_.coverage_.whole_state_copies += d_.reference_->manager().kept_whole_states() - kept;
    if (Check c = d_.reference_->FinishCall("AttachPrefillSnapshots", &pc())) return c;
    if (audit) {
      if (Check c = d_.reference_->CheckTrie(pc(), "AttachPrefillSnapshots")) return c;
    }
    if (Check c = CheckLive()) return c;
    if (audit) d_.UpdateCensus();
    return ProbeMisuse("after AttachPrefillSnapshots");
  }

  // Forwards the seed and every sampled token but the last; reports each sampled token. A
  // speculative step forwards drafts too and reports its accepted drafts and bonus token.
  // Then, by the plan's unforwarded count: 0 forwards the last sampled token as well; k >= 2
  // ends the decode k - 1 outputs early and reports those without forwarding them.
  Check Decode() {
    const int64_t n = plan_.decoded_outputs();
    auto next = plan_.speculation.begin();
    for (int64_t i = 0; i < n;) {
      const int64_t pos = len() - 1 + i;  // the forward's current token
      int64_t sampled = 1;
      if (next != plan_.speculation.end() && i == next->step) {
        const SpeculativeStep& spec = *next++;
        KV_CHECK(!spec.abandoned && spec.end() <= n, "a speculative step past the planned outputs");
        if (spec.probe) {
          if (Check c = ForwardDropped(pos, spec, /*isolated=*/true)) return c;
        }
        phase_ = {"speculative decode at {} (accept {})", {pos, spec.accepted}};
        if (Check c = ForwardSpeculative(pos, spec)) return c;
        sampled = spec.accepted + 1;  // the accepted drafts and the bonus token
      } else {
        phase_ = {"decode at {}", {pos}};
        if (Check c = ForwardLive(pos, 1)) return c;
      }
      phase_ = "AddOutputs";
      ++d_.steps_;
      const auto first = plan_.outputs.begin() + i;
      const std::vector<int32_t> tokens(first, first + sampled);
      if (Check c = StatusIsOk(d_.manager_->AddOutputs(tokens), "AddOutputs")) return c;
      d_.reference_->manager().AddOutputs(
          std::span(stored_).subspan(static_cast<size_t>(len() + i), static_cast<size_t>(sampled)));
      i += sampled;
    }
    if (next != plan_.speculation.end() && next->abandoned) {
      const SpeculativeStep& spec = *next++;
      KV_CHECK(spec.step == n && plan_.unforwarded == 1 && spec.accepted == 0,
               "an abandoned step forwards the last sampled token and accepts nothing");
      if (spec.probe) {
        if (Check c = ForwardDropped(len() - 1 + n, spec, /*isolated=*/true)) return c;
      }
      if (Check c = ForwardDropped(len() - 1 + n, spec, /*isolated=*/false)) return c;
    }
    // A step skipped over was unsorted, overlapping or past the outputs (the reader and
    // the generators never make one).
    KV_CHECK(next == plan_.speculation.end(), "a speculative step the decode never reached");
    const auto all = static_cast<int64_t>(plan_.outputs.size());
    if (plan_.unforwarded == 0) {
      phase_ = {"forward of the last sampled token at {}", {len() - 1 + n}};
      if (Check c = ForwardLive(len() - 1 + n, 1)) return c;
    } else if (n < all) {
      phase_ = "AddOutputs past the decode";
      ++d_.steps_;
      const std::vector<int32_t> tokens(plan_.outputs.begin() + n, plan_.outputs.end());
      if (Check c = StatusIsOk(d_.manager_->AddOutputs(tokens), "AddOutputs")) return c;
      d_.reference_->manager().AddOutputs(
          std::span(stored_).subspan(static_cast<size_t>(len() + n), static_cast<size_t>(all - n)));
    }
    return std::nullopt;
  }

  Check Close() {
    phase_ = "before Close";
    if (Check c = CheckLive()) return c;
    const bool audit = d_.StartCall();
    phase_ = "Close";
    ++d_.steps_;
    d_.manager_calls_.clear();
    if (Check c = StatusIsOk(d_.manager_->Close(), "Close")) return c;
    phase_ = "after Close";
    rules_.Closed();
    if (Check c = AfterEvictionPoint(audit)) return c;
    const int64_t kept = d_.reference_->manager().kept_whole_states();
    const std::optional<int64_t> paged_out_from = d_.reference_->manager().Close();
    d_.coverage_.whole_state_copies += d_.reference_->manager().kept_whole_states() - kept;
    std::vector<int32_t> caches;
    for (size_t i = 0; i < d_.caches_.size(); ++i) {
      if (d_.caches_[i] != nullptr) caches.push_back(static_cast<int32_t>(i));
    }
    if (Check c = CheckCloseCalls(d_.manager_calls_, caches, paged_out_from)) return c;
    if (Check c = d_.reference_->FinishCall("Close", &pc())) return c;
    if (audit) {
      if (Check c = d_.reference_->CheckTrie(pc(), "Close")) return c;
    }
    const auto offset = static_cast<int64_t>(d_.live_.size());
    const int64_t end = pc().active_path().back()->end_offset();
    if (offset > 0 && end != offset) {
      return Mismatch{"active path end after Close", std::to_string(offset), std::to_string(end)};
    }
    if (audit) d_.UpdateCensus();
    d_.coverage_.completed += !cancelled_;
    d_.coverage_.forwarded_last += !cancelled_ && plan_.unforwarded == 0;
    d_.coverage_.past_stop += !cancelled_ && plan_.unforwarded >= 2;
    d_.coverage_.cancelled += cancelled_;
    d_.previous_stored_ = plan_.inputs;
    if (!cancelled_) {
      d_.previous_stored_.insert(d_.previous_stored_.end(), plan_.outputs.begin(),
                                 plan_.outputs.end());
    }
    d_.previous_offset_ = offset;
    // By the trie's size, not by the audit schedule, so an every-call audit (the localizing
    // re-run, --audit-every-call) gives the same digest; FinalAudit folds the final trie.
    if (pc().trie().num_nodes() <= kAuditAlwaysNodes) {
      d_.Fold(d_.TrieDigest());
    } else {
      d_.Fold(static_cast<uint64_t>(pc().trie().num_nodes()));
      d_.Fold(static_cast<uint64_t>(pc().trie().paged_out_bytes()));
    }
    return ProbeMisuse("after Close");
  }

  // Memory pressure between sessions: an eviction pass under half the budget. A pass may
  // remove or merge only nodes off the active path, and those have no active descendants
  // (the path is a chain from the root), so every active-path node must come out of it
  // with the very same snapshots, whatever else the pass evicted.
  Check Squeeze() {
    phase_ = "eviction pass under half the budget, between sessions";
    std::vector<std::pair<TrieNode*, size_t>>& held = d_.squeeze_held_;
    std::vector<const CacheSnapshot*>& slots = d_.squeeze_slots_;
    held.clear();
    slots.clear();
    for (TrieNode* n : pc().active_path()) {
      held.emplace_back(n, n->snapshots().size());
      for (const SnapshotPtr& s : n->snapshots()) slots.push_back(s.get());
    }
    budget_bytes_ /= 2;
    d_.SetBudget(budget_bytes_);
    // The clock edits below walk both tries: on every squeeze that asks for one while the
    // trie is small, on one in 16 of them beyond. By the trie's size and the request's index,
    // not by the audit schedule, so an every-call audit (the localizing re-run,
    // --audit-every-call) replays the very same workload. (Gated on the audit, they once
    // made the two runs evict differently: the Mooncake workload under a budget matched 418
    // tokens audited against 290 amortized.)
    const bool edit_clock =
        pc().trie().num_nodes() <= kAuditAlwaysNodes || plan_.index % kSparseClockEdits < 4;
    const bool audit = d_.StartCall();
    // A coarse clock (a server stamping time.Now() at low resolution): every other squeeze
    // first rounds every age down to a multiple of 4, keeping the LRU order but making equal
    // ages common, so the tie-breaks (deeper, larger, pre-order) decide real evictions.
    if (edit_clock && plan_.index % 2 == 1) {
      pc().trie().Walk([](TrieNode* n) {
        const auto t = static_cast<uint64_t>(n->last_used());
        n->set_last_used(Tick{t - t % 4});
      });
      model::ForEachRefNode(d_.reference_->manager().mutable_root(),
                            [](model::RefNode& n) { n.last_used -= n.last_used % 4; });
    }
    // A clock that stepped back (a restart over a persisted trie, an NTP step under a
    // wall-clock stamp): on every fourth squeeze the nodes of odd age are stamped ahead of
    // the manager's clock, in the same order. Eviction still ranks them by age, and a use
    // must stamp them with now again (spec §3.4 lastUsed := now), not keep the later stamp.
    if (edit_clock && plan_.index % 4 == 2) {
      const auto ahead = static_cast<uint64_t>(pc().now()) + kClockStepBack;
      pc().trie().Walk([ahead](TrieNode* n) {
        const auto t = static_cast<uint64_t>(n->last_used());
        if (t % 2 == 1) n->set_last_used(Tick{ahead + t});
      });
      model::ForEachRefNode(d_.reference_->manager().mutable_root(), [ahead](model::RefNode& n) {
        if (n.last_used % 2 == 1) n.last_used += static_cast<int64_t>(ahead);
      });
    }
    ++d_.steps_;
    d_.manager_calls_.clear();
    d_.manager_->EnforceEvictionPolicy();
    // Spec §3.4 eviction only drops a node's snapshots or merges them into its child: a
    // live cache is never restored, freed, sliced or split by it.
    if (!d_.manager_calls_.empty()) {
      return Mismatch{"eviction pass cache calls (spec §3.4: a pass only drops and merges)", "none",
                      DescribeCalls(d_.manager_calls_)};
    }
    if (Check c = AfterEvictionPoint(audit)) return c;
    d_.reference_->manager().EnforceEvictionPolicy();
    if (Check c = d_.reference_->FinishCall("EnforceEvictionPolicy", &pc())) return c;
    if (audit) {
      if (Check c = d_.reference_->CheckTrie(pc(), "the eviction pass between sessions")) return c;
    }
    size_t first = 0;  // the entry's first slot in `slots`
    for (size_t i = 0; i < held.size(); ++i) {
      const auto [node, count] = held[i];
      const std::vector<SnapshotPtr>& now = node->snapshots();
      bool same = now.size() == count;
      for (size_t j = 0; same && j < count; ++j) same = now[j].get() == slots[first + j];
      if (!same) {
        return Mismatch{
            fmt::format("active path entry {} of {} ({})", i, held.size(), DescribeNode(*node)),
            fmt::format("its {} snapshot(s) untouched by eviction", count),
            fmt::format("{} snapshot slot(s), changed", now.size())};
      }
      first += count;
    }
    return std::nullopt;
  }

  // An ordinary forward of stored tokens [pos, pos + n) through the live caches.
  Check ForwardLive(int64_t pos, int64_t n) {
    KV_CHECK(pos == static_cast<int64_t>(d_.live_.size()), "forward away from the live offset");
    const std::span<const model::Token> tokens(stored_.data() + pos, static_cast<size_t>(n));
    if (Check c = Forward(tokens, nullptr)) return c;
    d_.live_.insert(d_.live_.end(), tokens.begin(), tokens.end());
    d_.reference_->manager().Forward(tokens);
    return std::nullopt;
  }

  // A step's forward: the current token at `pos`, its accepted drafts, then the rejected ones.
  model::TokenLog StepTokens(int64_t pos, const SpeculativeStep& spec) const {
    model::TokenLog tokens(stored_.begin() + pos, stored_.begin() + pos + 1 + spec.accepted);
    for (const int32_t t : spec.rejected) tokens.push_back({t, NextHash(tokens.back().h, t)});
    return tokens;
  }

  std::vector<LayerCache*> LiveCaches() const {
    std::vector<LayerCache*> live;
    for (LayerCache* c : d_.Caches()) {
      if (c != nullptr) live.push_back(c);
    }
    return live;
  }

  // [current, accepted drafts, rejected drafts] through BeginSpeculation, commit a + 1.
  Check ForwardSpeculative(int64_t pos, const SpeculativeStep& spec) {
    const model::TokenLog tokens = StepTokens(pos, spec);
    ++d_.steps_;
    Result<Speculation> s = BeginSpeculation(LiveCaches());
    if (!s.ok()) return StatusIsOk(s.status(), "BeginSpeculation");
    if (Check c = Forward(tokens, &*s)) return c;
    s->Commit(spec.accepted + 1);
    d_.live_.insert(d_.live_.end(), tokens.begin(), tokens.begin() + 1 + spec.accepted);
    d_.reference_->manager().CommitSpeculation(tokens, spec.accepted + 1);
    return std::nullopt;
  }

  // The step's tokens through isolated wrappers (a probe, spec §2.7) or committing ones
  // (an abandoned step), destroyed without a commit. Every history is checked as a
  // committing step's is; then every live row and buffer, not only the rows the next forward
  // would read: an isolated speculation must leave the caches as they were, a dropped one as
  // a commit of nothing would (spec §2.6 item 5), the current token unforwarded, where the
  // close that follows expects it.
  Check ForwardDropped(int64_t pos, const SpeculativeStep& spec, bool isolated) {
    phase_ = {isolated ? "isolated speculation at {}" : "abandoned speculation at {}", {pos}};
    const model::TokenLog tokens = StepTokens(pos, spec);
    ++d_.steps_;
    ++(isolated ? d_.coverage_.isolated_probes : d_.coverage_.abandoned_steps);
    {
      Result<Speculation> s =
          isolated ? BeginIsolatedSpeculation(LiveCaches()) : BeginSpeculation(LiveCaches());
      if (!s.ok()) {
        return StatusIsOk(s.status(), isolated ? "BeginIsolatedSpeculation" : "BeginSpeculation");
      }
      if (Check c = Forward(tokens, &*s)) return c;
    }
    // A full KV layer wrote a dropped step's drafts through (its buffer may have grown a
    // step) and rewound; an isolated speculation changes nothing and has no call.
    if (!isolated) d_.reference_->manager().CommitSpeculation(tokens, 0);
    phase_ = {
        isolated ? "after the isolated speculation at {}" : "after the abandoned speculation at {}",
        {pos}};
    return CheckLive();
  }

  // Every live row of every cache against the log; a pass also covers the history rows
  // that forwards since the last full check trusted.
  Check CheckLive() {
    if (Check c = CheckLiveSoundness(d_.Caches(), d_.oracle_ptrs_, d_.live_)) return c;
    // The reference manager's live caches went through the same switches, restores and
    // frees, so they know what the log cannot: the buffers' sizes and the schedule flag.
    if (Check c = CheckLiveBuffersAgainst(d_.Caches(), d_.oracle_ptrs_,
                                          d_.reference_->manager().caches())) {
      return c;
    }
    d_.history_skips_ = 0;
    return std::nullopt;
  }

  // One forward of `tokens` at the live offset through every stateful layer, or through
  // the speculation's wrappers; the attention history of each is checked.
  Check Forward(std::span<const model::Token> tokens, Speculation* spec) {
    ++d_.steps_;
    const auto start = static_cast<int64_t>(d_.live_.size());
    const auto n = static_cast<int64_t>(tokens.size());
    d_.forwarded_tokens_ += n;  // audit credit (RequestDriver::StartCall)
    ++d_.coverage_.forwards;
    // A speculative forward's history may be the wrapper's own buffer: read it all.
    const int64_t trusted = spec == nullptr ? d_.TrustedHistoryRows(start, n) : 0;
    // The log through the forward is the live log with the tokens appended for the checks
    // and taken off again (the caller appends what the forward committed): a copy of the
    // whole log per forward was quadratic over a long prefill.
    d_.live_.insert(d_.live_.end(), tokens.begin(), tokens.end());
    Check c = CheckedForward(tokens, spec, start, trusted);
    d_.live_.resize(static_cast<size_t>(start));
    if (!c && trusted == 0) d_.history_skips_ = 0;
    return c;
  }

  Check CheckedForward(std::span<const model::Token> tokens, Speculation* spec, int64_t start,
                       int64_t trusted) {
    const model::TokenLog& after = d_.live_;
    const auto n = static_cast<int64_t>(tokens.size());
    size_t wrapper = 0;
    for (size_t i = 0; i < d_.caches_.size(); ++i) {
      if (d_.caches_[i] == nullptr) continue;
      LayerCache& target = spec != nullptr ? spec->layer(wrapper++) : *d_.caches_[i];
      if (target.kind() != d_.caches_[i]->kind()) {  // a wrapper stands in for its layer
        return Mismatch{fmt::format("layer {} speculation wrapper kind", i),
                        CacheKindName(d_.caches_[i]->kind()), CacheKindName(target.kind())};
      }
      const History history = ForwardSynthetic(
          target, d_.config_, d_.synth_, static_cast<int32_t>(i), start, tokens,
          &d_.conv_weights_[i], &d_.gdn_params_[i], 0, false, &d_.forward_scratch_);
      if (target.kind() == CacheKind::kRecurrent) {
        const RecurrentForwardScratch& k = d_.forward_scratch_.kernels;
        if (Check c =
                d_.oracles_[i]->CheckRecurrentOutputs(k.conv.out, k.scan.y, after, start, n)) {
          c->what = fmt::format("layer {} outputs: {}", i, c->what);
          return c;
        }
        continue;
      }
      d_.Fold(static_cast<uint64_t>(history.length));
      const HistorySource source =
          spec != nullptr ? HistorySource::kSpeculation : HistorySource::kWrite;
      if (Check c = d_.oracles_[i]->CheckHistory(history, after, start, n, Op{}, trusted, source)) {
        c->what = fmt::format("layer {} history: {}", i, c->what);
        return c;
      }
    }
    return std::nullopt;
  }

  RequestDriver& d_;
  const RequestPlan& plan_;
  // PrefillCaptureOffsetsInto of the plan (the driver's buffer): scheduled once, and offered
  // again by every refused SchedulePrefillSnapshots probe.
  std::vector<int64_t>& capture_offsets_;
  model::TokenLog& stored_;  // inputs then outputs, with provenance hashes
  // Where the session is, for a report: a literal, or a format with the step's numbers,
  // rendered only then (a passing run formatted one per prefill chunk and decode step).
  struct Phase {
    const char* format = "";
    int64_t args[3] = {0, 0, 0};
    int count = 0;
    Phase() = default;
    Phase(const char* literal) : format(literal) {}  // NOLINT(google-explicit-constructor)
    Phase(const char* f, std::initializer_list<int64_t> a)
        : format(f), count(static_cast<int>(a.size())) {
      KV_CHECK(a.size() <= 3, "a phase has at most three numbers");
      std::copy(a.begin(), a.end(), args);
    }
    std::string Render() const {
      const auto f = fmt::runtime(format);
      switch (count) {
        case 0:
          return format;
        case 1:
          return fmt::format(f, args[0]);
        case 2:
          return fmt::format(f, args[0], args[1]);
        default:
          return fmt::format(f, args[0], args[1], args[2]);
      }
    }
  };
  Phase phase_;
  BeginReport report_;
  model::RefSession rules_;  // the session contract's state: closed until Begin succeeds
  ManagerState &probe_before_, &probe_after_;  // ProbeMisuse scratch
  bool cancelled_ = false;
  // This request's budget; the largest int64 without one (the counter never exceeds it).
  int64_t budget_bytes_ = std::numeric_limits<int64_t>::max();
};

void StoredTokensInto(const RequestPlan& plan, uint64_t hash_seed, model::TokenLog& stored) {
  stored.clear();
  stored.reserve(plan.inputs.size() + plan.outputs.size());
  uint64_t h = hash_seed;
  for (const std::vector<int32_t>* part : {&plan.inputs, &plan.outputs}) {
    for (const int32_t t : *part) {
      h = NextHash(h, t);
      stored.push_back({t, h});
    }
  }
}

void PrefillCaptureOffsetsInto(const RequestDriverOptions& options, const RequestPlan& plan,
                               std::vector<int64_t>& requested) {
  const auto len = static_cast<int64_t>(plan.inputs.size());
  requested.assign(plan.user_offsets.begin(), plan.user_offsets.end());
  for (int64_t p = options.capture_interval; options.capture_interval > 0 && p <= len;
       p += options.capture_interval) {
    requested.push_back(p);
  }
  if (options.pre_thinking > 0 && len - options.pre_thinking > 0) {
    requested.push_back(len - options.pre_thinking);
  }
}

std::optional<RequestDivergence> RequestDriver::Run(const RequestPlan& plan) {
  last_request_ = plan.index;
  Session session(*this, plan);
  std::optional<RequestDivergence> divergence = session.Run();
  if (!divergence && options_.after_request) options_.after_request(*manager_, plan.index);
  return divergence;
}

std::optional<RequestDivergence> RequestDriver::FinalAudit() {
  Fold(TrieDigest());
  if (audit_) return std::nullopt;  // the last call (or none) was audited
  Check c = CheckWholeTrie();
  if (!c) c = reference_->CheckTrie(*manager_, "the last session call");
  if (!c) return std::nullopt;
  return RequestDivergence{steps_,
                           last_request_,
                           "final audit (its last call was unaudited)",
                           fmt::format("(the run ended after request #{})", last_request_),
                           *c,
                           unaudited_calls_,
                           ""};
}

}  // namespace kvtwin::sim
