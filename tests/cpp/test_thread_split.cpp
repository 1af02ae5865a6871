// Every CPU kernel's split between threads (at::parallel_for over rows, blocks or elements) at sizes that make
// several chunks with a ragged last one: the output at 4 threads equals the output at 1 thread bit for bit (each
// element is computed by the same code whichever thread runs it), no element is left unwritten (outputs are
// poisoned), and the 1-thread output matches an ATen composition in float64. The other GoogleTests use sizes below
// every grain, so they run on one thread whatever OMP_NUM_THREADS says; this file is what checks the split on a
// build the Python tests do not reach (scripts/cross_check.sh: aarch64 under qemu).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace {

at::Tensor call(const char* name, const char* overload, std::vector<c10::IValue> args) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  torch::jit::Stack stack(std::make_move_iterator(args.begin()), std::make_move_iterator(args.end()));
  op.callBoxed(&stack);
  return stack.at(0).toTensor();
}

at::Tensor d(const at::Tensor& t) { return t.to(at::kDouble); }

class ThreadSplit : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = at::get_num_threads(); }
  void TearDown() override { at::set_num_threads(saved_); }

  // run() at 1 thread and at 4; the two outputs must be identical, and the first close to ref64.
  void check(const std::string& what, const std::function<at::Tensor()>& run, const at::Tensor& ref64) {
    at::set_num_threads(1);
    const at::Tensor one = run();
    at::set_num_threads(4);
    ASSERT_EQ(at::get_num_threads(), 4) << what;
    const at::Tensor four = run();
    ASSERT_FALSE(at::isnan(one).any().item<bool>()) << what << ": an element left unwritten at 1 thread";
    ASSERT_FALSE(at::isnan(four).any().item<bool>()) << what << ": an element left unwritten at 4 threads";
    EXPECT_TRUE(at::equal(one, four)) << what << ": 4 threads differ from 1 by up to "
                                      << (d(one) - d(four)).abs().max().item<double>();
    const double tol = one.scalar_type() == at::kFloat ? 1e-5 : 1.6e-2;
    EXPECT_TRUE(at::allclose(d(one), d(ref64.to(one.scalar_type())), tol, tol))
        << what << ": max error " << (d(one) - ref64).abs().max().item<double>();
  }

 private:
  int saved_ = 1;
};

const at::ScalarType kDtypes[] = {at::kFloat, at::kBFloat16, at::kHalf};

std::string name(const char* op, at::ScalarType dtype) { return std::string(op) + " " + c10::toString(dtype); }

TEST_F(ThreadSplit, RmsNorm) {
  for (auto dtype : kDtypes) {
    // D = 75: a grain of 16384 / 75 = 218 rows, so 1000 rows make 5 chunks, the last of 128
    const at::Tensor x = at::randn({4, 250, 75}).to(dtype), w = at::randn({75}).to(dtype);
    const at::Tensor x64 = d(x);
    const at::Tensor ref = x64 * at::rsqrt(x64.pow(2).mean({-1}, true) + 1e-6) * d(w);
    check(name("rms_norm", dtype),
          [&] { return call("fusegraph::rms_norm", "", {x, w, 1e-6, c10::IValue(), std::string("torch")}); }, ref);
  }
}

TEST_F(ThreadSplit, Adaln) {
  for (auto dtype : kDtypes) {
    const at::Tensor x = at::randn({2, 500, 75}).to(dtype);  // 1000 rows of 75: 5 chunks
    const at::Tensor scale = at::randn({2, 1, 75}).to(dtype), shift = at::randn({2, 1, 75}).to(dtype);
    const at::Tensor ln = at::layer_norm(d(x), {75}, std::nullopt, std::nullopt, 1e-6);
    check(name("adaln layer", dtype),
          [&] {
            return call("fusegraph::adaln", "",
                        {x, scale, shift, 1e-6, c10::IValue(), c10::IValue(), c10::IValue(), std::string("layer")});
          },
          ln * (1 + d(scale)) + d(shift));
    const at::Tensor x64 = d(x);
    const at::Tensor rms = x64 * at::rsqrt(x64.pow(2).mean({-1}, true) + 1e-6);
    check(name("adaln rms", dtype),
          [&] {
            return call("fusegraph::adaln", "",
                        {x, scale, c10::IValue(), 1e-6, c10::IValue(), c10::IValue(), c10::IValue(), std::string("rms")});
          },
          rms * (1 + d(scale)));
  }
}

TEST_F(ThreadSplit, Rope) {
  for (auto dtype : kDtypes) {
    // [B, S, H, D] with D = 64: a grain of 256 rows; 2 * 150 * 3 = 900 rows make 4 chunks
    const at::Tensor x = at::randn({2, 150, 3, 64}).to(dtype);
    const at::Tensor cos = at::randn({1, 150, 1, 64}), sin = at::randn({1, 150, 1, 64});
    const auto halves = d(x).reshape({2, 150, 3, 2, 32}).unbind(-2);
    const at::Tensor ref = d(x) * d(cos) + at::cat({-halves[1], halves[0]}, -1) * d(sin);
    check(name("rope", dtype),
          [&] { return call("fusegraph::rope", "", {x, cos, sin, c10::Scalar(false), c10::IValue()}); }, ref);
  }
}

TEST_F(ThreadSplit, GeluTanh) {
  for (auto dtype : kDtypes) {
    // chunks of 1024 vector blocks (at most 32 Ki elements): 5 full chunks and a ragged sixth, with a vector tail
    const at::Tensor x = at::randn({5 * 32768 + 1000 + 13}).to(dtype);
    check(name("gelu_tanh", dtype), [&] { return call("fusegraph::gelu_tanh", "", {x}); }, at::gelu(d(x), "tanh"));
  }
}

TEST_F(ThreadSplit, MulAdd) {
  for (auto dtype : kDtypes) {
    // chunks of 32768 elements: 2 * 700 * 99 = 138600 make 5, the last of 7528; the gate broadcasts over rows
    const at::Tensor y = at::randn({2, 700, 99}).to(dtype), gate = at::randn({2, 1, 99}).to(dtype);
    const at::Tensor residual = at::randn({2, 700, 99}).to(dtype);
    check(name("mul_add", dtype), [&] { return call("fusegraph::mul_add", "", {y, gate, residual, c10::IValue()}); },
          d(y) * d(gate) + d(residual));
  }
}

TEST_F(ThreadSplit, Gemv) {
  for (auto dtype : kDtypes) {
    // K = 67: a grain of 65536 / (4 * 67) = 244 blocks of 4 weight rows; N = 2931 is 733 blocks, the last of 3 rows
    const at::Tensor x = at::randn({3, 67}).to(dtype), w = (at::randn({2931, 67}) / 8).to(dtype);
    const at::Tensor b = at::randn({2931}).to(dtype);
    check(name("gemv", dtype), [&] { return call("fusegraph::gemv", "", {x, w, b}); }, at::linear(d(x), d(w), d(b)));
  }
}

TEST_F(ThreadSplit, KvAttention) {
  for (auto dtype : kDtypes) {
    // L = 40 keys, D = 24, Dv = 40: a grain of 32768 / (40 * 64) = 12 rows; 2 * 8 * 5 = 80 rows make 7 chunks
    const at::Tensor q = at::randn({2, 8, 5, 24}).to(dtype), kc = at::randn({2, 8, 37, 24}).to(dtype);
    const at::Tensor kn = at::randn({2, 8, 3, 24}).to(dtype), vc = at::randn({2, 8, 37, 40}).to(dtype);
    const at::Tensor vn = at::randn({2, 8, 3, 40}).to(dtype);
    const at::Tensor ref =
        at::scaled_dot_product_attention(d(q), at::cat({d(kc), d(kn)}, 2), at::cat({d(vc), d(vn)}, 2));
    check(name("kv_attention", dtype),
          [&] { return call("fusegraph::kv_attention", "", {q, kc, kn, vc, vn, c10::IValue()}); }, ref);
  }
}

}  // namespace
