// Compiled once per CPU capability (see isa_dispatch.h). RMSNorm over rows of D elements: float32 math,
// one rounding to the output dtype (plus the diffusers rounding points when asked for).
// Per row: pass 1 reads the row from memory and accumulates sum(x^2) in four vector accumulators (rows
// longer than kSumChunk: per chunk, the chunk sums added in double; one long run of float adds per lane
// lost fp32 accuracy at D >= 2^20, 4e-6 relative at D = 2^22); pass 2 reads it again from cache (a row of
// <= 12288 elements fits in L1/L2) and writes the output.
// bf16/fp16 rows are widened once in pass 1 into a per-task float32 buffer that pass 2 reads, so each
// element is converted once, not twice.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>

#include "ops/cpu/dtype_dispatch.h"
#include "ops/cpu/vec_io.h"
#include "ops/rms_norm.h"

namespace fusegraph::cpu {
inline namespace CPU_CAPABILITY {
namespace {

// Round both halves of a block to R (bf16 / fp16) and back: the rounding an eager cast would do.
template <typename R>
inline void round_through(fVec& a, fVec& b) {
  std::tie(a, b) = at::vec::convert_to_float<R>(at::vec::convert_from_float<R>(a, b));
}


// Elements per chunk of pass 1's sum (a multiple of every capability's 2 * kBlock). A row of <= kSumChunk
// elements is one chunk, summed as before chunking; longer rows add one horizontal sum per chunk.
constexpr int64_t kSumChunk = 4096;

// sum(x^2) over xr[i0, i1) in four vector accumulators; bf16/fp16 rows are also widened into bp[i0, i1).
// i0 is a multiple of 2 * kBlock; lanes past i1 load as zero and add nothing.
template <typename T_x>
C10_ALWAYS_INLINE float sum_squares(const T_x* xr, float* bp, int64_t i0, int64_t i1) {
  constexpr int64_t kB = VecIO<float>::kBlock;
  constexpr bool kWiden = !std::is_same_v<T_x, float>;
  fVec s0(0.0f), s1(0.0f), s2(0.0f), s3(0.0f);
  int64_t i = i0;
  for (; i + 2 * kB <= i1; i += 2 * kB) {
    fVec a, b, c, d;
    VecIO<T_x>::load(xr + i, a, b);
    VecIO<T_x>::load(xr + i + kB, c, d);
    if constexpr (kWiden) {
      VecIO<float>::store(bp + i, a, b);
      VecIO<float>::store(bp + i + kB, c, d);
    }
    s0 = at::vec::fmadd(a, a, s0);
    s1 = at::vec::fmadd(b, b, s1);
    s2 = at::vec::fmadd(c, c, s2);
    s3 = at::vec::fmadd(d, d, s3);
  }
  for (; i < i1; i += kB) {
    fVec a, b;
    load_block(xr + i, a, b, std::min(kB, i1 - i));
    if constexpr (kWiden) VecIO<float>::store(bp + i, a, b);  // whole block: the buffer is padded
    s0 = at::vec::fmadd(a, a, s0);
    s1 = at::vec::fmadd(b, b, s1);
  }
  return sum_lanes((s0 + s1) + (s2 + s3));
}

// A row longer than kSumChunk: sum_squares per chunk, the chunk sums added in double.
template <typename T_x>
C10_NOINLINE float sum_squares_chunked(const T_x* xr, float* bp, int64_t D) {
  double total = 0.0;
  for (int64_t c0 = 0; c0 < D; c0 += kSumChunk) {
    total += static_cast<double>(sum_squares(xr, bp, c0, std::min(D, c0 + kSumChunk)));
  }
  return static_cast<float>(total);
}

// Rows [r0, r1) of one parallel task. Every value the loops read is a local of this function: captured by
// reference in the parallel_for lambda, they were reloaded from memory for every block (vector stores may alias
// anything), and a 128-wide float32 row took ~2x the time of Inductor's loop.
// Short rows go in groups of row_group(D): pass 1 of every row of the group, then pass 2 of each. A row's
// statistic is a chain of a horizontal sum, a division, a square root and a reciprocal (~60 cycles for a 128-wide
// row whose loads take ~10); independent rows let those chains overlap. Each row is computed exactly as alone.
template <typename T_x, typename T_out>
void rms_norm_task(const RmsNormKernelArgs& p, int64_t r0, int64_t r1) {
  static_assert(VecIO<T_x>::kBlock == VecIO<T_out>::kBlock && VecIO<T_x>::kBlock == VecIO<float>::kBlock);
  constexpr int64_t kB = VecIO<float>::kBlock;
  static_assert(kSumChunk % (2 * kB) == 0);
  const int64_t D = p.D;
  const T_x* const x = static_cast<const T_x*>(p.x);
  T_out* const out = static_cast<T_out*>(p.out);
  const float* const w = p.weight;
  const float* const bias = p.bias;
  const bool round_bf16 = p.round_dtype == at::kBFloat16;
  const bool round_half = p.round_dtype == at::kHalf;
  const float eps = static_cast<float>(p.eps);  // eager: float32 mean + eps in float32
  const float d_f = static_cast<float>(D);
  constexpr bool kWiden = !std::is_same_v<T_x, float>;  // keep a float32 copy of the row
  // Whole blocks, so full-block loads/stores of the buffer stay inside it.
  const int64_t buf_len = kWiden ? at::divup(D, kB) * kB : 0;
  const int64_t group = row_group(D);
  std::unique_ptr<float[]> buf(kWiden ? new float[group * buf_len] : nullptr);

  RowOffsets::Cursor cursor(*p.layout, r0);
  for (int64_t r = r0; r < r1; r += group) {
    const int64_t g = std::min(group, r1 - r);
    const T_x* xr[kMaxRowGroup];
    fVec rstd[kMaxRowGroup];
    // Pass 1: sum of squares in four float32 vector accumulators (lanes past the row's end load as zero and add
    // nothing; a row longer than kSumChunk sums per chunk and adds the chunk sums in double). bf16/fp16 rows
    // are widened into the buffer on the way.
    for (int64_t k = 0; k < g; ++k) {
      xr[k] = x + cursor[0];
      cursor.next();
      float* const bp = buf.get() + k * buf_len;
      const float ss = D > kSumChunk ? sum_squares_chunked(xr[k], bp, D) : sum_squares(xr[k], bp, 0, D);
      // As eager: mean in float32, + eps in float32, reciprocal square root.
      rstd[k] = fVec(1.0f / std::sqrt(ss / d_f + eps));
    }
    // Pass 2: normalise, weight, bias, one store (the row is in cache now: x itself, or its widened copy).
    for (int64_t k = 0; k < g; ++k) {
      const float* const row = kWiden ? buf.get() + k * buf_len : reinterpret_cast<const float*>(xr[k]);
      T_out* const o = out + (r + k) * D;
      const fVec scale = rstd[k];  // a register copy: read from the array, it was loaded for every block
      for (int64_t j = 0; j < D; j += kB) {
        const int64_t n = std::min(kB, D - j);
        fVec a, b;
        load_block(row + j, a, b, n);
        a = a * scale;
        b = b * scale;
        if (w != nullptr) {
          // diffusers: the normalised value is cast to the (half) weight dtype before the multiply.
          if (round_bf16) round_through<c10::BFloat16>(a, b);
          if (round_half) round_through<c10::Half>(a, b);
          fVec wa, wb;
          load_block(w + j, wa, wb, n);
          a = a * wa;
          b = b * wb;
        }
        if (bias != nullptr) {
          // diffusers: the product is a half tensor before the bias is added.
          if (round_bf16) round_through<c10::BFloat16>(a, b);
          if (round_half) round_through<c10::Half>(a, b);
          fVec ba, bb;
          load_block(bias + j, ba, bb, n);
          a = a + ba;
          b = b + bb;
        }
        store_block(o + j, a, b, n);
      }
    }
  }
}

template <typename T_x, typename T_out>
void rms_norm_rows(const RmsNormKernelArgs& p) {
  at::parallel_for(0, p.rows, row_grain(p.D), [&p](int64_t r0, int64_t r1) { rms_norm_task<T_x, T_out>(p, r0, r1); });
}

void rms_norm_kernel(const RmsNormKernelArgs& p) {
  FG_DISPATCH_FLOAT_TYPES(p.x_dtype, "fusegraph_rms_norm", [&] {
    using x_t = scalar_t;
    FG_DISPATCH_FLOAT_TYPES(p.out_dtype, "fusegraph_rms_norm_out", [&] { rms_norm_rows<x_t, scalar_t>(p); });
  });
}

}  // namespace

FG_REGISTER_CPU_KERNEL(::fusegraph::rms_norm_stub, &rms_norm_kernel);

}  // namespace CPU_CAPABILITY
}  // namespace fusegraph::cpu
