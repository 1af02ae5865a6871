#pragma once
// RMSNorm over the last dim. Styles: "torch" (torch.rms_norm) and "diffusers" (diffusers RMSNorm:
// normalised value cast to weight.dtype before the multiply when the weight is fp16/bf16).
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

#include "ops/cpu/isa_dispatch.h"
#include "ops/norm_rows.h"

namespace fusegraph {

enum class RmsNormStyle { Torch, Diffusers };

// Parses `style`; ValueError naming 'style' for anything but "torch" / "diffusers".
RmsNormStyle parse_rms_norm_style(c10::string_view style);

// Validates every argument (dtype, device, shapes, eps) and returns the output dtype.
// Shared by the CPU and CUDA entry points.
at::ScalarType check_rms_norm_args(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                                   const std::optional<at::Tensor>& bias, RmsNormStyle style);

// The float64 path (any tensor argument float64): the documented math with at:: ops in float64, diffusers
// rounding points included, rounded once to out_dtype into a contiguous output. Device-agnostic; the CPU
// and CUDA entry points call it after check_rms_norm_args instead of their kernels.
at::Tensor rms_norm_float64(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                            const std::optional<at::Tensor>& bias, RmsNormStyle style, at::ScalarType out_dtype);

// ---- CPU kernel interface (csrc/ops/cpu/rms_norm_kernel.cpp) ----

// One call normalises `rows` rows of D elements. x rows start at the layout's offsets (last dim
// contiguous); out is contiguous [rows, D]. weight/bias are float32 [D] or null. round_dtype:
// Undefined, or the dtype (bf16/fp16) the normalised value is rounded to before the weight multiply
// and the product before the bias add (diffusers style with a half-precision weight).
struct RmsNormKernelArgs {
  const void* x;
  void* out;
  const float* weight;
  const float* bias;
  at::ScalarType x_dtype;
  at::ScalarType out_dtype;
  at::ScalarType round_dtype;
  int64_t rows;
  int64_t D;
  double eps;                // as given; added to the float32 mean in float32, as eager does
  const RowOffsets* layout;  // one tensor: x
};
using rms_norm_fn = void (*)(const RmsNormKernelArgs& args);
FG_DECLARE_CPU_STUB(rms_norm_stub, rms_norm_fn);

}  // namespace fusegraph
