// Compiled once per CPU capability (see dispatch.h). Adaptive norm modulation over rows of D elements:
// y = norm(x)[*w + b] * (1 + scale) [+ shift], float32 math, one rounding at the store.
// LayerNorm, per row: pass 1 reads x from memory (bf16/fp16 rows are widened once into a per-thread float32
// buffer) and sums it; pass 2 sums d = x - mean and d^2 from cache (corrected two-pass variance:
// accurate for rows with a large mean, unlike E[x^2] - mean^2); pass 3 reads scale/shift and writes.
// RMSNorm: pass 1 sums x^2 (and widens); no pass 2; 1 / sqrt(sum / D + eps) in float32 as fusegraph.rms_norm
// (and eager) compute it; pass 3 as above. Without a shift pass 3 multiplies only.
// Rows longer than kSumChunk sum passes 1 and 2 (RMSNorm: pass 1) per chunk in float32 vectors and add the chunk sums in
// double (one long run of float adds per lane lost fp32 accuracy at D >= 2^20: 1e-5 relative at 2^22).
// scale/shift are usually one [D] vector broadcast over all rows (AdaLN's [B, 1, D]): each task keeps
// (1 + scale) and shift as float32 for the rows that share them instead of re-reading and widening
// them per row (same float32 values, so the results are bitwise those of the per-row computation).
#include "common/dispatch.h"
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <memory>
#include <type_traits>

#include "ops/adaln.h"
#include "ops/cpu/vec_io.h"

namespace fusegraph::cpu {
inline namespace CPU_CAPABILITY {
namespace {

// Zero the lanes of a block past its first n elements.
inline void mask_tail(fVec& a, fVec& b, int64_t n) {
  constexpr int64_t kV = fVec::size();
  const fVec zero(0.0f);
  a = fVec::set(zero, a, std::min(n, kV));
  b = fVec::set(zero, b, n > kV ? n - kV : 0);
}

// Elements per chunk of the row sums (a multiple of every capability's kBlock). A row of <= kSumChunk
// elements is one chunk, summed (and its statistics computed) as before chunking.
constexpr int64_t kSumChunk = 4096;

// sum(x) over xr[i0, i1); bf16/fp16 rows are also widened into buf[i0, i1). i0 is a multiple of kBlock.
template <typename T_x>
C10_ALWAYS_INLINE float sum_row(const T_x* xr, float* buf, int64_t i0, int64_t i1) {
  constexpr int64_t kB = VecIO<float>::kBlock;
  fVec s0(0.0f), s1(0.0f);
  for (int64_t i = i0; i < i1; i += kB) {
    const int64_t n = std::min(kB, i1 - i);
    fVec a, b;
    load_block(xr + i, a, b, n);
    if constexpr (!std::is_same_v<T_x, float>) {
      a.store(buf + i);
      b.store(buf + i + fVec::size());
    }
    s0 = s0 + a;
    s1 = s1 + b;
  }
  return sum_lanes(s0 + s1);
}

// sum(x^2) over xr[i0, i1); bf16/fp16 rows are also widened into buf[i0, i1). i0 is a multiple of kBlock.
template <typename T_x>
C10_ALWAYS_INLINE float sum_squares_row(const T_x* xr, float* buf, int64_t i0, int64_t i1) {
  constexpr int64_t kB = VecIO<float>::kBlock;
  fVec s0(0.0f), s1(0.0f);
  for (int64_t i = i0; i < i1; i += kB) {
    const int64_t n = std::min(kB, i1 - i);
    fVec a, b;
    load_block(xr + i, a, b, n);  // lanes past n load as zero and add nothing
    if constexpr (!std::is_same_v<T_x, float>) {
      a.store(buf + i);
      b.store(buf + i + fVec::size());
    }
    s0 = at::vec::fmadd(a, a, s0);
    s1 = at::vec::fmadd(b, b, s1);
  }
  return sum_lanes(s0 + s1);
}

// The lane sums of d and d^2 for the deviations d = x - mean over row[i0, i1) (float32).
C10_ALWAYS_INLINE void sum_deviations(const float* row, const fVec& mean_v, int64_t i0, int64_t i1, fVec& sum_d,
                                      fVec& sum_q) {
  constexpr int64_t kB = VecIO<float>::kBlock;
  fVec c0(0.0f), c1(0.0f), q0(0.0f), q1(0.0f);
  for (int64_t i = i0; i < i1; i += kB) {
    const int64_t n = std::min(kB, i1 - i);
    fVec a, b;
    load_block(row + i, a, b, n);
    a = a - mean_v;
    b = b - mean_v;
    if (n < kB) mask_tail(a, b, n);
    c0 = c0 + a;
    c1 = c1 + b;
    q0 = at::vec::fmadd(a, a, q0);
    q1 = at::vec::fmadd(b, b, q1);
  }
  sum_d = c0 + c1;
  sum_q = q0 + q1;
}

template <typename T_x, typename T_m, typename T_out>
void adaln_rows(const AdalnKernelArgs& p) {
  constexpr int64_t kB = VecIO<float>::kBlock;
  constexpr bool kWiden = !std::is_same_v<T_x, float>;  // keep a float32 copy of the row
  const int64_t D = p.D;
  const T_x* x = static_cast<const T_x*>(p.x);
  const T_m* scale = static_cast<const T_m*>(p.scale);
  const T_m* shift = static_cast<const T_m*>(p.shift);
  T_out* out = static_cast<T_out*>(p.out);
  const float* w = p.weight;
  const float* bias = p.bias;
  const double eps = p.eps;
  const float d_f = static_cast<float>(D);
  static_assert(kSumChunk % kB == 0);
  // Round D up to whole blocks so full-block loads/stores of the buffer stay inside it.
  const int64_t buf_len = kWiden ? at::divup(D, kB) * kB : 0;

  const int64_t mod_len = at::divup(D, kB) * kB;

  at::parallel_for(0, p.rows, row_grain(D), [&](int64_t r0, int64_t r1) {
    std::unique_ptr<float[]> buf(kWiden ? new float[buf_len] : nullptr);
    // (1 + scale) and shift in float32 for the scale/shift rows at cached_off (none yet).
    std::unique_ptr<float[]> mod(new float[2 * mod_len]);
    float* const scale1 = mod.get();
    float* const shift_f = mod.get() + mod_len;
    int64_t cached_off[2] = {-1, -1};
    for (int64_t r = r0; r < r1; ++r) {
      int64_t off[3];
      p.layout->offsets(r, off);
      const T_x* xr = x + off[0];
      T_out* o = out + r * D;
      if (off[1] != cached_off[0] || off[2] != cached_off[1]) {
        const T_m* sc = scale + off[1];
        const fVec one(1.0f);
        for (int64_t j = 0; j < D; j += kB) {
          const int64_t n = std::min(kB, D - j);
          fVec sca, scb;
          load_block(sc + j, sca, scb, n);
          VecIO<float>::store(scale1 + j, one + sca, one + scb);  // whole blocks: padded buffers
          if (shift != nullptr) {
            fVec sha, shb;
            load_block(shift + off[2] + j, sha, shb, n);
            VecIO<float>::store(shift_f + j, sha, shb);
          }
        }
        cached_off[0] = off[1];
        cached_off[1] = off[2];
      }
      // The row as float32: x itself (float32), or the widened copy.
      const float* row = kWiden ? buf.get() : reinterpret_cast<const float*>(xr);

      // Pass 1: sum in float32 vectors (a row longer than kSumChunk adds its chunk sums in double).
      // Pass 2 (from cache): deviations d = x - mean. sum(d) corrects the float32 rounding of the mean (it
      // matters for rows whose mean is large against their spread), sum(d^2) gives the variance.
      // corr, applied as (x - mean) - corr: the float32 mean of a row near 1000 is off by up to 3e-5; its
      // correction is applied to the exact difference instead of being rounded into the mean.
      fVec mean_v(0.0f), corr(0.0f);
      fVec rstd;
      if (p.rms) {
        // RMSNorm: mean and corr stay 0. As eager: mean of squares in float32, + eps in float32.
        float ss;
        if (D <= kSumChunk) {
          ss = sum_squares_row(xr, buf.get(), 0, D);
        } else {
          double total = 0.0;
          for (int64_t c0 = 0; c0 < D; c0 += kSumChunk) {
            total += static_cast<double>(sum_squares_row(xr, buf.get(), c0, std::min(D, c0 + kSumChunk)));
          }
          ss = static_cast<float>(total);
        }
        rstd = fVec(1.0f / std::sqrt(ss / d_f + static_cast<float>(eps)));
      } else {
        double var;
        if (D <= kSumChunk) {
          mean_v = fVec(sum_row(xr, buf.get(), 0, D) / d_f);
          fVec lanes_d(0.0f), lanes_q(0.0f);
          sum_deviations(row, mean_v, 0, D, lanes_d, lanes_q);
          const float sum_d = sum_lanes(lanes_d);
          var = std::max(0.0f, (sum_lanes(lanes_q) - sum_d * (sum_d / d_f)) / d_f);
          corr = fVec(sum_d / d_f);
        } else {
          double sum_x = 0.0, sum_d = 0.0, sum_q = 0.0;
          for (int64_t c0 = 0; c0 < D; c0 += kSumChunk) {
            sum_x += static_cast<double>(sum_row(xr, buf.get(), c0, std::min(D, c0 + kSumChunk)));
          }
          const double d_d = static_cast<double>(D);
          mean_v = fVec(static_cast<float>(sum_x / d_d));
          for (int64_t c0 = 0; c0 < D; c0 += kSumChunk) {
            fVec lanes_d(0.0f), lanes_q(0.0f);
            sum_deviations(row, mean_v, c0, std::min(D, c0 + kSumChunk), lanes_d, lanes_q);
            sum_d += static_cast<double>(sum_lanes(lanes_d));
            sum_q += static_cast<double>(sum_lanes(lanes_q));
          }
          var = std::max(0.0, (sum_q - sum_d * (sum_d / d_d)) / d_d);
          corr = fVec(static_cast<float>(sum_d / d_d));
        }
        rstd = fVec(static_cast<float>(1.0 / std::sqrt(var + eps)));
      }

      // Pass 3: normalise, affine, modulate, one store.
      for (int64_t j = 0; j < D; j += kB) {
        const int64_t n = std::min(kB, D - j);
        fVec a, b;
        load_block(row + j, a, b, n);
        a = ((a - mean_v) - corr) * rstd;
        b = ((b - mean_v) - corr) * rstd;
        if (w != nullptr) {
          fVec wa, wb;
          load_block(w + j, wa, wb, n);
          a = a * wa;
          b = b * wb;
        }
        if (bias != nullptr) {
          fVec ba, bb;
          load_block(bias + j, ba, bb, n);
          a = a + ba;
          b = b + bb;
        }
        fVec sca, scb;
        VecIO<float>::load(scale1 + j, sca, scb);
        if (shift != nullptr) {
          fVec sha, shb;
          VecIO<float>::load(shift_f + j, sha, shb);
          a = at::vec::fmadd(a, sca, sha);
          b = at::vec::fmadd(b, scb, shb);
        } else {
          a = a * sca;
          b = b * scb;
        }
        store_block(o + j, a, b, n);
      }
    }
  });
}

template <typename T_x, typename T_m>
void adaln_dispatch_out(const AdalnKernelArgs& p) {
  FG_DISPATCH_FLOAT_TYPES(p.out_dtype, "fusegraph_adaln_out", [&] { adaln_rows<T_x, T_m, scalar_t>(p); });
}

void adaln_kernel(const AdalnKernelArgs& p) {
  FG_DISPATCH_FLOAT_TYPES(p.x_dtype, "fusegraph_adaln", [&] {
    // scale/shift come in x's dtype or float32 (the op upcasts any other mix).
    if (p.mod_dtype == p.x_dtype) {
      adaln_dispatch_out<scalar_t, scalar_t>(p);
    } else {
      TORCH_INTERNAL_ASSERT(p.mod_dtype == at::kFloat, "adaln: scale/shift dtype ", p.mod_dtype);
      adaln_dispatch_out<scalar_t, float>(p);
    }
  });
}

}  // namespace

FG_REGISTER_CPU_KERNEL(::fusegraph::adaln_stub, &adaln_kernel);

}  // namespace CPU_CAPABILITY
}  // namespace fusegraph::cpu
