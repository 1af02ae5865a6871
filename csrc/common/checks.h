#pragma once
// Argument validation shared by every op's CPU and CUDA entry points. Errors name the argument, the
// value seen and what was expected (SPEC §2: "Bad input raises a RuntimeError naming the argument").
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>

namespace fusegraph {

// float32, bfloat16 or float16: the dtypes every fused op computes on.
inline bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

inline void check_float_tensor(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(t.defined(), "fusegraph.", op, ": argument '", arg, "' is undefined; expected a tensor");
  TORCH_CHECK(is_supported_float(t.scalar_type()), "fusegraph.", op, ": argument '", arg, "' has dtype ",
              t.scalar_type(), "; expected float32, bfloat16 or float16");
}

inline void check_same_device(const at::Tensor& ref, const char* ref_name, const at::Tensor& t, const char* op,
                              const char* arg) {
  TORCH_CHECK(t.device() == ref.device(), "fusegraph.", op, ": argument '", arg, "' is on ", t.device(),
              " but '", ref_name, "' is on ", ref.device(), "; expected both on the same device");
}

inline void check_eps(double eps, const char* op) {
  TORCH_CHECK_VALUE(eps >= 0.0 && std::isfinite(eps), "fusegraph.", op, ": argument 'eps' is ", eps,
                    "; expected a finite number >= 0");
}

inline std::optional<at::ScalarType> check_out_dtype(std::optional<at::ScalarType> out_dtype, const char* op) {
  if (out_dtype.has_value()) {
    TORCH_CHECK_VALUE(is_supported_float(*out_dtype), "fusegraph.", op, ": argument 'out_dtype' is ", *out_dtype,
                      "; expected float32, bfloat16 or float16");
  }
  return out_dtype;
}

}  // namespace fusegraph
