// Goal: Tensor::EnsureShape, the reuse rule of every buffer kept across calls (the forward
// and kernel scratch): the same shape keeps the tensor untouched, any other dtype, row or
// column count gives a zero-filled tensor of the new shape. AssignRows, built on it, equals
// Rows() whatever the target held before; Rows() itself copies its range bit for bit. CopyRows
// moves whole rows bit-exactly, also within one tensor when the ranges overlap. A TensorView
// reads exactly the rows it was given from storage it does not own. Method: mark a
// tensor, ask for each shape, and look at the marks and the shape; copy row ranges and compare
// every element with the rows read one by one before the copy.
#include "src/core/tensor.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <tuple>

namespace kvtwin {
namespace {

Tensor Marked() {
  Tensor t(DType::kFloat32, 3, 2);
  t.Set(2, 1, 5.0f);
  return t;
}

TEST(Tensor, EnsureShapeKeepsATensorOfThatShapeAsItIs) {
  Tensor t = Marked();
  const void* storage = nullptr;
  t.Visit([&](const auto& m) { storage = m.data(); });
  t.EnsureShape(DType::kFloat32, 3, 2);
  EXPECT_EQ(t.At(2, 1), 5.0f);
  t.Visit([&](const auto& m) { EXPECT_EQ(static_cast<const void*>(m.data()), storage); });
}

TEST(Tensor, EnsureShapeGivesAZeroTensorForAnyOtherDtypeRowsOrCols) {
  struct Want {
    DType dtype;
    int64_t rows, cols;
  };
  for (const Want w : {Want{DType::kBFloat16, 3, 2}, Want{DType::kFloat32, 4, 2},
                       Want{DType::kFloat32, 3, 1}, Want{DType::kFloat32, 2, 3}}) {
    Tensor t = Marked();
    t.EnsureShape(w.dtype, w.rows, w.cols);
    EXPECT_EQ(t.dtype(), w.dtype);
    EXPECT_EQ(t.rows(), w.rows);
    EXPECT_EQ(t.cols(), w.cols);
    EXPECT_TRUE(t.Equals(Tensor(w.dtype, w.rows, w.cols))) << t.ShapeString();
  }
}

TEST(Tensor, AssignRowsEqualsRowsWhateverTheTargetHeld) {
  Tensor src(DType::kBFloat16, 6, 3);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 3; ++c) src.Set(r, c, static_cast<float>(10 * r + c));
  Tensor target = Marked();  // another dtype and shape
  for (const auto& [begin, count] : {std::pair{1, 3}, {2, 3}, {0, 6}, {5, 1}, {4, 0}}) {
    target.AssignRows(src, begin, count);
    EXPECT_TRUE(target.Equals(src.Rows(begin, count))) << begin << "+" << count;
  }
}

// Rows r of `t` filled with 100 r + c, and a NaN and a -0 whose bits a conversion could lose.
Tensor Numbered(DType dtype, int64_t rows, int64_t cols) {
  Tensor t(dtype, rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t.Set(r, c, static_cast<float>(100 * r + c));
  t.Set(1, 0, std::numeric_limits<float>::quiet_NaN());
  t.Set(2, cols - 1, -0.0f);
  return t;
}

// Rows is checked against the elements read one by one (not against another bulk copy):
// the range's own rows, bit for bit, in the source's dtype and column count.
TEST(Tensor, RowsCopiesExactlyTheRangeBitForBit) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const Tensor src = Numbered(dtype, 6, 3);
    for (const auto& [begin, count] :
         {std::pair{0, 6}, {1, 3}, {2, 1}, {5, 1}, {4, 0}, {6, 0}, {0, 2}}) {
      const Tensor got = src.Rows(begin, count);
      ASSERT_EQ(got.dtype(), dtype);
      ASSERT_EQ(got.rows(), count);
      ASSERT_EQ(got.cols(), 3);
      for (int64_t r = 0; r < count; ++r) {
        for (int64_t c = 0; c < 3; ++c) {
          const float want = src.At(begin + r, c);
          const float have = got.At(r, c);
          EXPECT_EQ(std::memcmp(&want, &have, sizeof(float)), 0)
              << DTypeName(dtype) << " row " << begin + r << " col " << c;
        }
      }
    }
  }
}

TEST(Tensor, CopyRowsMovesWholeRowsBitExactlyAlsoOverlappingWithinOneTensor) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    // {dst_row, src_row, count}: forward and backward overlaps, disjoint, empty, whole.
    for (const auto& [dst, src, count] :
         {std::tuple{0, 2, 4}, {2, 0, 4}, {1, 2, 3}, {3, 2, 3}, {0, 4, 2}, {5, 1, 0}, {0, 0, 6}}) {
      Tensor self = Numbered(dtype, 6, 3);
      Tensor want = self;
      const Tensor moved = self.Rows(src, count);  // the rows as they were before the copy
      for (int64_t r = 0; r < count; ++r) want.CopyRows(dst + r, moved, r, 1);
      self.CopyRows(dst, self, src, count);
      EXPECT_TRUE(self.Equals(want))
          << DTypeName(dtype) << " " << dst << "<-" << src << "+" << count;

      Tensor other(dtype, 7, 3);
      other.CopyRows(dst + 1, Numbered(dtype, 6, 3), src, count);
      EXPECT_TRUE(other.Rows(dst + 1, count).Equals(moved)) << DTypeName(dtype);
      EXPECT_TRUE(other.Rows(0, dst + 1).Equals(Tensor(dtype, dst + 1, 3))) << "rows before";
      EXPECT_EQ(other.rows(), 7);
      EXPECT_EQ(other.cols(), 3);
    }
  }
}

TEST(Tensor, NewTensorsAndGrownRowsAreZero) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    // Freed memory of a numbered tensor is likely to come back for the next allocations.
    { const Tensor garbage = Numbered(dtype, 64, 5); }
    Tensor t(dtype, 64, 5);
    for (int64_t r = 0; r < 64; ++r)
      for (int64_t c = 0; c < 5; ++c) ASSERT_EQ(t.At(r, c), 0.0f) << DTypeName(dtype);
    Tensor grown = Numbered(dtype, 6, 5);
    grown.ResizeRows(40);
    EXPECT_TRUE(grown.Rows(0, 6).Equals(Numbered(dtype, 6, 5)));
    for (int64_t r = 6; r < 40; ++r)
      for (int64_t c = 0; c < 5; ++c) ASSERT_EQ(grown.At(r, c), 0.0f) << r;
    EXPECT_EQ(Tensor(dtype, 0, 5).rows(), 0);
    Tensor no_cols(dtype, 3, 0);  // rows without bytes: copies move nothing
    no_cols.CopyRows(0, Tensor(dtype, 3, 0), 1, 2);
    // Columns without rows have no buffer either: nothing to copy, nothing passed to memcpy
    // (a null pointer there is undefined even for zero bytes; the asan preset's UBSan says so).
    Tensor no_rows(dtype, 0, 5);
    no_rows.CopyRows(0, Tensor(dtype, 0, 5), 0, 0);
    EXPECT_EQ(no_rows.Rows(0, 0).cols(), 5);
    no_cols.ResizeRows(5);
    EXPECT_EQ(no_cols.rows(), 5);
    EXPECT_EQ(no_cols.cols(), 0);
  }
}

// AppendRows of an empty tail appends nothing, whatever dtype and width the tail was built
// with (a default-built Tensor is [0 x 0] f32); a non-empty tail onto [0 x 0] becomes it.
// No caller passes an empty tail of another shape today, so only this test holds the
// contract (the guard-family operator mutants found it untested).
TEST(Tensor, AppendRowsOfAnEmptyTailOfAnyShapeAppendsNothing) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const Tensor before = Numbered(dtype, 3, 5);
    for (const Tensor& tail : {Tensor(), Tensor(DType::kBFloat16, 0, 2), Tensor(dtype, 0, 5)}) {
      Tensor t = before;
      t.AppendRows(tail);
      EXPECT_TRUE(t.Equals(before)) << DTypeName(dtype);
      EXPECT_EQ(t.dtype(), dtype);
    }
    Tensor empty;
    empty.AppendRows(before);
    EXPECT_TRUE(empty.Equals(before)) << DTypeName(dtype);
  }
}

// Zero-width rows still count (spec §2.5's MLA variant stores a zero-width V): only a
// default-built tensor, with neither rows nor columns, takes the tail's shape instead.
TEST(Tensor, AppendRowsKeepsTheRowsOfAZeroWidthTensor) {
  Tensor t(DType::kBFloat16, 3, 0);
  t.AppendRows(Tensor(DType::kBFloat16, 2, 0));
  EXPECT_EQ(t.rows(), 5);
  EXPECT_EQ(t.cols(), 0);
}

// Equals is false for tensors that differ only in dtype, rows or columns, even when their
// bytes agree as far as the smaller one reaches (all zeros here).
TEST(Tensor, EqualsComparesTheShapeAndTheDtypeBeforeTheBytes) {
  const Tensor t(DType::kFloat32, 2, 3);
  EXPECT_TRUE(t.Equals(Tensor(DType::kFloat32, 2, 3)));
  EXPECT_FALSE(t.Equals(Tensor(DType::kFloat32, 2, 4)));
  EXPECT_FALSE(t.Equals(Tensor(DType::kFloat32, 3, 3)));
  EXPECT_FALSE(t.Equals(Tensor(DType::kBFloat16, 2, 6)));  // as many bytes, another dtype
}

// RowsToFloatInto writes rows [0, count) of the buffer as RowsToFloat would return them, in
// both dtypes, growing the buffer when it is short or of another width and never shrinking
// it (rows past count stay as they were).
TEST(Tensor, RowsToFloatIntoEqualsRowsToFloatAndKeepsItsBuffer) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    MatF values(6, 3);
    for (int64_t i = 0; i < values.size(); ++i) values.data()[i] = 0.25f * static_cast<float>(i);
    const Tensor t = Tensor::FromFloat(dtype, values);
    MatF wide(8, 5);  // another width, rows enough: replaced all the same
    t.RowsToFloatInto(1, 4, wide);
    ASSERT_GE(wide.rows(), 4);
    ASSERT_EQ(wide.cols(), 3);
    EXPECT_EQ(MatF(wide.topRows(4)), t.RowsToFloat(1, 4));
    MatF buffer(1, 5);  // another width and too few rows: replaced
    t.RowsToFloatInto(1, 4, buffer);
    ASSERT_GE(buffer.rows(), 4);
    ASSERT_EQ(buffer.cols(), 3);
    EXPECT_EQ(MatF(buffer.topRows(4)), t.RowsToFloat(1, 4));
    const MatF kept = buffer;
    t.RowsToFloatInto(5, 1, buffer);  // fewer rows: the buffer keeps its size
    EXPECT_EQ(buffer.rows(), kept.rows());
    EXPECT_EQ(MatF(buffer.topRows(1)), t.RowsToFloat(5, 1));
    EXPECT_EQ(MatF(buffer.bottomRows(buffer.rows() - 1)), MatF(kept.bottomRows(kept.rows() - 1)));
    t.RowsToFloatInto(0, 6, buffer);  // more rows than it has: grows
    EXPECT_EQ(MatF(buffer.topRows(6)), t.RowsToFloat(0, 6));
  }
}

// A view reads the rows it was given from storage it does not own: shape, elements and
// sub-ranges agree with the tensor's own rows, an owned copy of a view equals those rows,
// and CopyRows from a view moves exactly its rows.
// bf16 keeps float32's exponent range, so a conversion rounds to nearest even at every
// magnitude: a finite float past bf16's largest finite value (3.3895e38) rounds to an
// infinity from the midpoint to 2^128 on (ties to even), as IEEE rounding does (no
// saturation), and float32's subnormals keep their leading bits.
TEST(Tensor, Bf16ConversionRoundsAtTheEdgesOfTheRange) {
  const auto bits = [](uint32_t b) { return std::bit_cast<float>(b); };
  const float bf16_max = bits(0x7F7F0000u);  // 3.3895e38
  const float inf = std::numeric_limits<float>::infinity();
  MatF v(1, 9);
  v << std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), bf16_max,
      bits(0x7F7F7FFFu),  // just below the midpoint to 2^128: down
      bits(0x7F7F8000u),  // the midpoint: to even, which is 2^128 (an infinity)
      inf, -inf, std::ldexp(1.0f, -130), std::ldexp(3.0f, -133);
  const Tensor t = Tensor::FromFloat(DType::kBFloat16, v);
  EXPECT_EQ(t.At(0, 0), inf);
  EXPECT_EQ(t.At(0, 1), -inf);
  EXPECT_EQ(t.At(0, 2), bf16_max);
  EXPECT_EQ(t.At(0, 3), bf16_max);
  EXPECT_EQ(t.At(0, 4), inf);
  EXPECT_EQ(t.At(0, 5), inf);
  EXPECT_EQ(t.At(0, 6), -inf);
  EXPECT_EQ(t.At(0, 7), std::ldexp(1.0f, -130));  // a subnormal bf16 holds exactly
  EXPECT_EQ(t.At(0, 8), std::ldexp(3.0f, -133));
}

// Every float NaN stays a NaN in bf16, whatever its payload: rounding the bit pattern as an
// integer (add 0x7FFF, keep the top half) would carry a payload held only in the low 16 bits
// into an infinity, and an all-ones one round to zero.
TEST(Tensor, Bf16ConversionKeepsEveryNanANan) {
  const uint32_t patterns[] = {0x7F800001u, 0xFF800001u, 0x7F80FFFFu, 0x7FFFFFFFu,
                               0xFFFFFFFFu, 0x7FC00000u, 0x7FA00000u, 0xFFC00001u};
  MatF v(1, static_cast<Eigen::Index>(std::size(patterns)));
  for (size_t i = 0; i < std::size(patterns); ++i) {
    v(0, static_cast<Eigen::Index>(i)) = std::bit_cast<float>(patterns[i]);
  }
  const Tensor t = Tensor::FromFloat(DType::kBFloat16, v);
  for (size_t i = 0; i < std::size(patterns); ++i) {
    EXPECT_TRUE(std::isnan(t.At(0, static_cast<int64_t>(i)))) << std::hex << patterns[i];
  }
}

TEST(TensorView, ReadsTheRowsOfItsStorageAndCopiesAsTheTensorsRows) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const Tensor src = Numbered(dtype, 6, 3);
    const TensorView whole = src;
    EXPECT_EQ(whole.dtype(), dtype);
    EXPECT_EQ(whole.rows(), 6);
    EXPECT_EQ(whole.cols(), 3);
    EXPECT_EQ(whole.Bytes(), src.Bytes());
    EXPECT_TRUE(whole.Equals(src));
    for (const auto& [begin, count] : {std::pair{0, 6}, {1, 3}, {5, 1}, {4, 0}, {6, 0}}) {
      const TensorView part = whole.Rows(begin, count).Rows(0, count);
      ASSERT_EQ(part.rows(), count);
      EXPECT_TRUE(part.Equals(src.Rows(begin, count))) << begin << "+" << count;
      EXPECT_TRUE(Tensor(part).Equals(src.Rows(begin, count))) << begin << "+" << count;
      for (int64_t r = 0; r < count; ++r) {
        for (int64_t c = 0; c < 3; ++c) {
          const float want = src.At(begin + r, c);  // bits: Numbered holds a NaN
          const float have = part.At(r, c);
          EXPECT_EQ(std::memcmp(&want, &have, sizeof(float)), 0) << "row " << begin + r;
        }
      }
      Tensor into(dtype, 8, 3);
      into.CopyRows(2, part, 0, count);
      EXPECT_TRUE(into.Rows(2, count).Equals(src.Rows(begin, count)));
      EXPECT_TRUE(into.Rows(0, 2).Equals(Tensor(dtype, 2, 3)));
    }
    // Equal shapes, one element apart; or the same bits under another shape or dtype.
    Tensor other = src;
    other.Set(4, 2, other.At(4, 2) + 1.0f);
    EXPECT_FALSE(whole.Equals(other));
    EXPECT_FALSE(whole.Rows(0, 2).Equals(whole.Rows(0, 3)));
    const TensorView flat(dtype, whole.data(), 1, 9);  // rows 0-2's bits as one row
    EXPECT_FALSE(flat.Equals(whole.Rows(0, 3)));
    const TensorView other_dtype(dtype == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32,
                                 whole.data(), 2, 3);
    EXPECT_FALSE(other_dtype.Equals(whole.Rows(0, 2)));
  }
}

// A view names storage it cannot size itself, so its shape and every range read through it
// are checked: a negative shape, elements without storage, rows or an element past the end.
TEST(TensorViewDeathTest, ShapesAndRangesAreChecked) {
  const Tensor t = Numbered(DType::kFloat32, 4, 3);
  const TensorView v = t;
  EXPECT_DEATH(TensorView(DType::kFloat32, v.data(), -1, 3), "negative tensor view shape");
  EXPECT_DEATH(TensorView(DType::kFloat32, nullptr, 2, 3), "needs their storage");
  EXPECT_DEATH(v.Rows(3, 2), "row range out of tensor view");
  EXPECT_DEATH(v.Rows(-1, 1), "row range out of tensor view");
  EXPECT_DEATH(v.At(4, 0), "index out of range");
  EXPECT_DEATH(v.Rows(1, 2).At(0, 3), "index out of range");
  EXPECT_EQ(TensorView(DType::kFloat32, nullptr, 0, 3).rows(), 0);  // no elements, no storage
}

// Only a default-built tensor takes the first tail's shape: an empty tensor that has one
// (a shaped buffer with its rows dropped) keeps it, so a tail of another width or dtype is a
// caller bug, as on any other append.
TEST(TensorDeathTest, AppendRowsToAShapedEmptyTensorKeepsItsShape) {
  Tensor t(DType::kFloat32, 0, 3);
  t.AppendRows(Numbered(DType::kFloat32, 3, 3));
  EXPECT_TRUE(t.Equals(Numbered(DType::kFloat32, 3, 3)));
  EXPECT_DEATH(Tensor(DType::kFloat32, 0, 3).AppendRows(Numbered(DType::kFloat32, 3, 5)),
               "column counts");
  EXPECT_DEATH(Tensor(DType::kFloat32, 0, 3).AppendRows(Numbered(DType::kBFloat16, 3, 3)), "");
}

}  // namespace
}  // namespace kvtwin
