// fusegraph::kv_attention and fusegraph::gemv (the decode-step ops) through the dispatcher, and each CPU
// capability's kernel directly, against ATen compositions in float64.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <optional>

#include "ops/cpu/isa_dispatch.h"
#include "ops/gemv.h"
#include "ops/kv_attention.h"

namespace {

at::Tensor kv_attention(const at::Tensor& q, const at::Tensor& kc, const at::Tensor& kn, const at::Tensor& vc,
                        const at::Tensor& vn, std::optional<double> scale = std::nullopt) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fusegraph::kv_attention", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const at::Tensor&, std::optional<double>)>();
  return op.call(q, kc, kn, vc, vn, scale);
}

at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b = std::nullopt) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fusegraph::gemv", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&)>();
  return op.call(x, w, b);
}

at::Tensor d(const at::Tensor& t) { return t.to(at::kDouble); }

void expect_close(const at::Tensor& out, const at::Tensor& ref64) {
  const double tol = out.scalar_type() == at::kFloat ? 1e-5 : 1.6e-2;
  ASSERT_EQ(out.sizes(), ref64.sizes());
  ASSERT_FALSE(at::isnan(out).any().item<bool>());
  EXPECT_TRUE(at::allclose(d(out), d(ref64.to(out.scalar_type())), tol, tol))
      << "max error " << (d(out) - ref64).abs().max().item<double>();
}

at::Tensor attention64(const at::Tensor& q, const at::Tensor& kc, const at::Tensor& kn, const at::Tensor& vc,
                       const at::Tensor& vn) {
  return at::scaled_dot_product_attention(d(q), at::cat({d(kc), d(kn)}, 2), at::cat({d(vc), d(vn)}, 2));
}

TEST(KvAttention, MatchesConcatenatedSdpa) {
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::Tensor q = at::randn({2, 3, 1, 37}).to(dtype), kc = at::randn({2, 3, 20, 37}).to(dtype);
    const at::Tensor kn = at::randn({2, 3, 2, 37}).to(dtype), vc = at::randn({2, 3, 20, 70}).to(dtype);
    const at::Tensor vn = at::randn({2, 3, 2, 70}).to(dtype);
    expect_close(kv_attention(q, kc, kn, vc, vn), attention64(q, kc, kn, vc, vn));
  }
}

TEST(KvAttention, EveryCapabilityKernel) {
  const at::Tensor q = at::randn({1, 2, 3, 40}), kc = at::randn({1, 2, 9, 40}), kn = at::randn({1, 2, 1, 40});
  const at::Tensor vc = at::randn({1, 2, 9, 33}), vn = at::randn({1, 2, 1, 33});
  const fusegraph::KvAttentionShape s{1, 2, 3, 9, 1, 40, 33};
  // every kernel this CPU can execute (a higher capability's would raise SIGILL)
  for (int cap = 0; cap <= static_cast<int>(fusegraph::cpu::current_capability()); ++cap) {
    const auto fn = fusegraph::kv_attention_stub.table[cap];
    if (fn == nullptr) continue;
    at::Tensor out = at::full({1, 2, 3, 33}, NAN);
    fn(q, kc, kn, vc, vn, 1.0 / std::sqrt(40.0), s, out);
    expect_close(out, attention64(q, kc, kn, vc, vn));
  }
}

TEST(KvAttention, NamesTheBadArgument) {
  const at::Tensor q = at::randn({1, 2, 1, 8}), k = at::randn({1, 2, 3, 8}), v = at::randn({1, 2, 3, 8});
  EXPECT_THROW(
      {
        try {
          kv_attention(q, k, k, v, v.narrow(3, 0, 4));
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("argument 'v_new'"), std::string::npos) << e.what();
          throw;
        }
      },
      c10::Error);
}

TEST(Gemv, MatchesLinear) {
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t m : {1, 2, 5}) {
      const at::Tensor x = at::randn({m, 70}).to(dtype), w = (at::randn({37, 70}) / 8).to(dtype);
      const at::Tensor b = at::randn({37}).to(dtype);
      expect_close(gemv(x, w, b), at::linear(d(x), d(w), d(b)));
      expect_close(gemv(x, w), at::linear(d(x), d(w)));
    }
  }
}

TEST(Gemv, EveryCapabilityKernel) {
  const at::Tensor x = at::randn({3, 65}), w = at::randn({9, 65}) / 8, b = at::randn({9});
  // every kernel this CPU can execute (a higher capability's would raise SIGILL)
  for (int cap = 0; cap <= static_cast<int>(fusegraph::cpu::current_capability()); ++cap) {
    const auto fn = fusegraph::gemv_stub.table[cap];
    if (fn == nullptr) continue;
    at::Tensor out = at::full({3, 9}, NAN);
    fn(x, w, b, out);
    expect_close(out, at::linear(d(x), d(w), d(b)));
  }
}

}  // namespace
