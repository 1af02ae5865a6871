// Compiled once per CPU capability (see isa_dispatch.h). Adaptive norm modulation over rows of D elements:
// y = norm(x)[*w + b] * (1 + scale) [+ shift], float32 math, one rounding at the store.
// LayerNorm, per row: pass 1 reads x from memory and sums it; pass 2 sums d = x - mean and d^2 from cache
// (corrected two-pass variance: accurate for rows with a large mean, unlike E[x^2] - mean^2); pass 3 reads x
// again from cache, normalises, modulates and writes. bf16/fp16 rows are widened to float32 at each read (a
// float32 copy of the row, kept before, made the per-row working set outgrow L1 with the modulation).
// RMSNorm: pass 1 sums x^2; no pass 2; 1 / sqrt(sum / D + eps) in float32 as fusegraph.rms_norm (and eager)
// compute it; pass 3 as above, without centring.
// Rows longer than kSumChunk sum passes 1 and 2 per chunk in float32 vectors and add the chunk sums in double
// (one long run of float adds per lane lost fp32 accuracy at D >= 2^20: 1e-5 relative at 2^22).
// scale/shift are usually one [D] vector broadcast over all rows (AdaLN's [B, 1, D]): each task folds the
// affine into the modulation once for the rows that share them, mul = w * (1 + scale) and
// add = b * (1 + scale) + shift, as float32 vectors (same values for every row, so the results are bitwise
// those of the per-row computation); pass 3 is then one fmadd per element (a multiply without shift and bias).
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>

#include "ops/adaln.h"
#include "ops/cpu/dtype_dispatch.h"
#include "ops/cpu/row_sums.h"
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

// The lane sums of d and d^2 for the deviations d = x - mean over xr[i0, i1) (read again from cache).
template <typename T_x>
C10_ALWAYS_INLINE void sum_deviations(const T_x* xr, const fVec& mean_v, int64_t i0, int64_t i1, fVec& sum_d,
                                      fVec& sum_q) {
  constexpr int64_t kB = VecIO<float>::kBlock;
  fVec c0(0.0f), c1(0.0f), q0(0.0f), q1(0.0f);
  for (int64_t i = i0; i < i1; i += kB) {
    const int64_t n = std::min(kB, i1 - i);
    fVec a, b;
    load_block(xr + i, a, b, n);
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

// A row's statistics: pass 3 computes ((x - mean) - corr) * rstd (LayerNorm) or x * rstd (RMSNorm; mean and
// corr stay 0).
struct RowStats {
  fVec mean{0.0f};
  fVec corr{0.0f};
  fVec rstd;
};

// Passes 1 and 2 of one row.
// Pass 1: sum in float32 vectors (a row longer than kSumChunk adds its chunk sums in double).
// Pass 2 (from cache): deviations d = x - mean. sum(d) corrects the float32 rounding of the mean (it
// matters for rows whose mean is large against their spread), sum(d^2) gives the variance.
// corr, applied as (x - mean) - corr: the float32 mean of a row near 1000 is off by up to 3e-5; its
// correction is applied to the exact difference instead of being rounded into the mean.
// A LayerNorm row whose float32 sum of squared deviations overflowed (|x - mean| above ~1.8e19): the statistics
// again in double, element by element (rare; the float32 sums gave var = inf, so rstd = 0 and the row became
// `shift`, where the float64 result is finite and eager's is NaN). A row holding inf or NaN stays NaN.
template <typename T_x>
C10_NOINLINE RowStats row_stats_double(const T_x* xr, int64_t D, double eps) {
  double sum_x = 0.0;
  for (int64_t i = 0; i < D; ++i) sum_x += static_cast<double>(static_cast<float>(xr[i]));
  const double d_d = static_cast<double>(D);
  const float mean = static_cast<float>(sum_x / d_d);
  double sum_d = 0.0, sum_q = 0.0;
  for (int64_t i = 0; i < D; ++i) {
    const double d = static_cast<double>(static_cast<float>(xr[i])) - static_cast<double>(mean);
    sum_d += d;
    sum_q += d * d;
  }
  RowStats st;
  st.mean = fVec(mean);
  st.corr = fVec(static_cast<float>(sum_d / d_d));
  st.rstd = fVec(static_cast<float>(1.0 / std::sqrt(std::max(0.0, (sum_q - sum_d * (sum_d / d_d)) / d_d) + eps)));
  return st;
}

template <typename T_x>
C10_ALWAYS_INLINE RowStats row_stats(const T_x* xr, int64_t D, double eps, bool rms) {
  const float d_f = static_cast<float>(D);
  RowStats st;
  if (rms) {
    // RMSNorm: as eager, mean of squares in float32, + eps in float32.
    const float ss = sum_row<false, AddSquares>(xr, nullptr, D);
    st.rstd = fVec(1.0f / std::sqrt(ss / d_f + static_cast<float>(eps)));
    return st;
  }
  double var;
  if (D <= kSumChunk) {
    st.mean = fVec(sum_blocks<false>(xr, nullptr, 0, D, AddValues{}) / d_f);
    fVec lanes_d(0.0f), lanes_q(0.0f);
    sum_deviations(xr, st.mean, 0, D, lanes_d, lanes_q);
    const float sum_d = sum_lanes(lanes_d);
    var = std::max(0.0f, (sum_lanes(lanes_q) - sum_d * (sum_d / d_f)) / d_f);
    st.corr = fVec(sum_d / d_f);
  } else {
    double sum_x = 0.0, sum_d = 0.0, sum_q = 0.0;
    for (int64_t c0 = 0; c0 < D; c0 += kSumChunk) {
      sum_x += static_cast<double>(sum_blocks<false>(xr, nullptr, c0, std::min(D, c0 + kSumChunk), AddValues{}));
    }
    const double d_d = static_cast<double>(D);
    st.mean = fVec(static_cast<float>(sum_x / d_d));
    for (int64_t c0 = 0; c0 < D; c0 += kSumChunk) {
      fVec lanes_d(0.0f), lanes_q(0.0f);
      sum_deviations(xr, st.mean, c0, std::min(D, c0 + kSumChunk), lanes_d, lanes_q);
      sum_d += static_cast<double>(sum_lanes(lanes_d));
      sum_q += static_cast<double>(sum_lanes(lanes_q));
    }
    var = std::max(0.0, (sum_q - sum_d * (sum_d / d_d)) / d_d);
    st.corr = fVec(static_cast<float>(sum_d / d_d));
  }
  if (std::isinf(var)) return row_stats_double(xr, D, eps);
  st.rstd = fVec(static_cast<float>(1.0 / std::sqrt(var + eps)));
  return st;
}

// Rows [r0, r1) of one parallel task. Every value the loops read is a local of this function: captured by
// reference in the parallel_for lambda, they were reloaded from memory for every block (vector stores may alias
// anything). Short rows go in groups of row_group(D): the statistics of every row of the group, then pass 3 of
// each. A LayerNorm row's statistics are a chain of horizontal sums, divisions and a double square root (~150
// cycles for a 128-wide row whose loads take ~10); independent rows let those chains overlap. Each row is
// computed exactly as alone.
template <typename T_x, typename T_m, typename T_out>
void adaln_task(const AdalnKernelArgs& p, int64_t r0, int64_t r1) {
  constexpr int64_t kB = VecIO<float>::kBlock;
  static_assert(kSumChunk % kB == 0);
  const int64_t D = p.D;
  const T_x* const x = static_cast<const T_x*>(p.x);
  const T_m* const scale = static_cast<const T_m*>(p.scale);
  const T_m* const shift = static_cast<const T_m*>(p.shift);
  T_out* const out = static_cast<T_out*>(p.out);
  const float* const w = p.weight;
  const float* const bias = p.bias;
  const double eps = p.eps;
  const bool rms = p.rms;
  const bool has_add = shift != nullptr || bias != nullptr;
  // Round D up to whole blocks so full-block stores/loads of the cached vectors stay inside them.
  const int64_t mod_len = at::divup(D, kB) * kB;
  const int64_t group = row_group(D);

  // The modulation folded with the affine, in float32, for the scale/shift rows at cached_off (none yet):
  // mul = w * (1 + scale) and add = b * (1 + scale) + shift (w = 1, b = 0, shift = 0 when absent), so
  // pass 3 reads two cached vectors besides x's row (reading w, b, 1 + scale, shift and a widened row there,
  // a 3072-wide row's working set outgrew L1: bf16 RMSNorm modulation ran at 1.9x fusegraph.rms_norm's time).
  std::unique_ptr<float[]> mod(new float[2 * mod_len]);
  float* const mul_f = mod.get();
  float* const add_f = mod.get() + mod_len;
  int64_t cached_off[2] = {-1, -1};
  const auto fold_modulation = [&](int64_t scale_off, int64_t shift_off) {
    const T_m* sc = scale + scale_off;
    const fVec one(1.0f);
    for (int64_t j = 0; j < D; j += kB) {
      const int64_t n = std::min(kB, D - j);
      fVec sca, scb;
      load_block(sc + j, sca, scb, n);
      const fVec s1a = one + sca, s1b = one + scb;
      fVec ma = s1a, mb = s1b;
      if (w != nullptr) {
        fVec wa, wb;
        load_block(w + j, wa, wb, n);
        ma = wa * s1a;
        mb = wb * s1b;
      }
      VecIO<float>::store(mul_f + j, ma, mb);  // whole blocks: padded buffers
      if (has_add) {
        fVec aa(0.0f), ab(0.0f);
        if (shift != nullptr) load_block(shift + shift_off + j, aa, ab, n);
        if (bias != nullptr) {
          fVec ba, bb;
          load_block(bias + j, ba, bb, n);
          aa = at::vec::fmadd(ba, s1a, aa);
          ab = at::vec::fmadd(bb, s1b, ab);
        }
        VecIO<float>::store(add_f + j, aa, ab);
      }
    }
    cached_off[0] = scale_off;
    cached_off[1] = shift_off;
  };

  // Pass 3 (x again, from cache): normalise — the LayerNorm row centred, the RMSNorm row only scaled —, then
  // the affine and the modulation as one fmadd (n * mul + add), one store.
  const auto modulate = [&](const T_x* src, T_out* o, const RowStats& st, auto centre) {
    // Register copies: read through `st` (a stack array), they were loaded from memory for every block.
    const fVec mean = st.mean, corr = st.corr, rstd = st.rstd;
    for (int64_t j = 0; j < D; j += kB) {
      const int64_t n = std::min(kB, D - j);
      fVec a, b;
      load_block(src + j, a, b, n);
      if constexpr (decltype(centre)::value) {
        a = ((a - mean) - corr) * rstd;
        b = ((b - mean) - corr) * rstd;
      } else {
        a = a * rstd;
        b = b * rstd;
      }
      fVec ma, mb;
      VecIO<float>::load(mul_f + j, ma, mb);
      if (has_add) {
        fVec aa, ab;
        VecIO<float>::load(add_f + j, aa, ab);
        a = at::vec::fmadd(a, ma, aa);
        b = at::vec::fmadd(b, mb, ab);
      } else {
        a = a * ma;
        b = b * mb;
      }
      store_block(o + j, a, b, n);
    }
  };

  RowOffsets::Cursor cursor(*p.layout, r0);
  for (int64_t r = r0; r < r1; r += group) {
    const int64_t g = std::min(group, r1 - r);
    // One array per tensor: a row's three offsets copied side by side were merged into one 16-byte load of the
    // cursor, just written by next() in 8-byte stores - a failed store-to-load forward, which waits for every
    // store before it, the previous rows' output stores missing cache included (2x a copy's time at 2^22).
    int64_t off_x[kMaxRowGroup], off_scale[kMaxRowGroup], off_shift[kMaxRowGroup];
    RowStats st[kMaxRowGroup];
    for (int64_t k = 0; k < g; ++k) {
      off_x[k] = cursor[0];
      off_scale[k] = cursor[1];
      off_shift[k] = cursor[2];
      cursor.next();
      st[k] = row_stats(x + off_x[k], D, eps, rms);
    }
    for (int64_t k = 0; k < g; ++k) {
      if (off_scale[k] != cached_off[0] || off_shift[k] != cached_off[1]) fold_modulation(off_scale[k], off_shift[k]);
      if (rms) {
        modulate(x + off_x[k], out + (r + k) * D, st[k], std::false_type{});
      } else {
        modulate(x + off_x[k], out + (r + k) * D, st[k], std::true_type{});
      }
    }
  }
}

template <typename T_x, typename T_m, typename T_out>
void adaln_rows(const AdalnKernelArgs& p) {
  at::parallel_for(0, p.rows, row_grain(p.D),
                   [&p](int64_t r0, int64_t r1) { adaln_task<T_x, T_m, T_out>(p, r0, r1); });
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
