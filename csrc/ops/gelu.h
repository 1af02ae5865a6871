#pragma once
// tanh-GELU and the sigmoid "fast" GELU: elementwise, one read and one write.
#include <ATen/core/Tensor.h>

#include "ops/cpu/isa_dispatch.h"

namespace fusegraph {

// out[i] = f(x[i]) over `numel` contiguous elements of x's dtype.
using gelu_fn = void (*)(const at::Tensor& x, at::Tensor& out);
FG_DECLARE_CPU_STUB(gelu_tanh_stub, gelu_fn);
FG_DECLARE_CPU_STUB(fast_gelu_stub, gelu_fn);

// The float64 path (x float64): F.gelu(x, approximate="tanh") / x * sigmoid(1.702 x) with at:: ops in float64,
// into a contiguous output. Device-agnostic.
at::Tensor gelu_tanh_float64(const at::Tensor& x);
at::Tensor fast_gelu_float64(const at::Tensor& x);

// Validates x for op `op` ("gelu_tanh" / "fast_gelu") on any device.
void check_gelu_args(const at::Tensor& x, const char* op);

}  // namespace fusegraph
