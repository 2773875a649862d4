// RequestDriver: runs requests through a PrefixCache over a real layer stack, the way an
// inference server drives it (spec §3.4): Begin -> SchedulePrefillSnapshots -> chunked
// prefill of inputs[cached : len-1] -> AttachPrefillSnapshots -> decode (the seed, then
// every sampled token but the last, optionally with speculative steps through
// BeginSpeculation) with AddOutputs -> Close; a cancelled request closes after part of
// its prefill without the attach or any decode (its outputs, if any, are never used). Rows come
// from the synthetic forward (sim/synthetic.h), so every row carries the provenance of the prefix
// that produced it.
//
// After every session call it checks (spec §4.2, §5.4):
//   Begin   the report (cached <= matched <= len, cached <= len - 1, left == len - cached)
//           against ExpectBegin (matched, cached, free-all and the active path, computed
//           beforehand from the trie and reference caches); the caches aligned at cached
//           and holding exactly inputs[0 : cached]; a continuation of the previous session
//           resumes at least at its frontier (exactly at matched when the match ends there);
//   Attach  and after Begin and Close: trie structure, soundness of every snapshot, and the
//           eviction bound under a budget (every point where an eviction pass may have run);
//   decode  the attention history of every forward (rows and visible positions);
//   Close   the caches held exactly the stored tokens before it, and the active path ends at
//           the offset afterwards.
// Whole-trie checks (structure, soundness of every snapshot, the reference trie, the census)
// cost O(trie) per session call, which is quadratic over a long trace. (Eviction passes are
// checked on every call: a pass walks the trie per victim, so its check costs about what the
// pass does.)
// They run on every call while the trie has at most kAuditAlwaysNodes nodes (every sweep and
// fuzz target stays there); beyond, a call is "audited" when the credit it earned covers
// the trie: a call earns kAuditTokensPerCall plus the tokens forwarded since the previous
// call, and an audit costs kAuditTokensPerNode per node (a call under a budget of 0 is always
// audited). An audit's node visit reads the
// node, its children's edges and every snapshot's rows (and the reference trie's node),
// and costs about as much as eight forwarded tokens of production work (perf, the Mooncake
// trace at block scale 1: 1.4 us against 0.18 us), so the audits during a run cost at most
// about as much time as the production work that earned them. FinalAudit audits the end
// of a run. A divergence found after unaudited calls carries their number, and the
// callers (replay, requests, the prefix fuzz target) re-run with audit_every_call to
// report the first call at which an audit fails: the run is deterministic, the checks
// only read production state and nothing the workload does depends on the schedule (the
// squeeze's clock edits follow the trie's size), so this costs time only on a failure. The report
// and live soundness checks run on every call, and every forward's history is checked. A forward's
// history rows before the write were verified when they were written and by every later full check,
// so on a full KV layer past kHistoryAlwaysRows they are re-read on the same kind of credit
// (kHistoryRowsPerToken per forwarded token), the new rows and every row's visibility always; each
// live check at a session call reads every row again. Forwards that trusted rows count as unaudited
// until the next full check passes, so a divergence after them is localized the same way
// (audit_every_call checks every row). The reference manager (sim/manager_reference.h) runs in lock
// step at every budget: every session call must leave exactly its trie, active path and pending
// offsets, and under a budget it runs the eviction policy at its own points over production's
// snapshot sizes. Under a budget every eviction pass that evicts must also give, right when it
// ends, exactly the reference pass's trie with its sizes (sim/eviction_reference.h). The first
// failure is returned as a RequestDivergence; the driver then must not be used. Every observable is
// folded into a digest. Single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/ref_cache.h"
#include "sim/cache_calls.h"
#include "sim/checks.h"
#include "sim/eviction_reference.h"
#include "sim/forward.h"
#include "sim/manager_reference.h"
#include "sim/request_workload.h"
#include "sim/stack.h"
#include "sim/synthetic.h"
#include "sim/trie_checks.h"
#include "src/kernels.h"
#include "src/prefix_cache.h"

namespace kvtwin::sim {

struct RequestDivergence {
  int64_t step = 0;     // session calls and forwards before the failing check
  int64_t request = 0;  // index of the request in the run
  std::string phase;    // "after Begin", "prefill chunk 2", ...
  std::string request_summary;
  Mismatch mismatch;
  // Session calls since the last audit that passed which the amortized schedule did not
  // audit (the failing call included). When > 0, auditing every call might have found an
  // earlier divergence: callers re-run with RequestDriverOptions::audit_every_call.
  int64_t unaudited_calls = 0;
  std::string note;              // LocalizedNote after a localizing re-run, else empty
  std::string ToString() const;  // multi-line human report (the note on its last line)
};

// The last report line of a divergence a re-run with every call audited localized: the
// amortized run failed at request (or event) `found_at` after `unaudited_calls` skipped
// audits.
std::string LocalizedNote(int64_t found_at, int64_t unaudited_calls);

// How often the workload reached each mechanism (approximate where noted).
struct RequestCoverage {
  int64_t completed = 0, cancelled = 0, cache_hits = 0;
  int64_t extensions = 0, dropped_tails = 0, divergent = 0, new_conversations = 0;
  int64_t repeats = 0, retries = 0, user_offsets = 0, unscheduled = 0, speculative = 0;
  // Speculations run through isolated wrappers and dropped (SpeculativeStep::probe), and
  // steps abandoned without a commit.
  int64_t isolated_probes = 0, abandoned_steps = 0;
  // Budgets changed while a session was open (RequestPlan::budget_pct_after_prefill).
  int64_t session_budgets = 0;
  // Closes with every stored token forwarded (unforwarded 0), and with two or more sampled
  // tokens never forwarded (reported past a stop).
  int64_t forwarded_last = 0, past_stop = 0;
  // Continuations of the previous session (its stored tokens then more) under the
  // property's condition, and those that resumed with cached == matched.
  int64_t continuations = 0, resumed_exactly = 0;
  int64_t branch_points = 0, free_all = 0;
  // Begins whose matched path has a node without a KV snapshot in some KV layer (left by
  // a caller that scheduled no captures while eviction removed the path): page-in can
  // stop on a KV layer there. Counted before the Begin's checks, like the two below.
  int64_t kv_gaps = 0;
  // Begins whose page-in stopped at a refused restore while a page-in going on past it
  // would have restored more (BeginExpectation::pagein_cut): a recurrent or window restore
  // refused mid-path, or a KV one at a gap.
  // Of them, cut at a full KV layer's restore without its base (after a KV gap). Both are
  // counted before the Begin's checks, so a divergence there counts too.
  int64_t cut_pageins = 0, kv_cut_pageins = 0;
  // Rotating and recurrent snapshots a node kept beside a capture attached there, which the
  // manager re-installs as copies (only after a snapshot-less node merged into its child:
  // rare in every seeded stream; traces/regress/attach-beside-kept-whole-states-*).
  int64_t whole_state_copies = 0;
  // From comparing the trie before and after each session call (node identity = the
  // provenance hash of its key path at its end): a node whose start moved up was split;
  // a vanished node off the active key path was evicted.
  int64_t splits = 0, evictions = 0;
  // Eviction passes that evicted, each checked against the reference pass.
  int64_t eviction_passes = 0;
  int64_t largest_eviction_pass = 0;  // the most victims of one checked pass
  // Session calls, and those that ran the whole-trie checks (all while the trie is small).
  int64_t calls = 0, audited_calls = 0;
  // Forwards, and those that left history rows to the amortized schedule (long contexts).
  int64_t forwards = 0, trusting_forwards = 0;
  std::string ToString() const;
  // "completed=3 cancelled=0 ...": every counter by name (Fields), one line.
  std::string Counters() const;
  RequestCoverage& operator+=(const RequestCoverage& o);
  // Every counter by its member's name ("completed", ...), in declaration order.
  struct Field {
    const char* name;
    int64_t RequestCoverage::*member;
  };
  static const std::vector<Field>& Fields();
};

struct RequestDriverOptions {
  int64_t budget_bytes = 0;  // 0: unlimited
  int64_t chunk = 5;
  int64_t capture_interval = 8;  // 0: no periodic captures
  int64_t pre_thinking = 4;      // 0: no capture at len - pre_thinking
  // Every session call runs the whole-trie checks, whatever the trie's size: the re-run
  // that localizes a divergence found after unaudited calls (quadratic on a large trie).
  bool audit_every_call = false;
  // A test seam: called after every request that passed, with the production manager and
  // the request's index. A fault planted here as a function of the index is planted again
  // by a localizing re-run, like a bug in production code.
  std::function<void(PrefixCache&, int64_t)> after_request;
  // Attention re-checks by these counts (ShapeRunCounts, sim/checks.h; not owned): a fuzz
  // session's many short runs. Null: the first forward of each shape in the run.
  ShapeRunCounts* shape_run_counts = nullptr;
};

// The offsets a request's SchedulePrefillSnapshots asks for: the plan's user offsets, then
// every capture_interval-th position up to the prompt length, then len - pre_thinking.
// Into `requested` (replaced), keeping its capacity.
void PrefillCaptureOffsetsInto(const RequestDriverOptions& options, const RequestPlan& plan,
                               std::vector<int64_t>& requested);
// The request's stored tokens, inputs then outputs, with their provenance hashes from
// `hash_seed` (WithHashes of the concatenation, without building it), into `stored`
// (replaced, its capacity kept).
void StoredTokensInto(const RequestPlan& plan, uint64_t hash_seed, model::TokenLog& stored);

class RequestDriver {
 public:
  // REQUIRES: config.Validate().ok(); chunk >= 1.
  RequestDriver(StackConfig config, RequestDriverOptions options, uint64_t value_seed);
  ~RequestDriver();

  // Runs one request; returns the first divergence. REQUIRES: no divergence before; the
  // plan's speculative steps are sorted, apart and within its outputs (RequestPlan).
  std::optional<RequestDivergence> Run(const RequestPlan& plan);
  // At the end of a run: the whole-trie checks (structure, soundness, the reference trie)
  // when the last session call was not audited, so every run ends audited and a divergence
  // the amortized schedule skipped still fails the run (then localized by the caller).
  // Also folds the final trie (TrieDigest) into the digest. REQUIRES: no divergence before.
  std::optional<RequestDivergence> FinalAudit();

  uint64_t digest() const { return digest_; }
  // Forwards whose attention arithmetic was checked, over every layer.
  int64_t attention_checks() const;
  int64_t steps() const { return steps_; }
  const RequestCoverage& coverage() const { return coverage_; }
  const PrefixCache& manager() const { return *manager_; }
  // "cached 12/40 matched 15" of the last Begin, for the recent-request list.
  const std::string& last_outcome() const { return last_outcome_; }
  // The trie as text (DumpTrie) and DOT (TrieToDot). After a divergence the active path
  // may name freed nodes (a faulty eviction), so it is left out then.
  struct TrieDumps {
    std::string text, dot;
  };
  TrieDumps DumpTries(bool diverged) const;
  // The last Begin report (zeros before the first).
  const BeginReport& last_report() const { return last_report_; }

 private:
  class Session;  // one request's run (request_session.cc)
  // The trie reduced to what survives a structural change: each node named by the
  // provenance hash of its key path at its end (unique per path), with its start; plus the
  // hashes at every position of the active key path.
  // Sorted vectors rather than trees: a census is taken after every audited call, and a
  // node per entry was most of a prefix fuzz execution's allocations.
  struct Census {
    std::vector<std::pair<uint64_t, int64_t>> start_by_end;  // sorted by end hash
    std::vector<uint64_t> active_key_path;                   // sorted
  };

  static constexpr int64_t kHistoryAlwaysRows = 1024;
  static constexpr int64_t kHistoryRowsPerToken = 32;
  static constexpr int64_t kAuditAlwaysNodes = 128;
  static constexpr int64_t kAuditTokensPerCall = 2;
  static constexpr int64_t kAuditTokensPerNode = 8;
  // Starts a session call; returns (and remembers) whether it is audited.
  bool StartCall();
  // How many leading history rows a forward of `n` tokens at offset `start` may leave
  // unread (0: read them all); counts a forward that trusts any as unaudited.
  int64_t TrustedHistoryRows(int64_t start, int64_t n);

  // caches_ as raw pointers (null holes stay null), kept rather than rebuilt per call.
  std::span<LayerCache* const> Caches() const { return cache_ptrs_; }
  // What the manager is given: the caches behind LoggedCaches that log into manager_calls_
  // (null holes stay null).
  std::vector<LayerCache*> ManagerCaches() const;
  int64_t MinCacheOffset() const;  // the least offset of the stateful caches (-1: none)
  // Structure and soundness of the whole trie (the first two of an audit's checks), in one
  // walk that also takes the nodes of the next census (census_next_.start_by_end).
  Check CheckWholeTrie();
  std::vector<std::optional<model::RefCache>> Shadows() const;
  // Completes census_next_ from this call's CheckWholeTrie (the nodes) and the active path.
  void TakeCensus();
  // After an audited call (whose CheckWholeTrie passed): counts the changes since the previous
  // audited call's census (splits and evictions, approximate: a node that came and went between two
  // audits is not seen) and keeps the new census.
  void UpdateCensus();
  void CountChanges(const Census& before, const Census& after);
  void Fold(uint64_t value);
  // The budget of the production manager and of the reference alike.
  void SetBudget(int64_t bytes);
  // A hash of everything DumpTrie shows (structure, keys, ticks, bytes, slot kinds and
  // ranges, user flags, the active path), folded field by field with no text.
  uint64_t TrieDigest() const;

  StackConfig config_;
  RequestDriverOptions options_;
  SyntheticForward synth_;
  std::vector<std::unique_ptr<LayerCache>> caches_;
  std::vector<LayerCache*> cache_ptrs_;   // Caches()
  std::vector<CacheCall> manager_calls_;  // the manager's Restore and Free calls since Begin
  std::vector<std::unique_ptr<LoggedCache>> logged_;  // one per cache (null for a hole)
  std::vector<std::unique_ptr<LayerOracle>> oracles_;
  std::vector<LayerOracle*> oracle_ptrs_;
  std::vector<ConvWeights> conv_weights_;
  std::vector<GdnParams> gdn_params_;
  std::unique_ptr<PrefixCache> manager_;
  std::unique_ptr<ManagerReference> reference_;
  std::unique_ptr<EvictionReference> eviction_ref_;  // under a budget only
  model::TokenLog live_;            // what every cache holds: positions [0, offset)
  ForwardScratch forward_scratch_;  // every forward's input buffers
  // The previous session: the tokens it stored and the offset it closed at.
  std::vector<int32_t> previous_stored_;
  int64_t previous_offset_ = 0;
  int64_t steps_ = 0;
  uint64_t digest_ = 0;
  RequestCoverage coverage_;
  std::string last_outcome_;
  BeginReport last_report_;
  Census census_;       // at the last audited call, if has_census_
  Census census_next_;  // UpdateCensus's scratch
  bool has_census_ = false;
  bool census_walked_ = false;  // census_next_'s nodes are this call's (CheckWholeTrie)
  int64_t audit_credit_ = 0;
  int64_t history_credit_ = 0;  // rows a full history check may read (TrustedHistoryRows)
  int64_t history_skips_ = 0;   // forwards that trusted rows since the last full check
  // The budget last set (SetBudget), and the one in force at production's last policy
  // point, which is what the eviction bound holds to.
  int64_t budget_ = std::numeric_limits<int64_t>::max();
  int64_t point_budget_ = std::numeric_limits<int64_t>::max();
  int64_t unaudited_calls_ = 0;   // since the last audited call (RequestDivergence)
  int64_t forwarded_tokens_ = 0;  // since the last call started (StartCall)
  int64_t last_request_ = -1;     // the index of the last plan run (FinalAudit)
  bool audit_ = true;
  AuditScratch audit_scratch_;                 // CheckWholeTrie's buffers and soundness memo
  std::vector<NodeSketch> begin_path_sketch_;  // Session::Begin's expected active path
  // Session::Squeeze's scratch: each active-path node with its slot count, and the slots,
  // flat, as they were before the pass.
  std::vector<std::pair<TrieNode*, size_t>> squeeze_held_;
  std::vector<const CacheSnapshot*> squeeze_slots_;
  // One Session runs at a time; its per-request buffers live here so they outlive it: the
  // plan's capture offsets, its stored tokens, and what ProbeMisuse observes of the manager
  // (the pending captures and each cache's offset and schedule) before and after a probe.
  std::vector<int64_t> session_capture_offsets_;
  model::TokenLog session_stored_;
  struct ManagerState {
    std::vector<std::pair<int64_t, bool>> pending;
    std::vector<std::pair<int64_t, bool>> caches;
    int64_t nodes = 0, bytes = 0;
    size_t path = 0, calls = 0;
    bool operator==(const ManagerState&) const = default;
  };
  ManagerState probe_before_, probe_after_;
};

}  // namespace kvtwin::sim
