// Rotary position embedding: out = x * cos + rot(x) * sin over the first R (rotary_dim) channels of the head
// dim, fp32 math, one rounding; channels R..D-1 copied. Rows are x's leading dims (coalesced); cos/sin (R wide)
// are read through their broadcast strides (0 on the dims they lack), so [S,R], [1,S,1,R], [1,1,S,R] and
// [B,S,1,R] tables need no copy.
#include <numeric>

#include "ops/cuda/row_launch.cuh"
#include "ops/cuda/vec_io.cuh"

namespace fusegraph::cuda {
namespace {

using namespace detail;

struct RopeParams {
  RowLayout layout;  // cols: the rotated width R
  Operand x, cos, sin;
  void* out;
  int64_t out_cols;  // D: out's row length; x's channels R..D-1 are copied
};

// out[row, R:D] = x[row, R:D] (the channels rotary_dim leaves as they are), VEC elements per thread.
template <int VEC, bool kVec>
__device__ __forceinline__ void copy_pass_through(const RopeParams& p, int64_t row, int64_t x_row) {
  const int64_t r = p.layout.cols;
  for (int64_t col = r + static_cast<int64_t>(threadIdx.x) * VEC; col < p.out_cols; col += blockDim.x * VEC) {
    float v[VEC];
    load_elems<VEC, kVec>(p.x.data, x_row + col, 1, p.x.dtype, v);
    store_elems<VEC, kVec>(p.out, row * p.out_cols + col, p.x.dtype, v);
  }
}

// Interleaved pairs (x0, x1) -> (x0 c0 - x1 s0, x1 c1 + x0 s1); a thread takes VEC (even) elements of the
// rotated part, PASS_VEC of the pass-through (VEC is 2 where the launch's width is 1).
template <int VEC, int PASS_VEC, bool kVec>
__global__ void __launch_bounds__(256) rope_interleaved_kernel(const RopeParams p) {
  static_assert(VEC % 2 == 0, "pairs must not straddle threads");
  const int64_t cols = p.layout.cols;
  for_each_row(p.layout, [&](int64_t row, const int64_t* idx) {
    const int64_t x_row = row_offset(p.layout, p.x, idx);
    const int64_t cos_row = row_offset(p.layout, p.cos, idx);
    const int64_t sin_row = row_offset(p.layout, p.sin, idx);
    for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += blockDim.x * VEC) {
      float x[VEC], c[VEC], s[VEC], y[VEC];
      load_elems<VEC, kVec>(p.x.data, x_row + col, 1, p.x.dtype, x);
      load_elems<VEC, kVec>(p.cos.data, cos_row + col, 1, p.cos.dtype, c);
      load_elems<VEC, kVec>(p.sin.data, sin_row + col, 1, p.sin.dtype, s);
#pragma unroll
      for (int i = 0; i < VEC; i += 2) {
        y[i] = x[i] * c[i] - x[i + 1] * s[i];
        y[i + 1] = x[i + 1] * c[i + 1] + x[i] * s[i + 1];
      }
      store_elems<VEC, kVec>(p.out, row * p.out_cols + col, p.x.dtype, y);
    }
    copy_pass_through<PASS_VEC, kVec>(p, row, x_row);
  });
}

// Rotate-half: with h = R/2, out[j] = x[j] c[j] - x[j+h] s[j], out[j+h] = x[j+h] c[j+h] + x[j] s[j+h];
// a thread takes VEC elements of the first half and the matching VEC of the second.
template <int VEC, bool kVec>
__global__ void __launch_bounds__(256) rope_half_kernel(const RopeParams p) {
  const int64_t cols = p.layout.cols;
  const int64_t half = cols / 2;
  for_each_row(p.layout, [&](int64_t row, const int64_t* idx) {
    const int64_t x_row = row_offset(p.layout, p.x, idx);
    const int64_t cos_row = row_offset(p.layout, p.cos, idx);
    const int64_t sin_row = row_offset(p.layout, p.sin, idx);
    for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < half; col += blockDim.x * VEC) {
      float x1[VEC], x2[VEC], c1[VEC], c2[VEC], s1[VEC], s2[VEC], y1[VEC], y2[VEC];
      load_elems<VEC, kVec>(p.x.data, x_row + col, 1, p.x.dtype, x1);
      load_elems<VEC, kVec>(p.x.data, x_row + col + half, 1, p.x.dtype, x2);
      load_elems<VEC, kVec>(p.cos.data, cos_row + col, 1, p.cos.dtype, c1);
      load_elems<VEC, kVec>(p.cos.data, cos_row + col + half, 1, p.cos.dtype, c2);
      load_elems<VEC, kVec>(p.sin.data, sin_row + col, 1, p.sin.dtype, s1);
      load_elems<VEC, kVec>(p.sin.data, sin_row + col + half, 1, p.sin.dtype, s2);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        y1[i] = x1[i] * c1[i] - x2[i] * s1[i];
        y2[i] = x2[i] * c2[i] + x1[i] * s2[i];
      }
      store_elems<VEC, kVec>(p.out, row * p.out_cols + col, p.x.dtype, y1);
      store_elems<VEC, kVec>(p.out, row * p.out_cols + col + half, p.x.dtype, y2);
    }
    copy_pass_through<VEC, kVec>(p, row, x_row);
  });
}

template <int VEC, bool kVec>
cudaError_t launch(const RopeParams& p, bool interleaved, cudaStream_t stream) {
  constexpr int kPairVec = VEC < 2 ? 2 : VEC;  // interleaved pairs never straddle threads
  const int64_t rotated = interleaved ? ceil_div(p.layout.cols, kPairVec) : ceil_div(p.layout.cols / 2, VEC);
  const int64_t passed = ceil_div(p.out_cols - p.layout.cols, VEC);
  const int64_t chunks = rotated > passed ? rotated : passed;
  const dim3 block = block_2d(chunks);
  const unsigned grid = grid_for(ceil_div(p.layout.rows, block.y));
  if (interleaved) return launch_kernel(rope_interleaved_kernel<kPairVec, VEC, kVec>, {grid, block}, stream, p);
  return launch_kernel(rope_half_kernel<VEC, kVec>, {grid, block}, stream, p);
}

}  // namespace

cudaError_t launch_rope(const RowLayout& layout, const Operand& x, const Operand& cos, const Operand& sin,
                        void* out, int64_t out_cols, bool interleaved, cudaStream_t stream) {
  if (layout.rows == 0 || out_cols == 0) return cudaSuccess;
  const RopeParams p{layout, x, cos, sin, out, out_cols};
  const Operand* const ops[] = {&x, &cos, &sin};
  // The width must divide the rotated unit (the row, or half of it for rotate-half) and out's row length D:
  // then R, the pass-through's start, and every row start of out are multiples of it too.
  const int64_t unit = std::gcd(interleaved ? layout.cols : layout.cols / 2, out_cols);
  return detail::with_vec_width(detail::choose_vec(layout, ops, unit, out), [&](auto vec) {
    constexpr int VEC = decltype(vec)::value;
    return launch<VEC, (VEC > 1)>(p, interleaved, stream);
  });
}

}  // namespace fusegraph::cuda
