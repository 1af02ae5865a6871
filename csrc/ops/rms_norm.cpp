#include "ops/rms_norm.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/output.h"

namespace fusegraph {

FG_DEFINE_CPU_STUB(rms_norm_stub, rms_norm_fn);

namespace {

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// weight / bias: float tensor of shape [D] on x's device.
void check_param(const at::Tensor& x, const at::Tensor& p, const char* arg) {
  check_float_tensor(p, "rms_norm", arg);
  check_same_device(x, "x", p, "rms_norm", arg);
  const int64_t D = x.size(-1);
  TORCH_CHECK(p.dim() == 1 && p.size(0) == D, "fusegraph.rms_norm: argument '", arg, "' has shape ", p.sizes(),
              "; expected [", D, "] (x's last dim; x has shape ", x.sizes(), ")");
}

}  // namespace

RmsNormStyle parse_rms_norm_style(c10::string_view style) {
  if (style == "torch") return RmsNormStyle::Torch;
  if (style == "diffusers") return RmsNormStyle::Diffusers;
  TORCH_CHECK_VALUE(false, "fusegraph.rms_norm: argument 'style' is \"", style,
                    "\"; expected \"torch\" or \"diffusers\"");
}

at::ScalarType check_rms_norm_args(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                                   const std::optional<at::Tensor>& bias, RmsNormStyle style) {
  check_float_tensor(x, "rms_norm", "x");
  TORCH_CHECK(x.dim() >= 1, "fusegraph.rms_norm: argument 'x' has shape ", x.sizes(),
              " (0 dims); expected at least 1 dim (the normalised last dim)");
  const bool has_w = weight.has_value() && weight->defined();
  const bool has_b = bias.has_value() && bias->defined();
  if (has_w) check_param(x, *weight, "weight");
  if (has_b) check_param(x, *bias, "bias");
  check_eps(eps, "rms_norm");
  // Output dtype = what the eager expression gives (fusegraph/ops/rms_norm.py: rms_norm_out_dtype, the same rule):
  //   torch:     torch.rms_norm(x, [D], w, eps) (+ bias)  -> x.dtype (promoted with bias.dtype)
  //   diffusers: half weight -> weight.dtype (promoted with bias); fp32 weight -> float32 (float64 when
  //              x or the weight is float64: the float32 normalised value times w promotes);
  //              no weight -> x.dtype (promoted with bias).
  at::ScalarType out = x.scalar_type();
  if (style == RmsNormStyle::Diffusers && has_w) {
    const at::ScalarType wt = weight->scalar_type();
    out = is_half(wt) ? wt : at::promote_types(at::kFloat, at::promote_types(x.scalar_type(), wt));
  }
  if (has_b) out = at::promote_types(out, bias->scalar_type());
  return out;
}

at::Tensor rms_norm_float64(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                            const std::optional<at::Tensor>& bias, RmsNormStyle style, at::ScalarType out_dtype) {
  const bool has_w = weight.has_value() && weight->defined();
  const bool has_b = bias.has_value() && bias->defined();
  const at::Tensor x64 = x.to(at::kDouble);
  at::Tensor y = x64 * at::rsqrt(x64.square().mean(-1, /*keepdim=*/true) + eps);
  // diffusers with a half weight: the normalised value and the product are rounded to weight.dtype.
  const bool round = style == RmsNormStyle::Diffusers && has_w && is_half(weight->scalar_type());
  if (has_w) {
    if (round) y = y.to(weight->scalar_type()).to(at::kDouble);
    y = y * weight->to(at::kDouble);
  }
  if (has_b) {
    if (round) y = y.to(weight->scalar_type()).to(at::kDouble);
    y = y + bias->to(at::kDouble);
  }
  return new_output(x.sizes(), x.options().dtype(out_dtype)).copy_(y);
}

namespace {

at::Tensor rms_norm_cpu(const at::Tensor& x_in, const std::optional<at::Tensor>& weight_in, double eps,
                        const std::optional<at::Tensor>& bias_in, c10::string_view style_name) {
  const RmsNormStyle style = parse_rms_norm_style(style_name);
  const at::ScalarType out_dtype = check_rms_norm_args(x_in, weight_in, eps, bias_in, style);
  const bool has_w = weight_in.has_value() && weight_in->defined();
  const bool has_b = bias_in.has_value() && bias_in->defined();
  if (uses_float64({&x_in, has_w ? &*weight_in : nullptr, has_b ? &*bias_in : nullptr})) {
    return rms_norm_float64(x_in, weight_in, eps, bias_in, style, out_dtype);
  }

  // Rows may be strided; the last dim must be contiguous for vector loads.
  at::Tensor x = (x_in.size(-1) <= 1 || x_in.stride(-1) == 1) ? x_in : x_in.contiguous();
  const int64_t D = x.size(-1);
  // Parameters are [D]: one float32 copy each (exact upcast) keeps the kernel free of their dtype.
  const at::Tensor w = has_w ? weight_in->to(at::kFloat).contiguous() : at::Tensor();
  const at::Tensor b = has_b ? bias_in->to(at::kFloat).contiguous() : at::Tensor();

  at::Tensor out = new_output(x.sizes(), x.options().dtype(out_dtype));
  if (out.numel() == 0) return out;

  const at::ScalarType round_dtype = (style == RmsNormStyle::Diffusers && has_w && is_half(weight_in->scalar_type()))
                                         ? weight_in->scalar_type()
                                         : at::ScalarType::Undefined;
  const RowOffsets layout = RowOffsets::plan({&x});
  RmsNormKernelArgs args{x.const_data_ptr(),
                         out.mutable_data_ptr(),
                         has_w ? w.const_data_ptr<float>() : nullptr,
                         has_b ? b.const_data_ptr<float>() : nullptr,
                         x.scalar_type(),
                         out_dtype,
                         round_dtype,
                         out.numel() / D,
                         D,
                         eps,
                         &layout};
  rms_norm_stub.get("rms_norm")(args);
  return out;
}

// The eps_tensor overload: eps read from its 0-d CPU tensor, then the same entry point.
at::Tensor rms_norm_cpu_eps_tensor(const at::Tensor& x, const std::optional<at::Tensor>& weight, const at::Tensor& eps,
                                   const std::optional<at::Tensor>& bias, c10::string_view style) {
  return rms_norm_cpu(x, weight, eps_from_tensor(eps, "rms_norm"), bias, style);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("rms_norm.eps_tensor", &rms_norm_cpu_eps_tensor);
}

}  // namespace fusegraph
