// Position-tagged K/V rows shared by the attention-cache tests: every element of the K row
// for position p is p + 1 and every element of its V row is -(p + 1), so any row read back
// says which position it holds and whether K and V still agree.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "src/attention_mask.h"
#include "src/core/tensor.h"

namespace kvtwin::tagged {

inline constexpr int64_t kKeyCols = 3;
inline constexpr int64_t kValueCols = 2;

// Tags for positions [first, first + count): position p is tagged p + 1.
inline std::vector<float> Positions(int64_t first, int64_t count) {
  std::vector<float> tags;
  for (int64_t p = first; p < first + count; ++p) tags.push_back(static_cast<float>(p + 1));
  return tags;
}

inline Tensor Rows(const std::vector<float>& tags, int64_t cols, float sign, DType dtype) {
  MatF m(static_cast<Eigen::Index>(tags.size()), static_cast<Eigen::Index>(cols));
  for (size_t r = 0; r < tags.size(); ++r) {
    m.row(static_cast<Eigen::Index>(r)).setConstant(sign * tags[r]);
  }
  return Tensor::FromFloat(dtype, m);
}

inline Tensor Keys(const std::vector<float>& tags, DType dtype = DType::kFloat32) {
  return Rows(tags, kKeyCols, 1.0f, dtype);
}
inline Tensor Values(const std::vector<float>& tags, DType dtype = DType::kFloat32) {
  return Rows(tags, kValueCols, -1.0f, dtype);
}

// The tag of one row; fails the test if the row is not uniformly tagged or V does not
// mirror K.
inline float TagAt(TensorView k, TensorView v, int64_t row) {
  const float tag = k.At(row, 0);
  for (int64_t c = 0; c < k.cols(); ++c) EXPECT_EQ(k.At(row, c), tag) << "K row " << row;
  for (int64_t c = 0; c < v.cols(); ++c) EXPECT_EQ(v.At(row, c), -tag) << "V row " << row;
  return tag;
}

// The tags of rows [begin, begin + count).
inline std::vector<float> Tags(TensorView k, TensorView v, int64_t begin, int64_t count) {
  std::vector<float> tags;
  for (int64_t r = begin; r < begin + count; ++r) tags.push_back(TagAt(k, v, r));
  return tags;
}

}  // namespace kvtwin::tagged
