// CUDA entry point of fusegraph::rope: cos/sin are read through broadcast strides; x needs only a
// unit-stride last dim ([B,S,H,D] and [B,H,S,D] views of a projection need no copy). rotary_dim: the first R
// channels rotated, the rest copied.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/tensor_args.h"
#include "ops/output.h"
#include "ops/rope.h"

namespace fusegraph {
namespace {

at::Tensor rope_cuda(const at::Tensor& x_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
                     const std::optional<c10::Scalar>& interleaved_in, std::optional<int64_t> rotary_dim_in) {
  const int64_t rotary_dim = check_rope_args(x_in, cos_in, sin_in, rotary_dim_in);
  const bool interleaved = check_rope_interleaved(interleaved_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  if (uses_float64({&x_in, &cos_in, &sin_in})) return rope_float64(x_in, cos_in, sin_in, interleaved, rotary_dim);
  at::Tensor out = new_output(x_in.sizes(), x_in.options());
  if (out.numel() == 0) return out;

  // Rows are planned over the rotated part x[..., :R] (x's strides); the kernel copies x[..., R:] too.
  at::Tensor x = cuda::last_dim_contiguous(x_in);
  at::Tensor x_rot = x.narrow(-1, 0, rotary_dim);
  at::Tensor cos = cuda::last_dim_contiguous(cos_in).expand(x_rot.sizes());
  at::Tensor sin = cuda::last_dim_contiguous(sin_in).expand(x_rot.sizes());
  cuda::Operand ops[3];
  std::optional<RowLayout> layout = cuda::plan_rows(x_rot.sizes(), {&x_rot, &cos, &sin}, ops);
  TORCH_INTERNAL_ASSERT(layout.has_value(), "rope: a rank-4 x leaves at most 3 leading dims");
  for (const cuda::Operand& op : ops) TORCH_INTERNAL_ASSERT(op.inner_stride == 1, "rope: head dim not unit-stride");
  C10_CUDA_CHECK(cuda::launch_rope(*layout, ops[0], ops[1], ops[2], out.data_ptr(), x.size(-1), interleaved,
                                   c10::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CUDA, m) { m.impl("rope", &rope_cuda); }

}  // namespace fusegraph
