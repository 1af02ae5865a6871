#pragma once
// a * b + c with broadcasting (b a tensor or a number), float32 math, one rounding.
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <optional>
#include <vector>

#include "ops/cpu/isa_dispatch.h"

namespace fusegraph {

// Validate and return the output dtype (out_dtype, or else the dtype eager `a * b + c` produces).
// Shared by the CPU and CUDA entry points.
at::ScalarType check_mul_add_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                                  std::optional<at::ScalarType> out_dtype);
at::ScalarType check_mul_add_scalar_args(const at::Tensor& a, const c10::Scalar& b, const at::Tensor& c,
                                         std::optional<at::ScalarType> out_dtype);

// The output shape: the broadcast of the given shapes (call after the checks above, which reject shapes that
// do not broadcast).
std::vector<int64_t> mul_add_output_shape(at::IntArrayRef a, at::IntArrayRef b, at::IntArrayRef c);

// The float64 path (any tensor argument or out_dtype float64): a * b + c with at:: ops in float64 (b undefined:
// the number b_value, not rounded to float32), rounded once to out_dtype into a contiguous output of the
// broadcast shape. Device-agnostic.
at::Tensor mul_add_float64(const at::Tensor& a, const at::Tensor& b, double b_value, const at::Tensor& c,
                           at::ScalarType out_dtype);

// out = a * b + c, b given either as a tensor (b != nullptr) or as the number b_value. a, b, c have any
// strides and broadcast to out (contiguous, numel > 0); each may have any of float32 / bfloat16 / float16.
using mul_add_fn = void (*)(const at::Tensor& a, const at::Tensor* b, float b_value, const at::Tensor& c,
                            at::Tensor& out);
FG_DECLARE_CPU_STUB(mul_add_stub, mul_add_fn);

}  // namespace fusegraph
