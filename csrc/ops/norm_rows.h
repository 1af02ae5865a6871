#pragma once
// Row addressing for the CPU norm kernels (rms_norm, adaln): up to three tensors that share one RowLayout
// (x and broadcast scale/shift, expanded with 0 strides), each with its strides over the layout's outer
// dims (the row's start in tensor t is sum_d idx_d * strides[t][d]; the last dim is contiguous). This lets
// the kernels read strided rows and [B,1,D] views from `chunk` in place, without copies.
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "ops/row_layout.h"
#include "ops/row_plan.h"

namespace fusegraph {

struct RowOffsets {
  static constexpr int kMaxTensors = 3;

  RowLayout layout;
  int ntensors = 0;
  int64_t strides[kMaxTensors][kMaxOuterDims] = {};  // [tensor][outer dim]

  // The rows of `tensors` (expanded to one shape), planned by plan_or_copy: a tensor with more leading dims
  // than a RowLayout keeps is replaced by a contiguous copy.
  static RowOffsets plan(std::initializer_list<at::Tensor*> tensors) {
    TORCH_INTERNAL_ASSERT(tensors.size() >= 1 && tensors.size() <= kMaxTensors);
    RowOffsets r;
    r.ntensors = static_cast<int>(tensors.size());
    int64_t* outer_strides[kMaxTensors] = {r.strides[0], r.strides[1], r.strides[2]};
    r.layout = plan_or_copy(tensors, [&] {
      const at::Tensor* ts[kMaxTensors];
      size_t k = 0;
      for (const at::Tensor* t : tensors) ts[k++] = t;
      return coalesce_rows(ts[0]->sizes(), c10::ArrayRef<const at::Tensor*>(ts, k), outer_strides);
    });
    return r;
  }

  // Element offsets of row `row` (row-major over the leading shape) for each tensor, into off[0..n).
  inline void offsets(int64_t row, int64_t* off) const {
    for (int t = 0; t < ntensors; ++t) off[t] = 0;
    for (int d = layout.ndim - 1; d >= 0; --d) {
      const int64_t size = layout.sizes[d];
      const int64_t idx = row % size;
      row /= size;
      for (int t = 0; t < ntensors; ++t) off[t] += idx * strides[t][d];
    }
  }

  // Walks consecutive rows from `row` on: the offsets of the first come from offsets(), each next one from
  // an odometer step (an add per tensor, no division: offsets() divides once per dim, a visible share of a
  // short row's time).
  class Cursor {
   public:
    Cursor(const RowOffsets& rows, int64_t row) : rows_(rows) {
      rows.offsets(row, off_);
      for (int d = rows.layout.ndim - 1; d >= 0; --d) {
        idx_[d] = row % rows.layout.sizes[d];
        row /= rows.layout.sizes[d];
      }
    }
    // Offset of the current row in tensor t.
    int64_t operator[](int t) const { return off_[t]; }
    void next() {
      const int n = rows_.ntensors;
      for (int d = rows_.layout.ndim - 1; d >= 0; --d) {
        const int64_t size = rows_.layout.sizes[d];
        if (++idx_[d] < size) {
          for (int t = 0; t < n; ++t) off_[t] += rows_.strides[t][d];
          return;
        }
        for (int t = 0; t < n; ++t) off_[t] -= (size - 1) * rows_.strides[t][d];
        idx_[d] = 0;
      }
    }

   private:
    const RowOffsets& rows_;
    int64_t idx_[kMaxOuterDims] = {};
    int64_t off_[kMaxTensors] = {0, 0, 0};
  };
};

// Rows per parallel task: at least ~16K elements, so small rows are not split into tiny tasks. Rows are
// independent and each is computed in a fixed order, so results do not depend on the split.
inline int64_t row_grain(int64_t D) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)); }

// Short rows are normalised in groups (statistics of every row of the group, then the output of each), so the
// latency chains of independent rows' statistics overlap: up to kMaxRowGroup rows, at most 1024 elements in all
// (the group's rows stay in L1 between the passes). Each row is computed exactly as alone.
constexpr int64_t kMaxRowGroup = 8;
inline int64_t row_group(int64_t D) { return std::clamp<int64_t>(1024 / std::max<int64_t>(D, 1), 1, kMaxRowGroup); }

}  // namespace fusegraph
