#pragma once
// Adaptive LayerNorm modulation: layer_norm(x, [D], weight, bias, eps) * (1 + scale) + shift.
#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/cpu/dispatch.h"
#include "ops/norm_rows.h"

namespace fusegraph {

// Validates every argument and returns the output dtype (out_dtype, or else the dtype eager PyTorch
// would produce for the unfused expression). Shared by the CPU and CUDA entry points.
at::ScalarType check_adaln_args(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift, double eps,
                                const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                std::optional<at::ScalarType> out_dtype);

// The float64 path (any tensor argument or out_dtype float64): layer_norm(x, [D], w, b, eps) * (1 + scale) +
// shift with at:: ops in float64, rounded once to out_dtype into a contiguous output. Device-agnostic.
at::Tensor adaln_float64(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift, double eps,
                         const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                         at::ScalarType out_dtype);

// ---- CPU kernel interface (csrc/ops/cpu/adaln_kernel.cpp) ----

// One call modulates `rows` rows of D elements. x/scale/shift rows start at the layout's offsets
// (tensors 0, 1, 2; last dim contiguous; scale/shift share mod_dtype, which is x_dtype or float32);
// out is contiguous [rows, D]. weight/bias are float32 [D] or null.
struct AdalnKernelArgs {
  const void* x;
  const void* scale;
  const void* shift;
  void* out;
  const float* weight;
  const float* bias;
  at::ScalarType x_dtype;
  at::ScalarType mod_dtype;
  at::ScalarType out_dtype;
  int64_t rows;
  int64_t D;
  double eps;               // as given; var + eps and the square root are taken in double
  const RowLayout* layout;  // three tensors: x, scale, shift
};
using adaln_fn = void (*)(const AdalnKernelArgs& args);
FG_DECLARE_CPU_STUB(adaln_stub, adaln_fn);

}  // namespace fusegraph
