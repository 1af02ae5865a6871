// CPU kernel of fusegraph::kv_attention: one task per (batch, head, query) row. The row's scores over the cache
// and the new keys go to a float32 scratch row, softmax in float32 (max-subtracted exp), then the weighted sum of
// the value rows in float32 and one rounding to the output dtype. Keys and values are read in place from the
// two pieces: the concatenation is never built.
#include <ATen/Parallel.h>

#include <algorithm>
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

// The row's softmax weights in place over s[0:n] (float32); returns 1 / their sum.
inline float softmax_in_place(float* s, int64_t n) {
  const int64_t V = fVec::size();
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
  const fVec mv(m);
  fVec total(0.0f);
  int64_t j = 0;
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
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> qf(d_pad, 0.0f), acc(dv_pad), scores(L);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r % s.queries, h = (r / s.queries) % s.heads, b = r / (s.queries * s.heads);
      const T* qrow = qp + b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
      for (int64_t j = 0; j < D; ++j) qf[j] = static_cast<float>(qrow[j]) * sc;
      const Rows<T> kc{k_cache.const_data_ptr<T>() + b * k_cache.stride(0) + h * k_cache.stride(1),
                       k_cache.stride(2)};
      const Rows<T> kn{k_new.const_data_ptr<T>() + b * k_new.stride(0) + h * k_new.stride(1), k_new.stride(2)};
      const Rows<T> vc{v_cache.const_data_ptr<T>() + b * v_cache.stride(0) + h * v_cache.stride(1),
                       v_cache.stride(2)};
      const Rows<T> vn{v_new.const_data_ptr<T>() + b * v_new.stride(0) + h * v_new.stride(1), v_new.stride(2)};
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
