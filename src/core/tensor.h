// Tensor: a dense row-major matrix with an explicit element dtype, the storage type of every
// cache buffer and snapshot. A row is one token (one position) of one layer; columns are the
// flattened per-token features (heads x head dim), so a B = 1 cache buffer K[1,H,Cap,Dk] is
// a Tensor of Cap rows and H*Dk columns. bfloat16 is stored as Eigen::bfloat16 (2 bytes), so
// Bytes() is the real footprint. Values written into a bf16 tensor are rounded to bf16;
// rows moved between tensors of one dtype are copied bit-exactly. TensorView is a read-only
// window of rows over storage owned elsewhere (a Tensor, or a snapshot that keeps its rows in
// its own allocation); it converts implicitly from a Tensor, so a reader that takes a view
// accepts both. A view is valid while its owner lives and is not resized. Single-threaded.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace kvtwin {

enum class DType : uint8_t { kFloat32, kBFloat16 };

const char* DTypeName(DType dtype);
int64_t ElementBytes(DType dtype);

template <typename Scalar>
using RowMatrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatF = RowMatrix<float>;
using MatBf16 = RowMatrix<Eigen::bfloat16>;
using MatD = RowMatrix<double>;
using VecF = Eigen::VectorXf;
using VecD = Eigen::VectorXd;

// Rounds a float to the nearest value representable in `dtype` (identity for float32).
float RoundTo(DType dtype, float value);

class Tensor;

class TensorView {
 public:
  TensorView() = default;
  // Implicit by design: every reader of rows takes a view, and a Tensor is one.
  TensorView(const Tensor& t);  // NOLINT(google-explicit-constructor)
  // `data` holds rows x cols elements of `dtype`, row-major, aligned for the element type.
  TensorView(DType dtype, const void* data, int64_t rows, int64_t cols);

  DType dtype() const { return dtype_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  bool empty() const { return rows_ == 0; }
  int64_t Bytes() const { return rows_ * cols_ * ElementBytes(dtype_); }
  const void* data() const { return data_; }

  float At(int64_t row, int64_t col) const;
  // Rows [begin, begin + count) of this view. REQUIRES: the range is inside the view.
  TensorView Rows(int64_t begin, int64_t count) const;
  // Bit-exact equality of dtype, shape and every element.
  bool Equals(TensorView other) const;

  // Calls f with an Eigen map of the typed rows (const MatF or MatBf16 layout), as
  // Tensor::Visit does with the matrix itself.
  template <typename F>
  decltype(auto) Visit(F&& f) const {
    if (dtype_ == DType::kFloat32) {
      return f(Eigen::Map<const MatF>(static_cast<const float*>(data_), rows_, cols_));
    }
    return f(Eigen::Map<const MatBf16>(static_cast<const Eigen::bfloat16*>(data_), rows_, cols_));
  }

 private:
  DType dtype_ = DType::kFloat32;
  const void* data_ = nullptr;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // A zero-filled rows x cols tensor.
  Tensor(DType dtype, int64_t rows, int64_t cols);
  // An owned copy of the view's rows.
  explicit Tensor(TensorView view);
  // Converts (rounds) float values into `dtype`.
  static Tensor FromFloat(DType dtype, const MatF& values);

  DType dtype() const { return dtype_; }
  // Inline: the checks and the caches ask for the shape on every row they touch.
  int64_t rows() const {
    return data_.index() == 0 ? std::get<0>(data_).rows() : std::get<1>(data_).rows();
  }
  int64_t cols() const {
    return data_.index() == 0 ? std::get<0>(data_).cols() : std::get<1>(data_).cols();
  }
  bool empty() const { return rows() == 0; }
  // Bytes the elements occupy: rows * cols * ElementBytes(dtype).
  int64_t Bytes() const { return rows() * cols() * ElementBytes(dtype_); }

  float At(int64_t row, int64_t col) const;
  void Set(int64_t row, int64_t col, float value);  // rounds to dtype
  MatF ToFloat() const;
  MatF RowsToFloat(int64_t begin, int64_t count) const;
  // The same into rows [0, count) of `out`, which grows (never shrinks) to hold them, so a
  // buffer reused across calls stops allocating; rows past `count` are left as they were.
  void RowsToFloatInto(int64_t begin, int64_t count, MatF& out) const;

  // Copy of rows [begin, begin + count). REQUIRES: the range is inside the tensor.
  Tensor Rows(int64_t begin, int64_t count) const;
  // *this = src.Rows(begin, count), reusing this tensor's buffer when the shape already
  // fits (views rebuilt on every call).
  void AssignRows(const Tensor& src, int64_t begin, int64_t count);
  // Copies `count` rows of `src` starting at `src_row` into rows starting at `dst_row`.
  // REQUIRES: same dtype and column count; both ranges inside their tensors.
  void CopyRows(int64_t dst_row, TensorView src, int64_t src_row, int64_t count);
  // Keeps the first min(rows, new_rows) rows, zero-fills the rest.
  void ResizeRows(int64_t new_rows);
  // For a buffer reused across calls: a zero-filled dtype x rows x cols tensor unless it
  // already has that shape, in which case it is kept as is (the caller overwrites it).
  void EnsureShape(DType dtype, int64_t rows, int64_t cols);
  // Appends all rows of `tail`. REQUIRES: same dtype and column count (or this or tail
  // has no rows).
  void AppendRows(const Tensor& tail);
  // Drops the first `count` rows. REQUIRES: count <= rows().
  void DropFrontRows(int64_t count);
  // [a ; b] along rows. REQUIRES: same dtype and column count.
  static Tensor Concat(const Tensor& a, const Tensor& b);

  // Bit-exact equality of dtype, shape and every element.
  bool Equals(TensorView other) const;

  // Calls f with the typed storage (MatF or MatBf16): bulk loops without a per-element
  // dtype dispatch, for checkers and fillers that touch every element.
  template <typename F>
  decltype(auto) Visit(F&& f) const {
    return std::visit(std::forward<F>(f), data_);
  }
  template <typename F>
  decltype(auto) Visit(F&& f) {
    return std::visit(std::forward<F>(f), data_);
  }
  std::string ShapeString() const;  // "bf16[12x8]"

 private:
  DType dtype_ = DType::kFloat32;
  std::variant<MatF, MatBf16> data_;
};

}  // namespace kvtwin
