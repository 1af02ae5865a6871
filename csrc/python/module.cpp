// fusegraph._C: the module (PYBIND11_MODULE) and the ops-level functions. Loading it also registers the
// fusegraph:: operators (static TORCH_LIBRARY initialisers in csrc/ops) and the ops' Python autograd hook.
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include "aot/package_check.h"
#include "ops/autograd.h"
#include "ops/cpu/isa_dispatch.h"
#include "ops/output.h"
#include "python/bind.h"

namespace {

// The ops' autograd path (csrc/ops/autograd.h): the call's arguments as Python values, handed to
// fusegraph.ops._autograd.apply(name, overload, args), which returns the op's result.
void autograd_hook(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  py::gil_scoped_acquire gil;
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  py::list args(n);
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = (*stack)[stack->size() - n + i];
    const c10::TypePtr& real = schema.arguments()[i].real_type();
    const bool dtype = real->kind() == c10::TypeKind::ScalarTypeType ||
                       (real->kind() == c10::TypeKind::OptionalType &&
                        real->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::ScalarTypeType);
    if (dtype && v.isInt()) {  // a ScalarType travels as an int: hand Python a torch.dtype
      args[i] = py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(v.toInt()))));
    } else {
      args[i] = torch::jit::toPyObject(v);
    }
  }
  py::object out;
  try {
    out = py::module_::import("fusegraph.ops._autograd").attr("apply")(schema.name(), schema.overload_name(), args);
  } catch (py::error_already_set& e) {
    TORCH_CHECK(false, e.what());
  }
  torch::jit::drop(*stack, n);
  stack->push_back(torch::jit::toIValue(out, schema.returns()[0].type()));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "fusegraph C++ core: fused ops (torch.ops.fusegraph.*) and graph runtime";
  m.def("_set_poison_outputs", &fusegraph::set_poison_outputs,
        "Debug: fill every op output with NaN before its kernel writes it (tests use this).");
  m.def("_poison_outputs", &fusegraph::poison_outputs);
  m.def("_new_output_like", [](const at::Tensor& t) { return fusegraph::new_output(t.sizes(), t.options()); },
        "Debug: a fresh output shaped like t, allocated as the ops allocate theirs (NaN-filled in poison mode); "
        "tests write it with kernel stand-ins.");
  m.def("cpu_capability",
        [] { return std::string(fusegraph::cpu::capability_name(fusegraph::cpu::current_capability())); },
        "The instruction set the CPU kernels run with (DEFAULT, AVX2 or AVX512).");
  m.def("has_cuda_kernels", [] {
#ifdef FUSEGRAPH_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  m.def("aot_package_problems", &fusegraph::aot::package_problems, py::arg("metadata"), py::arg("path"),
        "Why this process cannot run an AOTInductor package made by fusegraph.aot.package, one reason per line "
        "(csrc/aot/package_check.h); empty when it can.");
  m.def("aot_prepare_inputs", &fusegraph::aot::prepare_inputs, py::arg("metadata"), py::arg("inputs"),
        "The flat inputs as the package's code takes them (one in another layout copied into the exported one); "
        "raises RuntimeError naming the input when they do not fit the package's fusegraph.inputs.");
  fusegraph::set_autograd_hook(&autograd_hook);
  py::module_ graph = m.def_submodule("graph", "graph runtime: GraphCache, HostGraph, PyExecutable");
  fusegraph::python::bind_graph(graph);
}
