// CUDA entry points of fusegraph::mul_add (tensor b) and mul_add.Scalar (number b): operands enter as
// broadcast views of the output shape, so a [B,1,D] gate chunk or a per-token [B,S,1] gate is not copied.
#include <ATen/ExpandUtils.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/tensor_args.h"
#include "ops/mul_add.h"
#include "ops/output.h"

namespace fusegraph {
namespace {

// b_tensor undefined: b is the number b_scalar.
at::Tensor run_cuda(const at::Tensor& a_in, const at::Tensor& b_in, float b_scalar, const at::Tensor& c_in,
                    at::ScalarType out_dtype) {
  const c10::cuda::CUDAGuard guard(a_in.device());
  const std::vector<int64_t> shape =
      b_in.defined() ? at::infer_size(at::infer_size(a_in.sizes(), b_in.sizes()), c_in.sizes())
                     : at::infer_size(a_in.sizes(), c_in.sizes());
  at::Tensor out = new_output(shape, a_in.options().dtype(out_dtype));
  if (out.numel() == 0) return out;

  at::Tensor a = a_in.expand(shape);
  at::Tensor b = b_in.defined() ? b_in.expand(shape) : a;  // placeholder operand when b is a number
  at::Tensor c = c_in.expand(shape);
  cuda::Operand ops[3];
  const RowLayout layout = plan_or_copy({&a, &b, &c}, [&] { return cuda::plan_rows(shape, {&a, &b, &c}, ops); });
  if (!b_in.defined()) ops[1] = cuda::Operand{};
  C10_CUDA_CHECK(cuda::launch_mul_add(layout, ops[0], ops[1], b_scalar, ops[2], out.data_ptr(),
                                      cuda::to_dtype(out_dtype), c10::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor mul_add_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                        std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType dtype = check_mul_add_args(a, b, c, out_dtype);
  if (uses_float64({&a, &b, &c}, dtype)) {
    const c10::cuda::CUDAGuard guard(a.device());
    return mul_add_float64(a, b, 0.0, c, dtype);
  }
  return run_cuda(a, b, 0.0f, c, dtype);
}

at::Tensor mul_add_scalar_cuda(const at::Tensor& a, const c10::Scalar& b, const at::Tensor& c,
                               std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType dtype = check_mul_add_scalar_args(a, b, c, out_dtype);
  if (uses_float64({&a, &c}, dtype)) {
    const c10::cuda::CUDAGuard guard(a.device());
    return mul_add_float64(a, at::Tensor(), b.toDouble(), c, dtype);
  }
  return run_cuda(a, at::Tensor(), static_cast<float>(b.toDouble()), c, dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CUDA, m) {
  m.impl("mul_add", &mul_add_cuda);
  m.impl("mul_add.Scalar", &mul_add_scalar_cuda);
}

}  // namespace fusegraph
