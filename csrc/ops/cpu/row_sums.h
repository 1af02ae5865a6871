#pragma once
// Row sums of the CPU norm kernels (rms_norm, adaln), per CPU capability like vec_io.h: four float32 vector
// accumulators, two blocks per step (independent add/FMA chains); rows longer than kSumChunk are summed per
// chunk and the chunk sums added in double (one long run of float adds per lane lost fp32 accuracy at
// D >= 2^20: 4e-6 relative at D = 2^22).
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/macros/Macros.h>

#include <algorithm>
#include <cstdint>

#include "ops/cpu/vec_io.h"

namespace fusegraph::cpu {
inline namespace CPU_CAPABILITY {

// Elements per chunk of a long row's sum (a multiple of every capability's 2 * kBlock). A row of <= kSumChunk
// elements is one chunk.
constexpr int64_t kSumChunk = 4096;

// The lane sums of acc over xr[i0, i1): s = acc(s, a) for each block a. Lanes past i1 load as zero (acc must
// leave s unchanged for a zero lane). kWiden: the row is also stored widened to float32 into bp[i0, i1),
// whole blocks (bp is padded to whole blocks).
template <bool kWiden, typename T_x, typename Acc>
C10_ALWAYS_INLINE float sum_blocks(const T_x* xr, float* bp, int64_t i0, int64_t i1, Acc acc) {
  constexpr int64_t kB = VecIO<float>::kBlock;
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
    s0 = acc(s0, a);
    s1 = acc(s1, b);
    s2 = acc(s2, c);
    s3 = acc(s3, d);
  }
  for (; i < i1; i += kB) {
    fVec a, b;
    load_block(xr + i, a, b, std::min(kB, i1 - i));
    if constexpr (kWiden) VecIO<float>::store(bp + i, a, b);
    s0 = acc(s0, a);
    s1 = acc(s1, b);
  }
  return sum_lanes((s0 + s1) + (s2 + s3));
}

struct AddValues {
  C10_ALWAYS_INLINE fVec operator()(const fVec& s, const fVec& a) const { return s + a; }
};
struct AddSquares {
  C10_ALWAYS_INLINE fVec operator()(const fVec& s, const fVec& a) const { return at::vec::fmadd(a, a, s); }
};

// A row longer than kSumChunk: sum_blocks per chunk, the chunk sums added in double (kept out of line: the
// short-row path stays small).
template <bool kWiden, typename Acc, typename T_x>
C10_NOINLINE float sum_row_chunked(const T_x* xr, float* bp, int64_t D) {
  double total = 0.0;
  for (int64_t c0 = 0; c0 < D; c0 += kSumChunk) {
    total += static_cast<double>(sum_blocks<kWiden>(xr, bp, c0, std::min(D, c0 + kSumChunk), Acc{}));
  }
  return static_cast<float>(total);
}

// sum(x) or sum(x^2) (Acc: AddValues, AddSquares) over a row of D elements, in float32 (see above).
template <bool kWiden, typename Acc, typename T_x>
C10_ALWAYS_INLINE float sum_row(const T_x* xr, float* bp, int64_t D) {
  return D > kSumChunk ? sum_row_chunked<kWiden, Acc>(xr, bp, D) : sum_blocks<kWiden>(xr, bp, 0, D, Acc{});
}

}  // namespace CPU_CAPABILITY
}  // namespace fusegraph::cpu
