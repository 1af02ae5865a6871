#pragma once
// Rotary position embedding: (x.float() * cos + rot(x).float() * sin).to(x.dtype).
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <optional>

#include "ops/cpu/dispatch.h"

namespace fusegraph {

// Validates x (rank 4: [B,S,H,D] or [B,H,S,D], D even), cos/sin (fp32 or x.dtype, same shape, broadcastable
// to x: [S,D], [1,S,1,D], [1,1,S,D], [B,S,1,D]) and devices. Shared by the CPU and CUDA entry points.
void check_rope_args(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// `interleaved` as the schema passes it (Scalar?): its bool value; TypeError naming the argument for None or a
// number (a `bool` schema argument would have turned None into False, i.e. rotate-half, silently).
bool check_rope_interleaved(const std::optional<c10::Scalar>& interleaved);

// The float64 path (any tensor argument float64): x * cos + rot(x) * sin with at:: ops in float64, rounded
// once to x.dtype into a contiguous output. Device-agnostic.
at::Tensor rope_float64(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved);

// Details of the contract above, for kernels: cos and sin also share one dtype (float32 or x.dtype); their
// rank is 1..4, aligned to x from the right like eager broadcasting; each dim is 1 or x's size there, and the
// last dim equals x's D.

// out[b,i,j,:] = rope of x[b,i,j,:] with cos/sin rows picked by broadcast strides (0 on dims of size 1).
// Preconditions (the CPU entry point guarantees them): check_rope_args passed, x.numel() > 0,
// x.stride(3) == 1, cos.stride(-1) == sin.stride(-1) == 1, out contiguous with x's shape and dtype.
using rope_fn = void (*)(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out,
                         bool interleaved);
FG_DECLARE_CPU_STUB(rope_stub, rope_fn);

// Strides (in elements) of `t` broadcast to `sizes` (t right-aligned): 0 on dims t lacks or has size 1.
// Used by the CPU kernels and available to the CUDA launchers.
void broadcast_strides(const at::Tensor& t, at::IntArrayRef sizes, int64_t* strides_out);

}  // namespace fusegraph
