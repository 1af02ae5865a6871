#pragma once
// Row addressing for the row-wise norm kernels (rms_norm, adaln). A tensor of rank k+1 is a set of rows
// (the last dim, contiguous) indexed by its k leading dims; the row's start is sum_d idx_d * stride_d.
// Several tensors that share the leading shape (x and broadcast scale/shift, expanded with 0 strides)
// are addressed together, after coalescing dims that are contiguous for all of them. This lets the
// kernels read strided rows and [B,1,D] views from `chunk` in place, without copies.
// RowOffsets holds the coalesced dims and every tensor's strides (any rank) and walks rows with a Cursor.
// The CUDA kernels coalesce by the same rule into a fixed-size cuda::RowLayout (sizes only, passed by value
// to the device) with the strides in each cuda::Operand (csrc/ops/cuda/launch.h, tensor_args.h).
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

namespace fusegraph {

class RowOffsets {
 public:
  static constexpr int kMaxTensors = 3;

  // lead_sizes: the shared leading shape; lead_strides: each tensor's strides (elements) over those dims.
  RowOffsets(c10::IntArrayRef lead_sizes, std::initializer_list<c10::IntArrayRef> lead_strides)
      : ntensors_(static_cast<int>(lead_strides.size())) {
    TORCH_INTERNAL_ASSERT(ntensors_ >= 1 && ntensors_ <= kMaxTensors);
    for (const auto& s : lead_strides) TORCH_INTERNAL_ASSERT(s.size() == lead_sizes.size());
    for (size_t d = 0; d < lead_sizes.size(); ++d) {
      if (lead_sizes[d] == 1) continue;  // index always 0: stride irrelevant
      bool merge = !sizes_.empty();
      int t = 0;
      for (const auto& s : lead_strides) {
        // dim d continues the previous kept dim when prev_stride == stride * size for every tensor
        if (merge && strides_[(sizes_.size() - 1) * kMaxTensors + t] != s[d] * lead_sizes[d]) merge = false;
        ++t;
      }
      if (merge) {
        sizes_.back() *= lead_sizes[d];
        t = 0;
        for (const auto& s : lead_strides) strides_[(sizes_.size() - 1) * kMaxTensors + t++] = s[d];
      } else {
        sizes_.push_back(lead_sizes[d]);
        t = 0;
        strides_.resize(sizes_.size() * kMaxTensors, 0);
        for (const auto& s : lead_strides) strides_[(sizes_.size() - 1) * kMaxTensors + t++] = s[d];
      }
    }
  }

  // Element offsets of row `row` (row-major over the leading shape) for each tensor, into off[0..n).
  inline void offsets(int64_t row, int64_t* off) const {
    for (int t = 0; t < ntensors_; ++t) off[t] = 0;
    for (int64_t d = static_cast<int64_t>(sizes_.size()) - 1; d >= 0; --d) {
      const int64_t size = sizes_[d];
      const int64_t idx = row % size;
      row /= size;
      for (int t = 0; t < ntensors_; ++t) off[t] += idx * strides_[d * kMaxTensors + t];
    }
  }

  int64_t num_dims() const { return static_cast<int64_t>(sizes_.size()); }

  // Walks consecutive rows from `row` on: the offsets of the first come from offsets(), each next one from
  // an odometer step (an add per tensor, no division: offsets() divides once per dim, a visible share of a
  // short row's time).
  class Cursor {
   public:
    Cursor(const RowOffsets& layout, int64_t row) : layout_(layout) {
      // assign, not the (size, value) constructor: a GCC 12 -Wmaybe-uninitialized false positive.
      idx_.assign(layout.sizes_.size(), 0);
      layout.offsets(row, off_);
      for (int64_t d = static_cast<int64_t>(idx_.size()) - 1; d >= 0; --d) {
        idx_[d] = row % layout.sizes_[d];
        row /= layout.sizes_[d];
      }
    }
    // Offset of the current row in tensor t.
    int64_t operator[](int t) const { return off_[t]; }
    void next() {
      const int n = layout_.ntensors_;
      for (int64_t d = static_cast<int64_t>(idx_.size()) - 1; d >= 0; --d) {
        const int64_t* st = &layout_.strides_[d * kMaxTensors];
        if (++idx_[d] < layout_.sizes_[d]) {
          for (int t = 0; t < n; ++t) off_[t] += st[t];
          return;
        }
        for (int t = 0; t < n; ++t) off_[t] -= (layout_.sizes_[d] - 1) * st[t];
        idx_[d] = 0;
      }
    }

   private:
    const RowOffsets& layout_;
    c10::SmallVector<int64_t, 4> idx_;
    int64_t off_[kMaxTensors] = {0, 0, 0};
  };

 private:
  int ntensors_;
  c10::SmallVector<int64_t, 4> sizes_;
  c10::SmallVector<int64_t, 4 * kMaxTensors> strides_;
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
