// SharedLog: a token log whose copies share their common prefix. The reference keeps every
// whole-state snapshot (rotating window, recurrent state) as the tokens [0, to) that made it,
// so a conversation captured every block held length^2 / 2 tokens, and a long trace ran out
// of memory on the reference alone. A SharedLog is a view [off, off + n) of an append-only
// buffer; copying or slicing it is O(1) and shares the buffer. Semantically it is a value:
// no holder can see another's edits, because a buffer is only ever appended to by a holder
// whose view ends at the buffer's end, and elements inside any view never change; a holder
// whose view ends earlier (it truncated, or another holder extended the buffer) appends to
// a private copy of its view instead.
// Two more ways to share rather than copy, both transparent because the tokens are equal:
// a buffer remembers which buffer its first tokens were copied from, so a KV restore that
// concatenates edges cut from successive copies of one conversation ends up viewing the
// newest copy (Concat); and a layer whose log holds what another layer's held before that
// layer appended the same tokens takes the other's log (SameTokensAs, AppendLike), so the
// layers of one stack keep one buffer per conversation turn rather than one each.
// Single-threaded, like the rest of the model.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "src/core/check.h"

namespace kvtwin::model {

struct Token {
  int32_t id = 0;
  uint64_t h = 0;  // rolling hash of the prefix ending at this token
  friend bool operator==(const Token&, const Token&) = default;
};
using TokenLog = std::vector<Token>;

class SharedLog {
 public:
  SharedLog() = default;
  // Implicit: a plain log (a test's literal, a forward's tokens) is a log.
  SharedLog(TokenLog tokens)  // NOLINT(google-explicit-constructor)
      : buf_(std::make_shared<Buffer>(std::move(tokens))), n_(buf_->tokens.size()) {}

  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const Token* data() const { return n_ == 0 ? nullptr : buf_->tokens.data() + off_; }
  const Token* begin() const { return data(); }
  const Token* end() const { return data() + n_; }
  const Token& operator[](size_t i) const { return data()[i]; }
  const Token& back() const {
    KV_CHECK(n_ > 0, "back() of an empty log");
    return data()[n_ - 1];
  }
  std::span<const Token> span() const { return {data(), n_}; }
  operator std::span<const Token>() const { return span(); }  // NOLINT
  TokenLog ToVector() const { return TokenLog(begin(), end()); }
  // Whether the two logs certainly hold the same tokens, judged by their views and the
  // buffers' copy records alone, never by reading tokens: false means "not known".
  bool SameTokensAs(const SharedLog& other) const {
    if (n_ != other.n_) return false;
    if (n_ == 0 || (buf_ == other.buf_ && off_ == other.off_)) return true;
    return off_ == 0 && other.off_ == 0 &&
           (StartsWith(*buf_, *other.buf_, n_) || StartsWith(*other.buf_, *buf_, n_));
  }

  // The tokens [begin, end) of this log, sharing its buffer. REQUIRES: begin <= end <= size.
  SharedLog Slice(size_t begin, size_t end) const {
    KV_CHECK(begin <= end && end <= n_, "slice beyond the log");
    SharedLog out;
    if (begin == end) return out;
    out.buf_ = buf_;
    out.off_ = off_ + begin;
    out.n_ = end - begin;
    return out;
  }
  // Keeps the first `length` tokens. REQUIRES: length <= size.
  void Truncate(size_t length) {
    KV_CHECK(length <= n_, "truncate beyond the log");
    n_ = length;
    if (n_ == 0) Clear();
  }
  void Clear() {
    buf_.reset();
    off_ = 0;
    n_ = 0;
  }
  // REQUIRES: `tokens` is not inside this log's buffer (Concat handles that case).
  void Append(std::span<const Token> tokens) {
    if (tokens.empty()) return;
    MakeAppendable(tokens.size());
    buf_->ExtendRecord(tokens);
    buf_->tokens.insert(buf_->tokens.end(), tokens.begin(), tokens.end());
    n_ += tokens.size();
  }
  // Append(tokens) by taking `leader`, the log that another holder of this log's tokens
  // became by appending the same tokens: the two then share one buffer.
  // REQUIRES: this log held what `leader` held before that append (SameTokensAs).
  void AppendLike(std::span<const Token> tokens, const SharedLog& leader) {
    KV_CHECK(leader.n_ == n_ + tokens.size() &&
                 std::equal(tokens.begin(), tokens.end(), leader.begin() + n_) &&
                 (n_ == 0 || leader[n_ - 1] == back()),
             "AppendLike: the leader's log is not this log followed by the tokens");
    *this = leader;
  }

  // Another log's tokens; when they are the continuation of this view in the same buffer
  // (a KV merge of two edges sliced from one log), or in a buffer whose first tokens are a
  // copy of this view (the next edge of the same conversation, cut after a later turn
  // copied its prefix), the view just moves and widens.
  void Concat(const SharedLog& next) {
    if (next.empty()) return;
    if (empty()) {  // restoring a path's first node: share it rather than copy it
      *this = next;
      return;
    }
    if (buf_ && next.buf_ == buf_ && next.off_ == off_ + n_) {
      n_ += next.n_;
      return;
    }
    if (off_ == 0 && next.off_ == n_ && StartsWith(*next.buf_, *buf_, n_)) {
      buf_ = next.buf_;
      n_ += next.n_;
      return;
    }
    if (next.buf_ == buf_) {  // the same buffer elsewhere: appending may move it
      Append(next.ToVector());
      return;
    }
    Append(next.span());
  }

  friend bool operator==(const SharedLog& a, const SharedLog& b) {
    return a.n_ == b.n_ && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  struct Buffer {
    explicit Buffer(TokenLog t = {}) : tokens(std::move(t)) {}
    TokenLog tokens;
    // tokens[0, copied) were copied from source->tokens[0, copied) (held weakly: the
    // record must not keep a buffer alive).
    std::weak_ptr<const Buffer> source;
    size_t copied = 0;
    // The fewest tokens this buffer was ever cut back to: elements at or past it may have
    // been overwritten since a copy was taken, so a copy's record covers only [0, stable).
    size_t stable = SIZE_MAX;

    // Before `more` is appended: while every token so far is a recorded copy, the tokens
    // that repeat the source's next ones (a prefix re-forwarded from an earlier restore
    // point) extend the record.
    void ExtendRecord(std::span<const Token> more) {
      if (copied == 0 || copied != tokens.size()) return;
      const std::shared_ptr<const Buffer> from = source.lock();
      if (!from) return;
      const size_t limit = std::min(from->tokens.size(), from->stable);
      if (limit <= copied) return;
      const size_t n = std::min(more.size(), limit - copied);
      const auto theirs = from->tokens.begin() + static_cast<ptrdiff_t>(copied);
      copied += static_cast<size_t>(
          std::mismatch(more.begin(), more.begin() + static_cast<ptrdiff_t>(n), theirs).first -
          more.begin());
    }
  };

  // Whether b.tokens[0, n) equals a.tokens[0, n), by the copy records alone (the walk is
  // bounded; a record it does not reach only costs a copy). REQUIRES: n <= a's size.
  static bool StartsWith(const Buffer& b, const Buffer& a, size_t n) {
    const Buffer* at = &b;
    std::shared_ptr<const Buffer> hold;
    for (int depth = 0; depth < 64; ++depth) {
      if (at == &a) return true;
      if (n > at->copied) return false;
      hold = at->source.lock();
      if (!hold || n > hold->stable) return false;
      at = hold.get();
    }
    return false;
  }

  // After this, the buffer ends where the view does and appending cannot change any other
  // holder's view: a buffer nobody else holds is cut back; a shared one that runs past the
  // view, or one the view does not start, is left to its holders and the view is copied.
  void MakeAppendable(size_t extra) {
    if (!buf_) {
      buf_ = std::make_shared<Buffer>();
      buf_->tokens.reserve(extra);
      return;
    }
    const bool alone = buf_.use_count() == 1;
    if (off_ + n_ == buf_->tokens.size()) {
      // The tip: other views stay inside [0, tip). A shared buffer must not reallocate,
      // though, or a span another holder took of its own log would dangle, which a plain
      // vector never does; it moves to a copy with room to grow geometrically instead.
      if (alone || buf_->tokens.size() + extra <= buf_->tokens.capacity()) return;
    } else if (alone && off_ == 0) {
      buf_->tokens.resize(n_);
      buf_->stable = std::min(buf_->stable, n_);
      buf_->copied = std::min(buf_->copied, n_);
      return;
    }
    auto copy = std::make_shared<Buffer>();
    copy->tokens.reserve(std::max(n_ + extra, 2 * n_));
    copy->tokens.assign(begin(), end());
    if (off_ == 0) {
      copy->source = buf_;
      copy->copied = n_;
    }
    buf_ = std::move(copy);
    off_ = 0;
  }

  std::shared_ptr<Buffer> buf_;
  size_t off_ = 0;
  size_t n_ = 0;
};

}  // namespace kvtwin::model
