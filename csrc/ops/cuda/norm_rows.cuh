#pragma once
// Device building blocks of the row-wise norm kernels (rms_norm, adaln): a thread's sum over its part of a
// row, the sum over the row's threads (fp32, fixed order for a fixed launch shape: bitwise deterministic), and
// the affine (weight, bias) of the normalised values. The CPU kernels' counterpart is ops/norm_rows.h.
// Plain CUDA C++: no torch header (the file compiles with nvcc alone).
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/launch.h"
#include "ops/cuda/vec_io.cuh"

namespace fusegraph::cuda::detail {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
  return v;
}

// A thread's running sum over a row. With one float32 accumulator, a long row (2^22 columns on 1024 threads:
// 4096 elements per thread) lost fp32 accuracy; here every kSteps loop steps' float32 partial is added to a
// double. A thread with at most kSteps steps (rows up to kSteps * VEC * 1024 columns, every model width)
// never folds and sums in float32 alone.
struct FoldedSum {
  static constexpr int kSteps = 32;
  double total = 0.0;
  float part = 0.0f;
  int steps = 0;
  __device__ __forceinline__ void add(float v) {
    part += v;
    if (++steps == kSteps) {
      total += static_cast<double>(part);
      part = 0.0f;
      steps = 0;
    }
  }
  __device__ __forceinline__ float value() const { return static_cast<float>(total + static_cast<double>(part)); }
};

// Sum of v over the threads of one row. A row is either one warp (blockDim.x == 32, several rows per
// block along y) or the whole block (blockDim.y == 1, blockDim.x a multiple of 32). Every thread of the
// row gets the total. smem: 32 floats.
__device__ __forceinline__ float row_sum(float v, float* smem) {
  v = warp_sum(v);
  if (blockDim.x <= 32) return v;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  __syncthreads();  // smem may still be read by the previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? smem[lane] : 0.0f;
  return warp_sum(v);
}

// What one chunk v[0..VEC) adds to a row's sum of squares (thread_row_sum's chunk_sum).
template <int VEC>
struct ChunkSquares {
  __device__ __forceinline__ float operator()(const float* v) const {
    float step = 0.0f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) step += v[i] * v[i];
    return step;
  }
};

// This thread's FoldedSum over its chunks of one row of x (VEC elements from column threadIdx.x * VEC, then
// every blockDim.x * VEC): chunk_sum(v) is what one chunk v[0..VEC) adds.
template <int VEC, bool kVec, typename ChunkSum>
__device__ __forceinline__ float thread_row_sum(const Operand& x, int64_t x_row, int64_t cols, ChunkSum chunk_sum) {
  const int64_t xs = x.inner_stride;
  FoldedSum sum;
  const int64_t col_step = static_cast<int64_t>(blockDim.x) * VEC;
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < cols; col += col_step) {
    float v[VEC];
    load_elems<VEC, kVec>(x.data, x_row + col * xs, xs, x.dtype, v);
    sum.add(chunk_sum(v));
  }
  return sum.value();
}

// v[i] = v[i] * weight[col + i] + bias[col + i] with whichever of weight and bias ([D] row vectors) is present.
// round_twice (diffusers RMSNorm with an fp16/bf16 weight): v rounded to weight's dtype before the multiply and
// the product rounded again.
template <int VEC, bool kVec>
__device__ __forceinline__ void apply_affine(const Operand& weight, const Operand& bias, int64_t col, bool round_twice,
                                             float* v) {
  if (weight.data != nullptr) {
    float w[VEC];
    load_elems<VEC, kVec>(weight.data, col * weight.inner_stride, weight.inner_stride, weight.dtype, w);
    if (round_twice) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = round_to(round_to(v[i], weight.dtype) * w[i], weight.dtype);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] *= w[i];
    }
  }
  if (bias.data != nullptr) {
    float b[VEC];
    load_elems<VEC, kVec>(bias.data, col * bias.inner_stride, bias.inner_stride, bias.dtype, b);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] += b[i];
  }
}

}  // namespace fusegraph::cuda::detail
