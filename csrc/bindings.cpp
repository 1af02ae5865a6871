// The only file that knows Python: pybind11 bindings of the C++ core into fusegraph._C.
// Loading this module also registers the fusegraph:: operators (static TORCH_LIBRARY initialisers).
#include <torch/extension.h>

#include "common/output.h"
#include "ops/cpu/dispatch.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "fusegraph C++ core: fused ops (torch.ops.fusegraph.*) and graph runtime";
  m.def("_set_poison_outputs", &fusegraph::set_poison_outputs,
        "Debug: fill every op output with NaN before its kernel writes it (tests use this).");
  m.def("_poison_outputs", &fusegraph::poison_outputs);
  m.def("cpu_capability", [] { return std::string(fusegraph::cpu::capability_name(fusegraph::cpu::current_capability())); },
        "The instruction set the CPU kernels run with (DEFAULT, AVX2 or AVX512).");
  m.def("has_cuda_kernels", [] {
#ifdef FUSEGRAPH_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
}
