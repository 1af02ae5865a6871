#pragma once
// Launch shape of the row-reduction kernels (rms_norm, adaln): one warp per row for short rows (several
// rows per block), the whole block per row otherwise. Kernels loop over rows with a grid stride.
#include <algorithm>

#include "ops/cuda/common.cuh"

namespace fusegraph::cuda::detail {

struct RowLaunch {
  dim3 grid;
  dim3 block;
};

inline RowLaunch row_launch(int64_t rows, int64_t cols, int vec) {
  constexpr int64_t kWarpRowMaxChunks = 64;  // up to 2 vectors per lane: a warp is enough
  constexpr int kRowsPerBlock = 8;
  const int64_t chunks = ceil_div(cols, vec);
  if (chunks <= kWarpRowMaxChunks) {
    return {dim3(grid_for(ceil_div(rows, kRowsPerBlock))), dim3(32, kRowsPerBlock, 1)};
  }
  const int64_t threads = std::min<int64_t>(1024, ceil_div(chunks, 32) * 32);
  return {dim3(grid_for(rows)), dim3(static_cast<unsigned>(threads), 1, 1)};
}

}  // namespace fusegraph::cuda::detail
