// out = a * b + c over rows of a coalesced broadcast layout (b a tensor or a number), fp32 math, one
// rounding. Fast path: a, c contiguous rows, b a [B,1,D] view: vector loads, b re-read from cache.
#include "ops/cuda/row_launch.cuh"
#include "ops/cuda/vec_io.cuh"

namespace fusegraph::cuda {
namespace {

using namespace detail;

struct MulAddParams {
  RowLayout layout;
  Operand a, b, c;
  float b_scalar;
  void* out;
  DType out_dtype;
};

template <int VEC, bool kVec>
__global__ void __launch_bounds__(256) mul_add_kernel(const MulAddParams p) {
  const int64_t cols = p.layout.cols;
  for_each_row(p.layout, [&](int64_t row, const int64_t* idx) {
    const int64_t a_row = row_offset(p.layout, p.a, idx);
    const int64_t b_row = row_offset(p.layout, p.b, idx);
    const int64_t c_row = row_offset(p.layout, p.c, idx);
    for (int64_t col = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * VEC; col < cols;
         col += static_cast<int64_t>(gridDim.y) * blockDim.x * VEC) {
      float a[VEC], b[VEC], c[VEC];
      load_elems<VEC, kVec>(p.a.data, a_row + col * p.a.inner_stride, p.a.inner_stride, p.a.dtype, a);
      if (p.b.data != nullptr) {
        load_elems<VEC, kVec>(p.b.data, b_row + col * p.b.inner_stride, p.b.inner_stride, p.b.dtype, b);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) b[i] = p.b_scalar;
      }
      load_elems<VEC, kVec>(p.c.data, c_row + col * p.c.inner_stride, p.c.inner_stride, p.c.dtype, c);
#pragma unroll
      for (int i = 0; i < VEC; ++i) a[i] = a[i] * b[i] + c[i];
      store_elems<VEC, kVec>(p.out, row * cols + col, p.out_dtype, a);
    }
  });
}

template <int VEC, bool kVec>
cudaError_t launch_mul_add_vec(const MulAddParams& p, cudaStream_t stream) {
  // x: tiles of rows, y: tiles of columns (a long 1-D tensor is one row), both grid-stride.
  const int64_t chunks = ceil_div(p.layout.cols, VEC);
  const dim3 block = block_2d(chunks);
  const int64_t col_tiles = ceil_div(chunks, block.x);
  const dim3 grid(grid_for(ceil_div(p.layout.rows, block.y)),
                  static_cast<unsigned>(col_tiles < 65535 ? col_tiles : 65535));
  return launch_kernel(mul_add_kernel<VEC, kVec>, {grid, block}, stream, p);
}

}  // namespace

cudaError_t launch_mul_add(const RowLayout& layout, const Operand& a, const Operand& b, float b_scalar,
                           const Operand& c, void* out, DType out_dtype, cudaStream_t stream) {
  if (layout.rows == 0 || layout.cols == 0) return cudaSuccess;
  const MulAddParams p{layout, a, b, c, b_scalar, out, out_dtype};
  const Operand* const ops[] = {&a, &b, &c};
  return detail::with_vec_width(detail::choose_vec(layout, ops, layout.cols, out), [&](auto vec) {
    constexpr int VEC = decltype(vec)::value;
    return launch_mul_add_vec<VEC, (VEC > 1)>(p, stream);
  });
}

}  // namespace fusegraph::cuda
