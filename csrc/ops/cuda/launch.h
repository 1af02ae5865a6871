#pragma once
// Host launch functions of the CUDA kernels: plain C++ over raw pointers, sizes, element strides and a
// dtype tag, so the device code (csrc/ops/cuda/*.cu) needs no torch header and the torch-facing entry
// points (csrc/ops/cuda/*_cuda.cpp) know nothing of kernels. Each launch returns the launch's
// cudaError_t (cudaGetLastError), never synchronises, and runs on the given stream.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/row_layout.h"

namespace fusegraph::cuda {

enum class DType : int { Float32 = 0, BFloat16 = 1, Float16 = 2 };

inline int element_size(DType t) { return t == DType::Float32 ? 4 : 2; }

// One input seen through the kernels' RowLayout (ops/row_layout.h): element (row, col) is at
//   data + sum_d index_d(row) * outer_strides[d] + col * inner_stride     (in elements).
// Broadcast dims have stride 0. data == nullptr means "absent" (optional weight, bias, ...).
struct Operand {
  const void* data = nullptr;
  DType dtype = DType::Float32;
  int64_t outer_strides[kMaxOuterDims] = {};
  int64_t inner_stride = 1;
};

// y = x * rsqrt(mean(x^2) + eps) * weight + bias over each row. weight and bias (optional) have zero
// outer strides. diffusers_style: when weight is fp16/bf16, the normalised value is rounded to
// weight's dtype before the multiply and the product rounded again (diffusers RMSNorm), else one rounding.
cudaError_t launch_rms_norm(const RowLayout& layout, const Operand& x, const Operand& weight, const Operand& bias,
                            void* out, DType out_dtype, float eps, bool diffusers_style, cudaStream_t stream);

// y = (norm(x) * weight + bias) * (1 + scale) + shift over each row, norm = (x - mean) * rsqrt(var + eps)
// (biased var) or, rms, x * rsqrt(mean(x^2) + eps); weight/bias/shift absent when their data is nullptr.
cudaError_t launch_adaln(const RowLayout& layout, const Operand& x, const Operand& scale, const Operand& shift,
                         const Operand& weight, const Operand& bias, void* out, DType out_dtype, float eps, bool rms,
                         cudaStream_t stream);

// out = a * b + c elementwise; when b.data is nullptr, b is the number b_scalar.
cudaError_t launch_mul_add(const RowLayout& layout, const Operand& a, const Operand& b, float b_scalar,
                           const Operand& c, void* out, DType out_dtype, cudaStream_t stream);

enum class GeluKind : int { Tanh = 0, Sigmoid = 1 };

// out[i] = gelu(x[i]) over n contiguous elements; out has x's dtype.
cudaError_t launch_gelu(GeluKind kind, const void* x, DType dtype, void* out, int64_t n, cudaStream_t stream);

// out = x * cos + rot(x) * sin over the first layout.cols (the rotated width R, even) elements of each row;
// x's elements R..out_cols-1 are copied (out_cols: the head dim D, x's row length too, R <= D). x, cos and sin
// have unit inner stride; out is contiguous, rows of out_cols. interleaved: rot pairs (x0, x1) -> (-x1, x0);
// else rotate-half: cat(-x[h:R], x[:h]), h = R/2. out has x's dtype.
cudaError_t launch_rope(const RowLayout& layout, const Operand& x, const Operand& cos, const Operand& sin,
                        void* out, int64_t out_cols, bool interleaved, cudaStream_t stream);

}  // namespace fusegraph::cuda
