#include "ops/adaln.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/output.h"

namespace fusegraph {

FG_DEFINE_CPU_STUB(adaln_stub, adaln_fn);

namespace {

// weight / bias of the LayerNorm: float tensor of shape [D] on x's device.
void check_param(const at::Tensor& x, const at::Tensor& p, const char* arg) {
  check_float_tensor(p, "adaln", arg);
  check_same_device(x, "x", p, "adaln", arg);
  const int64_t D = x.size(-1);
  TORCH_CHECK(p.dim() == 1 && p.size(0) == D, "fusegraph.adaln: argument '", arg, "' has shape ", p.sizes(),
              "; expected [", D, "] (x's last dim; x has shape ", x.sizes(), ")");
}

// scale / shift: last dim D, broadcastable to x (each leading dim 1 or x's), rank <= x's rank.
void check_modulation(const at::Tensor& x, const at::Tensor& m, const char* arg) {
  check_float_tensor(m, "adaln", arg);
  check_same_device(x, "x", m, "adaln", arg);
  const int64_t D = x.size(-1);
  TORCH_CHECK(m.dim() >= 1 && m.size(-1) == D, "fusegraph.adaln: argument '", arg, "' has shape ", m.sizes(),
              "; expected its last dim to be ", D, " (x's last dim; x has shape ", x.sizes(), ")");
  bool ok = m.dim() <= x.dim();
  for (int64_t i = 1; ok && i <= m.dim(); ++i) {
    ok = m.size(-i) == 1 || m.size(-i) == x.size(-i);
  }
  TORCH_CHECK(ok, "fusegraph.adaln: argument '", arg, "' has shape ", m.sizes(), ", which does not broadcast to x's shape ",
              x.sizes(), "; expected at most ", x.dim(), " dims, each 1 or equal to x's (e.g. [B, 1, D] or [B, S, D])");
}

}  // namespace

AdalnNorm parse_adaln_norm(c10::string_view norm) {
  if (norm == "layer") return AdalnNorm::Layer;
  if (norm == "rms") return AdalnNorm::Rms;
  TORCH_CHECK_VALUE(false, "fusegraph.adaln: argument 'norm' is \"", norm, "\"; expected \"layer\" or \"rms\"");
}

at::ScalarType check_adaln_args(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& shift,
                                double eps, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> out_dtype,
                                AdalnNorm norm) {
  check_float_tensor(x, "adaln", "x");
  TORCH_CHECK(x.dim() >= 2, "fusegraph.adaln: argument 'x' has shape ", x.sizes(), " (", x.dim(),
              " dims); expected at least 2 dims, e.g. [B, S, D]");
  check_modulation(x, scale, "scale");
  const bool has_shift = shift.has_value() && shift->defined();
  if (has_shift) check_modulation(x, *shift, "shift");
  const bool has_w = weight.has_value() && weight->defined();
  const bool has_b = bias.has_value() && bias->defined();
  if (has_w) check_param(x, *weight, "weight");
  if (has_b) check_param(x, *bias, "bias");
  check_eps(eps, "adaln");
  check_out_dtype(out_dtype, "adaln");
  if (out_dtype.has_value()) return *out_dtype;
  // Eager `norm(x) * (1 + scale) [+ shift]`: every operand has >= 1 dim, so torch.result_type is plain dtype
  // promotion. LayerNorm's affine is inside layer_norm(x, [D], w, b), whose result has x's dtype (eager's
  // mixed-dtype LayerNorm: float32 w, b on bf16/fp16 x); RMSNorm's is the product rms_norm(x) * w + b, which promotes.
  at::ScalarType t = at::promote_types(x.scalar_type(), scale.scalar_type());
  if (has_shift) t = at::promote_types(t, shift->scalar_type());
  if (norm == AdalnNorm::Rms && has_w) t = at::promote_types(t, weight->scalar_type());
  if (norm == AdalnNorm::Rms && has_b) t = at::promote_types(t, bias->scalar_type());
  return t;
}

at::Tensor adaln_float64(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& shift,
                         double eps, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                         at::ScalarType out_dtype, AdalnNorm norm) {
  const auto f64 = [](const std::optional<at::Tensor>& t) {
    return t.has_value() && t->defined() ? std::optional<at::Tensor>(t->to(at::kDouble)) : std::nullopt;
  };
  const at::Tensor x64 = x.to(at::kDouble);
  at::Tensor n;
  if (norm == AdalnNorm::Layer) {
    n = at::layer_norm(x64, {x.size(-1)}, f64(weight), f64(bias), eps);
  } else {
    n = x64 * at::rsqrt(x64.square().mean(-1, /*keepdim=*/true) + eps);
    if (const auto w = f64(weight)) n = n * *w;
    if (const auto b = f64(bias)) n = n + *b;
  }
  at::Tensor y = n * (1 + scale.to(at::kDouble));
  if (const auto s = f64(shift)) y = y + *s;
  return new_output(x.sizes(), x.options().dtype(out_dtype)).copy_(y);
}

namespace {

at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return (t.size(-1) <= 1 || t.stride(-1) == 1) ? t : t.contiguous();
}

at::Tensor adaln_cpu(const at::Tensor& x_in, const at::Tensor& scale_in, const std::optional<at::Tensor>& shift_in,
                     double eps, const std::optional<at::Tensor>& weight_in, const std::optional<at::Tensor>& bias_in,
                     std::optional<at::ScalarType> out_dtype_in, c10::string_view norm_name) {
  const AdalnNorm norm = parse_adaln_norm(norm_name);
  const at::ScalarType out_dtype =
      check_adaln_args(x_in, scale_in, shift_in, eps, weight_in, bias_in, out_dtype_in, norm);
  const bool has_shift = shift_in.has_value() && shift_in->defined();
  const bool has_w = weight_in.has_value() && weight_in->defined();
  const bool has_b = bias_in.has_value() && bias_in->defined();
  if (uses_float64({&x_in, &scale_in, has_shift ? &*shift_in : nullptr, has_w ? &*weight_in : nullptr,
                    has_b ? &*bias_in : nullptr},
                   out_dtype)) {
    return adaln_float64(x_in, scale_in, shift_in, eps, weight_in, bias_in, out_dtype, norm);
  }

  at::Tensor x = last_dim_contiguous(x_in);
  const int64_t D = x.size(-1);
  // The kernel reads scale and shift in one dtype, x's or float32. The usual cases (both x's dtype, or
  // both float32) are read in place; any other mix is upcast to float32 (exact) first.
  at::Tensor scale = scale_in;
  at::Tensor shift = has_shift ? *shift_in : at::Tensor();
  const at::ScalarType sd = scale.scalar_type();
  if (!((!has_shift || sd == shift.scalar_type()) && (sd == x.scalar_type() || sd == at::kFloat))) {
    scale = scale.to(at::kFloat);
    if (has_shift) shift = shift.to(at::kFloat);
  }
  // Broadcast views (0 strides): a [B,1,D] chunk of an embedding is read in place, row by row.
  scale = last_dim_contiguous(scale).expand(x.sizes());
  // No shift: the layout's third tensor repeats scale's strides (the kernel reads no shift).
  shift = has_shift ? last_dim_contiguous(shift).expand(x.sizes()) : scale;
  const at::Tensor w = has_w ? weight_in->to(at::kFloat).contiguous() : at::Tensor();
  const at::Tensor b = has_b ? bias_in->to(at::kFloat).contiguous() : at::Tensor();

  at::Tensor out = new_output(x.sizes(), x.options().dtype(out_dtype));
  if (out.numel() == 0) return out;

  const RowOffsets layout = RowOffsets::plan({&x, &scale, &shift});
  AdalnKernelArgs args{x.const_data_ptr(),
                       scale.const_data_ptr(),
                       has_shift ? shift.const_data_ptr() : nullptr,
                       out.mutable_data_ptr(),
                       has_w ? w.const_data_ptr<float>() : nullptr,
                       has_b ? b.const_data_ptr<float>() : nullptr,
                       x.scalar_type(),
                       scale.scalar_type(),
                       out_dtype,
                       out.numel() / D,
                       D,
                       eps,
                       &layout,
                       norm == AdalnNorm::Rms};
  adaln_stub.get("adaln")(args);
  return out;
}

// The eps_tensor overload: eps read from its 0-d CPU tensor, then the same entry point.
at::Tensor adaln_cpu_eps_tensor(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& shift,
                                const at::Tensor& eps, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> out_dtype,
                                c10::string_view norm) {
  return adaln_cpu(x, scale, shift, eps_from_tensor(eps, "adaln"), weight, bias, out_dtype, norm);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CPU, m) {
  m.impl("adaln", &adaln_cpu);
  m.impl("adaln.eps_tensor", &adaln_cpu_eps_tensor);
}

}  // namespace fusegraph
