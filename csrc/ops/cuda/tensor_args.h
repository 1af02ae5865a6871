#pragma once
// Torch side of the CUDA launches (included only by csrc/ops/cuda/*_cuda.cpp): tensors -> RowLayout +
// Operands. Broadcast operands come in expanded to the output shape (stride 0 on broadcast dims);
// size-1 dims are dropped and adjacent leading dims merged where every operand allows it, so the
// kernels' per-row index arithmetic stays short and no input is copied.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <optional>

#include "ops/cuda/launch.h"

namespace fusegraph::cuda {

inline DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::Float32;
    case at::kBFloat16: return DType::BFloat16;
    case at::kHalf: return DType::Float16;
    default: TORCH_CHECK(false, "fusegraph (CUDA): unsupported dtype ", t, "; expected float32, bfloat16 or float16");
  }
}

// An operand whose only dim is the row (weight, bias: shape [D], any stride).
inline Operand row_vector(const std::optional<at::Tensor>& t) {
  Operand op;
  if (!t.has_value() || !t->defined()) return op;
  op.data = t->const_data_ptr();
  op.dtype = to_dtype(t->scalar_type());
  op.inner_stride = t->dim() == 0 ? 0 : t->stride(-1);
  return op;
}

// Layout of `shape` over `tensors` (each already expanded to `shape`); nullopt when more than
// kMaxOuterDims leading dims remain after coalescing (the caller then makes the operands contiguous).
inline std::optional<RowLayout> plan_rows(at::IntArrayRef shape, std::initializer_list<const at::Tensor*> tensors,
                                          Operand* operands) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const size_t n = tensors.size();
  RowLayout layout;
  layout.cols = rank == 0 ? 1 : shape[rank - 1];
  size_t k = 0;
  for (const at::Tensor* t : tensors) {
    TORCH_INTERNAL_ASSERT(t->sizes() == shape, "plan_rows: operand not expanded to the output shape");
    operands[k].data = t->const_data_ptr();
    operands[k].dtype = to_dtype(t->scalar_type());
    operands[k].inner_stride = (rank == 0 || shape[rank - 1] == 1) ? 0 : t->stride(rank - 1);
    ++k;
  }
  // Leading dims, outermost first: drop size-1 dims, merge d into the previous one when every operand has
  // stride(prev) == stride(d) * size(d).
  int ndim = 0;
  int64_t sizes[64];
  int64_t strides[64][8];  // [dim][operand]
  TORCH_INTERNAL_ASSERT(rank <= 65 && n <= 8, "plan_rows: rank ", rank, " or ", n, " operands out of range");
  for (int64_t d = 0; d + 1 < rank; ++d) {
    if (shape[d] == 1) continue;
    size_t j = 0;
    bool mergeable = ndim > 0;
    for (const at::Tensor* t : tensors) {
      if (mergeable && strides[ndim - 1][j] != t->stride(d) * shape[d]) mergeable = false;
      ++j;
    }
    if (!mergeable) {
      sizes[ndim] = 1;
      ++ndim;
    }
    sizes[ndim - 1] *= shape[d];
    j = 0;
    for (const at::Tensor* t : tensors) strides[ndim - 1][j++] = t->stride(d);
  }
  if (ndim > kMaxOuterDims) return std::nullopt;
  layout.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    layout.sizes[d] = sizes[d];
    layout.rows *= sizes[d];
    for (size_t j = 0; j < n; ++j) operands[j].outer_strides[d] = strides[d][j];
  }
  if (layout.cols == 0) layout.rows = 0;
  return layout;
}

// The tensor itself when its last dim is unit-stride (or trivial), else a contiguous copy.
inline at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return (t.dim() == 0 || t.size(-1) == 1 || t.stride(-1) == 1) ? t : t.contiguous();
}

}  // namespace fusegraph::cuda
