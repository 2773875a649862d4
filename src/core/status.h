// Status and Result<T>: operating errors as values (STYLE §4). A Status is ok or carries a
// code and a one-line message; Result<T> is a value or a non-ok Status. Both are
// [[nodiscard]] so an ignored error is a compile warning (an error under -Werror).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "src/core/check.h"

namespace kvtwin {

enum class StatusCode {
  kOk,
  kInvalidArgument,     // malformed input, out-of-range numbers, impossible configuration
  kFailedPrecondition,  // operation not allowed in the current state
  kNotFound,            // unknown sequence, snapshot, file
  kResourceExhausted,   // cache full
  kUnsupported,         // the operation is not supported by this kind
  kIo,                  // file could not be read or written
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIo, std::move(m)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    KV_CHECK(!status_.ok(), "Result built from an ok Status carries no value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & {
    KV_CHECK(ok(), status_.ToString());
    return *value_;
  }
  const T& value() const& {
    KV_CHECK(ok(), status_.ToString());
    return *value_;
  }
  T&& value() && {
    KV_CHECK(ok(), status_.ToString());
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace kvtwin

// Propagates a non-ok Status from an expression returning Status.
#define KV_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::kvtwin::Status kv_status_ = (expr);    \
    if (!kv_status_.ok()) return kv_status_; \
  } while (false)
