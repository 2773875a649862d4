#include "src/core/tensor.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "src/core/check.h"

namespace kvtwin {
namespace {

// Zero bits are 0.0 in float32 and in bfloat16, so one memset zero-fills either.
template <typename Mat>
void ZeroRows(Mat& m, int64_t begin, int64_t count) {
  static_assert(Mat::IsRowMajor, "rows are contiguous only in row-major storage");
  if (count <= 0 || m.cols() == 0) return;
  std::memset(static_cast<void*>(m.data() + begin * m.cols()), 0,
              static_cast<size_t>(count * m.cols()) * sizeof(typename Mat::Scalar));
}

template <typename Mat>
void ResizeKeep(Mat& m, int64_t new_rows) {
  const int64_t old_rows = m.rows();
  m.conservativeResize(new_rows, m.cols());
  if (new_rows > old_rows) ZeroRows(m, old_rows, new_rows - old_rows);
}

}  // namespace

TensorView::TensorView(const Tensor& t)
    : dtype_(t.dtype()),
      data_(t.Visit([](const auto& m) { return static_cast<const void*>(m.data()); })),
      rows_(t.rows()),
      cols_(t.cols()) {}

TensorView::TensorView(DType dtype, const void* data, int64_t rows, int64_t cols)
    : dtype_(dtype), data_(data), rows_(rows), cols_(cols) {
  KV_CHECK(rows >= 0 && cols >= 0, "negative tensor view shape");
  KV_CHECK(data != nullptr || rows * cols == 0, "a tensor view of elements needs their storage");
}

float TensorView::At(int64_t row, int64_t col) const {
  KV_CHECK(row >= 0 && row < rows_ && col >= 0 && col < cols_, "tensor view index out of range");
  return Visit([&](const auto& m) { return static_cast<float>(m(row, col)); });
}

TensorView TensorView::Rows(int64_t begin, int64_t count) const {
  KV_CHECK(begin >= 0 && count >= 0 && begin + count <= rows_, "row range out of tensor view");
  const auto row_bytes = static_cast<size_t>(cols_ * ElementBytes(dtype_));
  const char* first = static_cast<const char*>(data_);
  return TensorView(dtype_,
                    first == nullptr ? nullptr : first + static_cast<size_t>(begin) * row_bytes,
                    count, cols_);
}

bool TensorView::Equals(TensorView other) const {
  if (dtype_ != other.dtype_ || rows_ != other.rows_ || cols_ != other.cols_) return false;
  const auto bytes = static_cast<size_t>(Bytes());
  return bytes == 0 || std::memcmp(data_, other.data_, bytes) == 0;
}

const char* DTypeName(DType dtype) { return dtype == DType::kFloat32 ? "f32" : "bf16"; }

int64_t ElementBytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

float RoundTo(DType dtype, float value) {
  if (dtype == DType::kFloat32) return value;
  return static_cast<float>(Eigen::bfloat16(value));
}

Tensor::Tensor(DType dtype, int64_t rows, int64_t cols) : dtype_(dtype) {
  KV_CHECK(rows >= 0 && cols >= 0, "negative tensor shape");
  if (dtype == DType::kFloat32) {
    ZeroRows(data_.emplace<MatF>(rows, cols), 0, rows);
  } else {
    ZeroRows(data_.emplace<MatBf16>(rows, cols), 0, rows);
  }
}

Tensor::Tensor(TensorView view) : dtype_(view.dtype()) {
  view.Visit([&](const auto& m) {
    using M = RowMatrix<typename std::decay_t<decltype(m)>::Scalar>;
    data_.emplace<M>(m);
  });
}

Tensor Tensor::FromFloat(DType dtype, const MatF& values) {
  Tensor t;
  t.dtype_ = dtype;
  if (dtype == DType::kFloat32) {
    t.data_ = values;
  } else {
    t.data_ = MatBf16(values.cast<Eigen::bfloat16>());
  }
  return t;
}

float Tensor::At(int64_t row, int64_t col) const {
  KV_CHECK(row >= 0 && row < rows() && col >= 0 && col < cols(), "tensor index out of range");
  return std::visit([&](const auto& m) { return static_cast<float>(m(row, col)); }, data_);
}

void Tensor::Set(int64_t row, int64_t col, float value) {
  KV_CHECK(row >= 0 && row < rows() && col >= 0 && col < cols(), "tensor index out of range");
  std::visit(
      [&](auto& m) {
        m(row, col) = static_cast<typename std::decay_t<decltype(m)>::Scalar>(value);
      },
      data_);
}

MatF Tensor::ToFloat() const { return RowsToFloat(0, rows()); }

MatF Tensor::RowsToFloat(int64_t begin, int64_t count) const {
  KV_CHECK(begin >= 0 && count >= 0 && begin + count <= rows(), "row range out of tensor");
  return std::visit(
      [&](const auto& m) -> MatF { return m.middleRows(begin, count).template cast<float>(); },
      data_);
}

void Tensor::RowsToFloatInto(int64_t begin, int64_t count, MatF& out) const {
  KV_CHECK(begin >= 0 && count >= 0 && begin + count <= rows(), "row range out of tensor");
  if (out.rows() < count || out.cols() != cols()) {
    out.resize(std::max(count, out.cols() == cols() ? 2 * out.rows() : int64_t{0}), cols());
  }
  std::visit(
      [&](const auto& m) {
        out.topRows(count) = m.middleRows(begin, count).template cast<float>();
      },
      data_);
}

Tensor Tensor::Rows(int64_t begin, int64_t count) const {
  KV_CHECK(begin >= 0 && count >= 0 && begin + count <= rows(), "row range out of tensor");
  Tensor t;
  t.dtype_ = dtype_;
  std::visit(
      [&](const auto& m) {
        // The new matrix is left uninitialized and filled by one memcpy (rows are contiguous
        // in row-major storage): every KV capture and split copies through here.
        using M = std::decay_t<decltype(m)>;
        M& out = t.data_.template emplace<M>(count, m.cols());
        const auto cols = static_cast<size_t>(m.cols());
        if (count > 0 && cols > 0) {
          std::memcpy(static_cast<void*>(out.data()),
                      static_cast<const void*>(m.data() + static_cast<size_t>(begin) * cols),
                      static_cast<size_t>(count) * cols * sizeof(typename M::Scalar));
        }
      },
      data_);
  return t;
}

void Tensor::AssignRows(const Tensor& src, int64_t begin, int64_t count) {
  KV_CHECK(this != &src, "AssignRows from itself");
  EnsureShape(src.dtype_, count, src.cols());
  CopyRows(0, src, begin, count);
}

void Tensor::CopyRows(int64_t dst_row, TensorView src, int64_t src_row, int64_t count) {
  KV_CHECK(dtype_ == src.dtype(), "CopyRows across dtypes");
  KV_CHECK(cols() == src.cols(), "CopyRows across column counts");
  KV_CHECK(count >= 0 && dst_row >= 0 && dst_row + count <= rows(), "CopyRows target range");
  KV_CHECK(src_row >= 0 && src_row + count <= src.rows(), "CopyRows source range");
  // Row-major storage with equal column counts: the rows are one contiguous range on each
  // side, so one memmove copies them bit-exactly (and handles a self-copy that overlaps).
  if (count == 0 || cols() == 0) return;  // no bytes (and maybe no buffer) to move
  const auto row_bytes = static_cast<size_t>(cols() * ElementBytes(dtype_));
  std::visit(
      [&](auto& m) {
        static_assert(std::decay_t<decltype(m)>::IsRowMajor,
                      "rows are contiguous only in row-major storage");
        std::memmove(
            reinterpret_cast<char*>(m.data()) + static_cast<size_t>(dst_row) * row_bytes,
            static_cast<const char*>(src.data()) + static_cast<size_t>(src_row) * row_bytes,
            static_cast<size_t>(count) * row_bytes);
      },
      data_);
}

void Tensor::EnsureShape(DType dtype, int64_t rows, int64_t cols) {
  if (dtype_ != dtype || this->rows() != rows || this->cols() != cols) {
    *this = Tensor(dtype, rows, cols);
  }
}

void Tensor::ResizeRows(int64_t new_rows) {
  KV_CHECK(new_rows >= 0, "negative row count");
  std::visit([&](auto& m) { ResizeKeep(m, new_rows); }, data_);
}

void Tensor::AppendRows(const Tensor& tail) {
  // Nothing to append, whatever shape the empty tail was default-built with.
  if (tail.rows() == 0) return;
  if (rows() == 0 && cols() == 0) {
    *this = tail;
    return;
  }
  const int64_t old_rows = rows();
  ResizeRows(old_rows + tail.rows());
  CopyRows(old_rows, tail, 0, tail.rows());
}

void Tensor::DropFrontRows(int64_t count) {
  KV_CHECK(count >= 0 && count <= rows(), "DropFrontRows beyond the tensor");
  *this = Rows(count, rows() - count);
}

Tensor Tensor::Concat(const Tensor& a, const Tensor& b) {
  Tensor out = a;
  out.AppendRows(b);
  return out;
}

bool Tensor::Equals(TensorView other) const { return TensorView(*this).Equals(other); }

std::string Tensor::ShapeString() const {
  return std::string(DTypeName(dtype_)) + "[" + std::to_string(rows()) + "x" +
         std::to_string(cols()) + "]";
}

}  // namespace kvtwin
