// CPU kernel of fusegraph::gemv: x [M, K] times the rows of weight [N, K]. Memory-bound for a few rows of x:
// each weight row is read once from memory, four at a time (four streams, each prefetched ahead), against x's
// rows held as float32 in a scratch buffer, two x rows per pass over the four weight rows (those stay in L1
// between passes). Each output is a float32 sum, bias added, one rounding. Parallel over blocks of weight rows.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <string>
#include <vector>

#include "ops/cpu/dtype_dispatch.h"
#include "ops/cpu/vec_io.h"
#include "ops/gemv.h"

namespace fusegraph::cpu {
inline namespace CPU_CAPABILITY {
namespace {

constexpr int64_t kRowsW = 4;  // weight rows per block
constexpr int64_t kRowsX = 2;  // x rows per pass
// Each weight row is prefetched 1 KiB ahead of the loads: four sequential streams alone left the hardware
// prefetchers short of requests in flight (FLUX.1-width bf16 modulation GEMVs, 1 x 3072 x 18432, 1 thread, on
// this project's AMD Zen 5: ~11 GB/s, as addmm; 17-25 GB/s with it; 2 KiB and 4 KiB ahead were slower again).
constexpr int64_t kPrefetchBytes = 1024;

// Which hint the prefetch carries is the microarchitecture's, not the ISA's, measured on each development machine
// (BENCHMARKS §1.3, §1.7): on Intel cores prefetchnta fills L1 only, bypassing L2, and the lines are gone before
// the next pass over the block reads them (an Intel Xeon, Sapphire Rapids class: 0.3-0.9x of addmm with it,
// 1.0-1.7x with prefetcht0); the kernel was tuned with prefetchnta on the Zen 5 (family 0x1A); on a Zen 4 (family
// 0x19) prefetcht1, into L2, reads the weight 15-35 % faster than prefetchnta at 1-2 rows (level at 4-8). So:
// prefetchnta on AMD family 0x1A and later, prefetcht1 on earlier AMD families, prefetcht0 elsewhere.
// FUSEGRAPH_GEMV_PREFETCH=nta|t0|t1|t2|none overrides the choice (read once per process): how the hints are
// compared on a new machine. Returned as __builtin_prefetch's locality (0 nta, 1 t2, 2 t1, 3 t0), or -1: none.
inline int prefetch_hint() {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  static const int hint = [] {
    const char* env = std::getenv("FUSEGRAPH_GEMV_PREFETCH");
    const std::string h = env ? env : "";
    if (h == "nta") return 0;
    if (h == "t2") return 1;
    if (h == "t1") return 2;
    if (h == "t0") return 3;
    if (h == "none") return -1;
    if (!h.empty()) {
      TORCH_WARN_ONCE("FUSEGRAPH_GEMV_PREFETCH: expected 'nta', 't0', 't1', 't2' or 'none', got '", h,
                      "'; using the CPU's default hint");
    }
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd") == 0) return 3;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return 0;
    const unsigned family = ((eax >> 8) & 0xF) + ((eax >> 20) & 0xFF);  // base + extended family (AMD's rule)
    return family >= 0x1A ? 0 : 2;
  }();
  return hint;
#else
  return 3;
#endif
}

template <int kHint, typename T>
inline void prefetch_ahead(const T* p, int64_t ahead) {
#if defined(__GNUC__) || defined(__clang__)
  // past a row's end: harmless
  if constexpr (kHint >= 0) __builtin_prefetch(p + ahead, 0, kHint);
#else
  (void)p;
  (void)ahead;
#endif
}

// GCC 12 warns that the shuffles of at::vec's lane reduction read an uninitialized vector when it inlines them
// here (arrays of Vectorized, every element assigned before use): a false positive, silenced for this function.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// out[m, n0 + j] for m in [m0, m0 + MX), j in [0, NW): MX x NW float32 dot products over K.
template <typename T, int MX, int NW, int kHint>
inline void block(const float* xf, int64_t k_pad, int64_t m0, const T* w, int64_t ldw, int64_t K, int64_t n0,
                  const T* bias, T* out, int64_t ldo) {
  using IO = VecIO<T>;
  fVec acc[MX][NW][2];
  for (int r = 0; r < MX; ++r)
    for (int j = 0; j < NW; ++j) acc[r][j][0] = acc[r][j][1] = fVec(0.0f);
  const int64_t k_full = K / IO::kBlock * IO::kBlock;
  constexpr int64_t ahead = kPrefetchBytes / static_cast<int64_t>(sizeof(T));
  for (int64_t k = 0; k < k_full; k += IO::kBlock) {
    fVec wa[NW], wb[NW];
    for (int j = 0; j < NW; ++j) {
      prefetch_ahead<kHint>(w + (n0 + j) * ldw + k, ahead);
      IO::load(w + (n0 + j) * ldw + k, wa[j], wb[j]);
    }
    for (int r = 0; r < MX; ++r) {
      const float* xr = xf + (m0 + r) * k_pad + k;
      const fVec xa = fVec::loadu(xr), xb = fVec::loadu(xr + fVec::size());
      for (int j = 0; j < NW; ++j) {
        acc[r][j][0] = at::vec::fmadd(wa[j], xa, acc[r][j][0]);
        acc[r][j][1] = at::vec::fmadd(wb[j], xb, acc[r][j][1]);
      }
    }
  }
  // The lane sums first, in a loop of constant trip counts the compiler unrolls: the K tail below indexes rows at
  // run time, and reading acc there kept the accumulators in memory (GCC 12 stored all of them to the stack on
  // every iteration of the loop above: 8 extra 64-byte stores per 8 loads, the kernel ~25 % slower).
  float sums[MX][NW];
  for (int r = 0; r < MX; ++r)
    for (int j = 0; j < NW; ++j) sums[r][j] = sum_lanes(acc[r][j][0] + acc[r][j][1]);
  for (int r = 0; r < MX; ++r) {
    for (int j = 0; j < NW; ++j) {
      float s = sums[r][j];
      const T* wr = w + (n0 + j) * ldw;
      for (int64_t k = k_full; k < K; ++k) s += xf[(m0 + r) * k_pad + k] * static_cast<float>(wr[k]);
      if (bias != nullptr) s += static_cast<float>(bias[n0 + j]);
      out[(m0 + r) * ldo + n0 + j] = static_cast<T>(s);
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

template <typename T, int NW, int kHint>
inline void rows(const float* xf, int64_t k_pad, int64_t M, const T* w, int64_t ldw, int64_t K, int64_t n0,
                 const T* bias, T* out, int64_t ldo) {
  int64_t m = 0;
  for (; m + kRowsX <= M; m += kRowsX) block<T, kRowsX, NW, kHint>(xf, k_pad, m, w, ldw, K, n0, bias, out, ldo);
  for (; m < M; ++m) block<T, 1, NW, kHint>(xf, k_pad, m, w, ldw, K, n0, bias, out, ldo);
}

template <typename T, int kHint>
void weight_blocks(const float* xf, int64_t k_pad, int64_t M, const T* w, int64_t ldw, int64_t K, int64_t N,
                   const T* b, T* o) {
  const int64_t blocks = at::divup(N, kRowsW);
  // about 64 Ki weight elements per task
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, kRowsW * K));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t n0 = blk * kRowsW;
      if (n0 + kRowsW <= N) {
        rows<T, kRowsW, kHint>(xf, k_pad, M, w, ldw, K, n0, b, o, N);
      } else {
        for (int64_t n = n0; n < N; ++n) rows<T, 1, kHint>(xf, k_pad, M, w, ldw, K, n, b, o, N);
      }
    }
  });
}

template <typename T>
void run(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::Tensor& out) {
  using IO = VecIO<T>;
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const int64_t k_pad = at::divup(K, IO::kBlock) * IO::kBlock;
  // x in float32, each row zero-padded to whole blocks, 64-byte aligned: a vector load of x that straddles two
  // cache lines costs two loads, on every step of the loop over the weight
  constexpr int64_t kAlign = 64 / sizeof(float);
  std::vector<float> xf_buf(M * k_pad + kAlign, 0.0f);
  float* xf = xf_buf.data() + (kAlign - reinterpret_cast<uintptr_t>(xf_buf.data()) / sizeof(float) % kAlign) % kAlign;
  const T* xp = x.const_data_ptr<T>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xf[m * k_pad + k] = static_cast<float>(xp[m * x.stride(0) + k]);
  const T* w = weight.const_data_ptr<T>();
  const T* b = bias.defined() ? bias.const_data_ptr<T>() : nullptr;
  T* o = out.mutable_data_ptr<T>();
  switch (prefetch_hint()) {
    case 0: weight_blocks<T, 0>(xf, k_pad, M, w, weight.stride(0), K, N, b, o); break;
    case 1: weight_blocks<T, 1>(xf, k_pad, M, w, weight.stride(0), K, N, b, o); break;
    case 2: weight_blocks<T, 2>(xf, k_pad, M, w, weight.stride(0), K, N, b, o); break;
    case 3: weight_blocks<T, 3>(xf, k_pad, M, w, weight.stride(0), K, N, b, o); break;
    default: weight_blocks<T, -1>(xf, k_pad, M, w, weight.stride(0), K, N, b, o); break;
  }
}

void gemv_kernel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::Tensor& out) {
  FG_DISPATCH_FLOAT_TYPES(x.scalar_type(), "fusegraph_gemv", [&] { run<scalar_t>(x, weight, bias, out); });
}

}  // namespace

FG_REGISTER_CPU_KERNEL(::fusegraph::gemv_stub, &gemv_kernel);

}  // namespace CPU_CAPABILITY
}  // namespace fusegraph::cpu
