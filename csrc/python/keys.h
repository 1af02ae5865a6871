#pragma once
// Keying a call's Python arguments into the cache's Signature (csrc/graph/cache.h).
#include <torch/extension.h>

#include <memory>
#include <string>
#include <vector>

#include "graph/cache.h"

namespace fusegraph::python {

// An owned Python object behind the cache's opaque pointers (released with the GIL held).
std::shared_ptr<void> hold_py(pybind11::object obj);

struct Keyed {
  graph::Signature sig;
  std::vector<at::Tensor> tensors;
  // Miss when keyed; NotFlat, SpecialTensor or Unkeyable when not (the call does not reach the cache)
  graph::LookupStatus status = graph::LookupStatus::Miss;
  std::string why;  // Unkeyable: which argument and its type
  bool keyed() const { return status == graph::LookupStatus::Miss; }
};

// Keys a call's flat arguments: tensors by shape, dtype and device (and, for tensors sharing storage, which they
// share and their strides: Signature::add_aliasing); immutable values by value; modules,
// functions and the like by identity (held); anything else (numpy arrays, mutable or unknown objects, whose
// repr may be truncated or hide the state the function reads) is not keyed: the call runs uncaptured.
// Tensors that are subclasses (a __torch_function__ override the graph would drop) or that require grad
// under grad mode are handed back to the front end (SpecialTensor). `tensors_only`: stop at the first
// non-tensor (NotFlat: the front end flattens the arguments with pytree and keys them again).
Keyed key_leaves(const pybind11::sequence& leaves, bool tensors_only = false);

// The signature of arguments the front end already keyed successfully (insert, record_failure, ...).
graph::Signature signature_of(const pybind11::sequence& leaves, std::vector<at::Tensor>* tensors);

}  // namespace fusegraph::python
