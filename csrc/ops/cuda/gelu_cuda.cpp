// CUDA entry points of fusegraph::gelu_tanh and fusegraph::fast_gelu.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/tensor_args.h"
#include "ops/gelu.h"
#include "ops/output.h"

namespace fusegraph {
namespace {

at::Tensor run_cuda(const at::Tensor& x_in, const char* op, cuda::GeluKind kind) {
  check_gelu_args(x_in, op);
  const c10::cuda::CUDAGuard guard(x_in.device());
  if (uses_float64({&x_in})) return kind == cuda::GeluKind::Tanh ? gelu_tanh_float64(x_in) : fast_gelu_float64(x_in);
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = new_output(x.sizes(), x.options());
  C10_CUDA_CHECK(cuda::launch_gelu(kind, x.const_data_ptr(), cuda::to_dtype(x.scalar_type()), out.data_ptr(),
                                   x.numel(), c10::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor gelu_tanh_cuda(const at::Tensor& x) { return run_cuda(x, "gelu_tanh", cuda::GeluKind::Tanh); }
at::Tensor fast_gelu_cuda(const at::Tensor& x) { return run_cuda(x, "fast_gelu", cuda::GeluKind::Sigmoid); }

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CUDA, m) {
  m.impl("gelu_tanh", &gelu_tanh_cuda);
  m.impl("fast_gelu", &fast_gelu_cuda);
}

}  // namespace fusegraph
