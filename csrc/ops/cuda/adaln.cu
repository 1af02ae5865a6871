// Adaptive norm modulation: y = (n * weight + bias) * (1 + scale) + shift per row, fp32 math, one rounding.
// LayerNorm (n = (x - mean) * rsqrt(var + eps), biased variance): two-pass statistics (mean, then centred sum
// of squares; each thread's sums are FoldedSums) for the accuracy of a float64 reference. RMSNorm (rms:
// n = x * rsqrt(mean(x^2) + eps), mean and eps in fp32 as eager): one pass of squares. The row is re-read
// from L1/L2, written once. scale/shift are broadcast through their strides ([B,1,D] chunk views, per-token
// [B,S,D], [D]); shift, weight and bias are optional (data nullptr).
#include "ops/cuda/common.cuh"
#include "ops/cuda/row_launch.cuh"

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
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  const int64_t col_step = static_cast<int64_t>(blockDim.x) * VEC;
  const int64_t col0 = static_cast<int64_t>(threadIdx.x) * VEC;
  const int64_t xs = p.x.inner_stride;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < p.layout.rows;
       row += row_step) {
    int64_t idx[kMaxOuterDims];
    row_index(p.layout, row, idx);
    const int64_t x_row = row_offset(p.layout, p.x, idx);

    float mean = 0.0f;
    float rstd;
    if (p.rms) {
      FoldedSum thread_sq;
      for (int64_t col = col0; col < cols; col += col_step) {
        float v[VEC];
        load_elems<VEC, kVec>(p.x.data, x_row + col * xs, xs, p.x.dtype, v);
        float step = 0.0f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) step += v[i] * v[i];
        thread_sq.add(step);
      }
      rstd = 1.0f / sqrtf(row_sum(thread_sq.value(), smem) / static_cast<float>(cols) + p.eps);
    } else {
      FoldedSum thread_sum;
      for (int64_t col = col0; col < cols; col += col_step) {
        float v[VEC];
        load_elems<VEC, kVec>(p.x.data, x_row + col * xs, xs, p.x.dtype, v);
        float step = 0.0f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) step += v[i];
        thread_sum.add(step);
      }
      mean = row_sum(thread_sum.value(), smem) / static_cast<float>(cols);

      FoldedSum thread_sq;
      for (int64_t col = col0; col < cols; col += col_step) {
        float v[VEC];
        load_elems<VEC, kVec>(p.x.data, x_row + col * xs, xs, p.x.dtype, v);
        float step = 0.0f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) step += (v[i] - mean) * (v[i] - mean);
        thread_sq.add(step);
      }
      rstd = 1.0f / sqrtf(row_sum(thread_sq.value(), smem) / static_cast<float>(cols) + p.eps);
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
      if (p.weight.data != nullptr) {
        float w[VEC];
        load_elems<VEC, kVec>(p.weight.data, col * p.weight.inner_stride, p.weight.inner_stride, p.weight.dtype, w);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] *= w[i];
      }
      if (p.bias.data != nullptr) {
        float b[VEC];
        load_elems<VEC, kVec>(p.bias.data, col * p.bias.inner_stride, p.bias.inner_stride, p.bias.dtype, b);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] += b[i];
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = has_shift ? v[i] * (1.0f + scale[i]) + shift[i] : v[i] * (1.0f + scale[i]);
      store_elems<VEC, kVec>(p.out, row * cols + col, p.out_dtype, v);
    }
  }
}

template <int VEC, bool kVec>
cudaError_t launch(const AdalnParams& p, cudaStream_t stream) {
  const RowLaunch shape = row_launch(p.layout.rows, p.layout.cols, VEC);
  adaln_kernel<VEC, kVec><<<shape.grid, shape.block, 0, stream>>>(p);
  return cudaGetLastError();
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
    return launch<VEC, (VEC > 1)>(p, stream);
  });
}

}  // namespace fusegraph::cuda
