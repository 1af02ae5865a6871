// Poison mode for every GoogleTest, as tests/conftest.py sets it for pytest: each op output is NaN-filled
// (fusegraph::new_output) before its kernel writes it, so an element a kernel forgets shows up as NaN in the
// comparisons. Tests that call a capability's kernel directly fill their own output with NaN.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "ops/output.h"

namespace {

class PoisonOutputs : public ::testing::Environment {
 public:
  void SetUp() override { fusegraph::set_poison_outputs(true); }
  void TearDown() override { fusegraph::set_poison_outputs(false); }
};

// gtest_main runs RUN_ALL_TESTS: an environment must be registered before main, by a static initialiser.
::testing::Environment* const poison_env = ::testing::AddGlobalTestEnvironment(new PoisonOutputs);

TEST(PoisonOutputs, AnUnwrittenElementFailsTheComparison) {
  // A kernel stand-in that writes every element of its output but the first.
  const at::Tensor ref = at::randn({3, 17});
  at::Tensor out = fusegraph::new_output(ref.sizes(), ref.options());
  out.view({-1}).narrow(0, 1, ref.numel() - 1).copy_(ref.view({-1}).narrow(0, 1, ref.numel() - 1));
  EXPECT_TRUE(std::isnan(out.view({-1})[0].item<float>()));
  EXPECT_FALSE(at::allclose(out, ref, 1e-5, 1e-5));
  EXPECT_TRUE(at::isnan(out).any().item<bool>());
}

}  // namespace
