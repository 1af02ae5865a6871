// fusegraph::adaln through the dispatcher, against ATen compositions.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include "ops/adaln.h"
#include "ops/cpu/isa_dispatch.h"

namespace {

at::Tensor call_adaln(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& shift, double eps,
                      const std::optional<at::Tensor>& w = std::nullopt,
                      const std::optional<at::Tensor>& b = std::nullopt,
                      std::optional<at::ScalarType> out_dtype = std::nullopt, c10::string_view norm = "layer") {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fusegraph::adaln", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, double,
                            const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                            std::optional<at::ScalarType>, c10::string_view)>();
  return op.call(x, scale, shift, eps, w, b, out_dtype, norm);
}

at::Tensor composition64(const at::Tensor& x, const at::Tensor& scale, const std::optional<at::Tensor>& shift,
                         double eps, const std::optional<at::Tensor>& w = std::nullopt,
                         const std::optional<at::Tensor>& b = std::nullopt, bool rms = false) {
  const auto d = [](const std::optional<at::Tensor>& t) {
    return t.has_value() ? std::optional<at::Tensor>(t->to(at::kDouble)) : std::nullopt;
  };
  const at::Tensor x64 = x.to(at::kDouble);
  at::Tensor n;
  if (rms) {  // x / sqrt(mean(x^2) + eps), then the affine
    n = x64 / at::sqrt(x64.pow(2).mean({-1}, /*keepdim=*/true) + eps);
    if (w) n = n * d(w).value();
    if (b) n = n + d(b).value();
  } else {
    n = at::layer_norm(x64, {x.size(-1)}, d(w), d(b), eps);
  }
  const at::Tensor y = n * (1 + scale.to(at::kDouble));
  return shift.has_value() ? y + shift->to(at::kDouble) : y;
}

TEST(Adaln, EveryCapabilityHasAKernel) {
  for (int c = 0; c < fusegraph::cpu::kBuiltCapabilities; ++c) {
    EXPECT_NE(fusegraph::adaln_stub.table[c], nullptr) << "capability " << c;
  }
}

TEST(Adaln, ChunkedModulationMatchesLayerNormComposition) {
  for (int64_t D : {1, 9, 3072 + 3}) {
    const int64_t B = 3;
    const at::Tensor x = at::randn({B, 5, D});
    const auto chunks = at::randn({B, 6 * D}).chunk(6, 1);
    const at::Tensor shift = chunks[0].unsqueeze(1), scale = chunks[1].unsqueeze(1);  // [B,1,D], stride 6D
    const at::Tensor out = call_adaln(x, scale, shift, 1e-6);
    const at::Tensor ref = composition64(x, scale, shift, 1e-6).to(at::kFloat);
    EXPECT_TRUE(at::allclose(out, ref, 1e-5, 1e-5)) << "D=" << D;
  }
}

TEST(Adaln, Bf16WithFloatModulationAndAffine) {
  const int64_t D = 130;
  const at::Tensor x = at::randn({2, 7, D}, at::kBFloat16);
  const at::Tensor scale = at::randn({2, 7, D}), shift = at::randn({2, 7, D});
  const at::Tensor w = at::randn({D}), b = at::randn({D}, at::kBFloat16);
  const at::Tensor out = call_adaln(x, scale, shift, 1e-5, w, b, at::kBFloat16);
  ASSERT_EQ(out.scalar_type(), at::kBFloat16);
  const at::Tensor ref = composition64(x, scale, shift, 1e-5, w, b).to(at::kBFloat16);
  EXPECT_TRUE(at::allclose(out.to(at::kFloat), ref.to(at::kFloat), 1.6e-2, 1e-5));
  // Without out_dtype: eager promotion (bf16 x, fp32 scale) -> float32.
  EXPECT_EQ(call_adaln(x, scale, shift, 1e-5).scalar_type(), at::kFloat);
}

TEST(Adaln, BadArgumentsNameTheArgument) {
  const at::Tensor x = at::randn({2, 3, 8});
  try {
    call_adaln(x, at::randn({3, 1, 8}), at::randn({8}), 1e-6);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'scale' has shape [3, 1, 8], which does not broadcast"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(call_adaln(x, at::randn({8}), at::randn({7}), 1e-6), c10::Error);
  EXPECT_THROW(call_adaln(x, at::randn({8}), at::randn({8}), -1e-6), c10::ValueError);
  EXPECT_THROW(call_adaln(at::randn({8}), at::randn({8}), at::randn({8}), 1e-6), c10::Error);
}

TEST(Adaln, Float64PathIsTheMathInDouble) {
  const at::Tensor x = at::randn({2, 3, 16}, at::kDouble) + 3.0;
  const at::Tensor emb = at::randn({2, 32}, at::kDouble);
  const at::Tensor scale = emb.slice(1, 0, 16).unsqueeze(1), shift = emb.slice(1, 16, 32).unsqueeze(1);
  const at::Tensor w = at::randn({16}, at::kDouble), b = at::randn({16}, at::kDouble);
  const at::Tensor out = call_adaln(x, scale, shift, 1e-5, w, b);
  EXPECT_EQ(out.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::allclose(out, composition64(x, scale, shift, 1e-5, w, b), 1e-12, 1e-12));
  // float32 inputs with out_dtype=float64 take the same path
  const at::Tensor out2 = call_adaln(x.to(at::kFloat), scale.to(at::kFloat), shift.to(at::kFloat), 1e-5,
                                     std::nullopt, std::nullopt, at::kDouble);
  EXPECT_EQ(out2.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::allclose(out2, composition64(x.to(at::kFloat), scale.to(at::kFloat), shift.to(at::kFloat), 1e-5),
                           1e-12, 1e-12));
}

TEST(Adaln, RmsNormWithAndWithoutShiftMatchesComposition) {
  for (int64_t D : {1, 9, 3072 + 3, 2 * 4096 + 5}) {  // the last: chunked sum of squares with a tail
    const int64_t B = 3;
    const at::Tensor x = at::randn({B, 5, D}) + 0.5;
    const auto chunks = at::randn({B, 6 * D}).chunk(6, 1);
    const at::Tensor shift = chunks[0].unsqueeze(1), scale = chunks[1].unsqueeze(1);
    for (const bool with_shift : {true, false}) {
      const std::optional<at::Tensor> sh = with_shift ? std::optional<at::Tensor>(shift) : std::nullopt;
      const at::Tensor out = call_adaln(x, scale, sh, 1e-6, std::nullopt, std::nullopt, std::nullopt, "rms");
      const at::Tensor ref = composition64(x, scale, sh, 1e-6, std::nullopt, std::nullopt, true).to(at::kFloat);
      EXPECT_TRUE(at::allclose(out, ref, 1e-5, 1e-5)) << "D=" << D << " shift=" << with_shift;
    }
  }
}

TEST(Adaln, MoreLeadingDimsThanARowLayoutKeeps) {
  // Eight leading dims in reverse memory order (x) and a broadcast scale: more dims than kMaxOuterDims remain
  // after coalescing, so the op reads contiguous copies; same values as with contiguous inputs.
  const at::Tensor x = at::randn({2, 3, 2, 3, 2, 3, 2, 3, 24}).permute({7, 6, 5, 4, 3, 2, 1, 0, 8});
  const at::Tensor scale = at::randn({3, 1, 3, 1, 3, 1, 3, 1, 24});
  const at::Tensor shift = at::randn({24});
  const at::Tensor out = call_adaln(x, scale, shift, 1e-6);
  const at::Tensor ref = call_adaln(x.contiguous(), scale.expand(x.sizes()).contiguous(), shift, 1e-6);
  EXPECT_TRUE(at::equal(out, ref));
  EXPECT_TRUE(at::allclose(out, composition64(x, scale, shift, 1e-6).to(at::kFloat), 1e-5, 1e-5));
}

TEST(Adaln, LayerNormWithoutShiftMatchesComposition) {
  const int64_t D = 131;
  const at::Tensor x = at::randn({2, 7, D}, at::kBFloat16);
  const at::Tensor scale = at::randn({2, 1, D});  // fp32 modulation of bf16 x: float32 result
  const at::Tensor w = at::randn({D}, at::kBFloat16);
  const at::Tensor out = call_adaln(x, scale, std::nullopt, 1e-5, w);
  ASSERT_EQ(out.scalar_type(), at::kFloat);
  const at::Tensor ref = composition64(x, scale, std::nullopt, 1e-5, w).to(at::kFloat);
  EXPECT_TRUE(at::allclose(out, ref, 1e-5, 1e-5));
}

TEST(Adaln, RmsNormBf16AffineAndFloat64Path) {
  const int64_t D = 130;
  const at::Tensor x = at::randn({2, 7, D}, at::kBFloat16);
  const at::Tensor scale = at::randn({2, 7, D}, at::kBFloat16), shift = at::randn({D}, at::kBFloat16);
  const at::Tensor w = at::randn({D}, at::kBFloat16), b = at::randn({D}, at::kBFloat16);
  const at::Tensor out = call_adaln(x, scale, shift, 1e-5, w, b, std::nullopt, "rms");
  ASSERT_EQ(out.scalar_type(), at::kBFloat16);
  const at::Tensor ref = composition64(x, scale, shift, 1e-5, w, b, true).to(at::kBFloat16);
  EXPECT_TRUE(at::allclose(out.to(at::kFloat), ref.to(at::kFloat), 1.6e-2, 1e-5));
  const at::Tensor x64 = x.to(at::kDouble), s64 = scale.to(at::kDouble);
  const at::Tensor out64 = call_adaln(x64, s64, std::nullopt, 1e-5, w, std::nullopt, std::nullopt, "rms");
  EXPECT_EQ(out64.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::allclose(out64, composition64(x64, s64, std::nullopt, 1e-5, w, std::nullopt, true), 1e-12, 1e-12));
}

TEST(Adaln, UnknownNormIsAValueErrorNamingTheArgument) {
  const at::Tensor x = at::randn({2, 3, 8});
  try {
    call_adaln(x, at::randn({8}), std::nullopt, 1e-6, std::nullopt, std::nullopt, std::nullopt, "batch");
    FAIL() << "expected an error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'norm' is \"batch\"; expected \"layer\" or \"rms\""),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(call_adaln(x, at::randn({8}), at::randn({7}), 1e-6, std::nullopt, std::nullopt, std::nullopt, "rms"),
               c10::Error);
}

}  // namespace
