// fusegraph::rope through the dispatcher (and each CPU capability's kernel directly) against ATen compositions.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include "ops/cpu/isa_dispatch.h"
#include "ops/rope.h"

namespace {

at::Tensor rope_op(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                   std::optional<int64_t> rotary_dim = std::nullopt) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fusegraph::rope", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const std::optional<c10::Scalar>&, std::optional<int64_t>)>();
  return op.call(x, cos, sin, c10::Scalar(interleaved), rotary_dim);
}

// Partial rotary in ATen ops, float64: reference() on x[..., :R], x[..., R:] as it is.
at::Tensor reference(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin, bool interleaved);
at::Tensor partial_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                             int64_t r) {
  const int64_t d = x.size(-1);
  return at::cat({reference(x.narrow(-1, 0, r), cos, sin, interleaved), x.narrow(-1, r, d - r).to(at::kDouble)}, -1);
}

// diffusers' apply_rotary_emb(use_real=True) in ATen ops, in float64.
at::Tensor reference(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  const at::Tensor x = x_in.to(at::kDouble);
  at::Tensor rotated;
  if (interleaved) {
    auto pairs = x.reshape({x.size(0), x.size(1), x.size(2), -1, 2}).unbind(-1);
    rotated = at::stack({-pairs[1], pairs[0]}, -1).flatten(3);
  } else {
    auto halves = x.reshape({x.size(0), x.size(1), x.size(2), 2, -1}).unbind(-2);
    rotated = at::cat({-halves[1], halves[0]}, -1);
  }
  return x * cos.to(at::kDouble) + rotated * sin.to(at::kDouble);
}

void expect_close(const at::Tensor& out, const at::Tensor& ref64, double tol) {
  ASSERT_EQ(out.sizes(), ref64.sizes());
  EXPECT_TRUE(at::allclose(out.to(at::kDouble), ref64.to(out.scalar_type()).to(at::kDouble), tol, tol))
      << "max error " << (out.to(at::kDouble) - ref64).abs().max().item<double>();
}

TEST(Rope, MatchesAtenCompositionForEveryDtypeAndMode) {
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (bool interleaved : {true, false}) {
      const at::Tensor x = at::randn({2, 7, 3, 38}).to(dtype);  // [B,S,H,D]
      const at::Tensor cos = at::randn({1, 7, 1, 38}), sin = at::randn({1, 7, 1, 38});
      const at::Tensor out = rope_op(x, cos, sin, interleaved);
      EXPECT_EQ(out.scalar_type(), dtype);
      EXPECT_TRUE(out.is_contiguous());
      expect_close(out, reference(x, cos, sin, interleaved), dtype == at::kFloat ? 1e-5 : 1.6e-2);
    }
  }
}

TEST(Rope, TransposedXAndSlicedTable) {
  const at::Tensor x = at::randn({2, 9, 4, 16}).transpose(1, 2);  // [B,H,S,D] view
  const at::Tensor table = at::randn({20, 32});
  const at::Tensor cos = table.slice(0, 3, 12).slice(1, 0, 16), sin = table.slice(0, 5, 14).slice(1, 16, 32);
  expect_close(rope_op(x, cos, sin, false), reference(x, cos, sin, false), 1e-5);
}

TEST(Rope, EveryCapabilityKernelAgrees) {
  const at::Tensor x = at::randn({1, 5, 3, 70}).to(at::kBFloat16);
  const at::Tensor cos = at::randn({5, 1, 70}), sin = at::randn({5, 1, 70});
  for (int c = 0; c < fusegraph::cpu::kBuiltCapabilities; ++c) {
    ASSERT_NE(fusegraph::rope_stub.table[c], nullptr) << "capability " << c;
    if (c > static_cast<int>(fusegraph::cpu::current_capability())) continue;  // SIGILL on this CPU
    for (bool interleaved : {true, false}) {
      at::Tensor out = at::full(x.sizes(), NAN, x.options());
      fusegraph::rope_stub.table[c](x, cos, sin, out, interleaved, 70);
      expect_close(out, reference(x, cos, sin, interleaved), 1.6e-2);
      at::Tensor part = at::full(x.sizes(), NAN, x.options());
      const at::Tensor c34 = cos.narrow(-1, 0, 34).contiguous(), s34 = sin.narrow(-1, 0, 34).contiguous();
      fusegraph::rope_stub.table[c](x, c34, s34, part, interleaved, 34);
      expect_close(part, partial_reference(x, c34, s34, interleaved, 34), 1.6e-2);
      EXPECT_TRUE(at::equal(part.narrow(-1, 34, 36), x.narrow(-1, 34, 36)));
    }
  }
}

TEST(Rope, PartialRotaryDim) {
  // x[..., :R] rotated, x[..., R:] copied unchanged; odd D, transposed x, every dtype and form.
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (bool interleaved : {true, false}) {
      for (int64_t d : {11, 40}) {
        const at::Tensor x = at::randn({2, 7, 3, d}).to(dtype).transpose(1, 2);  // [B,H,S,D] view
        const at::Tensor cos = at::randn({7, 6}), sin = at::randn({7, 6});
        const at::Tensor out = rope_op(x, cos, sin, interleaved, 6);
        EXPECT_EQ(out.scalar_type(), dtype);
        EXPECT_TRUE(out.is_contiguous());
        expect_close(out, partial_reference(x, cos, sin, interleaved, 6), dtype == at::kFloat ? 1e-5 : 1.6e-2);
        EXPECT_TRUE(at::equal(out.narrow(-1, 6, d - 6), x.narrow(-1, 6, d - 6)));
        const at::Tensor out64 = rope_op(x.to(at::kDouble), cos, sin, interleaved, 6);  // the float64 path
        EXPECT_TRUE(at::allclose(out64, partial_reference(x, cos, sin, interleaved, 6), 1e-12, 1e-12));
      }
    }
  }
  const at::Tensor x = at::randn({1, 3, 2, 8}), cos = at::randn({3, 1, 8}), sin = at::randn({3, 1, 8});
  EXPECT_TRUE(at::equal(rope_op(x, cos, sin, false, 8), rope_op(x, cos, sin, false)));  // rotary_dim = D
}

TEST(Rope, ChecksNameTheArgument) {
  const at::Tensor x = at::randn({2, 3, 4, 8});
  const at::Tensor ok = at::randn({3, 1, 8});
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NO_THROW(fusegraph::check_rope_args(x, ok, ok));
  EXPECT_NE(message([&] { fusegraph::check_rope_args(x.select(0, 0), ok, ok); }).find("argument 'x' has shape [3, 4, 8] (rank 3)"),
            std::string::npos);
  EXPECT_NE(message([&] { fusegraph::check_rope_args(at::randn({2, 3, 4, 7}), ok, ok); }).find("odd last dim D = 7"),
            std::string::npos);
  EXPECT_NE(message([&] { fusegraph::check_rope_args(x, at::randn({3, 8}), at::randn({3, 8})); })
                .find("argument 'cos' has shape [3, 8] which does not broadcast"),
            std::string::npos);
  EXPECT_EQ(fusegraph::check_rope_args(x, ok, ok), 8);
  const at::Tensor narrow = at::randn({3, 1, 4});
  EXPECT_EQ(fusegraph::check_rope_args(x, narrow, narrow, 4), 4);
  EXPECT_NE(message([&] { fusegraph::check_rope_args(x, narrow, narrow, 5); })
                .find("argument 'rotary_dim' is 5; expected an even width with 0 < rotary_dim <= D = 8"),
            std::string::npos);
  EXPECT_NE(message([&] { fusegraph::check_rope_args(x, ok, ok, 10); }).find("argument 'rotary_dim' is 10"),
            std::string::npos);
  EXPECT_NE(message([&] { fusegraph::check_rope_args(x, ok, ok, 4); })
                .find("argument 'cos' has shape [3, 1, 8] with last dim 8; expected rotary_dim = 4"),
            std::string::npos);
  const at::Tensor meta = at::empty({3, 1, 8}, at::TensorOptions().device(at::kMeta));
  EXPECT_NE(message([&] { fusegraph::check_rope_args(x, ok, meta); }).find("argument 'sin' is on meta but 'x' is on cpu"),
            std::string::npos);
}

TEST(Rope, Float64PathIsTheMathInDouble) {
  const at::Tensor x = at::randn({2, 5, 3, 12}, at::kDouble);
  for (bool interleaved : {true, false}) {
    for (auto table : {at::kDouble, at::kFloat}) {
      const at::Tensor cos = at::randn({5, 1, 12}, table), sin = at::randn({5, 1, 12}, table);
      const at::Tensor out = rope_op(x, cos, sin, interleaved);
      EXPECT_EQ(out.scalar_type(), at::kDouble);
      EXPECT_TRUE(at::allclose(out, reference(x, cos, sin, interleaved), 1e-12, 1e-12));
    }
  }
}

TEST(Rope, InterleavedMustBeABool) {
  // The schema takes `Scalar? interleaved` so that None and numbers reach the op (a `bool` would read None as
  // False: rotate-half) and are refused with a TypeError naming the argument.
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fusegraph::rope", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const std::optional<c10::Scalar>&, std::optional<int64_t>)>();
  const at::Tensor x = at::randn({1, 2, 1, 4}), cs = at::randn({2, 1, 4});
  const auto message = [&](std::optional<c10::Scalar> v) {
    try {
      op.call(x, cs, cs, v, std::nullopt);
    } catch (const c10::TypeError& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no TypeError");
  };
  EXPECT_NE(message(std::nullopt).find("fusegraph.rope: argument 'interleaved' is None; expected a bool"),
            std::string::npos);
  EXPECT_NE(message(c10::Scalar(2)).find("argument 'interleaved' is the int 2; expected a bool"), std::string::npos);
  EXPECT_NE(message(c10::Scalar(0.5)).find("argument 'interleaved' is the float 0.5; expected a bool"),
            std::string::npos);
  EXPECT_EQ(message(c10::Scalar(false)), "no TypeError");
  EXPECT_EQ(message(c10::Scalar(1)), "no TypeError");  // Inductor's C++ wrapper passes a bool Scalar as an int
  EXPECT_EQ(message(c10::Scalar(0)), "no TypeError");
}

}  // namespace
