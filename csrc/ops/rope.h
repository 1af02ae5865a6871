#pragma once
// Rotary position embedding: (x.float() * cos + rot(x).float() * sin).to(x.dtype).
#include <ATen/core/Tensor.h>

namespace fusegraph {

// Validates x (rank 4: [B,S,H,D] or [B,H,S,D], D even), cos/sin (fp32 or x.dtype, same shape, broadcastable
// to x: [S,D], [1,S,1,D], [1,1,S,D], [B,S,1,D]) and devices. Shared by the CPU and CUDA entry points.
void check_rope_args(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace fusegraph
