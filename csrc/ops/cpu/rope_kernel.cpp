// Compiled once per CPU capability (see isa_dispatch.h). Rotary embedding over rows of D elements, the first R
// (rotary_dim) rotated, the rest copied: each row of x is read once (any strides over the leading dims), cos/sin
// rows (R wide) are found through broadcast strides (never expanded in memory), float32 math, one rounding to
// x's dtype, contiguous output.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cstring>

#include "ops/cpu/dtype_dispatch.h"
#include "ops/cpu/vec_io.h"
#include "ops/rope.h"

namespace fusegraph::cpu {
inline namespace CPU_CAPABILITY {
namespace {

// Interleaved pairs: out[2k] = x[2k] cos[2k] - x[2k+1] sin[2k], out[2k+1] = x[2k+1] cos[2k+1] + x[2k] sin[2k+1].
template <typename T, typename TC>
inline void rope_row_interleaved(const T* x, const TC* c, const TC* s, T* o, int64_t D) {
  using IOX = VecIO<T>;
  using IOC = VecIO<TC>;
  constexpr int64_t K = IOX::kBlock;  // even, so blocks never split a pair
  const fVec zero(0.0f);
  auto block = [&](fVec x0, fVec x1, fVec c0, fVec c1, fVec s0, fVec s1, fVec& o0, fVec& o1) {
    auto [even, odd] = at::vec::deinterleave2(x0, x1);
    auto [r0, r1] = at::vec::interleave2(zero - odd, even);  // rot(x) = (-x1, x0, -x3, x2, ...)
    o0 = at::vec::fmadd(r0, s0, x0 * c0);
    o1 = at::vec::fmadd(r1, s1, x1 * c1);
  };
  fVec x0, x1, c0, c1, s0, s1, o0, o1;
  int64_t j = 0;
  for (; j + K <= D; j += K) {
    IOX::load(x + j, x0, x1);
    IOC::load(c + j, c0, c1);
    IOC::load(s + j, s0, s1);
    block(x0, x1, c0, c1, s0, s1, o0, o1);
    IOX::store(o + j, o0, o1);
  }
  if (j < D) {
    const int64_t n = D - j;
    IOX::load(x + j, x0, x1, n);
    IOC::load(c + j, c0, c1, n);
    IOC::load(s + j, s0, s1, n);
    block(x0, x1, c0, c1, s0, s1, o0, o1);
    IOX::store(o + j, o0, o1, n);
  }
}

// Rotate-half: with h = D/2, out[k] = x[k] cos[k] - x[k+h] sin[k], out[k+h] = x[k+h] cos[k+h] + x[k] sin[k+h].
template <typename T, typename TC>
inline void rope_row_half(const T* x, const TC* c, const TC* s, T* o, int64_t D) {
  using IOX = VecIO<T>;
  using IOC = VecIO<TC>;
  constexpr int64_t K = IOX::kBlock;
  const int64_t h = D / 2;
  fVec xa0, xa1, xb0, xb1, ca0, ca1, cb0, cb1, sa0, sa1, sb0, sb1;
  for (int64_t j = 0; j < h; j += K) {
    const int64_t n = std::min(K, h - j);
    if (n == K) {
      IOX::load(x + j, xa0, xa1);
      IOX::load(x + h + j, xb0, xb1);
      IOC::load(c + j, ca0, ca1);
      IOC::load(c + h + j, cb0, cb1);
      IOC::load(s + j, sa0, sa1);
      IOC::load(s + h + j, sb0, sb1);
      IOX::store(o + j, at::vec::fmsub(xa0, ca0, xb0 * sa0), at::vec::fmsub(xa1, ca1, xb1 * sa1));
      IOX::store(o + h + j, at::vec::fmadd(xa0, sb0, xb0 * cb0), at::vec::fmadd(xa1, sb1, xb1 * cb1));
    } else {
      IOX::load(x + j, xa0, xa1, n);
      IOX::load(x + h + j, xb0, xb1, n);
      IOC::load(c + j, ca0, ca1, n);
      IOC::load(c + h + j, cb0, cb1, n);
      IOC::load(s + j, sa0, sa1, n);
      IOC::load(s + h + j, sb0, sb1, n);
      IOX::store(o + j, at::vec::fmsub(xa0, ca0, xb0 * sa0), at::vec::fmsub(xa1, ca1, xb1 * sa1), n);
      IOX::store(o + h + j, at::vec::fmadd(xa0, sb0, xb0 * cb0), at::vec::fmadd(xa1, sb1, xb1 * cb1), n);
    }
  }
}

template <typename T, typename TC, bool kInterleaved>
void rope_typed(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out, int64_t R) {
  const int64_t n0 = x.size(0), n1 = x.size(1), n2 = x.size(2), D = x.size(3);
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2);
  int64_t cs[4], ss[4];
  broadcast_strides(cos, x.sizes(), cs);
  broadcast_strides(sin, x.sizes(), ss);
  const T* xp = x.const_data_ptr<T>();
  const TC* cp = cos.const_data_ptr<TC>();
  const TC* sp = sin.const_data_ptr<TC>();
  T* op = out.mutable_data_ptr<T>();
  const int64_t rows = n0 * n1 * n2;
  // Rows are independent, so the split never changes a result; ~16K elements per task amortises scheduling.
  const int64_t grain = std::max<int64_t>(1, 16384 / D);
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    int64_t i2 = r0 % n2, i1 = (r0 / n2) % n1, i0 = r0 / (n1 * n2);
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = xp + i0 * xs0 + i1 * xs1 + i2 * xs2;
      const TC* cr = cp + i0 * cs[0] + i1 * cs[1] + i2 * cs[2];
      const TC* sr = sp + i0 * ss[0] + i1 * ss[1] + i2 * ss[2];
      T* orow = op + r * D;
      if constexpr (kInterleaved) {
        rope_row_interleaved(xr, cr, sr, orow, R);
      } else {
        rope_row_half(xr, cr, sr, orow, R);
      }
      if (R < D) std::memcpy(orow + R, xr + R, static_cast<size_t>(D - R) * sizeof(T));  // pass-through, x's dtype
      if (++i2 == n2) {
        i2 = 0;
        if (++i1 == n1) {
          i1 = 0;
          ++i0;
        }
      }
    }
  });
}

void rope_kernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out,
                 bool interleaved, int64_t rotary_dim) {
  FG_DISPATCH_FLOAT_TYPES(x.scalar_type(), "fusegraph_rope", [&] {
    const bool float_tables = cos.scalar_type() == at::kFloat;
    if (interleaved) {
      float_tables ? rope_typed<scalar_t, float, true>(x, cos, sin, out, rotary_dim)
                   : rope_typed<scalar_t, scalar_t, true>(x, cos, sin, out, rotary_dim);
    } else {
      float_tables ? rope_typed<scalar_t, float, false>(x, cos, sin, out, rotary_dim)
                   : rope_typed<scalar_t, scalar_t, false>(x, cos, sin, out, rotary_dim);
    }
  });
}

}  // namespace

FG_REGISTER_CPU_KERNEL(::fusegraph::rope_stub, &rope_kernel);

}  // namespace CPU_CAPABILITY
}  // namespace fusegraph::cpu
