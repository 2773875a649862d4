// Shared fixture of the PrefixCache tests: the λ = 0 layer stacks of spec §6.10 / §6.11 over
// real caches, a request driver that follows spec §3.4 to the letter, and checkers that
// re-derive every §4.2 invariant plus the content of every snapshot and live cache.
//
// Values are recognisable by (position, token): a K row written at position p for token t
// is tagged p * kTagStride + t (V = -tag), and recurrent conv / scan inputs are waves of
// both p and t. So a snapshot or live row taken on the wrong branch shows even when the
// positions agree. A recurrent snapshot is compared with a twin RecurrentCache forwarded
// from scratch over exactly the tokens of its node's key path (stated tolerance from
// speculation_fixtures.h). Every manager cache is wrapped in a RecordingCache whose log
// shows the restores / frees / snapshots the manager issued, for step-by-step traces.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "src/kv_cache.h"
#include "src/prefix_cache.h"
#include "src/recurrent_cache.h"
#include "src/recurrent_forward.h"
#include "src/rotating_cache.h"
#include "src/trie_export.h"
#include "unit/speculation_fixtures.h"
#include "unit/tagged_rows.h"
#include "unit/trie_soundness.h"

namespace kvtwin::pcfx {

using Tokens = std::vector<int32_t>;

inline constexpr int64_t kTagStride = 4096;  // tokens stay below; tags exact in float32
inline constexpr int64_t kWindow = 4;        // the SlidingWindow env's W (Go: maxSize 4)

inline float Tag(int64_t position, int32_t token) {
  return static_cast<float>(position * kTagStride + token);
}

inline Tokens Seq(int32_t first, int32_t last) {
  Tokens t;
  for (int32_t v = first; v <= last; ++v) t.push_back(v);
  return t;
}

inline Tokens Cat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Short text for logs: "kv[0,9)", "rot@9", "rec@9".
inline std::string SnapName(const CacheSnapshot* s) {
  if (s == nullptr) return "null";
  const std::string to = std::to_string(s->to());
  switch (s->kind()) {
    case CacheKind::kFullKv:
      return "kv[" + std::to_string(s->from()) + "," + to + ")";
    case CacheKind::kRotating:
      return "rot@" + to;
    case CacheKind::kRecurrent:
      return "rec@" + to;
  }
  return "?";
}

// Forwards the cache contract to a real cache and logs what the manager asked of it. Two
// injectable refusals stand in for cache kinds the λ = 0 stacks lack (a layer that cannot
// rewind live, or rejects a snapshot), to reach the manager's fallback paths.
class RecordingCache final : public LayerCache {
 public:
  explicit RecordingCache(LayerCache& inner) : inner_(inner) {}
  CacheKind kind() const override { return inner_.kind(); }
  int64_t Offset() const override { return inner_.Offset(); }
  int64_t LiveBytes() const override { return inner_.LiveBytes(); }
  void Free() override {
    log_.push_back("free");
    inner_.Free();
  }
  SnapshotPtr Snapshot(int64_t from) override {
    SnapshotPtr s = inner_.Snapshot(from);
    log_.push_back("snapshot(" + std::to_string(from) + ")=" + SnapName(s.get()));
    return s;
  }
  Status PrepareSnapshots(const std::vector<int64_t>& offsets) override {
    std::string text = "prepare[";
    for (size_t i = 0; i < offsets.size(); ++i) {
      text += (i > 0 ? "," : "") + std::to_string(offsets[i]);
    }
    log_.push_back(text + "]");
    return inner_.PrepareSnapshots(offsets);
  }
  std::vector<SnapshotPtr> TakeSnapshots() override { return inner_.TakeSnapshots(); }
  bool ScheduleActive() const override { return inner_.ScheduleActive(); }
  bool Restore(const CacheSnapshot* snap, int64_t target) override {
    bool refused = refuse_snapshot_restores > 0;
    if (snap == nullptr) {
      refused = refuse_live_rewind && target != inner_.Offset();
    } else if (refused) {
      --refuse_snapshot_restores;
    }
    const bool ok = !refused && inner_.Restore(snap, target);
    log_.push_back("restore(" + SnapName(snap) + "," + std::to_string(target) +
                   ")=" + (ok ? "ok" : "refused"));
    return ok;
  }
  SnapshotPtr Merge(SnapshotPtr parent, SnapshotPtr child) override {
    return inner_.Merge(std::move(parent), std::move(child));
  }
  std::pair<SnapshotPtr, SnapshotPtr> Split(SnapshotPtr snap, int64_t at) override {
    return inner_.Split(std::move(snap), at);
  }
  // The log since the last call, cleared.
  std::vector<std::string> TakeLog() { return std::exchange(log_, {}); }

  bool refuse_live_rewind = false;   // Restore(null, t) only at the current offset
  int refuse_snapshot_restores = 0;  // the next n Restore(snapshot, t) calls are refused

 private:
  LayerCache& inner_;
  std::vector<std::string> log_;
};

enum class EnvKind { kTransformer, kSlidingWindow, kRecurrent, kStatelessLayers, kHybrid };

inline std::string EnvName(EnvKind kind) {
  switch (kind) {
    case EnvKind::kTransformer:
      return "Transformer";
    case EnvKind::kSlidingWindow:
      return "SlidingWindow";
    case EnvKind::kRecurrent:
      return "Recurrent";
    case EnvKind::kStatelessLayers:
      return "StatelessLayers";
    case EnvKind::kHybrid:
      return "Hybrid";
  }
  return "?";
}

// Recurrent forward inputs for `tokens` written from position `first`: waves of the
// position and of the token, so a different token at the same position differs.
inline RecurrentForwardInputs TokenRows(int64_t first, std::span<const int32_t> tokens) {
  const RecurrentDims d = specfx::Dims();
  const int64_t rows = static_cast<int64_t>(tokens.size());
  MatF conv(rows, d.conv_dim());
  RecurrentForwardInputs in;
  in.scan.qkv = MatF(rows, d.conv_dim());
  in.scan.ba = MatF(rows, 2 * d.num_v_heads);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = first + r;
    const float t = 0.0917f * static_cast<float>(tokens[static_cast<size_t>(r)]);
    for (int64_t c = 0; c < d.conv_dim(); ++c) conv(r, c) = specfx::Wave(p, c, 0.37f, 0.3f + t);
    for (int64_t c = 0; c < d.conv_dim(); ++c) {
      in.scan.qkv(r, c) = specfx::Wave(p, c, 0.53f, 1.0f - t);
    }
    for (int64_t c = 0; c < 2 * d.num_v_heads; ++c) {
      in.scan.ba(r, c) = 2.0f * specfx::Wave(p, c, 0.29f, 2.0f + 0.5f * t);
    }
  }
  in.conv_inputs = Tensor::FromFloat(DType::kBFloat16, conv);
  in.real_len = rows;
  return in;
}

// What a request did, as the Go tests read it.
struct RequestResult {
  BeginReport report;
  size_t pending_at_begin = 0;  // branch points Begin queued
};

class PrefixEnv {
 public:
  explicit PrefixEnv(EnvKind kind) : kind_(kind) {
    using K = CacheKind;
    switch (kind) {
      case EnvKind::kTransformer:
        Build({K::kFullKv});
        break;
      case EnvKind::kSlidingWindow:
        Build({K::kFullKv, K::kRotating});
        break;
      case EnvKind::kRecurrent:
        Build({K::kFullKv, K::kRecurrent});
        break;
      case EnvKind::kStatelessLayers:
        Build({K::kRecurrent, std::nullopt, K::kFullKv, std::nullopt});
        break;
      case EnvKind::kHybrid:
        Build({K::kRecurrent, K::kFullKv, K::kRecurrent, K::kFullKv});
        break;
    }
    pc_ = std::make_unique<PrefixCache>(managed_);
  }

  PrefixCache& pc() { return *pc_; }
  const PrefixTrie& trie() const { return pc_->trie(); }
  EnvKind kind() const { return kind_; }
  // Every cache can rewind live to any offset (spec §6.10 "rewindable").
  bool rewindable() const { return kind_ == EnvKind::kTransformer; }
  size_t num_layers() const { return inner_.size(); }
  LayerCache* layer(size_t i) const { return inner_[i].get(); }  // null = stateless
  RecordingCache& recorder(size_t i) const { return *recorders_.at(i); }
  std::vector<size_t> KvLayers() const { return LayersOf(CacheKind::kFullKv); }
  std::vector<size_t> LayersOf(CacheKind kind) const {
    std::vector<size_t> out;
    for (size_t i = 0; i < inner_.size(); ++i) {
      if (inner_[i] != nullptr && inner_[i]->kind() == kind) out.push_back(i);
    }
    return out;
  }
  int64_t Offset() const {
    for (const auto& c : inner_) {
      if (c != nullptr) return c->Offset();
    }
    return 0;
  }
  std::string Dump() const { return DumpTrie(pc_->trie(), pc_->active_path()); }

  // One forward of `tokens` through every stateful layer from its current offset (one
  // batched write per layer, as a prefill chunk).
  void Feed(std::span<const int32_t> tokens) {
    if (tokens.empty()) return;
    for (const auto& c : inner_) {
      if (c == nullptr) continue;
      const int64_t first = c->Offset();
      if (auto* rec = dynamic_cast<RecurrentCache*>(c.get())) {
        RunRecurrentForward(*rec, TokenRows(first, tokens), kernels_.conv, kernels_.gdn);
        continue;
      }
      std::vector<float> tags;
      for (size_t r = 0; r < tokens.size(); ++r) {
        tags.push_back(Tag(first + static_cast<int64_t>(r), tokens[r]));
      }
      dynamic_cast<AttentionCache&>(*c).Update(tagged::Keys(tags), tagged::Values(tags));
    }
  }
  // Decode: one single-token forward per token.
  void FeedEach(std::span<const int32_t> tokens) {
    for (size_t i = 0; i < tokens.size(); ++i) Feed(tokens.subspan(i, 1));
  }

  // ---- checkers ------------------------------------------------------------------------

  // Every stateful cache at the same offset.
  ::testing::AssertionResult Aligned() const {
    for (const auto& c : inner_) {
      if (c != nullptr && c->Offset() != Offset()) {
        return ::testing::AssertionFailure()
               << "caches disagree: " << c->Offset() << " vs " << Offset();
      }
    }
    return ::testing::AssertionSuccess();
  }

  // Every live cache holds exactly `tokens` (KV rows, window tail, recurrent state).
  ::testing::AssertionResult LiveHolds(const Tokens& tokens) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    for (size_t i = 0; i < inner_.size(); ++i) {
      LayerCache* c = inner_[i].get();
      if (c == nullptr) continue;
      if (c->Offset() != n) {
        return ::testing::AssertionFailure()
               << "layer " << i << " at offset " << c->Offset() << ", want " << n;
      }
      std::string why;
      if (auto* kv = dynamic_cast<KvCache*>(c)) {
        if (n > 0) why = RowsMatch(kv->keys().Rows(0, n), kv->values().Rows(0, n), 0, tokens);
      } else if (auto* rot = dynamic_cast<RotatingCache*>(c)) {
        const int64_t w = std::min(n, kWindow);
        const auto [k, v] = rot->LogicalTail(w);
        if (w > 0) why = RowsMatch(k, v, n - w, tokens);
      } else {
        const auto& rc = dynamic_cast<RecurrentCache&>(*c);
        if (n > 0) why = StateMatches(rc.conv(), rc.delta(), tokens);
      }
      if (!why.empty()) return ::testing::AssertionFailure() << "layer " << i << ": " << why;
    }
    return ::testing::AssertionSuccess();
  }

  // Spec §4.2: structure, siblings, counter (TrieIsSound); the active path is a root chain
  // ending at or below the caches (exactly at them when `at_offset`); every snapshot holds
  // exactly the content of its node's key path; with `kv_coverage` every non-root node has
  // a KV snapshot spanning exactly its edge in every KV layer.
  ::testing::AssertionResult TrieHolds(bool kv_coverage = true, bool at_offset = false) {
    ::testing::AssertionResult structure = TrieIsSound(trie());
    if (!structure) return structure << "\n" << Dump();
    const std::vector<TrieNode*>& path = pc_->active_path();
    std::string why;
    if (path.empty() || path.front() != trie().root()) why = "active path does not start at root";
    for (size_t i = 1; why.empty() && i < path.size(); ++i) {
      if (path[i]->parent() != path[i - 1]) why = "active path is not a parent chain";
    }
    if (why.empty() && path.back()->end_offset() > Offset()) why = "active path beyond caches";
    if (why.empty() && at_offset && path.back()->end_offset() != Offset()) {
      why = "active path ends at " + std::to_string(path.back()->end_offset()) + ", caches at " +
            std::to_string(Offset());
    }
    trie().Walk([&](TrieNode* n) {
      if (why.empty()) why = NodeProblem(*n, kv_coverage);
    });
    if (why.empty()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << why << "\n" << Dump();
  }

  // ---- the request of spec §6.10 / §3.4 -------------------------------------------------

  // begin -> schedule(user offsets) -> feed inputs[cached : len-1] -> attach -> (if any
  // generation) feed the seed and all generated tokens but the last -> close, checking
  // alignment, live content and the trie after every phase.
  RequestResult Request(const Tokens& inputs, const Tokens& generated,
                        const std::vector<int64_t>& user_offsets = {}) {
    RequestResult result;
    Result<BeginReport> begun = pc_->Begin(inputs);
    EXPECT_TRUE(begun.ok()) << begun.status().ToString();
    if (!begun.ok()) return result;
    result.report = begun.value();
    result.pending_at_begin = pc_->pending().size();
    const int64_t len = static_cast<int64_t>(inputs.size());
    const Tokens prompt_but_seed(inputs.begin(), inputs.end() - 1);
    const Tokens cached(inputs.begin(), inputs.begin() + result.report.cached);
    ExpectPhase("after begin", cached, /*at_offset=*/false);

    EXPECT_TRUE(pc_->SchedulePrefillSnapshots(user_offsets).ok());
    Feed(std::span(inputs).subspan(result.report.cached, len - 1 - result.report.cached));
    EXPECT_TRUE(pc_->AttachPrefillSnapshots().ok());
    ExpectPhase("after prefill", prompt_but_seed, false);

    Tokens history = prompt_but_seed;
    if (!generated.empty()) {
      EXPECT_TRUE(pc_->AddOutputs(generated).ok());
      FeedEach(std::span(inputs).last(1));
      FeedEach(std::span(generated).first(generated.size() - 1));
      history = Cat(inputs, Tokens(generated.begin(), generated.end() - 1));
    }
    ExpectPhase("before close", history, false);
    EXPECT_TRUE(pc_->Close().ok());
    ExpectPhase("after close", history, /*at_offset=*/history.size() > 0);
    return result;
  }

  void ExpectPhase(const std::string& label, const Tokens& live, bool at_offset) {
    SCOPED_TRACE(label);
    EXPECT_TRUE(Aligned());
    EXPECT_TRUE(LiveHolds(live));
    EXPECT_TRUE(TrieHolds(/*kv_coverage=*/true, at_offset));
  }

  // The key path root -> node as tokens.
  static Tokens PathTokens(const TrieNode& node) {
    std::vector<const TrieNode*> chain;
    for (const TrieNode* n = &node; n != nullptr; n = n->parent()) chain.push_back(n);
    Tokens tokens;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      for (const TrieKey k : (*it)->edge()) tokens.push_back(static_cast<int32_t>(k));
    }
    return tokens;
  }

  // The twin of a recurrent layer that forwarded exactly `tokens` from scratch.
  const RecurrentCache& Twin(const Tokens& tokens) {
    auto it = twins_.find(tokens);
    if (it != twins_.end()) return *it->second;
    auto twin = std::make_unique<RecurrentCache>(specfx::Dims());
    if (!tokens.empty()) {
      RunRecurrentForward(*twin, TokenRows(0, tokens), kernels_.conv, kernels_.gdn);
    }
    return *twins_.emplace(tokens, std::move(twin)).first->second;
  }

 private:
  void Build(const std::vector<std::optional<CacheKind>>& layout) {
    for (const std::optional<CacheKind>& k : layout) {
      std::unique_ptr<LayerCache> c;
      if (k == CacheKind::kFullKv) c = std::make_unique<KvCache>();
      if (k == CacheKind::kRotating) c = std::make_unique<RotatingCache>(kWindow);
      if (k == CacheKind::kRecurrent) c = std::make_unique<RecurrentCache>(specfx::Dims());
      recorders_.push_back(c != nullptr ? std::make_unique<RecordingCache>(*c) : nullptr);
      managed_.push_back(recorders_.back().get());
      inner_.push_back(std::move(c));
    }
  }

  // Rows tagged for positions [first, first + rows) of `tokens`, or why not.
  static std::string RowsMatch(TensorView k, TensorView v, int64_t first, const Tokens& tokens) {
    const std::vector<float> got = tagged::Tags(k, v, 0, k.rows());
    std::vector<float> want;
    for (int64_t p = first; p < first + k.rows(); ++p) {
      if (p >= static_cast<int64_t>(tokens.size())) return "rows beyond the token path";
      want.push_back(Tag(p, tokens[static_cast<size_t>(p)]));
    }
    if (got == want) return "";
    return "rows " + ::testing::PrintToString(got) + " want " + ::testing::PrintToString(want);
  }

  std::string StateMatches(const Tensor& conv, const MatF& delta, const Tokens& tokens) {
    const RecurrentCache& twin = Twin(tokens);
    if (!conv.Equals(twin.conv())) return "conv tail differs from the twin";
    const ::testing::AssertionResult near = specfx::DeltaNear(delta, twin.delta());
    return near ? "" : std::string("delta: ") + near.message();
  }

  std::string NodeProblem(const TrieNode& n, bool kv_coverage) {
    const std::string at = "node [" + std::to_string(n.start_offset()) + "," +
                           std::to_string(n.end_offset()) + ") layer ";
    if (n.is_root()) return n.HasSnapshots() ? "root holds snapshots" : "";
    const Tokens path = PathTokens(n);
    for (size_t i = 0; i < inner_.size(); ++i) {
      const CacheSnapshot* s = n.snapshot(i);
      if (inner_[i] != nullptr && inner_[i]->kind() == CacheKind::kFullKv && s == nullptr &&
          kv_coverage) {
        return at + std::to_string(i) + ": no KV snapshot";
      }
      if (s == nullptr) continue;
      const std::string why = SnapshotProblem(n, *s, path);
      if (!why.empty()) return at + std::to_string(i) + ": " + why;
    }
    return "";
  }

  std::string SnapshotProblem(const TrieNode& n, const CacheSnapshot& s, const Tokens& path) {
    if (s.to() != n.end_offset()) return SnapName(&s) + " does not end at the node's end";
    if (const auto* kv = dynamic_cast<const KvSnapshot*>(&s)) {
      if (kv->from() != n.start_offset()) return SnapName(&s) + " does not span the edge";
      return RowsMatch(kv->k(), kv->v(), kv->from(), path);
    }
    if (const auto* rot = dynamic_cast<const RotatingSnapshot*>(&s)) {
      RotatingCache scratch(kWindow);
      if (!scratch.Restore(rot, rot->to())) return "window snapshot does not restore";
      const int64_t w = std::min(rot->to(), kWindow);
      const auto [k, v] = scratch.LogicalTail(w);
      return RowsMatch(k, v, rot->to() - w, path);
    }
    const auto& rec = dynamic_cast<const RecurrentSnapshot&>(s);
    return StateMatches(rec.conv(), rec.delta(), Tokens(path.begin(), path.begin() + rec.offset()));
  }

  EnvKind kind_;
  specfx::Kernels kernels_ = specfx::MakeKernels();
  std::vector<std::unique_ptr<LayerCache>> inner_;
  std::vector<std::unique_ptr<RecordingCache>> recorders_;
  std::vector<LayerCache*> managed_;
  std::unique_ptr<PrefixCache> pc_;
  std::map<Tokens, std::unique_ptr<RecurrentCache>> twins_;
};

// Go's hasAllSnapshots (spec §6.10): every stateful layer has a snapshot; stateless (null)
// layers are ignored. Only checkers use it: the manager's page-out asks "any snapshot".
inline bool HasAllSnapshots(const TrieNode& node, std::span<LayerCache* const> caches) {
  for (size_t i = 0; i < caches.size(); ++i) {
    if (caches[i] != nullptr && node.snapshot(i) == nullptr) return false;
  }
  return true;
}

}  // namespace kvtwin::pcfx
