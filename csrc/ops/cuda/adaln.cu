// Adaptive norm modulation: y = (n * weight + bias) * (1 + scale) + shift per row, fp32 math, one rounding.
// LayerNorm (n = (x - mean) * rsqrt(var + eps), biased variance): two-pass statistics (mean, then centred sum
// of squares; each thread's sums are FoldedSums) for the accuracy of a float64 reference. RMSNorm (rms:
// n = x * rsqrt(mean(x^2) + eps), mean and eps in fp32 as eager): one pass of squares. The row is re-read
// from L1/L2, written once. scale/shift are broadcast through their strides ([B,1,D] chunk views, per-token
// [B,S,D], [D]); shift, weight and bias are optional (data nullptr).
#include "ops/cuda/norm_rows.cuh"
#include "ops/cuda/row_launch.cuh"
#include "ops/cuda/vec_io.cuh"

namespace fusegraph::cuda {
namespace {

using namespace detail;

struct AdalnParams {
  RowLayout layout;
  Operand x, scale, shift, weight, bias;
  void* out;
  DType out_dtype;
  float eps;
  bool rms;
};

template <int VEC, bool kVec>
__global__ void __launch_bounds__(1024) adaln_kernel(const AdalnParams p) {
  __shared__ float smem[32];
  const int64_t cols = p.layout.cols;
  const int64_t col_step = static_cast<int64_t>(blockDim.x) * VEC;
  const int64_t col0 = static_cast<int64_t>(threadIdx.x) * VEC;
  const int64_t xs = p.x.inner_stride;
  const auto sum = [](const float* v) {
    float step = 0.0f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) step += v[i];
    return step;
  };
  for_each_row(p.layout, [&](int64_t row, const int64_t* idx) {
    const int64_t x_row = row_offset(p.layout, p.x, idx);

    float mean = 0.0f;
    float sum_sq;  // of x (rms) or of x - mean
    if (p.rms) {
      sum_sq = row_sum(thread_row_sum<VEC, kVec>(p.x, x_row, cols, ChunkSquares<VEC>{}), smem);
    } else {
      mean = row_sum(thread_row_sum<VEC, kVec>(p.x, x_row, cols, sum), smem) / static_cast<float>(cols);
      const auto centred_squares = [mean](const float* v) {
        float step = 0.0f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) step += (v[i] - mean) * (v[i] - mean);
        return step;
      };
      sum_sq = row_sum(thread_row_sum<VEC, kVec>(p.x, x_row, cols, centred_squares), smem);
    }
    float rstd = 1.0f / sqrtf(sum_sq / static_cast<float>(cols) + p.eps);
    if (!p.rms && isinf(sum_sq) && isfinite(mean)) {
      // |x - mean| above ~1.8e19: the float32 sum of squares overflowed (rstd would be 0 and the row `shift`).
      // Sum the squares of the deviations scaled by 2^-64 instead; eps is negligible against such a variance. The
      // branch is uniform across the block (every thread holds the row's sum), so row_sum's barriers are safe.
      constexpr float kDown = 5.42101086242752217e-20f;  // 2^-64
      const auto scaled_squares = [mean](const float* v) {
        float step = 0.0f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) step += ((v[i] - mean) * kDown) * ((v[i] - mean) * kDown);
        return step;
      };
      const float scaled = row_sum(thread_row_sum<VEC, kVec>(p.x, x_row, cols, scaled_squares), smem);
      rstd = kDown / sqrtf(scaled / static_cast<float>(cols));
    }

    const int64_t scale_row = row_offset(p.layout, p.scale, idx);
    const bool has_shift = p.shift.data != nullptr;
    const int64_t shift_row = has_shift ? row_offset(p.layout, p.shift, idx) : 0;
    for (int64_t col = col0; col < cols; col += col_step) {
      float v[VEC], scale[VEC], shift[VEC];
      load_elems<VEC, kVec>(p.x.data, x_row + col * xs, xs, p.x.dtype, v);
      load_elems<VEC, kVec>(p.scale.data, scale_row + col * p.scale.inner_stride, p.scale.inner_stride,
                            p.scale.dtype, scale);
      if (has_shift) {
        load_elems<VEC, kVec>(p.shift.data, shift_row + col * p.shift.inner_stride, p.shift.inner_stride,
                              p.shift.dtype, shift);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) shift[i] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = (v[i] - mean) * rstd;
      apply_affine<VEC, kVec>(p.weight, p.bias, col, false, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = has_shift ? v[i] * (1.0f + scale[i]) + shift[i] : v[i] * (1.0f + scale[i]);
      store_elems<VEC, kVec>(p.out, row * cols + col, p.out_dtype, v);
    }
  });
}

}  // namespace

cudaError_t launch_adaln(const RowLayout& layout, const Operand& x, const Operand& scale, const Operand& shift,
                         const Operand& weight, const Operand& bias, void* out, DType out_dtype, float eps, bool rms,
                         cudaStream_t stream) {
  if (layout.rows == 0 || layout.cols == 0) return cudaSuccess;
  const AdalnParams p{layout, x, scale, shift, weight, bias, out, out_dtype, eps, rms};
  const Operand* const ops[] = {&x, &scale, &shift, &weight, &bias};
  return detail::with_vec_width(detail::choose_vec(layout, ops, layout.cols, out), [&](auto vec) {
    constexpr int VEC = decltype(vec)::value;
    const detail::LaunchShape shape = detail::reduction_shape(layout.rows, layout.cols, VEC);
    return detail::launch_kernel(adaln_kernel<VEC, (VEC > 1)>, shape, stream, p);
  });
}

}  // namespace fusegraph::cuda
