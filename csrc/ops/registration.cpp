// The fusegraph operator library: every schema lives here, so the whole op surface is readable in one
// place. Kernels register per op file (TORCH_LIBRARY_IMPL(fusegraph, CPU|CUDA, m)); fake (meta) kernels
// are Python (fusegraph/ops/*.py, torch.library.register_fake) so they handle symbolic shapes.
#include <torch/library.h>

TORCH_LIBRARY(fusegraph, m) {
  // set_python_module applies to the defs after it: it names the module that holds each op's fake kernel.
  m.set_python_module("fusegraph.ops.rms_norm");
  // Every tensor argument is positional (bias, and adaln's weight/bias, may still be passed by keyword):
  // the gradient formulas follow torch.library.register_autograd's contract, which takes tensors positionally (DESIGN §3.1).
  m.def("rms_norm(Tensor x, Tensor? weight=None, float eps=1e-06, Tensor? bias=None, *, str style=\"torch\") -> Tensor");
  // eps_tensor: eps as a 0-d CPU tensor read at each call (checks.h: eps_from_tensor), what the fusion passes emit
  // for a norm whose eps Dynamo passes as an input under torch.compile(dynamic=True). Same math otherwise.
  m.def(
      "rms_norm.eps_tensor(Tensor x, Tensor? weight, Tensor eps, Tensor? bias=None, *, str style=\"torch\") -> "
      "Tensor");
  m.set_python_module("fusegraph.ops.rope");
  // interleaved is a bool; it is declared `Scalar?` so that the op itself sees and rejects None and numbers other
  // than 0 and 1, which a `bool` argument would silently coerce (None -> False: rotate-half; 0.5 -> True).
  m.def("rope(Tensor x, Tensor cos, Tensor sin, *, Scalar? interleaved=True, int? rotary_dim=None) -> Tensor");
  m.set_python_module("fusegraph.ops.adaln");
  m.def(
      "adaln(Tensor x, Tensor scale, Tensor? shift=None, float eps=1e-06, Tensor? weight=None, Tensor? bias=None, *, "
      "ScalarType? out_dtype=None, str norm=\"layer\") -> Tensor");
  m.def(
      "adaln.eps_tensor(Tensor x, Tensor scale, Tensor? shift, Tensor eps, Tensor? weight=None, Tensor? bias=None, *, "
      "ScalarType? out_dtype=None, str norm=\"layer\") -> Tensor");
  m.set_python_module("fusegraph.ops.gelu");
  m.def("gelu_tanh(Tensor x) -> Tensor");
  m.def("fast_gelu(Tensor x) -> Tensor");
  m.set_python_module("fusegraph.ops.mul_add");
  m.def("mul_add(Tensor a, Tensor b, Tensor c, *, ScalarType? out_dtype=None) -> Tensor");
  m.def("mul_add.Scalar(Tensor a, Scalar b, Tensor c, *, ScalarType? out_dtype=None) -> Tensor");
  m.set_python_module("fusegraph.ops.kv_attention");
  m.def(
      "kv_attention(Tensor q, Tensor k_cache, Tensor k_new, Tensor v_cache, Tensor v_new, *, float? scale=None) "
      "-> Tensor");
  m.set_python_module("fusegraph.ops.gemv");
  m.def("gemv(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
  m.set_python_module("fusegraph.ops.linear");
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
}
