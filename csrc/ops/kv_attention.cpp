#include "ops/kv_attention.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>

#include "ops/checks.h"
#include "ops/output.h"

namespace fusegraph {

FG_DEFINE_CPU_STUB(kv_attention_stub, kv_attention_fn);

namespace {

constexpr const char* kOp = "kv_attention";

void check_4d(const at::Tensor& t, const char* arg) {
  TORCH_CHECK(t.dim() == 4, "fusegraph.", kOp, ": argument '", arg, "' has shape ", t.sizes(),
                    "; expected 4 dims [batch, heads, length, head_dim]");
}

void check_dim(const at::Tensor& t, const char* arg, int64_t d, int64_t expected, const char* what) {
  TORCH_CHECK(t.size(d) == expected, "fusegraph.", kOp, ": argument '", arg, "' has shape ", t.sizes(),
                    "; expected ", what, " ", expected, " at dim ", d);
}

}  // namespace

KvAttentionShape check_kv_attention_args(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& k_new,
                                         const at::Tensor& v_cache, const at::Tensor& v_new,
                                         std::optional<double> scale) {
  const std::pair<const at::Tensor*, const char*> args[] = {
      {&q, "q"}, {&k_cache, "k_cache"}, {&k_new, "k_new"}, {&v_cache, "v_cache"}, {&v_new, "v_new"}};
  for (const auto& [t, name] : args) {
    check_float_tensor(*t, kOp, name);
    check_4d(*t, name);
  }
  for (const auto& [t, name] : args) {
    check_same_device(q, "q", *t, kOp, name);
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "fusegraph.", kOp, ": argument '", name, "' has dtype ",
                      t->scalar_type(), "; expected q's dtype ", q.scalar_type());
    check_dim(*t, name, 0, q.size(0), "q's batch size");
    check_dim(*t, name, 1, q.size(1), "q's number of heads");
  }
  check_dim(k_cache, "k_cache", 3, q.size(3), "q's head_dim");
  check_dim(k_new, "k_new", 3, q.size(3), "q's head_dim");
  check_dim(v_cache, "v_cache", 2, k_cache.size(2), "k_cache's length");
  check_dim(v_new, "v_new", 2, k_new.size(2), "k_new's length");
  check_dim(v_new, "v_new", 3, v_cache.size(3), "v_cache's head_dim");
  TORCH_CHECK(k_cache.size(2) + k_new.size(2) > 0, "fusegraph.", kOp,
                    ": k_cache and k_new are both empty (length 0); expected at least one key");
  if (scale.has_value()) {
    TORCH_CHECK_VALUE(std::isfinite(*scale), "fusegraph.", kOp, ": argument 'scale' is ", *scale,
                      "; expected a finite number or None");
  }
  return {q.size(0), q.size(1), q.size(2), k_cache.size(2), k_new.size(2), q.size(3), v_cache.size(3)};
}

at::Tensor kv_attention_reference(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& k_new,
                                  const at::Tensor& v_cache, const at::Tensor& v_new, std::optional<double> scale) {
  const KvAttentionShape s = check_kv_attention_args(q, k_cache, k_new, v_cache, v_new, scale);
  at::Tensor out = new_output({s.batch, s.heads, s.queries, s.value_dim}, q.options());
  if (out.numel() == 0) return out;
  const at::Tensor keys = at::cat({k_cache, k_new}, 2);
  const at::Tensor values = at::cat({v_cache, v_new}, 2);
  return out.copy_(at::scaled_dot_product_attention(q, keys, values, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                    /*is_causal=*/false, scale));
}

namespace {

at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return t.stride(-1) == 1 || t.size(-1) <= 1 ? t : t.contiguous();
}

at::Tensor kv_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& k_new,
                            const at::Tensor& v_cache, const at::Tensor& v_new, std::optional<double> scale) {
  const KvAttentionShape s = check_kv_attention_args(q, k_cache, k_new, v_cache, v_new, scale);
  if (uses_float64({&q})) return kv_attention_reference(q, k_cache, k_new, v_cache, v_new, scale);
  at::Tensor out = new_output({s.batch, s.heads, s.queries, s.value_dim}, q.options());
  if (out.numel() == 0) return out;
  const double sc = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(s.dim));
  kv_attention_stub.get(kOp)(last_dim_contiguous(q), last_dim_contiguous(k_cache), last_dim_contiguous(k_new),
                             last_dim_contiguous(v_cache), last_dim_contiguous(v_new), sc, s, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CPU, m) { m.impl("kv_attention", &kv_attention_cpu); }

// Every other device (CUDA, NPU): the at:: ops; the fusion pass only fuses CPU sites.
TORCH_LIBRARY_IMPL(fusegraph, CompositeExplicitAutograd, m) {
  m.impl("kv_attention", &kv_attention_reference);
}

}  // namespace fusegraph
