#pragma once
// Argument validation shared by every op's CPU and CUDA entry points. Errors name the argument, the
// value seen and what was expected (SPEC §2: "Bad input raises a RuntimeError naming the argument").
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <optional>
#include <string>

namespace fusegraph {

// float32, bfloat16 or float16 (the dtypes the fused kernels read and write), or float64 (accepted so that
// gradcheck can run: an op with a float64 argument computes its documented math with at:: ops in float64).
inline bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kDouble;
}

// The float64 path: true when any given tensor (undefined ones are skipped) or the output dtype is float64.
// Entry points call it after the checks and then compute with at:: ops in float64 instead of the kernels.
inline bool uses_float64(std::initializer_list<const at::Tensor*> tensors,
                         std::optional<at::ScalarType> out_dtype = std::nullopt) {
  if (out_dtype.has_value() && *out_dtype == at::kDouble) return true;
  for (const at::Tensor* t : tensors) {
    if (t != nullptr && t->defined() && t->scalar_type() == at::kDouble) return true;
  }
  return false;
}

inline void check_float_tensor(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(t.defined(), "fusegraph.", op, ": argument '", arg, "' is undefined; expected a tensor");
  TORCH_CHECK(is_supported_float(t.scalar_type()), "fusegraph.", op, ": argument '", arg, "' has dtype ",
              t.scalar_type(), "; expected float32, bfloat16, float16 or float64");
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

// The `eps_tensor` overloads (rms_norm, adaln): eps given as a 0-d floating-point CPU tensor, the form in which
// Dynamo passes a module's Python float attribute under torch.compile(dynamic=True) (diffusers RMSNorm's
// self.eps). Its value is read here, on the host, at every call: a CPU scalar read costs no device sync, and a
// tensor on a GPU is refused (reading it would synchronise, and a CUDA graph capture cannot). Then check_eps.
inline double eps_from_tensor(const at::Tensor& eps, const char* op) {
  TORCH_CHECK(eps.defined(), "fusegraph.", op, ": argument 'eps' is an undefined tensor; expected a 0-d floating-point "
              "tensor on the CPU or a number");
  TORCH_CHECK(eps.dim() == 0 && at::isFloatingType(eps.scalar_type()) && eps.device().is_cpu(), "fusegraph.", op,
              ": argument 'eps' is a tensor of shape ", eps.sizes(), ", dtype ", eps.scalar_type(), " on ",
              eps.device(), "; expected a 0-d floating-point tensor on the CPU or a number");
  const double value = eps.item<double>();
  check_eps(value, op);
  return value;
}

inline std::optional<at::ScalarType> check_out_dtype(std::optional<at::ScalarType> out_dtype, const char* op) {
  if (out_dtype.has_value()) {
    TORCH_CHECK_VALUE(is_supported_float(*out_dtype), "fusegraph.", op, ": argument 'out_dtype' is ", *out_dtype,
                      "; expected float32, bfloat16, float16 or float64");
  }
  return out_dtype;
}

}  // namespace fusegraph
