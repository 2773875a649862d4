// Speculation transactions (spec §2.7) and the attention wrappers. The wrappers keep the
// live cache's invariants by construction: the KV wrapper only ever moves the live cursor
// backwards within what the forward wrote, and the accumulating wrapper only touches the
// live cache in Commit, through the same Update an ordinary forward uses.
#include "src/speculation.h"

#include <algorithm>
#include <string>
#include <utility>

#include "src/core/check.h"
#include "src/speculation_wrappers.h"

namespace kvtwin {
namespace {

void CheckRows(const Tensor& k, const Tensor& v, const Tensor& like) {
  KV_CHECK(k.rows() >= 1 && v.rows() == k.rows(),
           "speculative write needs K and V with the same row count >= 1");
  if (like.rows() == 0 && like.cols() == 0) return;
  KV_CHECK(k.dtype() == like.dtype() && k.cols() == like.cols(),
           "speculative write " + k.ShapeString() + " does not match " + like.ShapeString());
}

using Wrappers = std::vector<std::unique_ptr<SpeculativeLayer>>;

Result<Wrappers> Wrap(std::span<LayerCache* const> layers, bool isolated) {
  Wrappers wrappers;
  wrappers.reserve(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerCache* layer = layers[i];
    const std::string where = "layer " + std::to_string(i);
    if (layer == nullptr) return InvalidArgument(where + " is null");
    // A speculation begins every decode step, over tens of layers: scanning the ones before
    // finds a repeat without a hash set's allocation per layer (most of Wrap's).
    if (std::find(layers.begin(), layers.begin() + static_cast<std::ptrdiff_t>(i), layer) !=
        layers.begin() + static_cast<std::ptrdiff_t>(i)) {
      return InvalidArgument(where + " is listed twice");
    }
    if (auto* kv = dynamic_cast<KvCache*>(layer)) {
      if (isolated) {
        const int64_t o = kv->Offset();
        wrappers.push_back(
            std::make_unique<AccumulatingAttention>(*kv, o > 0 ? kv->keys().Rows(0, o) : Tensor(),
                                                    o > 0 ? kv->values().Rows(0, o) : Tensor(),
                                                    /*window=*/0, /*committing=*/false));
      } else {
        wrappers.push_back(std::make_unique<KvSpeculation>(*kv));
      }
    } else if (auto* rot = dynamic_cast<RotatingCache*>(layer)) {
      // The whole live window: a forward keeps its newest W - 1, View all W.
      auto [k, v] = rot->LogicalTail(std::min(rot->Offset(), rot->window()));
      wrappers.push_back(std::make_unique<AccumulatingAttention>(
          *rot, std::move(k), std::move(v), rot->window(), /*committing=*/!isolated));
    } else if (auto* rec = dynamic_cast<RecurrentCache*>(layer)) {
      wrappers.push_back(std::make_unique<RecurrentSpeculation>(*rec, /*committing=*/!isolated));
    } else {
      return Unsupported(where + ": speculation needs a live KvCache, RotatingCache or " +
                         "RecurrentCache, not another kind of " + CacheKindName(layer->kind()) +
                         " cache (e.g. a speculation wrapper)");
    }
  }
  return wrappers;
}

// `out` = the newest `keep` rows of [base ; acc], copied straight from both (no
// concatenation first); `out` keeps its buffer when its shape already fits.
void NewestRows(const Tensor& base, const Tensor& acc, int64_t keep, Tensor& out) {
  const int64_t total = base.rows() + acc.rows();
  KV_CHECK(0 <= keep && keep <= total, "history keeps more rows than were written");
  const Tensor& like = base.rows() > 0 ? base : acc;
  out.EnsureShape(like.dtype(), keep, like.cols());
  const int64_t first = total - keep;
  const int64_t from_base = std::max<int64_t>(0, base.rows() - first);
  if (from_base > 0) out.CopyRows(0, base, first, from_base);
  if (keep > from_base) {
    out.CopyRows(from_base, acc, std::max<int64_t>(0, first - base.rows()), keep - from_base);
  }
}

}  // namespace

Result<Speculation> BeginSpeculation(std::span<LayerCache* const> layers) {
  Result<Wrappers> w = Wrap(layers, /*isolated=*/false);
  if (!w.ok()) return w.status();
  return Speculation(std::move(w).value(), /*isolated=*/false);
}

Result<Speculation> BeginIsolatedSpeculation(std::span<LayerCache* const> layers) {
  Result<Wrappers> w = Wrap(layers, /*isolated=*/true);
  if (!w.ok()) return w.status();
  return Speculation(std::move(w).value(), /*isolated=*/true);
}

Speculation::~Speculation() {
  // Every exit path must roll back, or uncommitted tokens leak (spec §2.6 step 5).
  if (!isolated_ && !committed_) Commit(0);
}

void Speculation::Commit(int64_t accepted) {
  KV_CHECK(!isolated_, "an isolated speculation has no commit");
  KV_CHECK(!committed_, "speculation committed twice");
  committed_ = true;
  for (auto& layer : layers_) layer->Commit(accepted);
}

KvSpeculation::KvSpeculation(KvCache& live)
    : WrapperContract(CacheKind::kFullKv), live_(live), start_(live.Offset()), end_(start_) {}

History KvSpeculation::Update(const Tensor& k, const Tensor& v) {
  KV_CHECK(!done_, "write through a committed speculation");
  KV_CHECK(live_.Offset() == end_, "live KV cache used directly during a speculation");
  History h = live_.Update(k, v);
  end_ = live_.Offset();
  return h;
}

void KvSpeculation::Commit(int64_t accepted) {
  KV_CHECK(!done_, "speculation wrapper committed twice");
  done_ = true;
  KV_CHECK(live_.Offset() == end_, "live KV cache used directly during a speculation");
  // Clamp the count, not the sum: start_ + a count near INT64_MAX would overflow.
  const int64_t target = start_ + std::clamp<int64_t>(accepted, 0, end_ - start_);
  // A live KV rewind within the written range always succeeds (spec §1.2).
  KV_CHECK(live_.Restore(nullptr, target), "KV rewind to the accepted prefix failed");
}

AccumulatingAttention::AccumulatingAttention(AttentionCache& live, Tensor base_k, Tensor base_v,
                                             int64_t window, bool committing)
    : WrapperContract(live.kind()),
      live_(live),
      start_(live.Offset()),
      window_(window),
      committing_(committing),
      base_k_(std::move(base_k)),
      base_v_(std::move(base_v)) {}

int64_t AccumulatingAttention::LiveBytes() const {
  return base_k_.Bytes() + base_v_.Bytes() + acc_k_.Bytes() + acc_v_.Bytes() + hist_k_.Bytes() +
         hist_v_.Bytes() + view_k_.Bytes() + view_v_.Bytes();
}

History AccumulatingAttention::Update(const Tensor& k, const Tensor& v) {
  KV_CHECK(!done_, "write through a committed speculation");
  CheckRows(k, v, acc_k_.rows() > 0 ? acc_k_ : base_k_);
  const int64_t before = base_k_.rows() + acc_k_.rows();
  acc_k_.AppendRows(k);
  acc_v_.AppendRows(v);
  // A window shows what a non-speculative batched forward would: the newest W - 1 older
  // tokens, then the new ones (for one forward that is exactly base ; acc).
  const int64_t keep = window_ > 0 ? std::min(before, window_ - 1) + k.rows() : before + k.rows();
  return MakeHistory(keep, k.rows(), hist_k_, hist_v_);
}

History AccumulatingAttention::View() const {
  // Read-only: a window shows its newest W tokens, as the live cache's View would.
  const int64_t total = base_k_.rows() + acc_k_.rows();
  return MakeHistory(window_ > 0 ? std::min(total, window_) : total, 1, view_k_, view_v_);
}

History AccumulatingAttention::MakeHistory(int64_t keep, int64_t query_len, Tensor& k,
                                           Tensor& v) const {
  NewestRows(base_k_, acc_k_, keep, k);
  NewestRows(base_v_, acc_v_, keep, v);
  History h;
  h.k = &k;
  h.v = &v;
  h.length = keep;
  if (window_ > 0) {
    // Logical order: a batched query gets causal ∩ sliding window; a single query sees at
    // most W keys, all at or before it, and cursor 0 means "no rotation".
    h.has_applier = true;
    h.applier = {keep, query_len, window_, 0};
  }
  return h;
}

void AccumulatingAttention::Commit(int64_t accepted) {
  KV_CHECK(committing_, "an isolated wrapper has no commit");
  KV_CHECK(!done_, "speculation wrapper committed twice");
  done_ = true;
  KV_CHECK(live_.Offset() == start_, "live cache used directly during a speculation");
  const int64_t n = std::min(accepted, accumulated());
  if (n <= 0) return;
  // The normal write path: capture schedule, trimming and ring cursor as for any forward.
  (void)live_.Update(acc_k_.Rows(0, n), acc_v_.Rows(0, n));
}

}  // namespace kvtwin
