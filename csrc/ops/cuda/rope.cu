// Rotary position embedding: out = x * cos + rot(x) * sin over the head dim, fp32 math, one rounding.
// Rows are x's leading dims (coalesced); cos/sin are read through their broadcast strides (0 on the dims
// they lack), so [S,D], [1,S,1,D], [1,1,S,D] and [B,S,1,D] tables need no copy.
#include "ops/cuda/common.cuh"

namespace fusegraph::cuda {
namespace {

using namespace detail;

struct RopeParams {
  RowLayout layout;
  Operand x, cos, sin;
  void* out;
};

// Interleaved pairs (x0, x1) -> (x0 c0 - x1 s0, x1 c1 + x0 s1); a thread takes VEC (even) elements.
template <int VEC, bool kVec>
__global__ void __launch_bounds__(256) rope_interleaved_kernel(const RopeParams p) {
  static_assert(VEC % 2 == 0, "pairs must not straddle threads");
  const int64_t cols = p.layout.cols;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < p.layout.rows;
       row += row_step) {
    int64_t idx[kMaxOuterDims];
    row_index(p.layout, row, idx);
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
      store_elems<VEC, kVec>(p.out, row * cols + col, p.x.dtype, y);
    }
  }
}

// Rotate-half: with h = D/2, out[j] = x[j] c[j] - x[j+h] s[j], out[j+h] = x[j+h] c[j+h] + x[j] s[j+h];
// a thread takes VEC elements of the first half and the matching VEC of the second.
template <int VEC, bool kVec>
__global__ void __launch_bounds__(256) rope_half_kernel(const RopeParams p) {
  const int64_t cols = p.layout.cols;
  const int64_t half = cols / 2;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < p.layout.rows;
       row += row_step) {
    int64_t idx[kMaxOuterDims];
    row_index(p.layout, row, idx);
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
      store_elems<VEC, kVec>(p.out, row * cols + col, p.x.dtype, y1);
      store_elems<VEC, kVec>(p.out, row * cols + col + half, p.x.dtype, y2);
    }
  }
}

template <int VEC, bool kVec>
cudaError_t launch(const RopeParams& p, bool interleaved, cudaStream_t stream) {
  constexpr int kPairVec = VEC < 2 ? 2 : VEC;  // interleaved pairs never straddle threads
  const int64_t chunks = interleaved ? ceil_div(p.layout.cols, kPairVec) : ceil_div(p.layout.cols / 2, VEC);
  const dim3 block = block_2d(chunks);
  const unsigned grid = grid_for(ceil_div(p.layout.rows, block.y));
  if (interleaved) {
    rope_interleaved_kernel<kPairVec, kVec><<<grid, block, 0, stream>>>(p);
  } else {
    rope_half_kernel<VEC, kVec><<<grid, block, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_rope(const RowLayout& layout, const Operand& x, const Operand& cos, const Operand& sin,
                        void* out, bool interleaved, cudaStream_t stream) {
  if (layout.rows == 0 || layout.cols == 0) return cudaSuccess;
  const RopeParams p{layout, x, cos, sin, out};
  const Operand* const ops[] = {&x, &cos, &sin};
  const int64_t unit = interleaved ? layout.cols : layout.cols / 2;
  return detail::with_vec_width(detail::choose_vec(layout, ops, unit, out), [&](auto vec) {
    constexpr int VEC = decltype(vec)::value;
    return launch<VEC, (VEC > 1)>(p, interleaved, stream);
  });
}

}  // namespace fusegraph::cuda
