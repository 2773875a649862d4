// SharedLog: a token log whose copies share their common prefix. The reference keeps every
// whole-state snapshot (rotating window, recurrent state) as the tokens [0, to) that made it,
// so a conversation captured every block held length^2 / 2 tokens, and a long trace ran out
// of memory on the reference alone. A SharedLog is a view [off, off + n) of an append-only
// buffer; copying or slicing it is O(1) and shares the buffer. Semantically it is a value:
// no holder can see another's edits, because a buffer is only ever appended to by a holder
// whose view ends at the buffer's end, and elements inside any view never change; a holder
// whose view ends earlier (it truncated, or another holder extended the buffer) appends to
// a private copy of its view instead. Single-threaded, like the rest of the model.
#pragma once

#include <algorithm>
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
      : buf_(std::make_shared<TokenLog>(std::move(tokens))), n_(buf_->size()) {}

  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const Token* data() const { return n_ == 0 ? nullptr : buf_->data() + off_; }
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
    buf_->insert(buf_->end(), tokens.begin(), tokens.end());
    n_ += tokens.size();
  }

  // Another log's tokens; when they are the continuation of this view in the same buffer
  // (a KV merge of two edges sliced from one log), the view just widens.
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
  // After this, the buffer ends where the view does and appending cannot change any other
  // holder's view: a buffer nobody else holds is cut back; a shared one that runs past the
  // view, or one the view does not start, is left to its holders and the view is copied.
  void MakeAppendable(size_t extra) {
    if (!buf_) {
      buf_ = std::make_shared<TokenLog>();
      buf_->reserve(extra);
      return;
    }
    const bool alone = buf_.use_count() == 1;
    if (off_ + n_ == buf_->size()) {
      // The tip: other views stay inside [0, tip). A shared buffer must not reallocate,
      // though, or a span another holder took of its own log would dangle, which a plain
      // vector never does; it moves to a copy with room to grow geometrically instead.
      if (alone || buf_->size() + extra <= buf_->capacity()) return;
    } else if (alone && off_ == 0) {
      buf_->resize(n_);
      return;
    }
    auto copy = std::make_shared<TokenLog>();
    copy->reserve(std::max(n_ + extra, 2 * n_));
    copy->assign(begin(), end());
    buf_ = std::move(copy);
    off_ = 0;
  }

  std::shared_ptr<TokenLog> buf_;
  size_t off_ = 0;
  size_t n_ = 0;
};

}  // namespace kvtwin::model
