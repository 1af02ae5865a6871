#pragma once
// a * b + c with broadcasting (b a tensor or a number), float32 math, one rounding.
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <optional>

namespace fusegraph {

// Validate and return the output dtype (out_dtype, or else the dtype eager `a * b + c` produces).
// Shared by the CPU and CUDA entry points.
at::ScalarType check_mul_add_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                                  std::optional<at::ScalarType> out_dtype);
at::ScalarType check_mul_add_scalar_args(const at::Tensor& a, const c10::Scalar& b, const at::Tensor& c,
                                         std::optional<at::ScalarType> out_dtype);

}  // namespace fusegraph
