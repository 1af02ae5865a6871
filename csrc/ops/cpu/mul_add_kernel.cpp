// Compiled once per CPU capability (see isa_dispatch.h). out = a * b + c over broadcast operands: the output
// (contiguous) is walked as rows of its innermost coalesced dim; each operand contributes a row pointer
// found through broadcast strides (0 on broadcast dims) and a unit or zero inner stride. float32 math with a
// fused multiply-add, one rounding to the output dtype; each input read once, the output written once.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/SmallVector.h>

#include <vector>

#include "ops/cpu/dtype_dispatch.h"
#include "ops/cpu/vec_io.h"
#include "ops/mul_add.h"

namespace fusegraph::cpu {
inline namespace CPU_CAPABILITY {
namespace {

enum Op : int { kA = 0, kB = 1, kC = 2, kOut = 3, kNumOps = 4 };

struct Operand {
  const char* data;
  at::ScalarType dtype;
  int64_t itemsize;
};

// The iteration space after dropping size-1 dims and merging dims every operand walks contiguously.
// sizes.back() is the row length; strides are in elements, per operand.
struct Plan {
  c10::SmallVector<int64_t, 6> sizes;
  c10::SmallVector<int64_t, 6> strides[kNumOps];
  int64_t ndim() const { return static_cast<int64_t>(sizes.size()); }
  int64_t inner(int k) const { return strides[k].back(); }
};

Plan make_plan(const at::Tensor& a, const at::Tensor* b, const at::Tensor& c, const at::Tensor& out) {
  const int64_t rank = out.dim();
  const at::Tensor* tensors[kNumOps] = {&a, b, &c, &out};
  c10::SmallVector<int64_t, 6> raw[kNumOps];
  for (int k = 0; k < kNumOps; ++k) {
    raw[k].resize(rank, 0);
    if (tensors[k] == nullptr) continue;  // number b: stride 0 everywhere
    const at::Tensor& t = *tensors[k];
    for (int64_t d = rank - t.dim(); d < rank; ++d) {
      const int64_t td = d - (rank - t.dim());
      raw[k][d] = t.size(td) == 1 ? 0 : t.stride(td);
    }
  }
  // Innermost first, then reversed at the end.
  Plan p;
  for (int64_t d = rank - 1; d >= 0; --d) {
    const int64_t size = out.size(d);
    if (size == 1) continue;
    bool merge = !p.sizes.empty();
    for (int k = 0; k < kNumOps && merge; ++k) merge = raw[k][d] == p.strides[k].back() * p.sizes.back();
    if (merge) {
      p.sizes.back() *= size;
    } else {
      p.sizes.push_back(size);
      for (int k = 0; k < kNumOps; ++k) p.strides[k].push_back(raw[k][d]);
    }
  }
  if (p.sizes.empty()) {  // a single element
    p.sizes.push_back(1);
    for (int k = 0; k < kNumOps; ++k) p.strides[k].push_back(0);
  }
  std::reverse(p.sizes.begin(), p.sizes.end());
  for (int k = 0; k < kNumOps; ++k) std::reverse(p.strides[k].begin(), p.strides[k].end());
  return p;
}

// ---- fast rows: a, c and out share dtype T, b is T or float, inner strides 0 or 1 ----

template <typename T>
const T* broadcast_block(const T* p, int64_t stride, T* buf) {
  if (stride != 0) return p;
  std::fill(buf, buf + VecIO<T>::kBlock, *p);
  return buf;
}

// kUnit: every inner stride is 1 (the usual case), known at compile time so the loads need no index math.
template <typename T, typename TB, bool kUnit>
C10_ALWAYS_INLINE void row_fast(const char* const* ptrs, const int64_t* inner, int64_t n) {
  using IO = VecIO<T>;
  using IOB = VecIO<TB>;
  constexpr int64_t K = IO::kBlock;
  // A zero-stride operand reads a block of copies of its value with step 0: one loop for every stride mix.
  T abuf[K], cbuf[K];
  TB bbuf[K];
  const int64_t sa = kUnit ? 1 : inner[kA], sb = kUnit ? 1 : inner[kB], sc = kUnit ? 1 : inner[kC];
  const T* a = broadcast_block(reinterpret_cast<const T*>(ptrs[kA]), sa, abuf);
  const TB* b = broadcast_block(reinterpret_cast<const TB*>(ptrs[kB]), sb, bbuf);
  const T* c = broadcast_block(reinterpret_cast<const T*>(ptrs[kC]), sc, cbuf);
  T* o = reinterpret_cast<T*>(const_cast<char*>(ptrs[kOut]));
  fVec a0, a1, b0, b1, c0, c1;
  int64_t i = 0;
  for (; i + K <= n; i += K) {
    IO::load(a + i * sa, a0, a1);
    IOB::load(b + i * sb, b0, b1);
    IO::load(c + i * sc, c0, c1);
    IO::store(o + i, at::vec::fmadd(a0, b0, c0), at::vec::fmadd(a1, b1, c1));
  }
  if (i < n) {
    const int64_t m = n - i;
    IO::load(a + i * sa, a0, a1, m);
    IOB::load(b + i * sb, b0, b1, m);
    IO::load(c + i * sc, c0, c1, m);
    IO::store(o + i, at::vec::fmadd(a0, b0, c0), at::vec::fmadd(a1, b1, c1), m);
  }
}

// ---- general rows: any dtype per operand, any inner stride; operands pass through float32 scratch ----

constexpr int64_t kScratch = 512;  // elements per piece; a multiple of every capability's block

template <typename T>
void to_float(const T* p, int64_t stride, int64_t n, float* dst) {
  if (stride == 0) {
    std::fill(dst, dst + n, static_cast<float>(*p));
  } else if (stride == 1) {
    using IO = VecIO<T>;
    fVec x0, x1;
    int64_t i = 0;
    for (; i + IO::kBlock <= n; i += IO::kBlock) {
      IO::load(p + i, x0, x1);
      VecIO<float>::store(dst + i, x0, x1);
    }
    if (i < n) {
      IO::load(p + i, x0, x1, n - i);
      VecIO<float>::store(dst + i, x0, x1, n - i);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(p[i * stride]);
  }
}

// A float view of n elements of an operand: its own memory when it already is unit-stride float32.
const float* as_float(const Operand& op, const char* p, int64_t stride, int64_t n, float* scratch) {
  if (op.dtype == at::kFloat && stride == 1) return reinterpret_cast<const float*>(p);
  FG_DISPATCH_FLOAT_TYPES(op.dtype, "fusegraph_mul_add_load",
                          [&] { to_float(reinterpret_cast<const scalar_t*>(p), stride, n, scratch); });
  return scratch;
}

void row_general(const Operand* ops, const char* const* ptrs, const int64_t* inner, int64_t n) {
  alignas(64) float scratch[kNumOps][kScratch];
  const at::ScalarType out_dtype = ops[kOut].dtype;
  for (int64_t start = 0; start < n; start += kScratch) {
    const int64_t m = std::min(kScratch, n - start);
    const float* in[3];
    for (int k = kA; k <= kC; ++k) {
      in[k] = as_float(ops[k], ptrs[k] + start * inner[k] * ops[k].itemsize, inner[k], m, scratch[k]);
    }
    char* o = const_cast<char*>(ptrs[kOut]) + start * ops[kOut].itemsize;
    float* res = out_dtype == at::kFloat ? reinterpret_cast<float*>(o) : scratch[kOut];
    int64_t i = 0;
    for (; i + fVec::size() <= m; i += fVec::size()) {
      at::vec::fmadd(fVec::loadu(in[kA] + i), fVec::loadu(in[kB] + i), fVec::loadu(in[kC] + i)).store(res + i);
    }
    if (i < m) {
      const int64_t r = m - i;
      at::vec::fmadd(fVec::loadu(in[kA] + i, r), fVec::loadu(in[kB] + i, r), fVec::loadu(in[kC] + i, r))
          .store(res + i, r);
    }
    if (out_dtype != at::kFloat) {
      FG_DISPATCH_FLOAT_TYPES(out_dtype, "fusegraph_mul_add_store", [&] {
        using IO = VecIO<scalar_t>;
        scalar_t* dst = reinterpret_cast<scalar_t*>(o);
        fVec x0, x1;
        int64_t j = 0;
        for (; j + IO::kBlock <= m; j += IO::kBlock) {
          VecIO<float>::load(res + j, x0, x1);
          IO::store(dst + j, x0, x1);
        }
        if (j < m) {
          VecIO<float>::load(res + j, x0, x1, m - j);
          IO::store(dst + j, x0, x1, m - j);
        }
      });
    }
  }
}

// `rows` rows of n elements; row r of operand k starts at ptrs[k] + r * step[k] (bytes). One call covers a
// task's run of rows along the innermost outer dim: a 128-wide row is ~50 cycles of work, and an indirect call
// plus the odometer over every operand per row made mul_add ~1.5x slower than Inductor's loop.
using RowFn = void (*)(const Operand* ops, const char* const* ptrs, const int64_t* inner, const int64_t* step,
                       int64_t n, int64_t rows);

template <typename T, typename TB>
void rows_fast(const Operand*, const char* const* ptrs, const int64_t* inner, const int64_t* step, int64_t n,
               int64_t rows) {
  const bool unit = inner[kA] == 1 && inner[kB] == 1 && inner[kC] == 1;
  for (int64_t r = 0; r < rows; ++r) {
    const char* p[kNumOps];
    for (int k = 0; k < kNumOps; ++k) p[k] = ptrs[k] + r * step[k];
    if (unit) {
      row_fast<T, TB, true>(p, inner, n);
    } else {
      row_fast<T, TB, false>(p, inner, n);
    }
  }
}

void rows_general(const Operand* ops, const char* const* ptrs, const int64_t* inner, const int64_t* step, int64_t n,
                  int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    const char* p[kNumOps];
    for (int k = 0; k < kNumOps; ++k) p[k] = ptrs[k] + r * step[k];
    row_general(ops, p, inner, n);
  }
}

// Picks the fused row loop when the dtypes and inner strides allow it; may swap a and b (a*b == b*a exactly).
RowFn choose_row_fn(Operand* ops, Plan& plan) {
  auto unit_or_zero = [&](int k) { return plan.inner(k) == 0 || plan.inner(k) == 1; };
  if (!(unit_or_zero(kA) && unit_or_zero(kB) && unit_or_zero(kC))) return &rows_general;
  const at::ScalarType t = ops[kOut].dtype;
  if (ops[kA].dtype == at::kFloat && ops[kB].dtype == t && t != at::kFloat) {
    std::swap(ops[kA], ops[kB]);
    std::swap(plan.strides[kA], plan.strides[kB]);
  }
  if (ops[kA].dtype != t || ops[kC].dtype != t) return &rows_general;
  if (ops[kB].dtype != t && ops[kB].dtype != at::kFloat) return &rows_general;
  const bool b_float = ops[kB].dtype == at::kFloat;
  switch (t) {
    case at::kFloat:
      return &rows_fast<float, float>;
    case at::kBFloat16:
      return b_float ? &rows_fast<c10::BFloat16, float> : &rows_fast<c10::BFloat16, c10::BFloat16>;
    case at::kHalf:
      return b_float ? &rows_fast<c10::Half, float> : &rows_fast<c10::Half, c10::Half>;
    default:
      return &rows_general;
  }
}

void mul_add_kernel(const at::Tensor& a, const at::Tensor* b, float b_value, const at::Tensor& c, at::Tensor& out) {
  Plan plan = make_plan(a, b, c, out);
  Operand ops[kNumOps] = {
      {static_cast<const char*>(a.const_data_ptr()), a.scalar_type(), static_cast<int64_t>(a.element_size())},
      b ? Operand{static_cast<const char*>(b->const_data_ptr()), b->scalar_type(),
                  static_cast<int64_t>(b->element_size())}
        : Operand{reinterpret_cast<const char*>(&b_value), at::kFloat, static_cast<int64_t>(sizeof(float))},
      {static_cast<const char*>(c.const_data_ptr()), c.scalar_type(), static_cast<int64_t>(c.element_size())},
      {static_cast<const char*>(out.mutable_data_ptr()), out.scalar_type(), static_cast<int64_t>(out.element_size())},
  };
  const RowFn row_fn = choose_row_fn(ops, plan);
  const int64_t nd = plan.ndim();
  const int64_t row_len = plan.sizes[nd - 1];
  int64_t inner[kNumOps];
  for (int k = 0; k < kNumOps; ++k) inner[k] = plan.inner(k);
  // Bytes from one row to the next along the innermost outer dim (none when there is a single row dim).
  int64_t step[kNumOps] = {0, 0, 0, 0};
  if (nd >= 2) {
    for (int k = 0; k < kNumOps; ++k) step[k] = plan.strides[k][nd - 2] * ops[k].itemsize;
  }
  const int64_t total = out.numel();

  // Elements are independent, so the split never changes a result. A task covers whole rows or row pieces.
  at::parallel_for(0, total, 32768, [&](int64_t begin, int64_t end) {
    // Multi-index of the row holding `begin` over the outer dims, and each operand's byte offset there.
    // A std::vector (one allocation per task): with a SmallVector, GCC 12 warns -Wmaybe-uninitialized (false positive).
    std::vector<int64_t> idx(nd - 1, 0);
    int64_t offset[kNumOps] = {0, 0, 0, 0};
    int64_t row = begin / row_len;
    for (int64_t d = nd - 2; d >= 0; --d) {
      idx[d] = row % plan.sizes[d];
      row /= plan.sizes[d];
      for (int k = 0; k < kNumOps; ++k) offset[k] += idx[d] * plan.strides[k][d] * ops[k].itemsize;
    }
    int64_t col = begin % row_len;
    int64_t pos = begin;
    while (pos < end) {
      const int64_t n = std::min(row_len - col, end - pos);
      // Whole rows go together, as many as the task holds before the innermost outer dim wraps.
      const int64_t rows =
          (nd >= 2 && n == row_len) ? std::min(plan.sizes[nd - 2] - idx[nd - 2], (end - pos) / row_len) : 1;
      const char* ptrs[kNumOps];
      for (int k = 0; k < kNumOps; ++k) ptrs[k] = ops[k].data + offset[k] + col * inner[k] * ops[k].itemsize;
      row_fn(ops, ptrs, inner, step, n, rows);
      pos += n * rows;
      col = 0;
      // Past those rows: odometer over the outer dims (the innermost one never passes its size: see `rows`).
      int64_t count = rows;
      for (int64_t d = nd - 2; d >= 0; --d) {
        for (int k = 0; k < kNumOps; ++k) offset[k] += count * plan.strides[k][d] * ops[k].itemsize;
        idx[d] += count;
        if (idx[d] < plan.sizes[d]) break;
        for (int k = 0; k < kNumOps; ++k) offset[k] -= plan.sizes[d] * plan.strides[k][d] * ops[k].itemsize;
        idx[d] = 0;
        count = 1;
      }
    }
  });
}

}  // namespace

FG_REGISTER_CPU_KERNEL(::fusegraph::mul_add_stub, &mul_add_kernel);

}  // namespace CPU_CAPABILITY
}  // namespace fusegraph::cpu
