#include "ops/mul_add.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>

#include "ops/checks.h"
#include "ops/output.h"

namespace fusegraph {

FG_DEFINE_CPU_STUB(mul_add_stub, mul_add_fn);

namespace {

// The dtype eager `x op y` gives for float tensors x and y: a dimensioned tensor's dtype wins over a
// zero-dim tensor's (same category), otherwise the two promote.
struct Promoted {
  at::ScalarType dtype;
  bool zero_dim;
};
Promoted promote(Promoted x, Promoted y) {
  if (x.zero_dim == y.zero_dim) return {c10::promoteTypes(x.dtype, y.dtype), x.zero_dim};
  return x.zero_dim ? y : x;
}
Promoted of(const at::Tensor& t) { return {t.scalar_type(), t.dim() == 0}; }

// Shapes a, b, c broadcast: raises naming the first dim where they do not.
void check_broadcast(at::IntArrayRef a, at::IntArrayRef b, at::IntArrayRef c) {
  const int64_t rank = std::max({a.size(), b.size(), c.size()});
  const at::IntArrayRef shapes[3] = {a, b, c};
  const char* names[3] = {"a", "b", "c"};
  for (int64_t d = 0; d < rank; ++d) {
    int64_t size = 1;
    int which = -1;
    for (int k = 0; k < 3; ++k) {
      const int64_t td = d - (rank - static_cast<int64_t>(shapes[k].size()));
      if (td < 0 || shapes[k][td] == 1) continue;
      if (which < 0) {
        size = shapes[k][td];
        which = k;
      } else {
        TORCH_CHECK(shapes[k][td] == size, "fusegraph.mul_add: argument '", names[k], "' has shape ", shapes[k],
                    " which does not broadcast with '", names[which], "' of shape ", shapes[which], " (size ",
                    shapes[k][td], " vs ", size, " at dim ", d - rank, "); expected sizes equal or 1 per dim");
      }
    }
  }
}

}  // namespace

std::vector<int64_t> mul_add_output_shape(at::IntArrayRef a, at::IntArrayRef b, at::IntArrayRef c) {
  const int64_t rank = std::max({a.size(), b.size(), c.size()});
  std::vector<int64_t> out(rank, 1);
  for (at::IntArrayRef s : {a, b, c}) {
    const int64_t offset = rank - static_cast<int64_t>(s.size());
    for (size_t d = 0; d < s.size(); ++d) {
      if (s[d] != 1) out[offset + d] = s[d];
    }
  }
  return out;
}

at::ScalarType check_mul_add_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                                  std::optional<at::ScalarType> out_dtype) {
  check_float_tensor(a, "mul_add", "a");
  check_float_tensor(b, "mul_add", "b");
  check_float_tensor(c, "mul_add", "c");
  check_same_device(a, "a", b, "mul_add", "b");
  check_same_device(a, "a", c, "mul_add", "c");
  check_broadcast(a.sizes(), b.sizes(), c.sizes());
  check_out_dtype(out_dtype, "mul_add");
  return out_dtype.value_or(promote(promote(of(a), of(b)), of(c)).dtype);
}

at::ScalarType check_mul_add_scalar_args(const at::Tensor& a, const c10::Scalar& b, const at::Tensor& c,
                                         std::optional<at::ScalarType> out_dtype) {
  check_float_tensor(a, "mul_add", "a");
  check_float_tensor(c, "mul_add", "c");
  TORCH_CHECK(!b.isComplex(), "fusegraph.mul_add: argument 'b' is the complex number ", b.toComplexDouble(),
              "; expected a real number or a float tensor");
  check_same_device(a, "a", c, "mul_add", "c");
  check_broadcast(a.sizes(), {}, c.sizes());
  check_out_dtype(out_dtype, "mul_add");
  // A Python number never promotes a floating tensor: a * b keeps a's dtype and dimensionality.
  return out_dtype.value_or(promote(of(a), of(c)).dtype);
}

at::Tensor mul_add_float64(const at::Tensor& a, const at::Tensor& b, double b_value, const at::Tensor& c,
                           at::ScalarType out_dtype) {
  const at::Tensor a64 = a.to(at::kDouble);
  const at::Tensor prod = b.defined() ? a64 * b.to(at::kDouble) : a64 * b_value;
  const at::Tensor y = prod + c.to(at::kDouble);
  const std::vector<int64_t> shape = mul_add_output_shape(a.sizes(), b.defined() ? b.sizes() : at::IntArrayRef{},
                                                          c.sizes());
  return new_output(shape, a.options().dtype(out_dtype)).copy_(y);
}

namespace {

at::Tensor mul_add_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                       std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType dtype = check_mul_add_args(a, b, c, out_dtype);
  if (uses_float64({&a, &b, &c}, dtype)) return mul_add_float64(a, b, 0.0, c, dtype);
  at::Tensor out = new_output(mul_add_output_shape(a.sizes(), b.sizes(), c.sizes()), a.options().dtype(dtype));
  if (out.numel() > 0) mul_add_stub.get("mul_add")(a, &b, 0.0f, c, out);
  return out;
}

at::Tensor mul_add_scalar_cpu(const at::Tensor& a, const c10::Scalar& b, const at::Tensor& c,
                              std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType dtype = check_mul_add_scalar_args(a, b, c, out_dtype);
  if (uses_float64({&a, &c}, dtype)) return mul_add_float64(a, at::Tensor(), b.toDouble(), c, dtype);
  at::Tensor out = new_output(mul_add_output_shape(a.sizes(), {}, c.sizes()), a.options().dtype(dtype));
  // Eager rounds the number to the float32 compute type too (opmath of every supported dtype is float).
  if (out.numel() > 0) mul_add_stub.get("mul_add")(a, nullptr, static_cast<float>(b.toDouble()), c, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CPU, m) {
  m.impl("mul_add", &mul_add_cpu);
  m.impl("mul_add.Scalar", &mul_add_scalar_cpu);
}

}  // namespace fusegraph
