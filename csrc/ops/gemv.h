#pragma once
// A linear layer on a few rows (a decode step's projection): out = x @ weight^T + bias, where reading the
// weight is the whole cost. One pass over the weight rows for all of x's rows.
#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "ops/cpu/isa_dispatch.h"

namespace fusegraph {

// x [M, K] (last dim contiguous), weight [N, K] (rows contiguous), bias [N] or undefined, out [M, N] contiguous
// (the op takes x [..., K] and gives [..., N]; the kernel sees the rows).
using gemv_fn = void (*)(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::Tensor& out);
FG_DECLARE_CPU_STUB(gemv_stub, gemv_fn);

// Validates the arguments on any device: x [..., K], weight [N, K], bias [N] or none (gemv's and linear's; `op`
// names the op in the messages).
void check_gemv_args(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                     const char* op = "gemv");

// [..., N]: x's sizes with the last one weight's out_features.
std::vector<int64_t> linear_out_sizes(const at::Tensor& x, const at::Tensor& weight);

// The same math with at:: ops (at::linear): the float64 path and every device without a kernel of its own.
at::Tensor gemv_reference(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

}  // namespace fusegraph
