#pragma once
// RMSNorm over the last dim. Styles: "torch" (torch.rms_norm) and "diffusers" (diffusers RMSNorm:
// normalised value cast to weight.dtype before the multiply when the weight is fp16/bf16).
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

namespace fusegraph {

enum class RmsNormStyle { Torch, Diffusers };

// Parses `style`; ValueError naming 'style' for anything but "torch" / "diffusers".
RmsNormStyle parse_rms_norm_style(c10::string_view style);

// Validates every argument (dtype, device, shapes, eps) and returns the output dtype.
// Shared by the CPU and CUDA entry points.
at::ScalarType check_rms_norm_args(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                                   const std::optional<at::Tensor>& bias, RmsNormStyle style);

}  // namespace fusegraph
