// Trace format v1, kind "multiseq" (sim/trace.h): the header's cache shape and the MsOp
// events. Ids are range-checked against max_seqs and batch positions against int32 here;
// whether an op is one a correct runner would issue at that point is the replayer's to judge.
#include <fmt/format.h>

#include <string>

#include "sim/stack.h"
#include "sim/synthetic.h"
#include "sim/trace_json.h"

namespace kvtwin::sim::trace_json {
namespace {

// Lengths, Remove bounds and probes reach one past a sequence at int32's last position and
// a little beyond; this bound only keeps arithmetic on them far from int64's edge.
constexpr int64_t kMaxProbe = int64_t{1} << 32;

// "window" / "memory": an integer, or null or absent for kvtwin::kUnbounded.
Status DecodeUnbounded(const Fields& m, std::string_view key, int64_t* out) {
  const Json* v = m.Find(key);
  if (v == nullptr || v->is_null()) {
    *out = kvtwin::kUnbounded;
    return Status::Ok();
  }
  return m.Int(key, 1, kMaxBatchPosition + 1, out, Need::kRequired);
}

}  // namespace

// "multiseq" (every MultiSeqConfig field) and "conv"; MultiSeqConfig::Validate has the last
// word. Shape fields are bounded so a hostile header cannot make the driver allocate
// gigabytes; the ids' and layers' real limits are Validate's.
Status DecodeMultiSeq(const Fields& f, TraceHeader* h) {
  constexpr int64_t kMaxShape = int64_t{1} << 16;
  const Json* object = nullptr;
  KV_RETURN_IF_ERROR(f.Object("multiseq", &object, Need::kRequired));
  const Fields m(f.where(), *object, f.Ptr("multiseq"));
  static constexpr std::string_view kKeys[] = {
      "capacity", "chunk",      "d_conv",          "dtype",  "hidden",
      "kv_cols",  "max_batch",  "max_seqs",        "memory", "num_conv_layers",
      "padding",  "permuted_v", "shift_supported", "window"};
  KV_RETURN_IF_ERROR(m.OnlyKeys(kKeys));
  MultiSeqConfig& c = h->multiseq;
  // Up to the cache's 2^24 cells: a windowed cache's cells follow its memory, so its
  // capacity may be large (MultiSeqConfig::Validate bounds the cells the layout derives).
  KV_RETURN_IF_ERROR(m.Int("capacity", 0, int64_t{1} << 24, &c.capacity, Need::kRequired));
  KV_RETURN_IF_ERROR(m.Int("chunk", 0, kMaxBatchPosition + 1, &c.chunk, Need::kRequired));
  KV_RETURN_IF_ERROR(m.Int("d_conv", 0, kMaxShape, &c.d_conv, Need::kRequired));
  std::string dtype;
  KV_RETURN_IF_ERROR(m.String("dtype", &dtype, Need::kRequired));
  const Result<DType> parsed = ParseDType(dtype);
  if (!parsed.ok()) return m.Error("dtype", parsed.status().message());
  c.dtype = *parsed;
  KV_RETURN_IF_ERROR(m.Int("hidden", 0, kMaxShape, &c.hidden, Need::kRequired));
  KV_RETURN_IF_ERROR(m.Int("kv_cols", 0, kMaxShape, &c.kv_cols, Need::kRequired));
  KV_RETURN_IF_ERROR(m.Int("max_batch", 0, kMaxShape, &c.max_batch, Need::kRequired));
  KV_RETURN_IF_ERROR(m.Int("max_seqs", 0, kMaxInt32, &c.max_seqs, Need::kRequired));
  KV_RETURN_IF_ERROR(DecodeUnbounded(m, "memory", &c.memory));
  KV_RETURN_IF_ERROR(m.Int("num_conv_layers", 0, kMaxInt32, &c.num_conv_layers, Need::kRequired));
  KV_RETURN_IF_ERROR(m.Int("padding", 0, kMaxShape, &c.padding, Need::kRequired));
  KV_RETURN_IF_ERROR(m.Bool("permuted_v", &c.permuted_v, Need::kRequired));
  KV_RETURN_IF_ERROR(m.Bool("shift_supported", &c.shift_supported, Need::kRequired));
  KV_RETURN_IF_ERROR(DecodeUnbounded(m, "window", &c.window));
  if (const Status valid = c.Validate(); !valid.ok()) {
    return f.Error("multiseq", valid.message());
  }
  std::string conv;
  KV_RETURN_IF_ERROR(f.String("conv", &conv, Need::kRequired));
  if (conv != "as-specified" && conv != "ideal") {
    return f.Error("conv", fmt::format("unknown conv expectation {} (expected \"as-specified\" or "
                                       "\"ideal\")",
                                       Quote(conv)));
  }
  c.conv = conv == "ideal" ? ConvExpectation::kIdeal : ConvExpectation::kAsSpecified;
  return Status::Ok();
}

namespace {

// ---- Multi-sequence ops ----

// [seq, pos, token] entries of a forward's "batch".
Status DecodeBatch(const Fields& f, int32_t max_seqs, std::vector<MsBatchToken>* batch) {
  const Json* v = f.Find("batch");
  if (v == nullptr) return f.Error("batch", "missing required field");
  if (!v->is_array()) return f.Error("batch", Expected("an array", *v));
  if (v->size() > static_cast<size_t>(kMaxLength)) {
    return f.Error("batch",
                   fmt::format("too long: {} entries (at most {})", v->size(), kMaxLength));
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string ptr = fmt::format("{}/{}", f.Ptr("batch"), i);
    const Json& e = (*v)[i];
    if (e.is_array() && e.size() != 3) {
      return f.where().Error(ptr,
                             fmt::format("expected [seq, pos, token], got {} entries", e.size()));
    }
    std::vector<int64_t> t;
    KV_RETURN_IF_ERROR(DecodeInts(f.where(), e, ptr, 0, kMaxInt32, 3, &t));
    if (t[0] >= max_seqs) {
      return f.where().Error(ptr + "/0",
                             fmt::format("sequence {} out of range (max_seqs {})", t[0], max_seqs));
    }
    if (t[1] > kMaxBatchPosition) {
      return f.where().Error(ptr + "/1",
                             fmt::format("must be <= {}, got {}", kMaxBatchPosition, t[1]));
    }
    batch->push_back({static_cast<int32_t>(t[0]), t[1], static_cast<int32_t>(t[2])});
  }
  return Status::Ok();
}

// A sequence id field, in [0, max_seqs).
Status DecodeSeq(const Fields& f, std::string_view key, int32_t max_seqs, int32_t* out) {
  KV_RETURN_IF_ERROR(f.Int(key, 0, kMaxInt32, out, Need::kRequired));
  if (*out < max_seqs) return Status::Ok();
  return f.Error(key, fmt::format("sequence {} out of range (max_seqs {})", *out, max_seqs));
}

Status DecodeMsOpAt(const Where& w, const Json& j, const std::string& prefix, int32_t max_seqs,
                    MsOp* op);

// A forward's "edits": CopyPrefix and Remove ops between its StartForward and Put. A few
// suffice for any interleaving a server makes; the bound keeps a hostile line small.
Status DecodeEdits(const Fields& f, int32_t max_seqs, MsOp* op) {
  constexpr size_t kMaxEdits = 16;
  const Json* v = f.Find("edits");
  if (v == nullptr) return Status::Ok();
  if (!v->is_array()) return f.Error("edits", Expected("an array", *v));
  if (v->size() > kMaxEdits) {
    return f.Error("edits", fmt::format("too long: {} entries (at most {})", v->size(), kMaxEdits));
  }
  if (op->reserve && !v->empty()) {
    return f.Error("edits", "a reserve pass places nothing, so it has no edits before its Put");
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string ptr = fmt::format("{}/{}", f.Ptr("edits"), i);
    const Json& e = (*v)[i];
    if (!e.is_object()) return f.where().Error(ptr, Expected("an object", e));
    // The kind first: a forward nested in an edit is refused before its own fields (and
    // edits) are read, so a hostile line cannot nest them deep.
    std::string name;
    KV_RETURN_IF_ERROR(Fields(f.where(), e, ptr).String("op", &name, Need::kRequired));
    if (name != MsOpKindName(MsOpKind::kCopyPrefix) && name != MsOpKindName(MsOpKind::kRemove)) {
      return f.where().Error(ptr + "/op",
                             "a forward's edits are copy_prefix or remove, got " + Quote(name));
    }
    MsOp edit;
    KV_RETURN_IF_ERROR(DecodeMsOpAt(f.where(), e, ptr, max_seqs, &edit));
    op->edits.push_back(std::move(edit));
  }
  return Status::Ok();
}

Status DecodeMsFields(const Fields& f, int32_t max_seqs, MsOp* op) {
  switch (op->kind) {
    case MsOpKind::kForward:
      KV_RETURN_IF_ERROR(DecodeBatch(f, max_seqs, &op->batch));
      KV_RETURN_IF_ERROR(f.Ints("causal_off", 0, kMaxLength, 0, &op->causal_off, Need::kOptional));
      KV_RETURN_IF_ERROR(f.Bool("reserve", &op->reserve, Need::kOptional));
      return DecodeEdits(f, max_seqs, op);
    case MsOpKind::kCopyPrefix:
      KV_RETURN_IF_ERROR(DecodeSeq(f, "dst", max_seqs, &op->dst));
      // Negative lengths too (spec §2.8: no cell has pos < len, so dst ends empty).
      KV_RETURN_IF_ERROR(f.Int("len", std::numeric_limits<int32_t>::min(), kMaxProbe, &op->begin,
                               Need::kRequired));
      return DecodeSeq(f, "src", max_seqs, &op->seq);
    case MsOpKind::kRemove:
      KV_RETURN_IF_ERROR(f.Int("begin", 0, kMaxProbe, &op->begin, Need::kRequired));
      // Any end (absent or the largest int64: to the end); positions stay within int32, so
      // a larger end removes the tail and shifts nothing.
      KV_RETURN_IF_ERROR(f.Int("end", 0, kvtwin::kUnbounded, &op->end, Need::kOptional));
      return DecodeSeq(f, "seq", max_seqs, &op->seq);
    case MsOpKind::kCanResume:
      KV_RETURN_IF_ERROR(f.Int("pos", 0, kMaxProbe, &op->begin, Need::kRequired));
      return DecodeSeq(f, "seq", max_seqs, &op->seq);
  }
  return Status::Ok();
}

Status DecodeMsOpAt(const Where& w, const Json& j, const std::string& prefix, int32_t max_seqs,
                    MsOp* op) {
  const Fields f(w, j, prefix);
  static constexpr std::string_view kForward[] = {"batch", "causal_off", "edits", "op", "reserve"};
  static constexpr std::string_view kCopyPrefix[] = {"dst", "len", "op", "src"};
  static constexpr std::string_view kRemove[] = {"begin", "end", "op", "seq"};
  static constexpr std::string_view kCanResume[] = {"op", "pos", "seq"};
  static constexpr Keys kKeys[] = {kForward, kCopyPrefix, kRemove, kCanResume};
  std::string name;
  KV_RETURN_IF_ERROR(f.String("op", &name, Need::kRequired));
  bool known = false;
  for (uint8_t k = 0; k <= static_cast<uint8_t>(MsOpKind::kCanResume) && !known; ++k) {
    op->kind = static_cast<MsOpKind>(k);
    known = name == MsOpKindName(op->kind);
  }
  if (!known) return f.Error("op", fmt::format("unknown multiseq op {}", Quote(name)));
  KV_RETURN_IF_ERROR(
      f.OnlyKeys(kKeys[static_cast<size_t>(op->kind)], fmt::format(" for op \"{}\"", name)));
  return DecodeMsFields(f, max_seqs, op);
}

}  // namespace

Status DecodeMsOp(const Where& w, const Json& j, int32_t max_seqs, MsOp* op) {
  return DecodeMsOpAt(w, j, "", max_seqs, op);
}

}  // namespace kvtwin::sim::trace_json
