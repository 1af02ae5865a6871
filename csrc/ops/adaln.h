#pragma once
// Adaptive LayerNorm modulation: layer_norm(x, [D], weight, bias, eps) * (1 + scale) + shift.
#include <ATen/core/Tensor.h>

#include <optional>

namespace fusegraph {

// Validates every argument and returns the output dtype (out_dtype, or else the dtype eager PyTorch
// would produce for the unfused expression). Shared by the CPU and CUDA entry points.
at::ScalarType check_adaln_args(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift, double eps,
                                const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                std::optional<at::ScalarType> out_dtype);

}  // namespace fusegraph
