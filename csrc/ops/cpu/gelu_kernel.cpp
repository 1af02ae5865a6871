// Compiled once per CPU capability (see dispatch.h). Elementwise GELU variants, computed in float32 and
// rounded once to the input dtype.
#include "common/dispatch.h"
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include "ops/cpu/vec_io.h"
#include "ops/gelu.h"

namespace fusegraph::cpu {
inline namespace CPU_CAPABILITY {
namespace {

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
struct GeluTanh {
  static fVec vec(fVec x) {
    const fVec beta(0.7978845608028654f), kappa(0.044715f), half(0.5f), one(1.0f);  // beta = sqrt(2/pi)
    const fVec inner = beta * (x + kappa * x * x * x);
    return half * x * (one + inner.tanh());
  }
};

// x * sigmoid(1.702 x) = x / (1 + exp(-1.702 x))
struct FastGelu {
  static fVec vec(fVec x) {
    const fVec k(-1.702f), one(1.0f);
    return x / (one + (k * x).exp());
  }
};

template <typename F>
void gelu_kernel(const at::Tensor& x, at::Tensor& out) {
  const int64_t n = x.numel();
  FG_DISPATCH_FLOAT_TYPES(x.scalar_type(), "fusegraph_gelu", [&] {
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    using IO = VecIO<scalar_t>;
    // Chunks are whole blocks so every thread but the last runs full vectors; fixed grain = deterministic.
    at::parallel_for(0, at::divup(n, IO::kBlock), 1024, [&](int64_t b0, int64_t b1) {
      const int64_t end = std::min(n, b1 * IO::kBlock);
      int64_t i = b0 * IO::kBlock;
      fVec a, b;
      for (; i + IO::kBlock <= end; i += IO::kBlock) {
        IO::load(in + i, a, b);
        IO::store(o + i, F::vec(a), F::vec(b));
      }
      if (i < end) {
        IO::load(in + i, a, b, end - i);
        IO::store(o + i, F::vec(a), F::vec(b), end - i);
      }
    });
  });
}

}  // namespace

FG_REGISTER_CPU_KERNEL(::fusegraph::gelu_tanh_stub, &gelu_kernel<GeluTanh>);
FG_REGISTER_CPU_KERNEL(::fusegraph::fast_gelu_stub, &gelu_kernel<FastGelu>);

}  // namespace CPU_CAPABILITY
}  // namespace fusegraph::cpu
