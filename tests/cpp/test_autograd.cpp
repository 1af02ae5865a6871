// The ops' Autograd kernel (csrc/ops/autograd.cpp): calls that need no gradient stay in C++; a call that needs
// one goes to the Python hook, and without it (this binary has no Python) says what is missing.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>


namespace {

at::Tensor fused_gelu(const at::Tensor& x) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fusegraph::gelu_tanh", "").typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

TEST(OpsAutograd, WithoutGradientsTheKernelRunsBelowAutograd) {
  at::Tensor x = at::randn({3, 5});
  at::Tensor y = fused_gelu(x);  // grad mode on, x does not require grad
  EXPECT_FALSE(y.requires_grad());
  at::Tensor xg = at::randn({3, 5}).requires_grad_();
  {
    at::NoGradGuard no_grad;
    at::Tensor z = fused_gelu(xg);
    EXPECT_FALSE(z.requires_grad());
    EXPECT_TRUE(at::allclose(z, at::gelu(xg.detach(), "tanh"), 1e-5, 1e-6));
  }
}

TEST(OpsAutograd, GradientsWithoutThePythonHookNameWhatIsMissing) {
  at::Tensor x = at::randn({3, 5}).requires_grad_();
  try {
    fused_gelu(x);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("need the Python package"), std::string::npos)
        << e.what_without_backtrace();
  }
}

}  // namespace
