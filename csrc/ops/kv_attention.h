#pragma once
// Attention of a few new queries over a key/value cache and the new keys/values (one decode step):
// softmax(q k^T * scale) v with k = cat([k_cache, k_new], -2), v = cat([v_cache, v_new], -2), without
// building the concatenation. No mask, no dropout, not causal.
#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/cpu/isa_dispatch.h"

namespace fusegraph {

// The shapes of one call, validated: q [B, H, Lq, D], keys [B, H, L*, D], values [B, H, L*, Dv].
struct KvAttentionShape {
  int64_t batch, heads, queries, cached, added, dim, value_dim;
};

// out[b, h, i, :] for every row; every tensor's last dim is contiguous, out is contiguous [B, H, Lq, Dv].
using kv_attention_fn = void (*)(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& k_new,
                                 const at::Tensor& v_cache, const at::Tensor& v_new, double scale,
                                 const KvAttentionShape& shape, at::Tensor& out);
FG_DECLARE_CPU_STUB(kv_attention_stub, kv_attention_fn);

// Validates the arguments on any device; returns the shapes.
KvAttentionShape check_kv_attention_args(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& k_new,
                                         const at::Tensor& v_cache, const at::Tensor& v_new,
                                         std::optional<double> scale);

// The same math with at:: ops (concatenation, then scaled_dot_product_attention): the float64 path and the
// path of every device without a kernel of its own.
at::Tensor kv_attention_reference(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& k_new,
                                  const at::Tensor& v_cache, const at::Tensor& v_new, std::optional<double> scale);

}  // namespace fusegraph
