// One boxed Autograd kernel for every fusegraph op. When grad mode is off or no tensor argument requires
// grad — every inference call, also under torch.no_grad() — it redispatches below autograd in C++ (about the
// cost of the dispatcher hop). Otherwise it hands the call to the hook: a torch.autograd.Function that runs the
// op below autograd and applies the op's backward formula (fusegraph/ops/_autograd.py). The same split as
// torch.library.register_autograd's kernel, whose check is Python and costs ~3 µs on every call.
#include "ops/autograd.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <utility>

namespace fusegraph {
namespace {

AutogradHook& hook_slot() {
  static AutogradHook hook;
  return hook;
}

bool needs_grad(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  if (!at::GradMode::is_enabled()) return false;
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor() && v.toTensor().requires_grad()) return true;
  }
  return false;
}

void autograd_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  if (!needs_grad(op, *stack)) {
    op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
    return;
  }
  const AutogradHook& hook = hook_slot();
  TORCH_CHECK(hook, "fusegraph: gradients of ", op.schema().operator_name(),
              " need the Python package (import fusegraph): its backward formulas are Python");
  hook(op, stack);
}

}  // namespace

void set_autograd_hook(AutogradHook hook) { hook_slot() = std::move(hook); }

TORCH_LIBRARY_IMPL(fusegraph, Autograd, m) {
  for (const char* name :
       {"rms_norm", "rms_norm.eps_tensor", "rope", "adaln", "adaln.eps_tensor", "gelu_tanh", "fast_gelu", "mul_add",
        "mul_add.Scalar", "kv_attention", "gemv", "linear"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&autograd_kernel>());
  }
}

}  // namespace fusegraph
