// Compiled once per CPU capability (see isa_dispatch.h). Elementwise GELU variants, computed in float32 and
// rounded once to the input dtype.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <type_traits>

#include "ops/cpu/dtype_dispatch.h"
#include "ops/cpu/vec_io.h"
#include "ops/gelu.h"

namespace fusegraph::cpu {
inline namespace CPU_CAPABILITY {
namespace {

// x / (1 + exp(z)), the shared tail of both variants.
template <bool kPrecise>
inline fVec sigmoid_times(fVec x, fVec z) {
  const fVec one(1.0f);
  if constexpr (kPrecise) {
    return x / (one + z.exp());
  } else {
    // exp_u20 saturates near FLT_MAX instead of overflowing to inf: keep the limit x * 0 there (-0, or
    // NaN for x = -inf, as eager and the precise path give).
    const fVec r = x / (one + z.exp_u20());
    return fVec::blendv(r, x * fVec(0.0f), z > fVec(88.0f));
  }
}

// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), evaluated as x / (1 + exp(-2u)): the same
// function (0.5 (1 + tanh(u)) = sigmoid(2u)), one exp and one division instead of at::vec's tanh, which
// is about 4x dearer per element here and made this op compute-bound. exp is at::vec's 1-ulp exp, so the
// result keeps float32 accuracy; there is no cancellation (eager's 1 + tanh(u) loses digits for x < 0).
// For bf16/fp16 outputs (8 / 11 significant bits) the exp is at::vec's exp_u20 (<= 20 ulp of float32,
// ~2.4e-6 relative, far below the output rounding), 1.5x cheaper again.
// Limits: exp overflows to inf for very negative x, giving -0 (eager: -0); x = +inf gives inf, -inf NaN
// (as eager), NaN propagates.
struct GeluTanh {
  template <bool kPrecise>
  static fVec vec(fVec x) {
    // -2u = x (c1 + c3 x^2), c1 = -2 sqrt(2/pi), c3 = -2 sqrt(2/pi) 0.044715
    const fVec c1(-1.5957691216057308f), c3(-0.07135481627260025f);
    const fVec z = x * at::vec::fmadd(x * x, c3, c1);
    return sigmoid_times<kPrecise>(x, z);
  }
};

// x * sigmoid(1.702 x) = x / (1 + exp(-1.702 x))
struct FastGelu {
  template <bool kPrecise>
  static fVec vec(fVec x) {
    return sigmoid_times<kPrecise>(x, fVec(-1.702f) * x);
  }
};

// Software prefetch of the input one 4 KiB page ahead (a hint: never faults, not even past the end).
// The loop spends ~15 cycles per cache line on arithmetic, and the hardware streamer does not cross
// 4 KiB pages, so every page began with a demand miss: bf16 [4096, 12288] at 1 thread went 83 -> 37 ms.
template <typename T>
inline void prefetch_ahead(const T* p, int64_t n) {
  constexpr int64_t kLine = 64, kAhead = 4096;
  const char* c = reinterpret_cast<const char*>(p) + kAhead;
  for (int64_t byte = 0; byte < n * static_cast<int64_t>(sizeof(T)); byte += kLine) __builtin_prefetch(c + byte);
}

template <typename F>
void gelu_kernel(const at::Tensor& x, at::Tensor& out) {
  const int64_t n = x.numel();
  FG_DISPATCH_FLOAT_TYPES(x.scalar_type(), "fusegraph_gelu", [&] {
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    using IO = VecIO<scalar_t>;
    constexpr bool kPrecise = std::is_same_v<scalar_t, float>;  // float32 output: 1-ulp exp
    // Chunks are whole blocks so every thread but the last runs full vectors; fixed grain = deterministic.
    at::parallel_for(0, at::divup(n, IO::kBlock), 1024, [&](int64_t b0, int64_t b1) {
      const int64_t end = std::min(n, b1 * IO::kBlock);
      int64_t i = b0 * IO::kBlock;
      fVec a, b;
      for (; i + IO::kBlock <= end; i += IO::kBlock) {
        prefetch_ahead(in + i, IO::kBlock);
        IO::load(in + i, a, b);
        IO::store(o + i, F::template vec<kPrecise>(a), F::template vec<kPrecise>(b));
      }
      if (i < end) {
        IO::load(in + i, a, b, end - i);
        IO::store(o + i, F::template vec<kPrecise>(a), F::template vec<kPrecise>(b), end - i);
      }
    });
  });
}

}  // namespace

FG_REGISTER_CPU_KERNEL(::fusegraph::gelu_tanh_stub, &gelu_kernel<GeluTanh>);
FG_REGISTER_CPU_KERNEL(::fusegraph::fast_gelu_stub, &gelu_kernel<FastGelu>);

}  // namespace CPU_CAPABILITY
}  // namespace fusegraph::cpu
