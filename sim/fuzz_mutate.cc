// MutateFuzzInput: libFuzzer's custom mutator, structure-aware. Byte flips alone rarely
// insert, drop or reorder whole operations, and almost never land an offset exactly on a
// window or snapshot edge, where the interesting cache bugs are (the off-by-ones of
// rotating rewinds, split points at a snapshot end). Working on whole records keeps every
// mutant a well-formed op list; the value-field table (FuzzLayout::value_fields) says where
// an offset's mode byte is, so "aim" can set it to a boundary mode that the decoder
// resolves against the live state. Everything else falls back to libFuzzer's own byte
// mutator on one record or the header.
#include <algorithm>
#include <utility>

#include "sim/fuzz_families.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

using Record = std::vector<uint8_t>;

// Byte-mutates `part` in place with libFuzzer's mutator, keeping its length.
void MutateBytes(Record& part, ByteMutator bytes) {
  if (part.empty()) return;
  const size_t n = bytes(part.data(), part.size(), part.size());
  std::fill(part.begin() + static_cast<std::ptrdiff_t>(std::min(n, part.size())), part.end(), 0);
}

Record FreshRecord(size_t size, Rng& rng) {
  Record r(size);
  for (uint8_t& b : r) b = static_cast<uint8_t>(rng.Below(256));
  return r;
}

// Sets one value field of `r` to a boundary mode: W - 1 .. W + 1, just behind the window,
// a snapshot end, or the anchor itself (kRelative with argument 8).
void Aim(Record& r, size_t field, Rng& rng) {
  static constexpr ValueMode kModes[] = {ValueMode::kWindow, ValueMode::kBehindWindow,
                                         ValueMode::kSnapshotEnd, ValueMode::kRelative};
  const ValueMode mode = kModes[rng.Below(std::size(kModes))];
  const size_t mode_at = r.size() - 1 - field;
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
  const FuzzLayout layout = LayoutOf(target);
  if (layout.record_bytes == 0 || max_size < layout.header_bytes)
    return bytes(data, size, max_size);
  Rng rng(seed);
  FuzzParts parts = SplitFuzzInput(layout, data, size);
  std::vector<Record> records;  // owned: the edits below write into `data`
  for (const std::span<const uint8_t> r : parts.records) records.emplace_back(r.begin(), r.end());
  const size_t capacity =
      std::min(layout.max_records, (max_size - layout.header_bytes) / layout.record_bytes);
  if (records.size() > capacity) records.resize(capacity);
  const size_t n = records.size();
  const auto pick = [&rng](size_t bound) { return static_cast<std::ptrdiff_t>(rng.Below(bound)); };
  switch (Choose(n, capacity, !layout.value_fields.empty(), rng)) {
    case Edit::kBytes:
      if (n == 0) {
        MutateBytes(parts.header, bytes);
      } else {
        MutateBytes(records[static_cast<size_t>(pick(n))], bytes);
      }
      break;
    case Edit::kHeader:
      MutateBytes(parts.header, bytes);
      break;
    case Edit::kInsert: {
      Record r = n > 0 && rng.Chance(1, 2) ? records[static_cast<size_t>(pick(n))]
                                           : FreshRecord(layout.record_bytes, rng);
      records.insert(records.begin() + pick(n + 1), std::move(r));
      break;
    }
    case Edit::kDelete:
      records.erase(records.begin() + pick(n));
      break;
    case Edit::kSwap:
      std::swap(records[static_cast<size_t>(pick(n))], records[static_cast<size_t>(pick(n))]);
      break;
    case Edit::kAim:
      Aim(records[static_cast<size_t>(pick(n))],
          layout.value_fields[rng.Below(layout.value_fields.size())], rng);
      break;
  }
  size_t out = 0;
  std::copy(parts.header.begin(), parts.header.end(), data);
  out += parts.header.size();
  for (const Record& r : records) {
    std::copy(r.begin(), r.end(), data + out);
    out += r.size();
  }
  return out;
}

}  // namespace kvtwin::sim
