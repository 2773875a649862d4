// Goal: the structure-aware mutator keeps inputs well formed and does what it says: whole
// records are inserted, deleted and swapped, value fields are aimed at boundary modes, the
// size never exceeds max_size, and equal seeds give equal mutants. Also the trace_reader
// family's properties on the bundled traces and on malformed text.
// Method: mutate random inputs of every structured target with a byte mutator that flips
// one byte (a stand-in for LLVMFuzzerMutate) and classify each mutant by diffing it against
// the original record by record.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "sim/fuzz_families.h"
#include "sim/fuzz_input.h"
#include "src/core/rng.h"

namespace kvtwin::sim {
namespace {

size_t FlipOne(uint8_t* data, size_t size, size_t /*max_size*/) {
  if (size > 0) data[size / 2] ^= 0x5a;
  return size;
}

// `in` followed by `extra` zero bytes: room for the mutator to grow into.
std::vector<uint8_t> WithRoom(const std::vector<uint8_t>& in, size_t extra) {
  std::vector<uint8_t> out(in.size() + extra, 0);
  std::copy(in.begin(), in.end(), out.begin());
  return out;
}

std::vector<uint8_t> RandomInput(const FuzzLayout& layout, size_t records, Rng& rng) {
  std::vector<uint8_t> v(layout.header_bytes + records * layout.record_bytes);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng.Below(256));
  return v;
}

// Whether two record lists hold the same records in any order (std::is_permutation, which
// unlike a multiset of vectors does not trip gcc 12's -Wstringop-overread false positive).
bool SameMultiset(const std::vector<std::vector<uint8_t>>& a,
                  const std::vector<std::vector<uint8_t>>& b) {
  return std::is_permutation(a.begin(), a.end(), b.begin(), b.end());
}

// Whether `small` is `big` with exactly one record taken out (the others in their order).
bool OneRecordRemoved(const std::vector<std::vector<uint8_t>>& big,
                      const std::vector<std::vector<uint8_t>>& small) {
  if (small.size() + 1 != big.size()) return false;
  for (size_t skip = 0; skip < big.size(); ++skip) {
    bool same = true;
    for (size_t i = 0, j = 0; i < big.size() && same; ++i) {
      if (i == skip) continue;
      same = big[i] == small[j++];
    }
    if (same) return true;
  }
  return false;
}

// A FuzzParts' records copied out of the input they view.
std::vector<std::vector<uint8_t>> Owned(const FuzzParts& parts) {
  std::vector<std::vector<uint8_t>> out;
  for (const std::span<const uint8_t> r : parts.records) out.emplace_back(r.begin(), r.end());
  return out;
}

const std::vector<FuzzTarget> kStructured = {FuzzTarget::kKv,        FuzzTarget::kRotating,
                                             FuzzTarget::kRecurrent, FuzzTarget::kSpeculation,
                                             FuzzTarget::kPrefix,    FuzzTarget::kHybrid};

TEST(FuzzMutate, KeepsWholeRecordsWithinMaxSize) {
  Rng rng(7);
  for (FuzzTarget t : kStructured) {
    const FuzzLayout layout = LayoutOf(t);
    ASSERT_GT(layout.record_bytes, 0u) << FuzzTargetName(t);
    for (uint32_t seed = 0; seed < 300; ++seed) {
      const size_t records = rng.Below(6);
      const size_t max_size = layout.header_bytes + (records + rng.Below(3)) * layout.record_bytes;
      std::vector<uint8_t> in =
          WithRoom(RandomInput(layout, records, rng),
                   max_size - layout.header_bytes - records * layout.record_bytes);
      const size_t out =
          MutateFuzzInput(t, in.data(), layout.header_bytes + records * layout.record_bytes,
                          max_size, seed, &FlipOne);
      EXPECT_LE(out, max_size) << FuzzTargetName(t) << " seed " << seed;
      EXPECT_GE(out, layout.header_bytes);
      EXPECT_EQ((out - layout.header_bytes) % layout.record_bytes, 0u)
          << FuzzTargetName(t) << " seed " << seed;
    }
  }
}

TEST(FuzzMutate, DeterministicInSeed) {
  Rng rng(8);
  const FuzzLayout layout = LayoutOf(FuzzTarget::kRotating);
  const std::vector<uint8_t> in = RandomInput(layout, 5, rng);
  for (uint32_t seed = 0; seed < 50; ++seed) {
    std::vector<uint8_t> a = WithRoom(in, 4 * layout.record_bytes);
    std::vector<uint8_t> b = a;
    const size_t na =
        MutateFuzzInput(FuzzTarget::kRotating, a.data(), in.size(), a.size(), seed, &FlipOne);
    const size_t nb =
        MutateFuzzInput(FuzzTarget::kRotating, b.data(), in.size(), b.size(), seed, &FlipOne);
    ASSERT_EQ(na, nb);
    EXPECT_TRUE(std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(na), b.begin()));
  }
}

// Every edit kind shows up over many seeds: growth by one record (insert), shrinkage by one
// (delete), a permutation of records (swap), and a mode byte set to a boundary mode (aim).
TEST(FuzzMutate, ReachesEveryEdit) {
  for (FuzzTarget t : kStructured) {
    const FuzzLayout layout = LayoutOf(t);
    Rng rng(9);
    const size_t n = 4;
    const std::vector<uint8_t> in = RandomInput(layout, n, rng);
    const FuzzParts before = SplitFuzzInput(layout, in.data(), in.size());
    std::set<std::string> seen;
    for (uint32_t seed = 0; seed < 400; ++seed) {
      std::vector<uint8_t> buf = WithRoom(in, layout.record_bytes);
      const size_t out = MutateFuzzInput(t, buf.data(), in.size(), buf.size(), seed, &FlipOne);
      const FuzzParts after = SplitFuzzInput(layout, buf.data(), out);
      // An insert adds one record and keeps every other in order; a delete takes exactly
      // one out; the header is untouched by both.
      if (after.records.size() == n + 1) {
        EXPECT_TRUE(OneRecordRemoved(Owned(after), Owned(before)) && after.header == before.header)
            << FuzzTargetName(t) << " seed " << seed << ": not an insert";
        seen.insert("insert");
      }
      if (after.records.size() + 1 == n) {
        EXPECT_TRUE(OneRecordRemoved(Owned(before), Owned(after)) && after.header == before.header)
            << FuzzTargetName(t) << " seed " << seed << ": not a delete";
        seen.insert("delete");
      }
      if (after.records.size() != n || after.header != before.header) continue;
      if (SameMultiset(Owned(before), Owned(after)) && Owned(after) != Owned(before))
        seen.insert("swap");
      for (size_t r = 0; r < n; ++r) {
        for (size_t f : layout.value_fields) {
          const size_t at = layout.record_bytes - 1 - f;
          const uint8_t mode = after.records[r][at];
          if (mode != before.records[r][at] && mode < kValueModes && mode != 1) seen.insert("aim");
        }
      }
    }
    for (const char* edit : {"insert", "delete", "swap", "aim"})
      EXPECT_TRUE(seen.count(edit)) << FuzzTargetName(t) << " never did " << edit;
  }
}

TEST(FuzzMutate, ResolveValueTable) {
  ValueContext c{.anchor = 20, .window = 4, .from = 3, .to = 9};
  EXPECT_EQ(ResolveValue(0, 8, c), 20);   // relative, arg 8 = the anchor
  EXPECT_EQ(ResolveValue(0, 0, c), 12);   // relative, -8
  EXPECT_EQ(ResolveValue(1, 77, c), 77);  // absolute
  EXPECT_EQ(ResolveValue(2, 0, c), 3);    // W - 1
  EXPECT_EQ(ResolveValue(2, 2, c), 5);    // W + 1
  EXPECT_EQ(ResolveValue(3, 1, c), 16);   // anchor - W
  EXPECT_EQ(ResolveValue(4, 0, c), 2);    // from - 1
  EXPECT_EQ(ResolveValue(4, 3, c), 9);    // to
  EXPECT_EQ(ResolveValue(9, 1, c), 8);    // mode 9 % 5 = snapshot end: to - 1
  c.from.reset();
  EXPECT_EQ(ResolveValue(4, 8, c), 20);  // no snapshot: relative
}

std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The reader properties hold on every seed-corpus entry; accepted ones come back whole.
TEST(FuzzTraceReader, CorpusEntriesHoldTheProperties) {
  int accepted = 0, rejected = 0;
  for (const auto& e : std::filesystem::directory_iterator("fuzz/corpus/trace_reader")) {
    const std::string text = ReadAll(e.path());
    const FuzzRun run = RunFuzzInput(FuzzTarget::kTraceReader,
                                     reinterpret_cast<const uint8_t*>(text.data()), text.size());
    EXPECT_FALSE(run.divergence) << e.path() << ": " << run.divergence.value_or("");
    (ParseTrace("x", text).ok() ? accepted : rejected)++;
  }
  EXPECT_GE(accepted, 5);
  EXPECT_GE(rejected, 3);
}

TEST(FuzzTraceReader, RejectionsNameTheInputOnOneLine) {
  for (const std::string text : {"{", "\n\n", "{\"format\":\"kvtwin-trace\"}", "[1,2]\n{}"}) {
    const Result<Trace> t = ParseTrace("fuzz-input", text);
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_EQ(t.status().message().rfind("fuzz-input:", 0), 0u) << t.status().message();
    const FuzzRun run = RunFuzzInput(FuzzTarget::kTraceReader,
                                     reinterpret_cast<const uint8_t*>(text.data()), text.size());
    EXPECT_FALSE(run.divergence) << run.divergence.value_or("");
  }
}

}  // namespace
}  // namespace kvtwin::sim
