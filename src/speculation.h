// Speculative decoding transactions over the layer caches, v1 (spec §2.7 and the recurrent
// wrapper paragraph of spec/README.md). BeginSpeculation wraps every live layer; the
// validation forward writes its tokens through the wrappers (layer(i)) instead of the live
// caches; Commit(accepted) then keeps, on every layer, exactly the first `accepted` tokens
// that forward wrote and nothing else:
//   full KV    the wrapper writes through; Commit is a cursor move to
//              clamp(start + accepted, start, end);
//   rotating   the live ring is never touched during the forward; Commit appends the
//              accepted tokens through the normal write path;
//   recurrent  the forward runs from a copy of the live state while the wrapper records
//              its scan inputs; Commit installs the post-forward state when everything was
//              accepted, and otherwise rebuilds the state of the accepted prefix by
//              replaying the recorded scan from the initial state.
// `accepted` counts tokens of the speculative forward. A forward of [current, d1..dD]
// that accepts a drafts commits a + 1; the target's bonus token (its prediction after the
// last accepted draft) is not part of the forward, so a commit never reaches it: counts
// past the forward are clamped, and accepted <= 0 commits nothing.
//
// BeginIsolatedSpeculation wraps the layers for instrumentation: the wrappers accumulate
// the forward privately and never mutate live state; there is no commit.
//
// Wrappers answer the rest of the cache contract as spec §2.7 says: Snapshot and Merge
// give null, Restore false, Split (null, input), Free does nothing; they have no capture
// schedule (PrepareSnapshots is FailedPrecondition, TakeSnapshots empty) and report their
// own offset (the live offset at Begin plus the tokens forwarded through them).
//
// Commits use the live cache's ordinary write path, so an active capture schedule sees the
// accepted tokens like any forward's; the full KV wrapper writes through, so its schedule
// also captures rejected drafts before the rewind (as the Go wrapper did).
//
// The live caches must not be used directly while a speculation over them is open
// (checked at Commit). An uncommitted speculation rolls back when destroyed.
// Single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "src/cache.h"
#include "src/core/status.h"

namespace kvtwin {

// What the transaction needs from each wrapper, whatever cache interface it serves.
class SpeculativeLayer {
 public:
  virtual ~SpeculativeLayer() = default;
  // The wrapper as the cache the forward talks to.
  virtual LayerCache& cache() = 0;
  // Keeps the first `accepted` forwarded tokens in the live cache (see the file comment).
  virtual void Commit(int64_t accepted) = 0;
};

class Speculation {
 public:
  Speculation(Speculation&&) noexcept = default;
  Speculation& operator=(Speculation&&) noexcept = delete;
  Speculation(const Speculation&) = delete;
  Speculation& operator=(const Speculation&) = delete;
  // An open (uncommitted, not isolated) speculation rolls back: Commit(0).
  ~Speculation();

  size_t size() const { return layers_.size(); }
  // The cache the forward uses for layer i: an AttentionCache for full KV and rotating
  // layers, a RecurrentLayer for recurrent ones.
  LayerCache& layer(size_t i) { return layers_.at(i)->cache(); }
  bool isolated() const { return isolated_; }
  bool committed() const { return committed_; }

  // REQUIRES: not isolated and not committed yet; the live caches were not used since
  // Begin. Afterwards the wrappers must not be used.
  void Commit(int64_t accepted);

 private:
  friend Result<Speculation> BeginSpeculation(std::span<LayerCache* const> layers);
  friend Result<Speculation> BeginIsolatedSpeculation(std::span<LayerCache* const> layers);
  Speculation(std::vector<std::unique_ptr<SpeculativeLayer>> layers, bool isolated)
      : layers_(std::move(layers)), isolated_(isolated) {}

  std::vector<std::unique_ptr<SpeculativeLayer>> layers_;
  bool isolated_ = false;
  bool committed_ = false;
};

// Errors: a null layer or one listed twice (InvalidArgument); a layer that is not a live
// KvCache, RotatingCache or RecurrentCache, e.g. another speculation's wrapper
// (Unsupported). Nothing is wrapped on error.
Result<Speculation> BeginSpeculation(std::span<LayerCache* const> layers);
Result<Speculation> BeginIsolatedSpeculation(std::span<LayerCache* const> layers);

}  // namespace kvtwin
