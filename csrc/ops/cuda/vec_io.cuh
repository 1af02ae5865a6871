#pragma once
// Element I/O of the fused kernels: fp32 <-> storage dtype conversion, vectorised loads and stores of an
// Operand's elements with a run-time dtype tag (the device counterpart of ops/cpu/vec_io.h).
// Plain CUDA C++: no torch header (the file compiles with nvcc alone).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "ops/cuda/launch.h"

namespace fusegraph::cuda::detail {

// ---- scalar conversions (round-to-nearest-even, as torch's .to()) ----
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// v rounded to `dt` and back: the value a tensor of dtype dt would hold.
__device__ __forceinline__ float round_to(float v, DType dt) {
  switch (dt) {
    case DType::BFloat16: return __bfloat162float(__float2bfloat16_rn(v));
    case DType::Float16: return __half2float(__float2half_rn(v));
    default: return v;
  }
}

// ---- raw vector types: one memory instruction per chunk of up to 16 bytes ----
template <int Bytes>
struct RawType;
template <>
struct RawType<2> { using type = unsigned short; };
template <>
struct RawType<4> { using type = unsigned int; };
template <>
struct RawType<8> { using type = uint2; };
template <>
struct RawType<16> { using type = uint4; };

// N elements of T starting at p (aligned to min(16, N * sizeof(T)) bytes) as floats.
template <typename T, int N>
__device__ __forceinline__ void load_typed(const T* p, float* out) {
  constexpr int kChunk = (N * sizeof(T) > 16) ? static_cast<int>(16 / sizeof(T)) : N;
  using Raw = typename RawType<kChunk * sizeof(T)>::type;
#pragma unroll
  for (int c = 0; c < N / kChunk; ++c) {
    const Raw raw = reinterpret_cast<const Raw*>(p)[c];
    T tmp[kChunk];
    memcpy(tmp, &raw, sizeof(raw));
#pragma unroll
    for (int i = 0; i < kChunk; ++i) out[c * kChunk + i] = to_float(tmp[i]);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_typed(T* p, const float* in) {
  constexpr int kChunk = (N * sizeof(T) > 16) ? static_cast<int>(16 / sizeof(T)) : N;
  using Raw = typename RawType<kChunk * sizeof(T)>::type;
#pragma unroll
  for (int c = 0; c < N / kChunk; ++c) {
    T tmp[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) tmp[i] = from_float<T>(in[c * kChunk + i]);
    Raw raw;
    memcpy(&raw, tmp, sizeof(raw));
    reinterpret_cast<Raw*>(p)[c] = raw;
  }
}

__device__ __forceinline__ float load_scalar(const void* base, int64_t off, DType dt) {
  switch (dt) {
    case DType::BFloat16: return to_float(static_cast<const __nv_bfloat16*>(base)[off]);
    case DType::Float16: return to_float(static_cast<const __half*>(base)[off]);
    default: return static_cast<const float*>(base)[off];
  }
}

// N elements of an operand at element offset `off` with inner stride `stride`. kVec: the host checked
// that stride is 0 or 1, that off is a multiple of N and the base suitably aligned (choose_vec), so a
// unit stride becomes vector loads. The dtype switch is uniform across a warp.
template <int N, bool kVec>
__device__ __forceinline__ void load_elems(const void* base, int64_t off, int64_t stride, DType dt, float* out) {
  if (kVec && stride == 1) {
    switch (dt) {
      case DType::BFloat16: load_typed<__nv_bfloat16, N>(static_cast<const __nv_bfloat16*>(base) + off, out); return;
      case DType::Float16: load_typed<__half, N>(static_cast<const __half*>(base) + off, out); return;
      default: load_typed<float, N>(static_cast<const float*>(base) + off, out); return;
    }
  }
  if (stride == 0) {
    const float v = load_scalar(base, off, dt);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = v;
    return;
  }
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = load_scalar(base, off + i * stride, dt);
}

// N floats rounded once to T, stored contiguously at p: vector stores (kVec: p aligned as for load_elems)
// or one element at a time.
template <typename T, int N, bool kVec>
__device__ __forceinline__ void store_as(T* p, const float* in) {
  if (kVec) {
    store_typed<T, N>(p, in);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_float<T>(in[i]);
  }
}

// N floats rounded once to `dt`, stored contiguously at element offset `off` of `base`.
template <int N, bool kVec>
__device__ __forceinline__ void store_elems(void* base, int64_t off, DType dt, const float* in) {
  switch (dt) {
    case DType::BFloat16: store_as<__nv_bfloat16, N, kVec>(static_cast<__nv_bfloat16*>(base) + off, in); return;
    case DType::Float16: store_as<__half, N, kVec>(static_cast<__half*>(base) + off, in); return;
    default: store_as<float, N, kVec>(static_cast<float*>(base) + off, in); return;
  }
}

}  // namespace fusegraph::cuda::detail
