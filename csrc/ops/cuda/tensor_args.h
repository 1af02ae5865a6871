#pragma once
// Torch side of the CUDA launches (included only by csrc/ops/cuda/*_cuda.cpp): tensors -> RowLayout +
// Operands (the coalescing rule is ops/row_plan.h's, shared with the CPU ops).
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <optional>

#include "ops/cuda/launch.h"
#include "ops/row_plan.h"

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

// Layout of `shape` over `tensors` (each already expanded to `shape`), their Operands in operands[0..n);
// nullopt when more than kMaxOuterDims leading dims remain after coalescing (see plan_or_copy).
inline std::optional<RowLayout> plan_rows(at::IntArrayRef shape, std::initializer_list<const at::Tensor*> tensors,
                                          Operand* operands) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  int64_t* outer_strides[8];
  TORCH_INTERNAL_ASSERT(tensors.size() <= 8, "plan_rows: ", tensors.size(), " operands out of range");
  size_t k = 0;
  for (const at::Tensor* t : tensors) {
    operands[k].data = t->const_data_ptr();
    operands[k].dtype = to_dtype(t->scalar_type());
    operands[k].inner_stride = (rank == 0 || shape[rank - 1] == 1) ? 0 : t->stride(rank - 1);
    outer_strides[k] = operands[k].outer_strides;
    ++k;
  }
  return coalesce_rows(shape, tensors, outer_strides);
}

// The tensor itself when its last dim is unit-stride (or trivial), else a contiguous copy.
inline at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return (t.dim() == 0 || t.size(-1) == 1 || t.stride(-1) == 1) ? t : t.contiguous();
}

}  // namespace fusegraph::cuda
