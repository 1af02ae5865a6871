// fusegraph::adaln through the dispatcher, against ATen compositions.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include "ops/adaln.h"
#include "ops/cpu/dispatch.h"

namespace {

at::Tensor call_adaln(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift, double eps,
                      const std::optional<at::Tensor>& w = std::nullopt,
                      const std::optional<at::Tensor>& b = std::nullopt,
                      std::optional<at::ScalarType> out_dtype = std::nullopt) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fusegraph::adaln", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                            const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                            std::optional<at::ScalarType>)>();
  return op.call(x, scale, shift, eps, w, b, out_dtype);
}

at::Tensor composition64(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift, double eps,
                         const std::optional<at::Tensor>& w = std::nullopt,
                         const std::optional<at::Tensor>& b = std::nullopt) {
  const auto d = [](const std::optional<at::Tensor>& t) {
    return t.has_value() ? std::optional<at::Tensor>(t->to(at::kDouble)) : std::nullopt;
  };
  return at::layer_norm(x.to(at::kDouble), {x.size(-1)}, d(w), d(b), eps) * (1 + scale.to(at::kDouble)) +
         shift.to(at::kDouble);
}

TEST(Adaln, EveryCapabilityHasAKernel) {
  for (int c = 0; c < static_cast<int>(fusegraph::cpu::Capability::NUM); ++c) {
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

}  // namespace
