#include "ops/rope.h"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "ops/checks.h"
#include "ops/output.h"

namespace fusegraph {

FG_DEFINE_CPU_STUB(rope_stub, rope_fn);

void broadcast_strides(const at::Tensor& t, at::IntArrayRef sizes, int64_t* strides_out) {
  const int64_t rank = static_cast<int64_t>(sizes.size());
  const int64_t offset = rank - t.dim();
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t td = d - offset;
    strides_out[d] = (td < 0 || t.size(td) == 1) ? 0 : t.stride(td);
  }
}

int64_t check_rope_args(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        std::optional<int64_t> rotary_dim) {
  check_float_tensor(x, "rope", "x");
  check_float_tensor(cos, "rope", "cos");
  check_float_tensor(sin, "rope", "sin");
  check_same_device(x, "x", cos, "rope", "cos");
  check_same_device(x, "x", sin, "rope", "sin");
  TORCH_CHECK(x.dim() == 4, "fusegraph.rope: argument 'x' has shape ", x.sizes(), " (rank ", x.dim(),
              "); expected rank 4, [B, S, H, D] or [B, H, S, D]");
  const int64_t D = x.size(3);
  if (rotary_dim.has_value()) {
    const int64_t r = *rotary_dim;
    TORCH_CHECK(r > 0 && r <= D && r % 2 == 0, "fusegraph.rope: argument 'rotary_dim' is ", r,
                "; expected an even width with 0 < rotary_dim <= D = ", D, " (x's last dim), or None for all of D");
  } else {
    TORCH_CHECK(D % 2 == 0, "fusegraph.rope: argument 'x' has shape ", x.sizes(), " with odd last dim D = ", D,
                "; expected D even (rotation pairs)");
  }
  const int64_t R = rotary_dim.value_or(D);
  TORCH_CHECK(cos.scalar_type() == at::kFloat || cos.scalar_type() == x.scalar_type(),
              "fusegraph.rope: argument 'cos' has dtype ", cos.scalar_type(), "; expected float32 or x's dtype ",
              x.scalar_type());
  TORCH_CHECK(sin.scalar_type() == cos.scalar_type(), "fusegraph.rope: argument 'sin' has dtype ",
              sin.scalar_type(), "; expected the dtype of 'cos', ", cos.scalar_type());
  TORCH_CHECK(sin.sizes() == cos.sizes(), "fusegraph.rope: argument 'sin' has shape ", sin.sizes(),
              "; expected the shape of 'cos', ", cos.sizes());
  TORCH_CHECK(cos.dim() >= 1 && cos.dim() <= 4, "fusegraph.rope: argument 'cos' has shape ", cos.sizes(),
              " (rank ", cos.dim(), "); expected rank 1 to 4, broadcastable to x ", x.sizes());
  if (rotary_dim.has_value()) {
    TORCH_CHECK(cos.size(-1) == R, "fusegraph.rope: argument 'cos' has shape ", cos.sizes(), " with last dim ",
                cos.size(-1), "; expected rotary_dim = ", R);
  } else {
    TORCH_CHECK(cos.size(-1) == D, "fusegraph.rope: argument 'cos' has shape ", cos.sizes(), " with last dim ",
                cos.size(-1), "; expected x's last dim D = ", D);
  }
  const int64_t offset = 4 - cos.dim();
  for (int64_t d = 0; d + 1 < cos.dim(); ++d) {
    TORCH_CHECK(cos.size(d) == 1 || cos.size(d) == x.size(d + offset), "fusegraph.rope: argument 'cos' has shape ",
                cos.sizes(), " which does not broadcast to x's shape ", x.sizes(), " (dim ", d, " is ", cos.size(d),
                ", x has ", x.size(d + offset),
                "); expected each dim 1 or x's size, e.g. [S, D], [1, S, 1, D], [1, 1, S, D] or [B, S, 1, D]");
  }
  return R;
}

bool check_rope_interleaved(const std::optional<c10::Scalar>& interleaved) {
  if (interleaved.has_value() && interleaved->isBoolean()) return interleaved->toBool();
  // The ints 0 and 1 too: Inductor's C++ wrapper passes a Python bool to a Scalar argument as an int.
  if (interleaved.has_value() && interleaved->isIntegral(false) && (interleaved->toLong() == 0 || interleaved->toLong() == 1)) {
    return interleaved->toLong() == 1;
  }
  std::string seen = "None";
  if (interleaved.has_value()) {
    const c10::Scalar& v = *interleaved;
    seen = v.isIntegral(false) ? "the int " + std::to_string(v.toLong())
           : v.isFloatingPoint() ? "the float " + c10::str(v.toDouble())
                                 : "the complex number " + c10::str(v.toComplexDouble());
  }
  TORCH_CHECK_TYPE(false, "fusegraph.rope: argument 'interleaved' is ", seen,
                   "; expected a bool: True (interleaved pairs) or False (rotate-half), or the int 1 or 0");
}

at::Tensor rope_float64(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                        int64_t rotary_dim) {
  const at::Tensor x64 = x.to(at::kDouble).narrow(-1, 0, rotary_dim);
  at::Tensor rotated;
  if (interleaved) {  // pairs (x0, x1) -> (-x1, x0)
    const std::vector<at::Tensor> pairs = x64.unflatten(-1, {-1, 2}).unbind(-1);
    rotated = at::stack({-pairs[1], pairs[0]}, -1).flatten(-2);
  } else {  // rotate-half: cat(-x2, x1)
    const std::vector<at::Tensor> halves = x64.chunk(2, -1);
    rotated = at::cat({-halves[1], halves[0]}, -1);
  }
  const at::Tensor y = x64 * cos.to(at::kDouble) + rotated * sin.to(at::kDouble);
  at::Tensor out = new_output(x.sizes(), x.options());
  out.narrow(-1, 0, rotary_dim).copy_(y);
  const int64_t D = x.size(-1);
  if (rotary_dim < D) out.narrow(-1, rotary_dim, D - rotary_dim).copy_(x.narrow(-1, rotary_dim, D - rotary_dim));
  return out;
}

namespace {

at::Tensor rope_cpu(const at::Tensor& x_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
                    const std::optional<c10::Scalar>& interleaved_in, std::optional<int64_t> rotary_dim_in) {
  const int64_t rotary_dim = check_rope_args(x_in, cos_in, sin_in, rotary_dim_in);
  const bool interleaved = check_rope_interleaved(interleaved_in);
  if (uses_float64({&x_in, &cos_in, &sin_in})) return rope_float64(x_in, cos_in, sin_in, interleaved, rotary_dim);
  at::Tensor out = new_output(x_in.sizes(), x_in.options());
  if (out.numel() == 0) return out;
  // Kernels need unit stride along D only; any other layout (transposed views, sliced tables) is read in place.
  // A D-strided operand is compacted first: for cos/sin that copies the (small) unexpanded table only.
  const at::Tensor x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
  const at::Tensor cos = cos_in.stride(-1) == 1 ? cos_in : cos_in.contiguous();
  const at::Tensor sin = sin_in.stride(-1) == 1 ? sin_in : sin_in.contiguous();
  rope_stub.get("rope")(x, cos, sin, out, interleaved, rotary_dim);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CPU, m) { m.impl("rope", &rope_cpu); }

}  // namespace fusegraph
