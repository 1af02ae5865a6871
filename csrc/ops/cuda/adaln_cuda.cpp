// CUDA entry point of fusegraph::adaln: scale/shift enter as broadcast views (no copy of a [B,1,D] chunk);
// no shift: the kernel gets an empty shift operand.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "ops/adaln.h"
#include "ops/checks.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/tensor_args.h"
#include "ops/output.h"

namespace fusegraph {
namespace {

at::Tensor adaln_cuda(const at::Tensor& x_in, const at::Tensor& scale_in, const std::optional<at::Tensor>& shift_in,
                      double eps, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                      std::optional<at::ScalarType> out_dtype_opt, c10::string_view norm_name) {
  const AdalnNorm norm = parse_adaln_norm(norm_name);
  const at::ScalarType out_dtype = check_adaln_args(x_in, scale_in, shift_in, eps, weight, bias, out_dtype_opt, norm);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const bool has_shift = shift_in.has_value() && shift_in->defined();
  const bool has_w = weight.has_value() && weight->defined();
  const bool has_b = bias.has_value() && bias->defined();
  if (uses_float64({&x_in, &scale_in, has_shift ? &*shift_in : nullptr, has_w ? &*weight : nullptr,
                    has_b ? &*bias : nullptr},
                   out_dtype)) {
    return adaln_float64(x_in, scale_in, shift_in, eps, weight, bias, out_dtype, norm);
  }
  at::Tensor out = new_output(x_in.sizes(), x_in.options().dtype(out_dtype));
  if (out.numel() == 0) return out;

  at::Tensor x = x_in;
  at::Tensor scale = scale_in.expand(x.sizes());
  at::Tensor shift = has_shift ? shift_in->expand(x.sizes()) : at::Tensor();
  cuda::Operand ops[3];  // x, scale, shift (no shift: ops[2] stays empty, data nullptr)
  const auto plan = [&] {
    return has_shift ? cuda::plan_rows(x.sizes(), {&x, &scale, &shift}, ops)
                     : cuda::plan_rows(x.sizes(), {&x, &scale}, ops);
  };
  const RowLayout layout = has_shift ? plan_or_copy({&x, &scale, &shift}, plan) : plan_or_copy({&x, &scale}, plan);
  C10_CUDA_CHECK(cuda::launch_adaln(layout, ops[0], ops[1], ops[2], cuda::row_vector(weight), cuda::row_vector(bias),
                                    out.data_ptr(), cuda::to_dtype(out_dtype), static_cast<float>(eps),
                                    norm == AdalnNorm::Rms, c10::cuda::getCurrentCUDAStream()));
  return out;
}

// The eps_tensor overload: eps read from its 0-d CPU tensor, then the same entry point.
at::Tensor adaln_cuda_eps_tensor(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& shift,
                                 const at::Tensor& eps, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> out_dtype,
                                 c10::string_view norm) {
  return adaln_cuda(x, scale, shift, eps_from_tensor(eps, "adaln"), weight, bias, out_dtype, norm);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CUDA, m) {
  m.impl("adaln", &adaln_cuda);
  m.impl("adaln.eps_tensor", &adaln_cuda_eps_tensor);
}

}  // namespace fusegraph
