// Mooncake JSONL import (sim/mooncake.h). nlohmann::json is used without exceptions
// (parse(..., allow_exceptions = false) and typed checks before every get), so a
// malformed line is always a Status and never a throw.
#include "sim/mooncake.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "src/core/check.h"

namespace kvtwin::sim {
namespace {

using Json = nlohmann::json;

// Lengths beyond any context window are rejected: the cap keeps the scaled-length
// arithmetic far from int64 overflow and a corrupt output_length from becoming a huge
// allocation (input_length is bounded by the hash ids on the line anyway).
constexpr int64_t kMaxLength = std::numeric_limits<int32_t>::max();

Status LineError(const std::string& file, int64_t line, std::string_view pointer,
                 std::string_view reason) {
  return InvalidArgument(fmt::format("{}:{}: {}: {}", file, line, pointer, reason));
}

std::string Describe(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return v.dump();  // a number; never a string, so dump() cannot throw on bad UTF-8
  }
}

// `v` as an integer in [lo, hi], or the reason it is not one.
Result<int64_t> Integer(const Json& v, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) {
    return InvalidArgument(fmt::format("expected an integer, got {}", Describe(v)));
  }
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return InvalidArgument(fmt::format("must be <= {}, got {}", hi, v.dump()));
  }
  const auto value = v.get<int64_t>();
  if (value < lo) return InvalidArgument(fmt::format("must be >= {}, got {}", lo, value));
  if (value > hi) return InvalidArgument(fmt::format("must be <= {}, got {}", hi, value));
  return value;
}

// The "hash_ids" of line object `j`, each a non-negative integer, appended to `out`.
Status ReadHashIds(const Json& j, const std::string& file, int64_t line,
                   std::vector<int64_t>& out) {
  const auto ids = j.find("hash_ids");
  if (ids == j.end()) return LineError(file, line, "/hash_ids", "missing");
  if (!ids->is_array()) {
    return LineError(file, line, "/hash_ids", "expected an array, got " + Describe(*ids));
  }
  out.reserve(ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    auto id = Integer((*ids)[i], 0, std::numeric_limits<int64_t>::max());
    if (!id.ok()) {
      return LineError(file, line, fmt::format("/hash_ids/{}", i), id.status().message());
    }
    out.push_back(*id);
  }
  return Status::Ok();
}

// The "timestamp" of line object `j`: a non-negative number, integer or not.
Result<TraceTime> Timestamp(const Json& j) {
  const auto it = j.find("timestamp");
  if (it == j.end()) return InvalidArgument("missing");
  if (it->is_number_integer()) {
    auto value = Integer(*it, 0, std::numeric_limits<int64_t>::max());
    if (!value.ok()) return value.status();
    return static_cast<TraceTime>(*value);
  }
  if (!it->is_number_float()) {
    return InvalidArgument(fmt::format("expected a number, got {}", Describe(*it)));
  }
  // Finite: nlohmann's lexer refuses a literal beyond double's range as invalid JSON.
  const auto value = it->get<double>();
  if (value < 0) return InvalidArgument(fmt::format("must be >= 0, got {}", it->dump()));
  return static_cast<TraceTime>(value);
}

// `t` as the trace wrote it: an integer in full, or else a double's shortest form (which is
// what a fractional timestamp parsed from).
std::string ShowTime(TraceTime t) {
  if (t == std::floor(t) && t < 0x1p63L) return fmt::format("{}", static_cast<int64_t>(t));
  return fmt::format("{}", static_cast<double>(t));
}

int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// ceil(n · s / B) without forming n · s: n = B q + r gives q · s + ceil(r · s / B), and
// r · s < B² <= 2^40.
int64_t Scale(int64_t n, int64_t block_scale, int64_t block_tokens) {
  return n / block_tokens * block_scale + CeilDiv(n % block_tokens * block_scale, block_tokens);
}

// For a hash id count that disagrees with B: the smallest power-of-two block size at which
// `ids` ids cover input_length (prefix caches hash power-of-two blocks), or 0.
int64_t FittingBlockSize(int64_t input_length, int64_t ids) {
  for (int64_t b = 1; b <= kMaxTraceBlockTokens; b *= 2) {
    if (CeilDiv(input_length, b) == ids) return b;
  }
  return 0;
}

// What a hash id count that disagrees with B suggests, or "". A count of the full blocks
// alone is a trace that hashes no short last block (as some prefix caches hash only full
// blocks); kvtwin needs an id for every block, so it says so rather than suggest a block
// size that would merely make the count fit.
std::string HashIdHint(int64_t input_length, int64_t ids, int64_t block_tokens) {
  const int64_t rest = input_length % block_tokens;
  if (rest != 0 && ids > 0 && ids == input_length / block_tokens) {
    return fmt::format(" (the ids name only the full {}-token blocks: the last {} token{} no id)",
                       block_tokens, rest, rest == 1 ? " has" : "s have");
  }
  const int64_t fits = FittingBlockSize(input_length, ids);
  if (fits == 0) return "";
  return fmt::format(" ({} ids fit a trace of {}-token blocks: --trace-block {})", ids, fits, fits);
}

Status ValidateOptions(const MooncakeOptions& o) {
  if (o.trace_block < 1 || o.trace_block > kMaxTraceBlockTokens) {
    return InvalidArgument(fmt::format("mooncake trace block must be in 1..{}, got {}",
                                       kMaxTraceBlockTokens, o.trace_block));
  }
  if (o.block_scale < 1 || o.block_scale > o.trace_block) {
    return InvalidArgument(
        fmt::format("mooncake block scale must be in 1..{} (the trace block), got {}",
                    o.trace_block, o.block_scale));
  }
  if (o.limit < 0) {
    return InvalidArgument(fmt::format("mooncake request limit must be >= 0, got {}", o.limit));
  }
  if (o.skip < 0) {
    return InvalidArgument(fmt::format("mooncake request skip must be >= 0, got {}", o.skip));
  }
  return Status::Ok();
}

Result<std::ifstream> OpenInput(const std::string& path) {
  std::ifstream in(path);
  if (!in) return IoError(fmt::format("{}: cannot open for reading", path));
  return in;
}

bool IsBlank(const std::string& text) {
  return text.find_first_not_of(" \t\r") == std::string::npos;
}

// The next request of `in` (nullopt at the end); `line` and `last_timestamp` advance.
// Blank lines are allowed only at the end of the file, so every line before the last
// request is a request line and a request's index is its line number minus one.
Result<std::optional<MooncakeRequest>> NextRequest(std::istream& in, const std::string& path,
                                                   int64_t block_tokens, int64_t& line,
                                                   TraceTime& last_timestamp) {
  std::string text;
  int64_t first_blank = 0;
  while (std::getline(in, text)) {
    ++line;
    if (IsBlank(text)) {
      if (first_blank == 0) first_blank = line;
      continue;
    }
    if (first_blank != 0) return LineError(path, first_blank, "/", "blank line before a request");
    auto request = ParseMooncakeLine(text, path, line, last_timestamp, block_tokens);
    if (!request.ok()) return request.status();
    last_timestamp = request->timestamp;
    return std::optional<MooncakeRequest>(std::move(request).value());
  }
  if (in.bad()) return IoError(fmt::format("{}:{}: read error", path, line + 1));
  return std::optional<MooncakeRequest>();
}

// The request's reusable prefix given `longest` (id -> longest scaled length seen).
int64_t MatchedTokens(const MooncakeRequest& r, const std::unordered_map<int64_t, int64_t>& longest,
                      int64_t block_scale) {
  int64_t matched = 0;
  for (size_t i = 0; i < r.hash_ids.size(); ++i) {
    const auto seen = longest.find(r.hash_ids[i]);
    if (seen == longest.end()) break;
    const int64_t len = ScaledBlockLength(r, i, block_scale);
    matched += std::min(len, seen->second);
    if (seen->second < len) break;  // the rest of this block was never computed
  }
  return matched;
}

}  // namespace

Result<MooncakeRequest> ParseMooncakeLine(const std::string& text, const std::string& file,
                                          int64_t line, TraceTime previous_timestamp,
                                          int64_t block_tokens) {
  KV_CHECK(block_tokens >= 1 && block_tokens <= kMaxTraceBlockTokens,
           "trace block outside 1..2^20");
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return LineError(file, line, "/", "not valid JSON");
  if (!j.is_object()) {
    return LineError(file, line, "/", "expected a JSON object, got " + Describe(j));
  }
  MooncakeRequest r;
  r.block_tokens = block_tokens;
  auto timestamp = Timestamp(j);
  if (!timestamp.ok()) return LineError(file, line, "/timestamp", timestamp.status().message());
  r.timestamp = *timestamp;
  struct Field {
    const char* name;
    int64_t lo;
    int64_t hi;
    int64_t* out;
  };
  // output_length may be 0: the plan still generates one token (MooncakePlan).
  const Field fields[] = {
      {"input_length", 1, kMaxLength, &r.input_length},
      {"output_length", 0, kMaxLength, &r.output_length},
  };
  for (const Field& f : fields) {
    const std::string pointer = fmt::format("/{}", f.name);
    const auto it = j.find(f.name);
    if (it == j.end()) return LineError(file, line, pointer, "missing");
    auto value = Integer(*it, f.lo, f.hi);
    if (!value.ok()) return LineError(file, line, pointer, value.status().message());
    *f.out = *value;
  }
  KV_RETURN_IF_ERROR(ReadHashIds(j, file, line, r.hash_ids));
  const int64_t blocks = CeilDiv(r.input_length, block_tokens);
  const auto ids = static_cast<int64_t>(r.hash_ids.size());
  if (ids != blocks) {
    return LineError(file, line, "/hash_ids",
                     fmt::format("{} ids, but input_length {} needs ceil({} / {}) = {}{}", ids,
                                 r.input_length, r.input_length, block_tokens, blocks,
                                 HashIdHint(r.input_length, ids, block_tokens)));
  }
  if (r.timestamp < previous_timestamp) {
    return LineError(file, line, "/timestamp",
                     fmt::format("{} is before the previous request's {} (timestamps never "
                                 "decrease)",
                                 ShowTime(r.timestamp), ShowTime(previous_timestamp)));
  }
  return r;
}

int64_t ScaledBlockLength(const MooncakeRequest& r, size_t i, int64_t block_scale) {
  KV_CHECK(i < r.hash_ids.size(), "block index past the request's hash ids");
  KV_CHECK(block_scale >= 1 && block_scale <= r.block_tokens, "block scale outside 1..B");
  const auto before = static_cast<int64_t>(i) * r.block_tokens;
  const int64_t recorded = std::min(r.block_tokens, r.input_length - before);
  KV_CHECK(recorded >= 1, "input_length disagrees with the hash ids (ParseMooncakeLine checks)");
  // A full block is exactly block_scale tokens; a short last block keeps its share, >= 1.
  return Scale(recorded, block_scale, r.block_tokens);
}

RequestPlan MooncakePlan(const MooncakeRequest& r, int64_t index, int64_t block_scale) {
  KV_CHECK(block_scale >= 1 && block_scale <= r.block_tokens, "block scale outside 1..B");
  KV_CHECK(!r.hash_ids.empty(), "a Mooncake request has at least one block");
  RequestPlan plan;
  plan.index = index;
  plan.kind = RequestKind::kNew;
  // The conversation is a label only (kNew requests never look one up): ids at or above
  // 2^31 fold modulo 2^31, so two such first blocks may share a label.
  plan.conversation = static_cast<int32_t>(r.hash_ids[0] % (int64_t{1} << 31));
  for (size_t i = 0; i < r.hash_ids.size(); ++i) {
    const std::vector<int32_t> block =
        BlockTokens(r.hash_ids[i], ScaledBlockLength(r, i, block_scale));
    plan.inputs.insert(plan.inputs.end(), block.begin(), block.end());
  }
  // At least one token is generated: the driver samples the first output after prefill.
  plan.outputs = GeneratedTokens(
      index, std::max<int64_t>(1, Scale(r.output_length, block_scale, r.block_tokens)));
  return plan;
}

bool LooksLikeMooncake(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) return false;
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("hash_ids") && !j.contains("format");
}

Result<std::unique_ptr<MooncakeReader>> MooncakeReader::Open(const std::string& path,
                                                             MooncakeOptions options,
                                                             TraceHeader header) {
  KV_RETURN_IF_ERROR(ValidateOptions(options));
  auto in = OpenInput(path);
  if (!in.ok()) return in.status();
  header.kind = TraceKind::kRequests;
  if (header.source.empty()) {
    header.source = fmt::format("mooncake {} block_scale {}", path, options.block_scale);
    if (options.trace_block != kMooncakeBlockTokens) {
      header.source += fmt::format(" trace_block {}", options.trace_block);
    }
    if (options.skip > 0) header.source += fmt::format(" skip {}", options.skip);
    if (options.limit > 0) header.source += fmt::format(" limit {}", options.limit);
  }
  return std::unique_ptr<MooncakeReader>(
      new MooncakeReader(path, std::move(in).value(), options, std::move(header)));
}

Result<std::optional<TraceEvent>> MooncakeReader::Next() {
  // Every line read so far holds a request (NextRequest), so line_ counts the requests.
  // Skipped requests are still read and validated, so errors keep their line.
  while (line_ < options_.skip) {
    auto skipped = NextRequest(in_, path_, options_.trace_block, line_, last_timestamp_);
    if (!skipped.ok()) return skipped.status();
    if (!skipped->has_value()) return std::optional<TraceEvent>();
  }
  if (options_.limit > 0 && line_ >= options_.skip + options_.limit) {
    return std::optional<TraceEvent>();
  }
  auto request = NextRequest(in_, path_, options_.trace_block, line_, last_timestamp_);
  if (!request.ok()) return request.status();
  if (!request->has_value()) return std::optional<TraceEvent>();
  return std::optional<TraceEvent>(MooncakePlan(**request, line_ - 1, options_.block_scale));
}

Result<int64_t> ImportMooncake(const std::string& in, const std::string& out,
                               MooncakeOptions options, TraceHeader header) {
  auto reader = MooncakeReader::Open(in, options, std::move(header));
  if (!reader.ok()) return reader.status();
  auto writer = TraceWriter::Create(out, (*reader)->header());
  if (!writer.ok()) return writer.status();
  int64_t requests = 0;
  while (true) {
    auto event = (*reader)->Next();
    if (!event.ok()) return event.status();  // the writer's destructor drops the temp file
    if (!event->has_value()) break;
    KV_RETURN_IF_ERROR((*writer)->Write(**event));
    ++requests;
  }
  KV_RETURN_IF_ERROR((*writer)->Commit());
  return requests;
}

Result<BlockReuse> MooncakeBlockReuse(const std::string& path, MooncakeOptions options) {
  KV_RETURN_IF_ERROR(ValidateOptions(options));
  auto in = OpenInput(path);
  if (!in.ok()) return in.status();
  // Lookups only: nothing about this map's order reaches the result.
  std::unordered_map<int64_t, int64_t> longest;
  BlockReuse reuse;
  int64_t line = 0;
  TraceTime last_timestamp = -1;
  while (options.limit == 0 || reuse.requests < options.limit) {
    auto next = NextRequest(*in, path, options.trace_block, line, last_timestamp);
    if (!next.ok()) return next.status();
    if (!next->has_value()) break;
    if (line <= options.skip) continue;  // outside the window: neither counted nor seen
    const MooncakeRequest& r = **next;
    // Match first, then record: a request never reuses its own blocks.
    reuse.matched_tokens += MatchedTokens(r, longest, options.block_scale);
    for (size_t i = 0; i < r.hash_ids.size(); ++i) {
      const int64_t len = ScaledBlockLength(r, i, options.block_scale);
      reuse.prompt_tokens += len;
      int64_t& seen = longest[r.hash_ids[i]];
      seen = std::max(seen, len);
    }
    ++reuse.requests;
  }
  return reuse;
}

}  // namespace kvtwin::sim
