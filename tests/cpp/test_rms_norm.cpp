// fusegraph::rms_norm through the dispatcher, against ATen compositions.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include "ops/cpu/isa_dispatch.h"
#include "ops/rms_norm.h"

namespace {

at::Tensor call_rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& w, double eps,
                         const std::optional<at::Tensor>& b, c10::string_view style) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fusegraph::rms_norm", "")
                             .typed<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&, double,
                                               const std::optional<at::Tensor>&, c10::string_view)>();
  return op.call(x, w, eps, b, style);
}

TEST(RmsNorm, EveryCapabilityHasAKernel) {
  for (int c = 0; c < fusegraph::cpu::kBuiltCapabilities; ++c) {
    EXPECT_NE(fusegraph::rms_norm_stub.table[c], nullptr) << "capability " << c;
  }
}

TEST(RmsNorm, TorchStyleMatchesAtenRmsNorm) {
  for (int64_t D : {1, 7, 131, 3072 + 5}) {
    const at::Tensor x = at::randn({5, 3, D});
    const at::Tensor w = at::randn({D});
    const at::Tensor out = call_rms_norm(x, w, 1e-6, std::nullopt, "torch");
    const at::Tensor ref = at::rms_norm(x.to(at::kDouble), {D}, w.to(at::kDouble), 1e-6).to(at::kFloat);
    EXPECT_TRUE(at::allclose(out, ref, 1e-5, 1e-5)) << "D=" << D;
  }
}

TEST(RmsNorm, DiffusersStyleRoundsBeforeHalfWeight) {
  const int64_t D = 259;
  const at::Tensor x = at::randn({4, D}, at::kBFloat16);
  const at::Tensor w = at::randn({D}, at::kBFloat16);
  const at::Tensor out = call_rms_norm(x, w, 1e-6, std::nullopt, "diffusers");
  ASSERT_EQ(out.scalar_type(), at::kBFloat16);
  // eager diffusers: variance in fp32, x * rsqrt in fp32, cast to the weight dtype, multiply in bf16
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor n = xf * at::rsqrt(xf.pow(2).mean({-1}, true) + 1e-6);
  const at::Tensor ref = n.to(at::kBFloat16) * w;
  EXPECT_TRUE(at::allclose(out.to(at::kFloat), ref.to(at::kFloat), 1.6e-2, 1e-5));
  EXPECT_GT(out.eq(ref).to(at::kFloat).mean().item<float>(), 0.98f);
}

TEST(RmsNorm, NonContiguousRowsAndBias) {
  const at::Tensor x = at::randn({6, 4, 50}).transpose(0, 1);  // strided rows
  const at::Tensor w = at::randn({50});
  const at::Tensor b = at::randn({50});
  const at::Tensor out = call_rms_norm(x, w, 1e-5, b, "torch");
  const at::Tensor ref = at::rms_norm(x, {50}, w, 1e-5) + b;
  EXPECT_TRUE(out.is_contiguous());
  EXPECT_TRUE(at::allclose(out, ref, 1e-5, 1e-5));
}

TEST(RmsNorm, MoreLeadingDimsThanARowLayoutKeeps) {
  // Eight leading dims in reverse memory order: none merge, more than kMaxOuterDims; the op reads a copy.
  const at::Tensor x = at::randn({2, 3, 2, 3, 2, 3, 2, 3, 40}).permute({7, 6, 5, 4, 3, 2, 1, 0, 8});
  const at::Tensor w = at::randn({40});
  const at::Tensor out = call_rms_norm(x, w, 1e-5, std::nullopt, "torch");
  const at::Tensor ref = call_rms_norm(x.contiguous(), w, 1e-5, std::nullopt, "torch");
  EXPECT_TRUE(at::equal(out, ref));
  EXPECT_TRUE(at::allclose(out, at::rms_norm(x, {40}, w, 1e-5), 1e-5, 1e-5));
}

TEST(RmsNorm, BadArgumentsNameTheArgument) {
  const at::Tensor x = at::randn({2, 8});
  try {
    call_rms_norm(x, at::randn({9}), 1e-6, std::nullopt, "torch");
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'weight' has shape [9]; expected [8]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(call_rms_norm(x, std::nullopt, 1e-6, std::nullopt, "gemma"), c10::ValueError);
  EXPECT_THROW(call_rms_norm(x, std::nullopt, -1.0, std::nullopt, "torch"), c10::ValueError);
  EXPECT_THROW(fusegraph::check_rms_norm_args(at::ones({2, 8}, at::kLong), std::nullopt, 1e-6, std::nullopt,
                                              fusegraph::RmsNormStyle::Torch),
               c10::Error);
}

TEST(RmsNorm, OutputDtypeRule) {
  using fusegraph::RmsNormStyle;
  const at::Tensor x = at::randn({2, 8}, at::kBFloat16);
  EXPECT_EQ(fusegraph::check_rms_norm_args(x, at::randn({8}), 1e-6, std::nullopt, RmsNormStyle::Torch), at::kBFloat16);
  EXPECT_EQ(fusegraph::check_rms_norm_args(x, at::randn({8}), 1e-6, std::nullopt, RmsNormStyle::Diffusers), at::kFloat);
  EXPECT_EQ(fusegraph::check_rms_norm_args(x.to(at::kFloat), at::randn({8}, at::kHalf), 1e-6, std::nullopt,
                                           RmsNormStyle::Diffusers),
            at::kHalf);
  EXPECT_EQ(fusegraph::check_rms_norm_args(x, std::nullopt, 1e-6, std::nullopt, RmsNormStyle::Diffusers),
            at::kBFloat16);
}

TEST(RmsNorm, Float64PathIsTheMathInDouble) {
  // float64 (for gradcheck): at:: ops in double, not a kernel; diffusers style with an fp32 weight gives double.
  const at::Tensor x = at::randn({3, 5, 19}, at::kDouble).transpose(0, 1), w = at::randn({19}, at::kDouble);
  const at::Tensor out = call_rms_norm(x, w, 1e-5, std::nullopt, "torch");
  EXPECT_EQ(out.scalar_type(), at::kDouble);
  EXPECT_TRUE(out.is_contiguous());
  EXPECT_TRUE(at::allclose(out, at::rms_norm(x, {19}, w, 1e-5), 1e-12, 1e-12));
  EXPECT_EQ(fusegraph::check_rms_norm_args(x, w.to(at::kFloat), 1e-6, std::nullopt, fusegraph::RmsNormStyle::Diffusers),
            at::kDouble);
  EXPECT_EQ(call_rms_norm(x, w.to(at::kFloat), 1e-5, std::nullopt, "diffusers").scalar_type(), at::kDouble);
}

}  // namespace
