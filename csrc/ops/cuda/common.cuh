#pragma once
// Device building blocks shared by the fused kernels: fp32 <-> storage conversion, vectorised loads and
// stores with a run-time dtype tag, row indexing through a RowLayout, warp/block sums, launch shapes.
// Plain CUDA C++: no torch header (the file compiles with nvcc alone).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

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

// N floats rounded once to `dt`, stored contiguously at element offset `off` of `base`.
template <int N, bool kVec>
__device__ __forceinline__ void store_elems(void* base, int64_t off, DType dt, const float* in) {
  switch (dt) {
    case DType::BFloat16: {
      auto* p = static_cast<__nv_bfloat16*>(base) + off;
      if (kVec) {
        store_typed<__nv_bfloat16, N>(p, in);
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) p[i] = from_float<__nv_bfloat16>(in[i]);
      }
      return;
    }
    case DType::Float16: {
      auto* p = static_cast<__half*>(base) + off;
      if (kVec) {
        store_typed<__half, N>(p, in);
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) p[i] = from_float<__half>(in[i]);
      }
      return;
    }
    default: {
      auto* p = static_cast<float*>(base) + off;
      if (kVec) {
        store_typed<float, N>(p, in);
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) p[i] = in[i];
      }
      return;
    }
  }
}

// ---- rows ----
// Multi-index of `row` in the layout's outer dims (innermost last), written to idx[0..ndim).
__device__ __forceinline__ void row_index(const RowLayout& layout, int64_t row, int64_t* idx) {
#pragma unroll
  for (int d = kMaxOuterDims - 1; d >= 0; --d) {
    if (d < layout.ndim) {
      const int64_t size = layout.sizes[d];
      idx[d] = row % size;
      row /= size;
    }
  }
}

__device__ __forceinline__ int64_t row_offset(const RowLayout& layout, const Operand& op, const int64_t* idx) {
  int64_t off = 0;
#pragma unroll
  for (int d = 0; d < kMaxOuterDims; ++d) {
    if (d < layout.ndim) off += idx[d] * op.outer_strides[d];
  }
  return off;
}

// ---- reductions (fp32, fixed order for a fixed launch shape: bitwise deterministic) ----
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

// ---- host helpers ----
inline bool aligned_for(const Operand& op, int vec) {
  if (op.data == nullptr || op.inner_stride == 0) return true;
  if (op.inner_stride != 1) return false;
  const auto bytes = static_cast<uintptr_t>(vec * element_size(op.dtype));
  const uintptr_t need = bytes < 16 ? bytes : 16;
  return reinterpret_cast<uintptr_t>(op.data) % need == 0;
}

inline bool strides_allow(const RowLayout& layout, const Operand& op, int vec) {
  if (op.data == nullptr || op.inner_stride == 0) return true;  // broadcast along the row: scalar loads
  for (int d = 0; d < layout.ndim; ++d) {
    if (op.outer_strides[d] % vec != 0) return false;
  }
  return true;
}

// The widest vector (8, 4, 2 elements) every operand allows, or 1 (scalar path). `cols_unit` is
// the length that must divide by the width (the row, or half of it for rotate-half rope).
template <int NOps>
inline int choose_vec(const RowLayout& layout, const Operand* const (&ops)[NOps], int64_t cols_unit,
                      const void* out) {
  for (int vec : {8, 4, 2}) {
    if (cols_unit % vec != 0) continue;
    if (reinterpret_cast<uintptr_t>(out) % 16 != 0) continue;
    bool ok = true;
    for (const Operand* op : ops) ok = ok && aligned_for(*op, vec) && strides_allow(layout, *op, vec);
    if (ok) return vec;
  }
  return 1;
}

// Calls launch(std::integral_constant<int, VEC>{}) for the width choose_vec picked (8, 4, 2, else 1), so
// every op instantiates its kernel for the same widths from one switch.
template <typename Launch>
inline cudaError_t with_vec_width(int vec, Launch&& launch) {
  switch (vec) {
    case 8: return launch(std::integral_constant<int, 8>{});
    case 4: return launch(std::integral_constant<int, 4>{});
    case 2: return launch(std::integral_constant<int, 2>{});
    default: return launch(std::integral_constant<int, 1>{});
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid for a grid-stride loop over `units` blocks of work: capped, the loops cover the rest.
inline unsigned grid_for(int64_t units) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;
  return static_cast<unsigned>(units < 1 ? 1 : (units < kMaxBlocks ? units : kMaxBlocks));
}

// 2-D block for row-wise elementwise kernels: x across a row's `chunks` (vectors), y across rows.
inline dim3 block_2d(int64_t chunks) {
  constexpr int kThreads = 256;
  int tx = 1;
  while (tx < chunks && tx < kThreads) tx *= 2;
  return dim3(static_cast<unsigned>(tx), static_cast<unsigned>(kThreads / tx), 1);
}

}  // namespace fusegraph::cuda::detail
