// CPU kernel of fusegraph::kv_attention: one task per (batch, head, query) row. The row's scores over the cache
// and the new keys go to a float32 scratch row, softmax in float32 (max-subtracted exp), then the weighted sum of
// the value rows in float32 and one rounding to the output dtype. Keys and values are read in place from the
// two pieces: the concatenation is never built. Rows of up to kMaxRegBlocks blocks (head_dim <= 128 for float32
// with AVX512, <= 64 with AVX2) keep the query and the value accumulators in registers, four keys per dot-product
// step; longer rows run the same math through a float32 scratch row.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/kv_attention.h"
#include "ops/cpu/dtype_dispatch.h"
#include "ops/cpu/vec_io.h"

namespace fusegraph::cpu {
inline namespace CPU_CAPABILITY {
namespace {

// A rows x len view: row r starts at base + r * row_stride (the last dim contiguous).
template <typename T>
struct Rows {
  const T* base;
  int64_t row_stride;
  const T* row(int64_t r) const { return base + r * row_stride; }
};

// dot(qf, k[0:d]): qf is float32, zero-padded to whole blocks; k's lanes past d load as zero.
template <typename T>
inline float dot(const float* qf, const T* k, int64_t d) {
  using IO = VecIO<T>;
  fVec acc0(0.0f), acc1(0.0f), a, b;
  int64_t j = 0;
  for (; j + IO::kBlock <= d; j += IO::kBlock) {
    IO::load(k + j, a, b);
    acc0 = at::vec::fmadd(a, fVec::loadu(qf + j), acc0);
    acc1 = at::vec::fmadd(b, fVec::loadu(qf + j + fVec::size()), acc1);
  }
  if (j < d) {
    IO::load(k + j, a, b, d - j);
    acc0 = at::vec::fmadd(a, fVec::loadu(qf + j), acc0);
    acc1 = at::vec::fmadd(b, fVec::loadu(qf + j + fVec::size()), acc1);
  }
  return sum_lanes(acc0 + acc1);
}

// acc[0:d] += p * v[0:d]; acc is zero-padded to whole blocks.
template <typename T>
inline void axpy(float* acc, float p, const T* v, int64_t d) {
  using IO = VecIO<T>;
  const fVec pv(p);
  fVec a, b;
  int64_t j = 0;
  for (; j + IO::kBlock <= d; j += IO::kBlock) {
    IO::load(v + j, a, b);
    at::vec::fmadd(a, pv, fVec::loadu(acc + j)).store(acc + j);
    at::vec::fmadd(b, pv, fVec::loadu(acc + j + fVec::size())).store(acc + j + fVec::size());
  }
  if (j < d) {
    IO::load(v + j, a, b, d - j);
    at::vec::fmadd(a, pv, fVec::loadu(acc + j)).store(acc + j);
    at::vec::fmadd(b, pv, fVec::loadu(acc + j + fVec::size())).store(acc + j + fVec::size());
  }
}

// GCC 12 warns that at::vec's AVX512 shuffles and conversions read an uninitialized vector when it inlines them
// below (lane reductions, arrays of Vectorized; every element is assigned before use): a false positive, as in gemv.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// The row's softmax weights in place over s[0:n] (float32); returns 1 / their sum.
inline float softmax_in_place(float* s, int64_t n) {
  const int64_t V = fVec::size();
  fVec mx(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + V <= n; j += V) mx = at::vec::maximum(mx, fVec::loadu(s + j));
  float m = at::vec::vec_reduce_all<float>([](const fVec& a, const fVec& b) { return at::vec::maximum(a, b); }, mx);
  for (; j < n; ++j) m = std::isnan(s[j]) ? s[j] : std::max(m, s[j]);  // NaN propagates, as in the vector part
  const fVec mv(m);
  fVec total(0.0f);
  j = 0;
  for (; j + V <= n; j += V) {
    const fVec e = (fVec::loadu(s + j) - mv).exp();
    e.store(s + j);
    total = total + e;
  }
  float sum = sum_lanes(total);
  if (j < n) {
    const fVec e = (fVec::loadu(s + j, n - j) - mv).exp();
    e.store(s + j, n - j);
    float tail[fVec::size()];
    e.store(tail, n - j);
    for (int64_t t = 0; t < n - j; ++t) sum += tail[t];
  }
  return 1.0f / sum;
}

constexpr int kMaxRegBlocks = 4;


// A row of d <= NB * kBlock elements as NB pairs of float32 vectors; lanes past d are zero.
template <typename T, int NB>
inline void load_row(const T* row, int64_t d, fVec (&a)[NB], fVec (&b)[NB]) {
  for (int i = 0; i + 1 < NB; ++i) VecIO<T>::load(row + i * VecIO<T>::kBlock, a[i], b[i]);
  load_block(row + (NB - 1) * VecIO<T>::kBlock, a[NB - 1], b[NB - 1], d - (NB - 1) * VecIO<T>::kBlock);
}

// s[j] = dot(q, k.row(j)) for j < n, four keys per step (four independent chains, then four lane sums).
template <typename T, int NB>
inline void dots(const fVec (&qa)[NB], const fVec (&qb)[NB], const Rows<T>& k, int64_t n, int64_t d, float* s) {
  constexpr int kKeys = 4;
  int64_t j = 0;
  for (; j + kKeys <= n; j += kKeys) {
    fVec acc[kKeys];
    for (int t = 0; t < kKeys; ++t) {
      fVec a[NB], b[NB];
      load_row<T, NB>(k.row(j + t), d, a, b);
      fVec x = a[0] * qa[0];
      x = at::vec::fmadd(b[0], qb[0], x);
      for (int i = 1; i < NB; ++i) x = at::vec::fmadd(b[i], qb[i], at::vec::fmadd(a[i], qa[i], x));
      acc[t] = x;
    }
    for (int t = 0; t < kKeys; ++t) s[j + t] = sum_lanes(acc[t]);
  }
  for (; j < n; ++j) {
    fVec a[NB], b[NB];
    load_row<T, NB>(k.row(j), d, a, b);
    fVec x = a[0] * qa[0];
    x = at::vec::fmadd(b[0], qb[0], x);
    for (int i = 1; i < NB; ++i) x = at::vec::fmadd(b[i], qb[i], at::vec::fmadd(a[i], qa[i], x));
    s[j] = sum_lanes(x);
  }
}

// acc += sum_j p[j] * v.row(j) over j < n; even and odd keys go to separate accumulators (two chains).
template <typename T, int NB>
inline void weighted_sum(const float* p, const Rows<T>& v, int64_t n, int64_t d, fVec (&acc)[2][NB][2]) {
  int64_t j = 0;
  for (; j + 2 <= n; j += 2) {
    for (int t = 0; t < 2; ++t) {
      fVec a[NB], b[NB];
      load_row<T, NB>(v.row(j + t), d, a, b);
      const fVec pv(p[j + t]);
      for (int i = 0; i < NB; ++i) {
        acc[t][i][0] = at::vec::fmadd(a[i], pv, acc[t][i][0]);
        acc[t][i][1] = at::vec::fmadd(b[i], pv, acc[t][i][1]);
      }
    }
  }
  if (j < n) {
    fVec a[NB], b[NB];
    load_row<T, NB>(v.row(j), d, a, b);
    const fVec pv(p[j]);
    for (int i = 0; i < NB; ++i) {
      acc[0][i][0] = at::vec::fmadd(a[i], pv, acc[0][i][0]);
      acc[0][i][1] = at::vec::fmadd(b[i], pv, acc[0][i][1]);
    }
  }
}

// One (batch, head, query) row with D <= NBK * kBlock and Dv <= NBV * kBlock: q and the output in registers.
template <typename T, int NBK, int NBV>
inline void row_in_registers(const T* qrow, float sc, const Rows<T>& kc, const Rows<T>& kn, const Rows<T>& vc,
                             const Rows<T>& vn, int64_t cached, int64_t added, int64_t D, int64_t Dv, float* scores,
                             T* orow) {
  using IO = VecIO<T>;
  fVec qa[NBK], qb[NBK];
  load_row<T, NBK>(qrow, D, qa, qb);
  const fVec scv(sc);
  for (int i = 0; i < NBK; ++i) {
    qa[i] = qa[i] * scv;
    qb[i] = qb[i] * scv;
  }
  dots<T, NBK>(qa, qb, kc, cached, D, scores);
  dots<T, NBK>(qa, qb, kn, added, D, scores + cached);
  const float inv = softmax_in_place(scores, cached + added);
  fVec acc[2][NBV][2];
  for (int t = 0; t < 2; ++t)
    for (int i = 0; i < NBV; ++i) acc[t][i][0] = acc[t][i][1] = fVec(0.0f);
  weighted_sum<T, NBV>(scores, vc, cached, Dv, acc);
  weighted_sum<T, NBV>(scores + cached, vn, added, Dv, acc);
  const fVec iv(inv);
  for (int i = 0; i < NBV; ++i) {
    store_block(orow + i * IO::kBlock, (acc[0][i][0] + acc[1][i][0]) * iv, (acc[0][i][1] + acc[1][i][1]) * iv,
                std::min<int64_t>(IO::kBlock, Dv - i * IO::kBlock));
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// row_in_registers for the row's block counts, or nullptr when either is over kMaxRegBlocks.
template <typename T>
using RowFn = void (*)(const T*, float, const Rows<T>&, const Rows<T>&, const Rows<T>&, const Rows<T>&, int64_t,
                       int64_t, int64_t, int64_t, float*, T*);

template <typename T, int NBK>
RowFn<T> pick_value_blocks(int64_t nbv) {
  switch (nbv) {
    case 1: return &row_in_registers<T, NBK, 1>;
    case 2: return &row_in_registers<T, NBK, 2>;
    case 3: return &row_in_registers<T, NBK, 3>;
    case 4: return &row_in_registers<T, NBK, 4>;
    default: return nullptr;
  }
}

template <typename T>
RowFn<T> pick_row_fn(int64_t nbk, int64_t nbv) {
  static_assert(kMaxRegBlocks == 4, "the switches below list the block counts");
  switch (nbk) {
    case 1: return pick_value_blocks<T, 1>(nbv);
    case 2: return pick_value_blocks<T, 2>(nbv);
    case 3: return pick_value_blocks<T, 3>(nbv);
    case 4: return pick_value_blocks<T, 4>(nbv);
    default: return nullptr;
  }
}

template <typename T>
void run(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& k_new, const at::Tensor& v_cache,
         const at::Tensor& v_new, double scale, const KvAttentionShape& s, at::Tensor& out) {
  using IO = VecIO<T>;
  const int64_t L = s.cached + s.added, D = s.dim, Dv = s.value_dim;
  const int64_t d_pad = at::divup(D, IO::kBlock) * IO::kBlock, dv_pad = at::divup(Dv, IO::kBlock) * IO::kBlock;
  const int64_t rows = s.batch * s.heads * s.queries;
  const T* qp = q.const_data_ptr<T>();
  T* op = out.mutable_data_ptr<T>();
  const float sc = static_cast<float>(scale);
  // rows of about 32 Ki elements read per task (a decode step's few rows: one each)
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, L * (D + Dv)));
  // D or Dv of 0 (an empty row): the scratch path (its dot products are zeros, its output empty)
  const RowFn<T> in_registers = D > 0 && Dv > 0 ? pick_row_fn<T>(d_pad / IO::kBlock, dv_pad / IO::kBlock) : nullptr;
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> qf(in_registers ? 0 : d_pad, 0.0f), acc(in_registers ? 0 : dv_pad), scores(L);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r % s.queries, h = (r / s.queries) % s.heads, b = r / (s.queries * s.heads);
      const T* qrow = qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
      const Rows<T> kc{k_cache.const_data_ptr<T>() + b * k_cache.stride(0) + h * k_cache.stride(1),
                       k_cache.stride(2)};
      const Rows<T> kn{k_new.const_data_ptr<T>() + b * k_new.stride(0) + h * k_new.stride(1), k_new.stride(2)};
      const Rows<T> vc{v_cache.const_data_ptr<T>() + b * v_cache.stride(0) + h * v_cache.stride(1),
                       v_cache.stride(2)};
      const Rows<T> vn{v_new.const_data_ptr<T>() + b * v_new.stride(0) + h * v_new.stride(1), v_new.stride(2)};
      if (in_registers != nullptr) {
        in_registers(qrow, sc, kc, kn, vc, vn, s.cached, s.added, D, Dv, scores.data(), op + r * Dv);
        continue;
      }
      for (int64_t j = 0; j < D; ++j) qf[j] = static_cast<float>(qrow[j]) * sc;
      for (int64_t j = 0; j < s.cached; ++j) scores[j] = dot(qf.data(), kc.row(j), D);
      for (int64_t j = 0; j < s.added; ++j) scores[s.cached + j] = dot(qf.data(), kn.row(j), D);
      const float inv = softmax_in_place(scores.data(), L);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < s.cached; ++j) axpy(acc.data(), scores[j], vc.row(j), Dv);
      for (int64_t j = 0; j < s.added; ++j) axpy(acc.data(), scores[s.cached + j], vn.row(j), Dv);
      T* orow = op + r * Dv;
      const fVec iv(inv);
      for (int64_t j = 0; j < Dv; j += IO::kBlock) {
        store_block(orow + j, fVec::loadu(acc.data() + j) * iv, fVec::loadu(acc.data() + j + fVec::size()) * iv,
                    std::min(IO::kBlock, Dv - j));
      }
    }
  });
}

void kv_attention_kernel(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& k_new,
                         const at::Tensor& v_cache, const at::Tensor& v_new, double scale,
                         const KvAttentionShape& shape, at::Tensor& out) {
  FG_DISPATCH_FLOAT_TYPES(q.scalar_type(), "fusegraph_kv_attention", [&] {
    run<scalar_t>(q, k_cache, k_new, v_cache, v_new, scale, shape, out);
  });
}

}  // namespace

FG_REGISTER_CPU_KERNEL(::fusegraph::kv_attention_stub, &kv_attention_kernel);

}  // namespace CPU_CAPABILITY
}  // namespace fusegraph::cpu
