#pragma once
// Tensors -> RowLayout, for the CPU ops and the CUDA entry points. Operands share the output shape (broadcast
// ones come in expanded, stride 0 on broadcast dims); size-1 leading dims are dropped and a dim is merged into
// the previous one where every operand has stride(prev) == stride(d) * size(d), so the kernels' per-row index
// arithmetic stays short and no input is copied.
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <optional>

#include "ops/row_layout.h"

namespace fusegraph {

// Layout of `shape` over `tensors` (each expanded to `shape`); tensor k's strides over the kept dims go to
// outer_strides[k][0..ndim). nullopt when more than kMaxOuterDims leading dims remain after coalescing.
inline std::optional<RowLayout> coalesce_rows(at::IntArrayRef shape, c10::ArrayRef<const at::Tensor*> tensors,
                                              int64_t* const* outer_strides) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const size_t n = tensors.size();
  for (const at::Tensor* t : tensors) {
    TORCH_INTERNAL_ASSERT(t->sizes() == shape, "coalesce_rows: operand not expanded to the output shape");
  }
  int ndim = 0;
  int64_t sizes[64];
  int64_t strides[64][8];  // [dim][operand]
  TORCH_CHECK(rank <= 65, "fusegraph: an argument of shape ", shape, " has ", rank,
              " dims; fusegraph's row ops take at most 65 (eager PyTorch's ops: 64)");
  TORCH_INTERNAL_ASSERT(n <= 8, "coalesce_rows: ", n, " operands out of range");
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
  RowLayout layout;
  layout.cols = rank == 0 ? 1 : shape[rank - 1];
  layout.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    layout.sizes[d] = sizes[d];
    layout.rows *= sizes[d];
    for (size_t j = 0; j < n; ++j) outer_strides[j][d] = strides[d][j];
  }
  if (layout.cols == 0) layout.rows = 0;
  return layout;
}

// plan() (a coalesce_rows over `tensors`); when it finds more leading dims than the kernels index, every tensor
// is replaced by a contiguous copy (whose leading dims then merge into one) and plan() runs again.
template <typename Plan>
RowLayout plan_or_copy(std::initializer_list<at::Tensor*> tensors, Plan&& plan) {
  std::optional<RowLayout> layout = plan();
  if (!layout) {
    for (at::Tensor* t : tensors) *t = t->contiguous();
    layout = plan();
  }
  TORCH_INTERNAL_ASSERT(layout.has_value(), "plan_or_copy: contiguous operands did not coalesce");
  return *layout;
}

}  // namespace fusegraph
