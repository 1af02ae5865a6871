#pragma once
// Rows of a RowLayout and the launches over them. Device: the grid-stride loop over a layout's rows and a
// row's element offset in an operand. Host: the vector width every operand allows, launch shapes, the launch.
// Plain CUDA C++: no torch header (the file compiles with nvcc alone).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "ops/cuda/launch.h"

namespace fusegraph::cuda::detail {

// ---- device: rows ----
// Multi-index of `row` in the layout's outer dims (innermost last), written to idx[0..ndim).
__device__ __forceinline__ void row_index(const RowLayout& layout, int64_t row, int64_t* idx) {
#pragma unroll
  for (int d = kMaxOuterDims - 1; d >= 0; --d) {
    if (d < layout.ndim) {
      const int64_t size = layout.sizes[d];
      idx[d] = row % size;
      row /= size;
    }
  }
}

__device__ __forceinline__ int64_t row_offset(const RowLayout& layout, const Operand& op, const int64_t* idx) {
  int64_t off = 0;
#pragma unroll
  for (int d = 0; d < kMaxOuterDims; ++d) {
    if (d < layout.ndim) off += idx[d] * op.outer_strides[d];
  }
  return off;
}

// Grid-stride loop over the layout's rows, blockDim.y rows per block (threadIdx.y picks one): f(row, idx) for
// each row of this thread, idx its multi-index over the outer dims (for row_offset).
template <typename F>
__device__ __forceinline__ void for_each_row(const RowLayout& layout, F&& f) {
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < layout.rows;
       row += row_step) {
    int64_t idx[kMaxOuterDims];
    row_index(layout, row, idx);
    f(row, idx);
  }
}

// ---- host: vector width, launch shapes, launch ----
inline bool aligned_for(const Operand& op, int vec) {
  if (op.data == nullptr || op.inner_stride == 0) return true;
  if (op.inner_stride != 1) return false;
  const auto bytes = static_cast<uintptr_t>(vec * element_size(op.dtype));
  const uintptr_t need = bytes < 16 ? bytes : 16;
  return reinterpret_cast<uintptr_t>(op.data) % need == 0;
}

inline bool strides_allow(const RowLayout& layout, const Operand& op, int vec) {
  if (op.data == nullptr || op.inner_stride == 0) return true;  // broadcast along the row: scalar loads
  for (int d = 0; d < layout.ndim; ++d) {
    if (op.outer_strides[d] % vec != 0) return false;
  }
  return true;
}

// The widest vector (8, 4, 2 elements) every operand allows, or 1 (scalar path). `cols_unit` is
// the length that must divide by the width (the row, or half of it for rotate-half rope).
template <int NOps>
inline int choose_vec(const RowLayout& layout, const Operand* const (&ops)[NOps], int64_t cols_unit,
                      const void* out) {
  for (int vec : {8, 4, 2}) {
    if (cols_unit % vec != 0) continue;
    if (reinterpret_cast<uintptr_t>(out) % 16 != 0) continue;
    bool ok = true;
    for (const Operand* op : ops) ok = ok && aligned_for(*op, vec) && strides_allow(layout, *op, vec);
    if (ok) return vec;
  }
  return 1;
}

// Calls launch(std::integral_constant<int, VEC>{}) for the width choose_vec picked (8, 4, 2, else 1), so
// every op instantiates its kernel for the same widths from one switch.
template <typename Launch>
inline cudaError_t with_vec_width(int vec, Launch&& launch) {
  switch (vec) {
    case 8: return launch(std::integral_constant<int, 8>{});
    case 4: return launch(std::integral_constant<int, 4>{});
    case 2: return launch(std::integral_constant<int, 2>{});
    default: return launch(std::integral_constant<int, 1>{});
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid for a grid-stride loop over `units` blocks of work: capped, the loops cover the rest.
inline unsigned grid_for(int64_t units) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;
  return static_cast<unsigned>(units < 1 ? 1 : (units < kMaxBlocks ? units : kMaxBlocks));
}

// 2-D block for row-wise elementwise kernels: x across a row's `chunks` (vectors), y across rows.
inline dim3 block_2d(int64_t chunks) {
  constexpr int kThreads = 256;
  int tx = 1;
  while (tx < chunks && tx < kThreads) tx *= 2;
  return dim3(static_cast<unsigned>(tx), static_cast<unsigned>(kThreads / tx), 1);
}

struct LaunchShape {
  dim3 grid;
  dim3 block;
};

// Launch shape of the row-reduction kernels (rms_norm, adaln): one warp per row for short rows (several
// rows per block), the whole block per row otherwise. Kernels loop over rows with a grid stride.
inline LaunchShape reduction_shape(int64_t rows, int64_t cols, int vec) {
  constexpr int64_t kWarpRowMaxChunks = 64;  // up to 2 vectors per lane: a warp is enough
  constexpr int kRowsPerBlock = 8;
  const int64_t chunks = ceil_div(cols, vec);
  if (chunks <= kWarpRowMaxChunks) {
    return {dim3(grid_for(ceil_div(rows, kRowsPerBlock))), dim3(32, kRowsPerBlock, 1)};
  }
  const int64_t threads = std::min<int64_t>(1024, ceil_div(chunks, 32) * 32);
  return {dim3(grid_for(rows)), dim3(static_cast<unsigned>(threads), 1, 1)};
}

// kernel<<<shape, no dynamic shared memory, stream>>>(args...); returns the launch's error (cudaGetLastError).
template <typename... Params, typename... Args>
inline cudaError_t launch_kernel(void (*kernel)(Params...), const LaunchShape& shape, cudaStream_t stream,
                                 Args&&... args) {
  kernel<<<shape.grid, shape.block, 0, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
}

}  // namespace fusegraph::cuda::detail
