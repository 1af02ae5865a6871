// CUDA entry point of fusegraph::rms_norm: shared validation, output allocation, launch on the current stream.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/tensor_args.h"
#include "ops/output.h"
#include "ops/rms_norm.h"

namespace fusegraph {
namespace {

at::Tensor rms_norm_cuda(const at::Tensor& x_in, const std::optional<at::Tensor>& weight, double eps,
                         const std::optional<at::Tensor>& bias, c10::string_view style_name) {
  const RmsNormStyle style = parse_rms_norm_style(style_name);
  const at::ScalarType out_dtype = check_rms_norm_args(x_in, weight, eps, bias, style);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const bool has_w = weight.has_value() && weight->defined();
  const bool has_b = bias.has_value() && bias->defined();
  if (uses_float64({&x_in, has_w ? &*weight : nullptr, has_b ? &*bias : nullptr})) {
    return rms_norm_float64(x_in, weight, eps, bias, style, out_dtype);
  }
  at::Tensor out = new_output(x_in.sizes(), x_in.options().dtype(out_dtype));
  if (out.numel() == 0) return out;

  at::Tensor x = x_in;
  cuda::Operand x_op;
  const RowLayout layout = plan_or_copy({&x}, [&] { return cuda::plan_rows(x.sizes(), {&x}, &x_op); });
  C10_CUDA_CHECK(cuda::launch_rms_norm(layout, x_op, cuda::row_vector(weight), cuda::row_vector(bias),
                                       out.data_ptr(), cuda::to_dtype(out_dtype), static_cast<float>(eps),
                                       style == RmsNormStyle::Diffusers, c10::cuda::getCurrentCUDAStream()));
  return out;
}

// The eps_tensor overload: eps read from its 0-d CPU tensor, then the same entry point.
at::Tensor rms_norm_cuda_eps_tensor(const at::Tensor& x, const std::optional<at::Tensor>& weight, const at::Tensor& eps,
                                    const std::optional<at::Tensor>& bias, c10::string_view style) {
  return rms_norm_cuda(x, weight, eps_from_tensor(eps, "rms_norm"), bias, style);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("rms_norm.eps_tensor", &rms_norm_cuda_eps_tensor);
}

}  // namespace fusegraph
