#include "python/keys.h"

namespace fusegraph::python {

namespace py = pybind11;
namespace fg = fusegraph::graph;

std::shared_ptr<void> hold_py(py::object obj) {
  return std::shared_ptr<void>(new py::object(std::move(obj)), [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
}

namespace {

// Types looked up once, with the GIL held (leaked on purpose: no destructor runs after the interpreter).
struct KeyTypes {
  py::object dtype, device, layout, memory_format, module, enum_base, np_generic;
  static const KeyTypes& get() {
    static const KeyTypes* t = [] {
      auto* k = new KeyTypes;
      py::module_ torch = py::module_::import("torch");
      k->dtype = py::type::of(torch.attr("float32"));
      k->device = torch.attr("device");
      k->layout = py::type::of(torch.attr("strided"));
      k->memory_format = py::type::of(torch.attr("contiguous_format"));
      k->module = torch.attr("nn").attr("Module");
      k->enum_base = py::module_::import("enum").attr("Enum");
      try {
        k->np_generic = py::module_::import("numpy").attr("generic");
      } catch (const py::error_already_set&) {
        k->np_generic = py::none();
      }
      return k;
    }();
    return *t;
  }
};

std::string type_name(py::handle h) { return py::str(py::type::handle_of(h).attr("__qualname__")); }

bool is_instance(py::handle h, const py::object& type) {
  return !type.is_none() && PyObject_IsInstance(h.ptr(), type.ptr()) == 1;
}

// An immutable value whose repr is exact and canonical: keyed by type and value. Empty when it is not one.
std::string value_key(py::handle h) {
  PyObject* o = h.ptr();
  const KeyTypes& k = KeyTypes::get();
  if (o == Py_None || o == Py_Ellipsis || PyBool_Check(o) || PyLong_CheckExact(o) || PyFloat_CheckExact(o) ||
      PyComplex_CheckExact(o) || PyUnicode_CheckExact(o) || PyBytes_CheckExact(o) || is_instance(h, k.dtype) ||
      is_instance(h, k.device) || is_instance(h, k.layout) || is_instance(h, k.memory_format) ||
      is_instance(h, k.np_generic)) {
    return type_name(h) + ":" + std::string(py::repr(h));
  }
  if (PySlice_Check(o)) {
    auto* sl = reinterpret_cast<PySliceObject*>(o);
    for (PyObject* part : {sl->start, sl->stop, sl->step}) {
      if (value_key(part).empty()) return "";
    }
    return "slice:" + std::string(py::repr(h));
  }
  return "";
}

// An object whose identity is what matters (a module, a function, a class, an enum member): keyed by
// address, held. Bound methods are new objects on every attribute access: keyed by (self, function).
bool identity_key(py::handle h, std::string* key, py::list* held) {
  PyObject* o = h.ptr();
  const KeyTypes& k = KeyTypes::get();
  auto address = [](PyObject* p) { return std::to_string(reinterpret_cast<uintptr_t>(p)); };
  if (PyMethod_Check(o)) {
    PyObject* self = PyMethod_GET_SELF(o);
    PyObject* func = PyMethod_GET_FUNCTION(o);
    *key = "method@" + address(self) + "." + address(func);
    held->append(py::reinterpret_borrow<py::object>(self));
    held->append(py::reinterpret_borrow<py::object>(func));
    return true;
  }
  if (PyType_Check(o) || PyFunction_Check(o) || PyCFunction_Check(o) || PyModule_Check(o) ||
      is_instance(h, k.enum_base) || is_instance(h, k.module)) {
    *key = type_name(h) + "@" + address(o);
    held->append(h);
    return true;
  }
  return false;
}

}  // namespace

Keyed key_leaves(const py::sequence& leaves, bool tensors_only) {
  Keyed k;
  k.sig.args.reserve(leaves.size());
  k.sig.grad_mode = at::GradMode::is_enabled();
  py::list held;
  int64_t pos = 0;
  for (py::handle h : leaves) {
    if (THPVariable_Check(h.ptr())) {
      const at::Tensor& t = THPVariable_Unpack(h.ptr());
      if (!THPVariable_CheckExact(h.ptr()) || (k.sig.grad_mode && t.requires_grad())) {
        k.status = fg::LookupStatus::SpecialTensor;
        return k;
      }
      k.sig.add_tensor(t);
      k.tensors.push_back(t);
    } else if (tensors_only) {
      k.status = fg::LookupStatus::NotFlat;
      return k;
    } else if (std::string v = value_key(h); !v.empty()) {
      k.sig.add_value(std::move(v));
    } else if (std::string id; identity_key(h, &id, &held)) {
      k.sig.add_value(std::move(id));
    } else {
      k.status = fg::LookupStatus::Unkeyable;
      k.why = "argument " + std::to_string(pos) + " is a " + type_name(h);
      return k;
    }
    ++pos;
  }
  if (!held.empty()) k.sig.held = hold_py(std::move(held));
  if (!k.sig.add_aliasing(k.tensors)) {
    k.status = fg::LookupStatus::Unkeyable;
    k.why = "tensor arguments share memory and one of them overlaps itself (an expanded view): a graph captured on "
            "a dense copy would cut the sharing";
    return k;
  }
  k.sig.finish();
  return k;
}

fg::Signature signature_of(const py::sequence& leaves, std::vector<at::Tensor>* tensors) {
  Keyed k = key_leaves(leaves);
  TORCH_CHECK(k.keyed(), "fusegraph: these arguments cannot be keyed: ",
              k.why.empty() ? "a tensor subclass or a tensor that requires grad" : k.why);
  if (tensors) *tensors = std::move(k.tensors);
  return std::move(k.sig);
}

}  // namespace fusegraph::python
