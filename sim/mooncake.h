// Mooncake JSONL (../shared/traces-external/README.md): one request per line,
// {"timestamp", "input_length", "output_length", "hash_ids"}, each hash id naming one
// B-token prompt block together with every block before it. B is the trace's block size:
// 512 in Mooncake's traces; other production traces in this format hash smaller blocks
// (Alibaba's Bailian/Qwen traces use 16, with fractional timestamps in seconds and extra
// fields such as chat_id and turn, which are ignored). kvtwin maps a request to a
// RequestPlan at a block scale s (tokens per block, B = the recorded size): block i of
// id b becomes BlockTokens(b, len_i) with len_i = s for every block but the last, and
// ceil(r · s / B) for a last block of r < B recorded tokens (at least 1); the outputs
// are GeneratedTokens(index, max(1, ceil(output_length · s / B))). Prompts then share
// token prefixes exactly where they share block ids (BlockTokens' first token is distinct
// per id).
//
// Reading is streaming: one line at a time, memory independent of the trace length. A
// malformed line (not JSON, a missing or negative field, a hash_ids count that disagrees
// with input_length at B, a decreasing timestamp) is an InvalidArgument
// "FILE:LINE: /pointer: reason". Single-threaded.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "sim/trace.h"
#include "src/core/status.h"

namespace kvtwin::sim {

// Mooncake's block size, the default B.
inline constexpr int64_t kMooncakeBlockTokens = 512;
// The largest B accepted: far above any block a prefix cache hashes, and small enough that
// the scaled-length arithmetic (a remainder times the scale, both below B) stays in int64.
inline constexpr int64_t kMaxTraceBlockTokens = int64_t{1} << 20;

// A request's arrival time, in the trace's unit (milliseconds in Mooncake's traces,
// seconds with a fraction in others). Only its order is used. long double holds every
// int64 exactly (a 64-bit mantissa on x86-64, 113 bits on AArch64), so integer timestamps
// such as epoch nanoseconds compare exactly, and fractional ones compare as parsed.
using TraceTime = long double;

struct MooncakeRequest {
  TraceTime timestamp = 0;
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<int64_t> hash_ids;
  int64_t block_tokens = kMooncakeBlockTokens;  // B: recorded tokens per hash id
};

// Parses and validates one line of a trace of `block_tokens`-token blocks (`file`, `line`
// name it in errors; `previous_timestamp` is the last line's, or -1). The timestamp is any
// non-negative finite JSON number.
// REQUIRES: 1 <= block_tokens <= kMaxTraceBlockTokens.
Result<MooncakeRequest> ParseMooncakeLine(const std::string& text, const std::string& file,
                                          int64_t line, TraceTime previous_timestamp,
                                          int64_t block_tokens = kMooncakeBlockTokens);

// The token length of block `i` of `r` at `block_scale`.
// REQUIRES: 1 <= block_scale <= r.block_tokens.
int64_t ScaledBlockLength(const MooncakeRequest& r, size_t i, int64_t block_scale);

// The plan of request number `index` at `block_scale`
// (REQUIRES: 1 <= block_scale <= r.block_tokens). The conversation is the request's first
// hash id.
RequestPlan MooncakePlan(const MooncakeRequest& r, int64_t index, int64_t block_scale);

// Whether the first line of `path` looks like Mooncake JSONL (an object with "hash_ids"
// and no "format"); false when it cannot be read.
bool LooksLikeMooncake(const std::string& path);

// The prefill cadence of a Mooncake replay unless the caller sets one: chunks and periodic
// captures of one block (block_scale tokens), as a server that prefills in chunks and keeps
// a block-level prefix cache would, never finer than the trace format's defaults (chunk 5,
// interval 8), so small scales keep their dense boundaries. With those defaults at 512
// tokens per block a 40k-token prompt took 8,000 forwards and 5,000 captures, and the
// reference's whole-state snapshots (each the log so far) grew quadratically with them.
inline int64_t MooncakeChunk(int64_t block_scale) { return block_scale > 5 ? block_scale : 5; }
inline int64_t MooncakeInterval(int64_t block_scale) { return block_scale > 8 ? block_scale : 8; }

struct MooncakeOptions {
  int64_t trace_block = kMooncakeBlockTokens;  // B, tokens per hash id in the trace
  int64_t block_scale = kMooncakeBlockTokens;  // s, in 1..B (the CLI defaults it to B)
  int64_t skip = 0;   // requests at the start left out (a later, warmer window)
  int64_t limit = 0;  // then `limit` requests only; 0 = all
};

// Streams a Mooncake file as request events (TraceReader's interface); `header` is the
// replay setup the caller chose (kind requests), with source naming the file and scale.
class MooncakeReader {
 public:
  static Result<std::unique_ptr<MooncakeReader>> Open(const std::string& path,
                                                      MooncakeOptions options, TraceHeader header);
  const TraceHeader& header() const { return header_; }
  Result<std::optional<TraceEvent>> Next();
  int64_t line() const { return line_; }
  const std::string& path() const { return path_; }

 private:
  MooncakeReader(std::string path, std::ifstream in, MooncakeOptions options, TraceHeader header)
      : path_(std::move(path)), in_(std::move(in)), options_(options), header_(std::move(header)) {}
  std::string path_;
  std::ifstream in_;
  MooncakeOptions options_;
  TraceHeader header_;
  int64_t line_ = 0;
  TraceTime last_timestamp_ = -1;
};

// Streams `in` into a kvtwin trace at `out` (atomic), request by request.
// Returns the number of requests written.
Result<int64_t> ImportMooncake(const std::string& in, const std::string& out,
                               MooncakeOptions options, TraceHeader header);

// The independent block-level prefix reuse at an unlimited budget, from the hash ids
// alone (no trie, no tokens), over the same window as the reader (skip, limit): for each
// request, walk its blocks in order while the id was
// seen in an earlier request and add min(this block's scaled length, the longest scaled
// length seen for that id); stop at the first unseen id or at a block only partly covered.
// Memory: one entry per distinct id.
struct BlockReuse {
  int64_t requests = 0;
  int64_t prompt_tokens = 0;   // Σ scaled prompt lengths
  int64_t matched_tokens = 0;  // Σ reusable prefix tokens
  double ratio() const {
    return prompt_tokens > 0
               ? static_cast<double>(matched_tokens) / static_cast<double>(prompt_tokens)
               : 0.0;
  }
};
Result<BlockReuse> MooncakeBlockReuse(const std::string& path, MooncakeOptions options);

}  // namespace kvtwin::sim
