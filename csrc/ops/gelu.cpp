#include "ops/gelu.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/output.h"

namespace fusegraph {

FG_DEFINE_CPU_STUB(gelu_tanh_stub, gelu_fn);
FG_DEFINE_CPU_STUB(fast_gelu_stub, gelu_fn);

void check_gelu_args(const at::Tensor& x, const char* op) { check_float_tensor(x, op, "x"); }

at::Tensor gelu_tanh_float64(const at::Tensor& x) {
  return new_output(x.sizes(), x.options()).copy_(at::gelu(x, "tanh"));
}

at::Tensor fast_gelu_float64(const at::Tensor& x) {
  return new_output(x.sizes(), x.options()).copy_(x * at::sigmoid(1.702 * x));
}

namespace {

at::Tensor run_cpu(const at::Tensor& x_in, const char* op, const cpu::KernelStub<gelu_fn>& stub,
                   at::Tensor (*float64_path)(const at::Tensor&)) {
  check_gelu_args(x_in, op);
  if (uses_float64({&x_in})) return float64_path(x_in);
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = new_output(x.sizes(), x.options());
  if (x.numel() > 0) stub.get(op)(x, out);
  return out;
}

at::Tensor gelu_tanh_cpu(const at::Tensor& x) { return run_cpu(x, "gelu_tanh", gelu_tanh_stub, gelu_tanh_float64); }
at::Tensor fast_gelu_cpu(const at::Tensor& x) { return run_cpu(x, "fast_gelu", fast_gelu_stub, fast_gelu_float64); }

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CPU, m) {
  m.impl("gelu_tanh", &gelu_tanh_cpu);
  m.impl("fast_gelu", &fast_gelu_cpu);
}

}  // namespace fusegraph
