#pragma once
// Adaptive norm modulation: norm(x)[* weight + bias] * (1 + scale) [+ shift], where norm is a LayerNorm
// (norm="layer") or an RMSNorm (norm="rms") over the last dim, and the shift is optional.
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

#include "ops/cpu/isa_dispatch.h"
#include "ops/norm_rows.h"

namespace fusegraph {

enum class AdalnNorm { Layer, Rms };

// "layer" or "rms"; anything else is a ValueError naming argument 'norm', the value and the allowed values.
AdalnNorm parse_adaln_norm(c10::string_view norm);

// Validates every argument and returns the output dtype (out_dtype, or else the dtype eager PyTorch
// would produce for the unfused expression). Shared by the CPU and CUDA entry points.
at::ScalarType check_adaln_args(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& shift,
                                double eps,
                                const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                std::optional<at::ScalarType> out_dtype, AdalnNorm norm);

// The float64 path (any tensor argument or out_dtype float64): norm(x) [* w + b] * (1 + scale) [+ shift]
// with at:: ops in float64, rounded once to out_dtype into a contiguous output. Device-agnostic.
at::Tensor adaln_float64(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& shift,
                         double eps, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                         at::ScalarType out_dtype, AdalnNorm norm);

// ---- CPU kernel interface (csrc/ops/cpu/adaln_kernel.cpp) ----

// One call modulates `rows` rows of D elements. x/scale/shift rows start at the layout's offsets
// (tensors 0, 1, 2; last dim contiguous; scale/shift share mod_dtype, which is x_dtype or float32);
// out is contiguous [rows, D]. weight/bias are float32 [D] or null; shift is null when the op has none.
// rms: RMSNorm statistics (no mean; 1 / sqrt(mean(x^2) + eps) in float32) instead of LayerNorm's.
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
  double eps;                // layer: var + eps and the square root in double; rms: in float32, as eager
  const RowOffsets* layout;  // three tensors: x, scale, shift (scale's strides again when there is no shift)
  bool rms;
};
using adaln_fn = void (*)(const AdalnKernelArgs& args);
FG_DECLARE_CPU_STUB(adaln_stub, adaln_fn);

}  // namespace fusegraph
