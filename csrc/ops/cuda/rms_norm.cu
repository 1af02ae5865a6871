// RMSNorm over the last dim: y = x * rsqrt(mean(x^2) + eps) * weight + bias, fp32 math.
// One row per warp (short rows) or per block; the sum of squares is a per-thread FoldedSum (fp32 partials
// added in double on long rows), then a warp-shuffle + shared-memory reduction in fp32; the row is read
// twice (the second read hits L1/L2) and written once.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/row_launch.cuh"

namespace fusegraph::cuda {
namespace {

using namespace detail;

struct RmsNormParams {
  RowLayout layout;
  Operand x, weight, bias;
  void* out;
  DType out_dtype;
  float eps;
  bool diffusers_style;
};

template <int VEC, bool kVec>
__global__ void __launch_bounds__(1024) rms_norm_kernel(const RmsNormParams p) {
  __shared__ float smem[32];
  const int64_t cols = p.layout.cols;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  // diffusers RMSNorm with an fp16/bf16 weight: normalised value and product each rounded to its dtype.
  const bool round_twice = p.diffusers_style && p.weight.data != nullptr && p.weight.dtype != DType::Float32;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < p.layout.rows;
       row += row_step) {
    int64_t idx[kMaxOuterDims];
    row_index(p.layout, row, idx);
    const int64_t x_row = row_offset(p.layout, p.x, idx);

    FoldedSum thread_sq;
    for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += blockDim.x * VEC) {
      float v[VEC];
      load_elems<VEC, kVec>(p.x.data, x_row + col * p.x.inner_stride, p.x.inner_stride, p.x.dtype, v);
      float step = 0.0f;
#pragma unroll
      for (int i = 0; i < VEC; ++i) step += v[i] * v[i];
      thread_sq.add(step);
    }
    const float sum_sq = row_sum(thread_sq.value(), smem);
    const float rstd = 1.0f / sqrtf(sum_sq / static_cast<float>(cols) + p.eps);

    for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += blockDim.x * VEC) {
      float v[VEC];
      load_elems<VEC, kVec>(p.x.data, x_row + col * p.x.inner_stride, p.x.inner_stride, p.x.dtype, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] *= rstd;
      if (p.weight.data != nullptr) {
        float w[VEC];
        load_elems<VEC, kVec>(p.weight.data, col * p.weight.inner_stride, p.weight.inner_stride, p.weight.dtype, w);
        if (round_twice) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) v[i] = round_to(round_to(v[i], p.weight.dtype) * w[i], p.weight.dtype);
        } else {
#pragma unroll
          for (int i = 0; i < VEC; ++i) v[i] *= w[i];
        }
      }
      if (p.bias.data != nullptr) {
        float b[VEC];
        load_elems<VEC, kVec>(p.bias.data, col * p.bias.inner_stride, p.bias.inner_stride, p.bias.dtype, b);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] += b[i];
      }
      store_elems<VEC, kVec>(p.out, row * cols + col, p.out_dtype, v);
    }
  }
}

template <int VEC, bool kVec>
cudaError_t launch(const RmsNormParams& p, cudaStream_t stream) {
  const RowLaunch shape = row_launch(p.layout.rows, p.layout.cols, VEC);
  rms_norm_kernel<VEC, kVec><<<shape.grid, shape.block, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_rms_norm(const RowLayout& layout, const Operand& x, const Operand& weight, const Operand& bias,
                            void* out, DType out_dtype, float eps, bool diffusers_style, cudaStream_t stream) {
  if (layout.rows == 0 || layout.cols == 0) return cudaSuccess;
  const RmsNormParams p{layout, x, weight, bias, out, out_dtype, eps, diffusers_style};
  const Operand* const ops[] = {&x, &weight, &bias};
  return detail::with_vec_width(detail::choose_vec(layout, ops, layout.cols, out), [&](auto vec) {
    constexpr int VEC = decltype(vec)::value;
    return launch<VEC, (VEC > 1)>(p, stream);
  });
}

}  // namespace fusegraph::cuda
