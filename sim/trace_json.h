// Trace JSON decoding helpers shared by the trace reader (trace.cc) and its multi-sequence
// part (trace_multiseq.cc); private to those files. A Fields is one JSON object of a line with
// typed, range-checked access by key; every error is an InvalidArgument
// "FILE:LINE: /json/pointer: reason". Single-threaded.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sim/trace.h"
#include "src/core/status.h"

namespace kvtwin::sim::trace_json {

using Json = nlohmann::json;
using Keys = std::span<const std::string_view>;

// Lengths and counts: far beyond any useful trace, small enough that sums and products of
// two of them fit int64 and a hostile line cannot make the reader allocate gigabytes.
constexpr int64_t kMaxLength = int64_t{1} << 24;
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

enum class Need : bool { kOptional, kRequired };

// RFC 6901: "~" and "/" inside a key are escaped as "~0" and "~1". A key is input, so the
// pointer also writes backslashes and control characters as JSON string escapes ("\\",
// "\n", "\u001f"): a newline in a key must not break the one-line error.
inline std::string Escape(std::string_view key) {
  std::string s;
  for (const char c : key) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '~') {
      s += "~0";
    } else if (c == '/') {
      s += "~1";
    } else if (c == '\\') {
      s += "\\\\";
    } else if (c == '\n') {
      s += "\\n";
    } else if (c == '\r') {
      s += "\\r";
    } else if (c == '\t') {
      s += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      s += fmt::format("\\u{:04x}", u);
    } else {
      s += c;
    }
  }
  return s;
}

// A string as a JSON literal, so odd bytes in a reason cannot break the one-line message.
inline std::string Quote(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

inline std::string Expected(std::string_view what, const Json& v) {
  return fmt::format("expected {}, got {}", what, v.is_number() ? v.dump() : v.type_name());
}

// The line being decoded; every error names it.
struct Where {
  const std::string& path;
  int64_t line;
  Status Error(const std::string& pointer, std::string_view reason) const {
    return InvalidArgument(
        fmt::format("{}:{}: {}: {}", path, line, pointer.empty() ? "/" : pointer, reason));
  }
};

// Whether `v` is an integer in [lo, hi] (hi >= 0); stores it in `out` if so.
inline bool IntIn(const Json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi) || static_cast<int64_t>(u) < lo) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (!v.is_number_integer()) return false;
  *out = v.get<int64_t>();
  return lo <= *out && *out <= hi;
}

// `length`: the upper bound is kMaxLength, reported as "too long".
inline Status DecodeInt(const Where& w, const Json& v, const std::string& ptr, int64_t lo,
                        int64_t hi, int64_t* out, bool length = false) {
  if (IntIn(v, lo, hi, out)) return Status::Ok();
  if (!v.is_number_integer()) return w.Error(ptr, Expected("an integer", v));
  // nlohmann stores every non-negative integer as unsigned; above int64 it is too high.
  const bool low = v.is_number_unsigned()
                       ? v.get<uint64_t>() <= static_cast<uint64_t>(hi) && v.get<int64_t>() < lo
                       : v.get<int64_t>() < lo;
  if (low) return w.Error(ptr, fmt::format("must be >= {}, got {}", lo, v.dump()));
  if (length) return w.Error(ptr, fmt::format("too long: {} (at most {})", v.dump(), hi));
  return w.Error(ptr, fmt::format("must be <= {}, got {}", hi, v.dump()));
}

template <typename T>
Status DecodeInts(const Where& w, const Json& v, const std::string& ptr, int64_t lo, int64_t hi,
                  size_t min_size, std::vector<T>* out) {
  if (!v.is_array()) return w.Error(ptr, Expected("an array", v));
  if (v.size() > static_cast<size_t>(kMaxLength)) {
    return w.Error(ptr, fmt::format("too long: {} entries (at most {})", v.size(), kMaxLength));
  }
  if (v.size() < min_size) {
    return w.Error(ptr, min_size == 1
                            ? std::string("must not be empty")
                            : fmt::format("needs at least {} entries, got {}", min_size, v.size()));
  }
  out->clear();
  out->reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t x = 0;
    // The pointer is built only for the failing entry: token arrays can be long.
    if (!IntIn(v[i], lo, hi, &x)) {
      return DecodeInt(w, v[i], fmt::format("{}/{}", ptr, i), lo, hi, &x);
    }
    out->push_back(static_cast<T>(x));
  }
  return Status::Ok();
}

// One JSON object of a line: typed access to its fields by key, errors at their pointers.
class Fields {
 public:
  Fields(const Where& where, const Json& object, std::string prefix)
      : where_(where), object_(object), prefix_(std::move(prefix)) {}

  const Where& where() const { return where_; }
  std::string Ptr(std::string_view key) const { return prefix_ + "/" + Escape(key); }
  Status Error(std::string_view key, std::string_view reason) const {
    return where_.Error(Ptr(key), reason);
  }
  const Json* Find(std::string_view key) const {
    const auto it = object_.find(std::string(key));
    return it == object_.end() ? nullptr : &*it;
  }
  bool Has(std::string_view key) const { return Find(key) != nullptr; }

  // The first key (in key order) not in `allowed` is an error.
  Status OnlyKeys(Keys allowed, std::string_view context = "") const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) {
        return Error(it.key(), fmt::format("unknown field{}", context));
      }
    }
    return Status::Ok();
  }

  template <typename T>
  Status Int(std::string_view key, int64_t lo, int64_t hi, T* out, Need need) const {
    const Json* v = Find(key);
    if (v == nullptr) return Absent(key, need);
    int64_t x = 0;
    KV_RETURN_IF_ERROR(DecodeInt(where_, *v, Ptr(key), lo, hi, &x));
    *out = static_cast<T>(x);
    return Status::Ok();
  }
  // A length or count in [lo, kMaxLength].
  Status Length(std::string_view key, int64_t lo, int64_t* out, Need need) const {
    const Json* v = Find(key);
    if (v == nullptr) return Absent(key, need);
    return DecodeInt(where_, *v, Ptr(key), lo, kMaxLength, out, /*length=*/true);
  }
  template <typename T>
  Status Ints(std::string_view key, int64_t lo, int64_t hi, size_t min_size, std::vector<T>* out,
              Need need) const {
    const Json* v = Find(key);
    if (v == nullptr) return Absent(key, need);
    return DecodeInts(where_, *v, Ptr(key), lo, hi, min_size, out);
  }
  Status Bool(std::string_view key, bool* out, Need need) const {
    const Json* v = Find(key);
    if (v == nullptr) return Absent(key, need);
    if (!v->is_boolean()) return Error(key, Expected("true or false", *v));
    *out = v->get<bool>();
    return Status::Ok();
  }
  Status String(std::string_view key, std::string* out, Need need) const {
    const Json* v = Find(key);
    if (v == nullptr) return Absent(key, need);
    if (!v->is_string()) return Error(key, Expected("a string", *v));
    *out = v->get<std::string>();
    return Status::Ok();
  }
  // The field as an object (nullptr when absent and optional).
  Status Object(std::string_view key, const Json** out, Need need) const {
    *out = Find(key);
    if (*out == nullptr) return Absent(key, need);
    if (!(*out)->is_object()) return Error(key, Expected("an object", **out));
    return Status::Ok();
  }

 private:
  Status Absent(std::string_view key, Need need) const {
    return need == Need::kRequired ? Error(key, "missing required field") : Status::Ok();
  }

  const Where& where_;
  const Json& object_;
  std::string prefix_;
};

// kind "multiseq" (trace_multiseq.cc): the header's "multiseq" and "conv", and one event.
Status DecodeMultiSeq(const Fields& f, TraceHeader* h);
Status DecodeMsOp(const Where& w, const Json& j, int32_t max_seqs, MsOp* op);

}  // namespace kvtwin::sim::trace_json
