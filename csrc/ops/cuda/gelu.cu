// tanh-GELU and the sigmoid "fast" GELU over contiguous data: grid-stride loop, 16-byte vectors when
// both pointers are aligned, a scalar tail.
#include "ops/cuda/row_launch.cuh"
#include "ops/cuda/vec_io.cuh"

namespace fusegraph::cuda {
namespace {

using namespace detail;

struct GeluTanh {
  __device__ __forceinline__ float operator()(float x) const {
    constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
    constexpr float kKappa = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(kBeta * (x + kKappa * x * x * x)));
  }
};

struct GeluSigmoid {
  __device__ __forceinline__ float operator()(float x) const { return x / (1.0f + expf(-1.702f * x)); }
};

template <typename F, int VEC, bool kVec>
__global__ void __launch_bounds__(256) gelu_kernel(const void* x, DType dtype, void* out, int64_t n) {
  const F f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_vec = n / VEC;
  for (int64_t i = first; i < n_vec; i += stride) {
    float v[VEC];
    load_elems<VEC, kVec>(x, i * VEC, 1, dtype, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = f(v[k]);
    store_elems<VEC, kVec>(out, i * VEC, dtype, v);
  }
  for (int64_t i = n_vec * VEC + first; i < n; i += stride) {  // tail shorter than one vector
    const float v = f(load_scalar(x, i, dtype));
    store_elems<1, false>(out, i, dtype, &v);
  }
}

template <typename F>
cudaError_t launch_gelu_as(const void* x, DType dtype, void* out, int64_t n, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (aligned) {
    gelu_kernel<F, 8, true><<<grid_for(ceil_div(n, kThreads * 8)), kThreads, 0, stream>>>(x, dtype, out, n);
  } else {
    gelu_kernel<F, 1, false><<<grid_for(ceil_div(n, kThreads)), kThreads, 0, stream>>>(x, dtype, out, n);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gelu(GeluKind kind, const void* x, DType dtype, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return kind == GeluKind::Tanh ? launch_gelu_as<GeluTanh>(x, dtype, out, n, stream)
                                : launch_gelu_as<GeluSigmoid>(x, dtype, out, n, stream);
}

}  // namespace fusegraph::cuda
