#pragma once
// The iteration space of the row-wise kernels, CPU and CUDA alike: a tensor [..., D] is `rows` rows of
// `cols` = D elements, indexed by its leading ("outer") dims after coalescing (row_plan.h). Each operand's
// strides over those dims travel with the operand (RowOffsets on the CPU, cuda::Operand on the GPU); the
// output is contiguous, element (row, col) at row * cols + col. Plain C++, no torch header: the CUDA device
// code (compiled by nvcc alone) takes a RowLayout by value.
#include <cstdint>

namespace fusegraph {

// Leading dims a layout may keep after coalescing; callers materialise anything with more (plan_or_copy).
constexpr int kMaxOuterDims = 6;

struct RowLayout {
  int ndim = 0;                       // outer dims in use
  int64_t sizes[kMaxOuterDims] = {};  // outer sizes, outermost first
  int64_t rows = 1;                   // product of sizes (0 when cols is 0)
  int64_t cols = 0;                   // row length (the last dim)
};

}  // namespace fusegraph
