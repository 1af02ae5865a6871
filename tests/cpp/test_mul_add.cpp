// fusegraph::mul_add (both overloads) through the dispatcher (and each CPU capability's kernel directly)
// against ATen compositions.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include "ops/cpu/isa_dispatch.h"
#include "ops/mul_add.h"

namespace {

using Dtype = std::optional<at::ScalarType>;

at::Tensor mul_add(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, Dtype out_dtype = std::nullopt) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fusegraph::mul_add", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, Dtype)>();
  return op.call(a, b, c, out_dtype);
}

at::Tensor mul_add(const at::Tensor& a, const at::Scalar& b, const at::Tensor& c, Dtype out_dtype = std::nullopt) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fusegraph::mul_add", "Scalar")
          .typed<at::Tensor(const at::Tensor&, const at::Scalar&, const at::Tensor&, Dtype)>();
  return op.call(a, b, c, out_dtype);
}

void expect_close(const at::Tensor& out, const at::Tensor& ref64) {
  const double tol = out.scalar_type() == at::kFloat ? 1e-5 : 1.6e-2;
  ASSERT_EQ(out.sizes(), ref64.sizes());
  EXPECT_TRUE(at::allclose(out.to(at::kDouble), ref64.to(out.scalar_type()).to(at::kDouble), tol, tol))
      << "max error " << (out.to(at::kDouble) - ref64).abs().max().item<double>();
}

at::Tensor d(const at::Tensor& t) { return t.to(at::kDouble); }

TEST(MulAdd, GatedResidualWithChunkedGate) {
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::Tensor y = at::randn({2, 9, 70}).to(dtype), residual = at::randn({2, 9, 70}).to(dtype);
    const at::Tensor gate = at::randn({2, 6 * 70}).to(dtype).chunk(6, 1)[4].unsqueeze(1);  // [B,1,D], strides (6D,D,1)
    const at::Tensor out = mul_add(y, gate, residual);
    EXPECT_EQ(out.scalar_type(), (residual + gate * y).scalar_type());
    expect_close(out, d(y) * d(gate) + d(residual));
  }
}

TEST(MulAdd, MixedDtypesPromoteLikeEagerOrTakeOutDtype) {
  const at::Tensor h = at::randn({3, 33}).to(at::kBFloat16), y = at::randn({3, 33}).to(at::kBFloat16);
  const at::Tensor gate = at::randn({3, 1});
  EXPECT_EQ(mul_add(y, gate, h).scalar_type(), at::kFloat);
  const at::Tensor out = mul_add(y, gate, h, at::kBFloat16);  // Wan: (h.float() + y.float() * gate).type_as(h)
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  expect_close(out, d(y) * d(gate) + d(h));
  EXPECT_EQ(mul_add(y, at::randn({}), h).scalar_type(), at::kBFloat16);  // zero-dim tensors do not promote
}

TEST(MulAdd, GeneralBroadcastAndScalar) {
  const at::Tensor a = at::randn({5, 1}), b = at::randn({1, 7}), c = at::randn({5, 7}).t().contiguous().t();
  expect_close(mul_add(a, b, c), d(a) * d(b) + d(c));
  const at::Tensor x = at::randn({4, 65}).to(at::kHalf);
  const at::Tensor out = mul_add(x, at::Scalar(0.25), at::randn({65}).to(at::kHalf));
  EXPECT_EQ(out.scalar_type(), at::kHalf);
}

TEST(MulAdd, EveryCapabilityKernelAgrees) {
  const at::Tensor a = at::randn({3, 4, 77}).to(at::kBFloat16), c = at::randn({3, 4, 77}).to(at::kBFloat16);
  const at::Tensor b = at::randn({3, 1, 77});
  // every kernel this CPU can execute (a higher capability's would raise SIGILL; its presence is checked alone)
  for (int cap = 0; cap < fusegraph::cpu::kBuiltCapabilities; ++cap) {
    ASSERT_NE(fusegraph::mul_add_stub.table[cap], nullptr) << "capability " << cap;
    if (cap > static_cast<int>(fusegraph::cpu::current_capability())) continue;
    at::Tensor out = at::full(a.sizes(), NAN, a.options());
    fusegraph::mul_add_stub.table[cap](a, &b, 0.0f, c, out);
    expect_close(out, d(a) * d(b) + d(c));
    fusegraph::mul_add_stub.table[cap](a, nullptr, -1.5f, c, out);
    expect_close(out, d(a) * -1.5 + d(c));
  }
}

TEST(MulAdd, ChecksNameTheArgument) {
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  const at::Tensor a = at::randn({3, 4});
  EXPECT_EQ(fusegraph::check_mul_add_args(a, a, a, std::nullopt), at::kFloat);
  EXPECT_NE(message([&] { fusegraph::check_mul_add_args(a, at::randn({5, 4}), a, std::nullopt); })
                .find("argument 'b' has shape [5, 4] which does not broadcast with 'a' of shape [3, 4]"),
            std::string::npos);
  EXPECT_NE(message([&] { fusegraph::check_mul_add_args(a, a, a.to(at::kInt), std::nullopt); }).find("argument 'c' has dtype Int"),
            std::string::npos);
  EXPECT_NE(message([&] { fusegraph::check_mul_add_scalar_args(a, at::Scalar(1.0), a, at::kLong); })
                .find("argument 'out_dtype' is Long"),
            std::string::npos);
  const at::Tensor meta = at::empty({3, 4}, at::TensorOptions().device(at::kMeta));
  EXPECT_NE(message([&] { fusegraph::check_mul_add_args(a, a, meta, std::nullopt); }).find("argument 'c' is on meta but 'a' is on cpu"),
            std::string::npos);
}

TEST(MulAdd, Float64PathIsTheMathInDouble) {
  const at::Tensor a = at::randn({2, 3, 8}, at::kDouble), gate = at::randn({2, 1, 8}, at::kDouble);
  const at::Tensor c = at::randn({3, 8}, at::kDouble);
  const at::Tensor out = mul_add(a, gate, c);
  EXPECT_EQ(out.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::allclose(out, a * gate + c, 1e-12, 1e-12));
  const at::Tensor out_s = mul_add(a, at::Scalar(0.1), c);  // 0.1 in double, not rounded to float32
  EXPECT_TRUE(at::allclose(out_s, a * 0.1 + c, 1e-15, 1e-15));
  EXPECT_EQ(mul_add(a.to(at::kFloat), gate, c.to(at::kFloat)).scalar_type(), at::kDouble);
  EXPECT_EQ(mul_add(a, gate, c, at::kBFloat16).scalar_type(), at::kBFloat16);
}

}  // namespace
