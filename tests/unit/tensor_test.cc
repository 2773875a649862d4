// Goal: Tensor::EnsureShape, the reuse rule of every buffer kept across calls (the forward
// and kernel scratch): the same shape keeps the tensor untouched, any other dtype, row or
// column count gives a zero-filled tensor of the new shape. AssignRows, built on it, equals
// Rows() whatever the target held before.
// Method: mark a tensor, ask for each shape, and look at the marks and the shape.
#include "src/core/tensor.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvtwin
