// Goal: a SharedLog (model/shared_log.h) is a value: whatever copies, slices, truncates and
// appends a set of logs goes through, each one reads back exactly what a plain vector put
// through the same operations holds, and no holder's tokens move under it while another
// holder appends. The reference keeps every whole-state snapshot as one, so a sharing bug
// here would make the oracle itself serve one conversation another's tokens.
// Method: a rapidcheck run drives N SharedLogs and N std::vectors side by side with random
// operations (append at the tip and off it, copy, slice, truncate, concat of adjacent and
// unrelated logs, concat across a copy of a prefix, one forward through two logs, clear)
// and compares all of them after every step; fixed cases pin the sharing itself (O(1)
// copies, widening concat, no reallocation of a shared buffer, a restore across copies
// that shares the newest, the logs of one forward sharing one buffer) and where it must
// not happen.
#include "model/shared_log.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace kvtwin::model {
namespace {

// The default tier is deterministic: a pinned seed, set before rapidcheck reads its
// configuration; an RC_PARAMS from the caller wins.
const bool kPinnedParams = [] {
  return setenv("RC_PARAMS", "seed=20261126 max_success=300", /*overwrite=*/0) == 0;
}();

TokenLog Tokens(int32_t first, int32_t count) {
  TokenLog out;
  for (int32_t i = 0; i < count; ++i) {
    out.push_back(Token{first + i, static_cast<uint64_t>(first + i) * 0x9E3779B97F4A7C15ull});
  }
  return out;
}

TokenLog Joined(TokenLog head, const TokenLog& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

RC_GTEST_PROP(SharedLog, EveryHolderReadsLikeAPlainVector, ()) {
  constexpr int kLogs = 4;
  std::vector<SharedLog> logs(kLogs);
  std::vector<TokenLog> want(kLogs);
  int32_t next_id = 1;
  const int steps = *rc::gen::inRange(1, 120);
  for (int step = 0; step < steps; ++step) {
    const int a = *rc::gen::inRange(0, kLogs);
    const int b = *rc::gen::inRange(0, kLogs);
    switch (*rc::gen::inRange(0, 8)) {
      case 0: {  // append fresh tokens
        const int32_t n = *rc::gen::inRange(1, 9);
        const TokenLog t = Tokens(next_id, n);
        next_id += n;
        logs[a].Append(t);
        want[a].insert(want[a].end(), t.begin(), t.end());
        break;
      }
      case 1:  // copy: shares the buffer
        logs[a] = logs[b];
        want[a] = want[b];
        break;
      case 2: {  // slice of another log
        const size_t size = want[b].size();
        const size_t begin = *rc::gen::inRange<size_t>(0, size + 1);
        const size_t end = *rc::gen::inRange<size_t>(begin, size + 1);
        const SharedLog slice = logs[b].Slice(begin, end);
        logs[a] = slice;
        want[a] = TokenLog(want[b].begin() + static_cast<int64_t>(begin),
                           want[b].begin() + static_cast<int64_t>(end));
        break;
      }
      case 3: {  // truncate
        const size_t length = *rc::gen::inRange<size_t>(0, want[a].size() + 1);
        logs[a].Truncate(length);
        want[a].resize(length);
        break;
      }
      case 4: {  // concat: often the adjacent slice of the same buffer
        const size_t size = want[b].size();
        const size_t cut = *rc::gen::inRange<size_t>(0, size + 1);
        SharedLog head = logs[b].Slice(0, cut);
        head.Concat(logs[b].Slice(cut, size));
        const bool adjacent = *rc::gen::arbitrary<bool>();
        if (adjacent) {
          logs[a] = head;
          want[a] = want[b];
        } else {
          const TokenLog tail = want[b];
          logs[a].Concat(logs[b]);
          want[a].insert(want[a].end(), tail.begin(), tail.end());
        }
        break;
      }
      case 5: {  // a later turn: b's prefix continued in a copy, its edges concatenated
        const size_t cut = *rc::gen::inRange<size_t>(0, want[b].size() + 1);
        const int32_t n = *rc::gen::inRange(1, 9);
        const TokenLog t = Tokens(next_id, n);
        next_id += n;
        SharedLog turn = logs[b];
        if (*rc::gen::arbitrary<bool>()) {  // re-forwards [back, cut) after a rewind first
          const size_t back = *rc::gen::inRange<size_t>(0, cut + 1);
          turn.Truncate(back);
          turn.Append(logs[b].Slice(back, cut).ToVector());
        }
        turn.Truncate(cut);
        turn.Append(t);  // b still holds the buffer: a copy that records where it came from
        const size_t part = *rc::gen::inRange<size_t>(0, cut + 1);
        SharedLog restored = logs[b].Slice(0, part);
        restored.Concat(turn.Slice(part, turn.size()));
        logs[a] = restored;
        want[a] = TokenLog(want[b].begin(), want[b].begin() + static_cast<int64_t>(cut));
        want[a].insert(want[a].end(), t.begin(), t.end());
        break;
      }
      case 6: {  // two layers write one forward: a takes b's log when it held b's tokens
        const int32_t n = *rc::gen::inRange(1, 9);
        const TokenLog t = Tokens(next_id, n);
        next_id += n;
        const bool same = a != b && logs[a].SameTokensAs(logs[b]);
        logs[b].Append(t);
        want[b].insert(want[b].end(), t.begin(), t.end());
        if (a != b) {
          if (same) {
            logs[a].AppendLike(t, logs[b]);
          } else {
            logs[a].Append(t);
          }
          want[a].insert(want[a].end(), t.begin(), t.end());
        }
        break;
      }
      default:
        logs[a].Clear();
        want[a].clear();
        break;
    }
    for (int i = 0; i < kLogs; ++i) {
      RC_ASSERT(logs[i].ToVector() == want[i]);
      RC_ASSERT(logs[i].size() == want[i].size());
      // "Certainly the same tokens" is never said of two different logs.
      for (int j = 0; j < kLogs; ++j)
        RC_ASSERT(!logs[i].SameTokensAs(logs[j]) || want[i] == want[j]);
    }
  }
}

TEST(SharedLog, CopiesAndSlicesShareTheBuffer) {
  SharedLog log(Tokens(1, 100));
  const SharedLog copy = log;
  const SharedLog head = log.Slice(0, 40);
  EXPECT_EQ(copy.data(), log.data());
  EXPECT_EQ(head.data(), log.data());
  // A KV merge of two edges cut from one log widens the view instead of copying.
  SharedLog left = log.Slice(10, 20);
  left.Concat(log.Slice(20, 35));
  EXPECT_EQ(left.data(), log.data() + 10);
  EXPECT_EQ(left.ToVector(), log.Slice(10, 35).ToVector());
  // A restore of a path's first node: concatenated onto an empty log, it is shared too, and
  // the restored log's later appends leave the original's tokens alone.
  SharedLog restored;
  restored.Concat(log.Slice(0, 30));
  EXPECT_EQ(restored.data(), log.data());
  restored.Append(Tokens(900, 5));
  EXPECT_EQ(log.ToVector(), Tokens(1, 100));
  EXPECT_EQ(restored.ToVector(), Joined(Tokens(1, 30), Tokens(900, 5)));
}

TEST(SharedLog, ARestoreAcrossTurnsViewsTheNewestCopy) {
  // Turn 1 writes 30 tokens; turn 2 restores its first 20 (the trie keeps edges [0, 10)
  // and [10, 20)) and appends 10 more, which copies the prefix because turn 1's log still
  // runs past it; turn 3 restores the edges [0, 10), [10, 20) and [20, 30) of turn 2.
  SharedLog turn1(Tokens(1, 30));
  SharedLog turn2 = turn1.Slice(0, 20);
  turn2.Append(Tokens(500, 10));
  ASSERT_NE(turn2.data(), turn1.data());
  SharedLog restored;
  restored.Concat(turn1.Slice(0, 10));
  restored.Concat(turn1.Slice(10, 20));
  restored.Concat(turn2.Slice(20, 30));  // turn 2's buffer starts with a copy of [0, 20)
  EXPECT_EQ(restored.data(), turn2.data());
  EXPECT_EQ(restored.ToVector(), turn2.ToVector());
}

TEST(SharedLog, ACopyOfARewrittenPrefixIsNotShared) {
  // The copy records [0, 10) of `source`; `source` is then cut back to 4 tokens and
  // rewritten, so only [0, 4) of the copy still matches it: [0, 6) must be copied.
  SharedLog source(Tokens(1, 10));
  SharedLog copy = source;
  copy.Append(Tokens(100, 40));  // past the shared buffer's capacity: a copy with a record
  ASSERT_NE(copy.data(), source.data());
  source.Truncate(4);
  source.Append(Tokens(200, 6));  // alone now, so [4, 10) is overwritten in place
  SharedLog restored = source.Slice(0, 6);
  restored.Concat(copy.Slice(6, 50));
  EXPECT_EQ(restored.ToVector(),
            Joined(Joined(Tokens(1, 4), Tokens(200, 2)), Joined(Tokens(7, 4), Tokens(100, 40))));
  EXPECT_NE(restored.data(), copy.data());
}

TEST(SharedLog, LogsOfOneForwardShareOneBuffer) {
  SharedLog first, second;  // two layers, empty: the same tokens
  for (int32_t turn = 0; turn < 3; ++turn) {
    const TokenLog t = Tokens(10 * turn + 1, 7);
    ASSERT_TRUE(second.SameTokensAs(first));
    first.Append(t);
    second.AppendLike(t, first);
    EXPECT_EQ(second.data(), first.data());
    EXPECT_EQ(second.ToVector(), first.ToVector());
  }
  // Equal tokens in unrelated buffers are not known to be equal; a copy of a prefix is.
  EXPECT_FALSE(SharedLog(Tokens(1, 7)).SameTokensAs(first.Slice(0, 7)));
  const SharedLog head = first.Slice(0, 5);
  SharedLog continued = head;
  continued.Append(Tokens(900, 40));  // a copy of [0, 5) with its record
  ASSERT_NE(continued.data(), first.data());
  EXPECT_TRUE(continued.Slice(0, 5).SameTokensAs(head));
  EXPECT_TRUE(head.SameTokensAs(continued.Slice(0, 5)));
  EXPECT_FALSE(continued.Slice(0, 6).SameTokensAs(first.Slice(0, 6)));
}

TEST(SharedLog, AnotherHoldersTokensNeverMove) {
  SharedLog cache(Tokens(1, 4));
  const SharedLog snapshot = cache;  // shares the buffer, its view ends at the tip
  const Token* before = snapshot.data();
  // Appends far past any spare capacity: a shared buffer must not reallocate under the
  // snapshot (a span taken of it would dangle, which a plain vector copy never does).
  for (int32_t i = 0; i < 64; ++i) cache.Append(Tokens(100 + i, 1));
  EXPECT_EQ(snapshot.data(), before);
  EXPECT_EQ(snapshot.ToVector(), Tokens(1, 4));
  EXPECT_EQ(cache.size(), 68u);
}

TEST(SharedLog, ATruncatedHolderDoesNotOverwriteALongerOne) {
  SharedLog a(Tokens(1, 10));
  const SharedLog b = a;
  a.Truncate(5);
  a.Append(Tokens(500, 3));
  EXPECT_EQ(b.ToVector(), Tokens(1, 10));
  EXPECT_EQ(a.ToVector(), Joined(Tokens(1, 5), Tokens(500, 3)));
}

}  // namespace
}  // namespace kvtwin::model
