// MutateFuzzInput: libFuzzer's custom mutator, structure-aware. Byte flips alone rarely
// insert, drop or reorder whole operations, and almost never land an offset exactly on a
// window or snapshot edge, where the interesting cache bugs are (the off-by-ones of
// rotating rewinds, split points at a snapshot end). Working on whole records keeps every
// mutant a well-formed op list; the value-field table (FuzzLayout::value_fields) says where
// an offset's mode byte is, so "aim" can set it to a boundary mode that the decoder
// resolves against the live state. Everything else falls back to libFuzzer's own byte
// mutator on one record or the header.
// Records are fixed-size, so every edit works in place on `data` (a memmove for insert and
// delete): the mutator runs once per execution and, under ASan, a copy of the records per
// call cost more than the edit.
#include <algorithm>
#include <array>
#include <cstring>

#include "sim/fuzz_families.h"
#include "src/core/check.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

// Byte-mutates [part, part + n) in place with libFuzzer's mutator, keeping its length.
void MutateBytes(uint8_t* part, size_t n, ByteMutator bytes) {
  if (n == 0) return;
  const size_t kept = std::min(bytes(part, n, n), n);
  std::fill(part + kept, part + n, 0);
}

// Sets one value field of the record at `r` to a boundary mode: W - 1 .. W + 1, just behind
// the window, a snapshot end, or the anchor itself (kRelative with argument 8).
void Aim(uint8_t* r, size_t record_bytes, size_t field, Rng& rng) {
  static constexpr ValueMode kModes[] = {ValueMode::kWindow, ValueMode::kBehindWindow,
                                         ValueMode::kSnapshotEnd, ValueMode::kRelative};
  const ValueMode mode = kModes[rng.Below(std::size(kModes))];
  const size_t mode_at = record_bytes - 1 - field;
  const size_t arg_at = mode_at - 1;  // the argument is the next field
  r[mode_at] = static_cast<uint8_t>(mode);
  r[arg_at] = mode == ValueMode::kRelative ? uint8_t{8} : static_cast<uint8_t>(rng.Below(6));
}

enum class Edit { kBytes, kHeader, kInsert, kDelete, kSwap, kAim };

Edit Choose(size_t n, size_t capacity, bool aimable, Rng& rng) {
  while (true) {
    const uint64_t roll = rng.Below(100);
    if (roll < 30) return Edit::kBytes;
    if (roll < 35) return Edit::kHeader;
    if (roll < 55 && n < capacity) return Edit::kInsert;
    if (roll < 65 && n > 1) return Edit::kDelete;
    if (roll < 75 && n > 1) return Edit::kSwap;
    if (roll >= 75 && aimable && n > 0) return Edit::kAim;
    if (n == 0 && capacity == 0) return Edit::kHeader;
  }
}

}  // namespace

size_t MutateFuzzInput(FuzzTarget target, uint8_t* data, size_t size, size_t max_size,
                       uint32_t seed, ByteMutator bytes) {
  const FuzzLayout& layout = CachedLayout(target);
  if (layout.record_bytes == 0 || max_size < layout.header_bytes)
    return bytes(data, size, max_size);
  const size_t hb = layout.header_bytes;
  const size_t rb = layout.record_bytes;
  // The header is read as if zero-padded (SplitFuzzInput); the mutant carries it whole.
  if (size < hb) std::fill(data + size, data + hb, 0);
  const size_t capacity = std::min(layout.max_records, (max_size - hb) / rb);
  const size_t n = std::min(size > hb ? (size - hb) / rb : 0, capacity);
  uint8_t* records = data + hb;
  const auto at = [&](size_t i) { return records + i * rb; };
  Rng rng(seed);
  const auto pick = [&rng](size_t bound) { return static_cast<size_t>(rng.Below(bound)); };
  size_t out_records = n;
  switch (Choose(n, capacity, !layout.value_fields.empty(), rng)) {
    case Edit::kBytes:
      if (n == 0) {
        MutateBytes(data, hb, bytes);
      } else {
        MutateBytes(at(pick(n)), rb, bytes);
      }
      break;
    case Edit::kHeader:
      MutateBytes(data, hb, bytes);
      break;
    case Edit::kInsert: {
      // The new record is decided before its place, as a copy of a record or fresh bytes.
      std::array<uint8_t, 256> fresh{};
      KV_CHECK(rb <= fresh.size(), "a record fits the insert buffer");
      if (n > 0 && rng.Chance(1, 2)) {
        std::memcpy(fresh.data(), at(pick(n)), rb);
      } else {
        for (size_t i = 0; i < rb; ++i) fresh[i] = static_cast<uint8_t>(rng.Below(256));
      }
      const size_t where = pick(n + 1);
      std::memmove(at(where + 1), at(where), (n - where) * rb);
      std::memcpy(at(where), fresh.data(), rb);
      out_records = n + 1;
      break;
    }
    case Edit::kDelete: {
      const size_t where = pick(n);
      std::memmove(at(where), at(where + 1), (n - where - 1) * rb);
      out_records = n - 1;
      break;
    }
    case Edit::kSwap: {
      const size_t a = pick(n);
      const size_t b = pick(n);
      if (a != b) std::swap_ranges(at(a), at(a) + rb, at(b));  // the ranges must not overlap
      break;
    }
    case Edit::kAim: {
      uint8_t* r = at(pick(n));
      Aim(r, rb, layout.value_fields[rng.Below(layout.value_fields.size())], rng);
      break;
    }
  }
  return hb + out_records * rb;
}

}  // namespace kvtwin::sim
