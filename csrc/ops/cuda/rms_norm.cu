// RMSNorm over the last dim: y = x * rsqrt(mean(x^2) + eps) * weight + bias, fp32 math.
// One row per warp (short rows) or per block; the sum of squares is a per-thread FoldedSum (fp32 partials
// added in double on long rows), then a warp-shuffle + shared-memory reduction in fp32; the row is read
// twice (the second read hits L1/L2) and written once.
#include "ops/cuda/norm_rows.cuh"
#include "ops/cuda/row_launch.cuh"
#include "ops/cuda/vec_io.cuh"

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
  // diffusers RMSNorm with an fp16/bf16 weight: normalised value and product each rounded to its dtype.
  const bool round_twice = p.diffusers_style && p.weight.data != nullptr && p.weight.dtype != DType::Float32;
  for_each_row(p.layout, [&](int64_t row, const int64_t* idx) {
    const int64_t x_row = row_offset(p.layout, p.x, idx);
    const float sum_sq = row_sum(thread_row_sum<VEC, kVec>(p.x, x_row, cols, ChunkSquares<VEC>{}), smem);
    const float rstd = 1.0f / sqrtf(sum_sq / static_cast<float>(cols) + p.eps);

    for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += blockDim.x * VEC) {
      float v[VEC];
      load_elems<VEC, kVec>(p.x.data, x_row + col * p.x.inner_stride, p.x.inner_stride, p.x.dtype, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] *= rstd;
      apply_affine<VEC, kVec>(p.weight, p.bias, col, round_twice, v);
      store_elems<VEC, kVec>(p.out, row * cols + col, p.out_dtype, v);
    }
  });
}

}  // namespace

cudaError_t launch_rms_norm(const RowLayout& layout, const Operand& x, const Operand& weight, const Operand& bias,
                            void* out, DType out_dtype, float eps, bool diffusers_style, cudaStream_t stream) {
  if (layout.rows == 0 || layout.cols == 0) return cudaSuccess;
  const RmsNormParams p{layout, x, weight, bias, out, out_dtype, eps, diffusers_style};
  const Operand* const ops[] = {&x, &weight, &bias};
  return detail::with_vec_width(detail::choose_vec(layout, ops, layout.cols, out), [&](auto vec) {
    constexpr int VEC = decltype(vec)::value;
    const detail::LaunchShape shape = detail::reduction_shape(layout.rows, layout.cols, VEC);
    return detail::launch_kernel(rms_norm_kernel<VEC, (VEC > 1)>, shape, stream, p);
  });
}

}  // namespace fusegraph::cuda
