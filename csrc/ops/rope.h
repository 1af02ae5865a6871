#pragma once
// Rotary position embedding: (x.float() * cos + rot(x).float() * sin).to(x.dtype) over the first rotary_dim
// channels of x's last dim (all of it by default); the channels after them are copied unchanged.
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <optional>

#include "ops/cpu/isa_dispatch.h"

namespace fusegraph {

// Validates x (rank 4: [B,S,H,D] or [B,H,S,D]), the rotated width R (rotary_dim: even, 0 < R <= D; None: R = D,
// then D must be even), cos/sin (fp32 or x.dtype, same shape, last dim R, broadcastable to x[..., :R]: [S,R],
// [1,S,1,R], [1,1,S,R], [B,S,1,R]) and devices. Returns R. Shared by the CPU and CUDA entry points.
int64_t check_rope_args(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        std::optional<int64_t> rotary_dim = std::nullopt);

// `interleaved` as the schema passes it (Scalar?): its bool value, or an int 1 or 0 as True or False (Inductor's C++
// wrapper passes a bool to a Scalar argument as an int); TypeError naming the argument for None or another number
// (a `bool` schema argument would have turned None into False, i.e. rotate-half, and 0.5 into True, silently).
bool check_rope_interleaved(const std::optional<c10::Scalar>& interleaved);

// The float64 path (any tensor argument float64): x * cos + rot(x) * sin on x[..., :rotary_dim] with at:: ops in
// float64, x[..., rotary_dim:] as it is, rounded once to x.dtype into a contiguous output. Device-agnostic.
at::Tensor rope_float64(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                        int64_t rotary_dim);

// Details of the contract above, for kernels: cos and sin also share one dtype (float32 or x.dtype); their
// rank is 1..4, aligned to x from the right like eager broadcasting; each leading dim is 1 or x's size there,
// and the last dim equals the rotated width R (x's D unless rotary_dim says less).

// out[b,i,j,:R] = rope of x[b,i,j,:R] with cos/sin rows picked by broadcast strides (0 on dims of size 1);
// out[b,i,j,R:] = x[b,i,j,R:]. Preconditions (the CPU entry point guarantees them): check_rope_args passed
// (rotary_dim = R), x.numel() > 0, x.stride(3) == 1, cos.stride(-1) == sin.stride(-1) == 1, out contiguous
// with x's shape and dtype.
using rope_fn = void (*)(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out,
                         bool interleaved, int64_t rotary_dim);
FG_DECLARE_CPU_STUB(rope_stub, rope_fn);

// Strides (in elements) of `t` broadcast to `sizes` (t right-aligned): 0 on dims t lacks or has size 1.
// Used by the CPU kernels and available to the CUDA launchers.
void broadcast_strides(const at::Tensor& t, at::IntArrayRef sizes, int64_t* strides_out);

}  // namespace fusegraph
