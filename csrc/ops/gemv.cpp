#include "ops/gemv.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "ops/checks.h"
#include "ops/output.h"

namespace fusegraph {

FG_DEFINE_CPU_STUB(gemv_stub, gemv_fn);

namespace {
constexpr const char* kGemv = "gemv";
}

void check_gemv_args(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                     const char* kOp) {
  check_float_tensor(x, kOp, "x");
  check_float_tensor(weight, kOp, "weight");
  TORCH_CHECK(x.dim() >= 1, "fusegraph.", kOp,
                    ": argument 'x' is a 0-dim tensor; expected [..., in_features]");
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == x.size(-1), "fusegraph.", kOp,
                    ": argument 'weight' has shape ", weight.sizes(), "; expected [out_features, ", x.size(-1),
                    "] (x's in_features)");
  check_same_device(x, "x", weight, kOp, "weight");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "fusegraph.", kOp, ": argument 'weight' has dtype ",
                    weight.scalar_type(), "; expected x's dtype ", x.scalar_type());
  if (bias.has_value() && bias->defined()) {
    check_float_tensor(*bias, kOp, "bias");
    check_same_device(x, "x", *bias, kOp, "bias");
    TORCH_CHECK(bias->scalar_type() == x.scalar_type(), "fusegraph.", kOp, ": argument 'bias' has dtype ",
                      bias->scalar_type(), "; expected x's dtype ", x.scalar_type());
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), "fusegraph.", kOp,
                      ": argument 'bias' has shape ", bias->sizes(), "; expected [", weight.size(0),
                      "] (weight's out_features)");
  }
}

namespace {

}  // namespace

std::vector<int64_t> linear_out_sizes(const at::Tensor& x, const at::Tensor& weight) {
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = weight.size(0);
  return sizes;
}

at::Tensor gemv_reference(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  check_gemv_args(x, weight, bias, kGemv);
  at::Tensor out = new_output(linear_out_sizes(x, weight), x.options());
  if (out.numel() == 0) return out;
  return out.copy_(at::linear(x, weight, bias));
}

namespace {

at::Tensor gemv_cpu(const at::Tensor& x_in, const at::Tensor& w_in, const std::optional<at::Tensor>& bias_in) {
  check_gemv_args(x_in, w_in, bias_in, kGemv);
  const at::Tensor bias = bias_in.has_value() ? *bias_in : at::Tensor();
  if (uses_float64({&x_in})) return gemv_reference(x_in, w_in, bias_in);
  at::Tensor out = new_output(linear_out_sizes(x_in, w_in), x_in.options());
  if (out.numel() == 0) return out;
  if (x_in.size(-1) == 0) return bias.defined() ? out.copy_(bias.expand_as(out)) : out.zero_();
  // rows: x as [M, K] (a view where the leading dims allow one), its last dim contiguous
  const at::Tensor rows = x_in.reshape({-1, x_in.size(-1)});
  const at::Tensor x = rows.stride(1) == 1 ? rows : rows.contiguous();
  const at::Tensor w = w_in.stride(1) == 1 ? w_in : w_in.contiguous();
  at::Tensor out2d = out.view({-1, w_in.size(0)});
  gemv_stub.get(kGemv)(x, w, bias.defined() ? bias.contiguous() : bias, out2d);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CPU, m) { m.impl("gemv", &gemv_cpu); }

// Every other device (CUDA, NPU): at::linear; the fusion pass only fuses CPU sites.
TORCH_LIBRARY_IMPL(fusegraph, CompositeExplicitAutograd, m) { m.impl("gemv", &gemv_reference); }

}  // namespace fusegraph
