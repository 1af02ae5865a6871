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
#include "ops/cpu/row_sums.h"
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
      const float ss = sum_row<kWiden, AddSquares>(xr[k], bp, D);
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
