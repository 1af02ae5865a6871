#include "ops/gelu.h"

#include <torch/library.h>

#include "common/checks.h"
#include "common/output.h"

namespace fusegraph {

FG_DEFINE_CPU_STUB(gelu_tanh_stub, gelu_fn);
FG_DEFINE_CPU_STUB(fast_gelu_stub, gelu_fn);

void check_gelu_args(const at::Tensor& x, const char* op) { check_float_tensor(x, op, "x"); }

namespace {

at::Tensor run_cpu(const at::Tensor& x_in, const char* op, const cpu::KernelStub<gelu_fn>& stub) {
  check_gelu_args(x_in, op);
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = new_output(x.sizes(), x.options());
  if (x.numel() > 0) stub.get(op)(x, out);
  return out;
}

at::Tensor gelu_tanh_cpu(const at::Tensor& x) { return run_cpu(x, "gelu_tanh", gelu_tanh_stub); }
at::Tensor fast_gelu_cpu(const at::Tensor& x) { return run_cpu(x, "fast_gelu", fast_gelu_stub); }

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CPU, m) {
  m.impl("gelu_tanh", &gelu_tanh_cpu);
  m.impl("fast_gelu", &fast_gelu_cpu);
}

}  // namespace fusegraph
