#pragma once
// fusegraph._C: the pybind11 bindings of the C++ core, one bind_* function per file of this folder
// (module.cpp defines the module and calls them). Nothing outside csrc/python/ knows Python.
#include <torch/extension.h>

namespace fusegraph::python {

// fusegraph._C.graph: the graph runtime (csrc/graph/*), graph.cpp
void bind_graph(pybind11::module_& m);

}  // namespace fusegraph::python
