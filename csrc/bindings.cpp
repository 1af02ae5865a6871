// The only file that knows Python: pybind11 bindings of the C++ core into fusegraph._C.
// Loading this module also registers the fusegraph:: operators (static TORCH_LIBRARY initialisers).
#include <torch/extension.h>

#include <ATen/ScalarOps.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include "ops/output.h"
#include "graph/cache.h"
#include "graph/frozen_guard.h"
#include "graph/host_graph.h"
#include "ops/autograd.h"
#include "ops/cpu/isa_dispatch.h"

#include <torch/csrc/DynamicTypes.h>

// ---- graph runtime (csrc/graph/*): the cache and the host graph, plus an Executable for Python drivers ----
namespace {

namespace fg = fusegraph::graph;

// An owned Python object behind the cache's opaque `user` pointer (released with the GIL held).
std::shared_ptr<void> hold_py(py::object obj) {
  return std::shared_ptr<void>(new py::object(std::move(obj)), [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
}

// ---- keying a call's arguments (the cache's Signature) ----
// What the runner does with a call that was not keyed (status codes shared with fusegraph/graph/runner.py).
constexpr int kKeyed = -1, kNotFlat = 3, kSpecialTensor = 4, kUnkeyable = 5;

struct Keyed {
  fg::Signature sig;
  std::vector<at::Tensor> tensors;
  int status = kKeyed;
  std::string why;  // kUnkeyable: which argument and its type
};

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

// Keys a call's flat arguments: tensors by shape, dtype and device; immutable values by value; modules,
// functions and the like by identity (held); anything else (numpy arrays, mutable or unknown objects, whose
// repr may be truncated or hide the state the function reads) is not keyed: the call runs uncaptured.
// Tensors that are subclasses (a __torch_function__ override the graph would drop) or that require grad
// under grad mode are handed back to the front end (kSpecialTensor). `tensors_only`: stop at the first
// non-tensor (kNotFlat: the front end flattens the arguments with pytree and keys them again).
Keyed key_leaves(const py::sequence& leaves, bool tensors_only = false) {
  Keyed k;
  k.sig.args.reserve(leaves.size());
  k.sig.grad_mode = at::GradMode::is_enabled();
  py::list held;
  int64_t pos = 0;
  for (py::handle h : leaves) {
    if (THPVariable_Check(h.ptr())) {
      const at::Tensor& t = THPVariable_Unpack(h.ptr());
      if (!THPVariable_CheckExact(h.ptr()) || (k.sig.grad_mode && t.requires_grad())) {
        k.status = kSpecialTensor;
        return k;
      }
      k.sig.add_tensor(t);
      k.tensors.push_back(t);
    } else if (tensors_only) {
      k.status = kNotFlat;
      return k;
    } else if (std::string v = value_key(h); !v.empty()) {
      k.sig.add_value(std::move(v));
    } else if (std::string id; identity_key(h, &id, &held)) {
      k.sig.add_value(std::move(id));
    } else {
      k.status = kUnkeyable;
      k.why = "argument " + std::to_string(pos) + " is a " + type_name(h);
      return k;
    }
    ++pos;
  }
  if (!held.empty()) k.sig.held = hold_py(std::move(held));
  k.sig.finish();
  return k;
}

// The signature of arguments the front end already keyed successfully (insert, record_failure, ...).
fg::Signature signature_of(const py::sequence& leaves, std::vector<at::Tensor>* tensors) {
  Keyed k = key_leaves(leaves);
  TORCH_CHECK(k.status == kKeyed, "fusegraph: these arguments cannot be keyed: ",
              k.why.empty() ? "a tensor subclass or a tensor that requires grad" : k.why);
  if (tensors) *tensors = std::move(k.tensors);
  return std::move(k.sig);
}

// Per-call check that the weights a captured graph read are still the ones in the module tree: each
// parameter, buffer, submodule and tensor attribute as a (dict, key, object) slot, plus the storage of each
// tensor (``p.data = other`` swaps it in place). A CUDA graph reads the captured addresses and the host graph
// holds the captured tensors, so in-place writes are seen by both; a replaced object or storage is not.
// One dict lookup and a pointer compare per slot, GIL held.
class SlotGuard {
 public:
  void add(py::dict dict, py::object key, py::object value) {
    Slot s{std::move(dict), std::move(key), std::move(value), nullptr, 0};
    if (THPVariable_Check(s.value.ptr())) {
      const at::Tensor& t = THPVariable_Unpack(s.value.ptr());
      if (t.has_storage()) s.storage = t.storage().unsafeGetStorageImpl();
      s.offset = t.storage_offset();
    }
    slots_.push_back(std::move(s));
  }
  // The first slot that changed ("" when none): its key.
  std::string changed() const {
    for (const Slot& s : slots_) {
      PyObject* now = PyDict_GetItemWithError(s.dict.ptr(), s.key.ptr());
      if (now == nullptr && PyErr_Occurred()) throw py::error_already_set();
      if (now != s.value.ptr()) return std::string(py::str(s.key));
      if (s.storage != nullptr) {
        const at::Tensor& t = THPVariable_Unpack(now);
        if (!t.has_storage() || t.storage().unsafeGetStorageImpl() != s.storage || t.storage_offset() != s.offset) {
          return std::string(py::str(s.key));
        }
      }
    }
    return "";
  }
  size_t size() const { return slots_.size(); }

 private:
  struct Slot {
    py::object dict, key, value;
    const c10::StorageImpl* storage;
    int64_t offset;
  };
  std::vector<Slot> slots_;
};

// A graph output or constant as an IValue: tensors, None, bool, int, float, str (what aten graphs return).
c10::IValue plain_ivalue(py::handle h) {
  if (THPVariable_Check(h.ptr())) return THPVariable_Unpack(h.ptr());
  if (h.is_none()) return c10::IValue();
  if (py::isinstance<py::bool_>(h)) return h.cast<bool>();
  if (py::isinstance<py::int_>(h)) return h.cast<int64_t>();
  if (py::isinstance<py::float_>(h)) return h.cast<double>();
  if (py::isinstance<py::str>(h)) return h.cast<std::string>();
  TORCH_CHECK(false, "fusegraph: a graph output of type ",
              std::string(py::str(py::type::handle_of(h).attr("__qualname__"))),
              " is not supported (expected tensors, None, bool, int, float or str)");
  return c10::IValue();
}

py::list to_py_list(const std::vector<c10::IValue>& values) {
  py::list out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = torch::jit::toPyObject(values[i]);
  return out;
}

// A graph captured by a Python driver (NPU graph, CUDA graph through torch.cuda, or the FX graph's own
// Python code when the host graph cannot run it). `run_fn()` replays on the static buffers and the stored
// outputs are returned; with binds_inputs, `run_fn(tensors)` runs on the caller's tensors and returns the
// outputs. `copy_fn(dst_groups, src_groups)`, when given, does the input copies (e.g. on a copy stream).
class PyExecutable final : public fg::Executable {
 public:
  PyExecutable(py::object run_fn, py::list outputs, bool binds_inputs, bool fresh, py::object copy_fn)
      : run_fn_(std::move(run_fn)), binds_(binds_inputs), fresh_(fresh), copy_fn_(std::move(copy_fn)) {
    for (py::handle h : outputs) outputs_.push_back(plain_ivalue(h));
  }
  ~PyExecutable() override {
    py::gil_scoped_acquire gil;
    run_fn_ = py::object();
    copy_fn_ = py::object();
  }
  std::vector<c10::IValue> run(const std::vector<at::Tensor>& inputs) override {
    py::gil_scoped_acquire gil;
    if (!binds_) {
      run_fn_();
      return outputs_;
    }
    py::list args(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) args[i] = py::cast(inputs[i]);
    py::object result = run_fn_(args);
    std::vector<c10::IValue> out;
    for (py::handle h : result) out.push_back(plain_ivalue(h));
    return out;
  }
  void copy_inputs(const std::vector<std::vector<at::Tensor>>& dsts,
                   const std::vector<std::vector<at::Tensor>>& srcs) override {
    if (copy_fn_.is_none()) return fg::Executable::copy_inputs(dsts, srcs);
    py::gil_scoped_acquire gil;
    copy_fn_(py::cast(dsts), py::cast(srcs));
  }
  bool binds_inputs() const override { return binds_; }
  bool outputs_are_fresh() const override { return fresh_; }

 private:
  py::object run_fn_;
  bool binds_, fresh_;
  py::object copy_fn_;
  std::vector<c10::IValue> outputs_;
};

// A constant argument. A Python number where the schema wants a Tensor (make_fx records `x * 2` as
// mul.Tensor(x, 2)) becomes a wrapped-number tensor, exactly as the Python argument parser makes it, so type
// promotion (and therefore the result) is the same as in the FX graph's own execution.
c10::IValue constant_ivalue(py::handle value, const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  if (t->kind() == c10::TypeKind::TensorType && !THPVariable_Check(value.ptr()) &&
      (py::isinstance<py::bool_>(value) || py::isinstance<py::int_>(value) || py::isinstance<py::float_>(value))) {
    at::Scalar scalar = py::isinstance<py::bool_>(value) ? at::Scalar(value.cast<bool>())
                        : py::isinstance<py::int_>(value) ? at::Scalar(value.cast<int64_t>())
                                                          : at::Scalar(value.cast<double>());
    at::Tensor tensor = c10::scalar_to_tensor(scalar);
    tensor.unsafeGetTensorImpl()->set_wrapped_number(true);
    return tensor;
  }
  return torch::jit::toIValue(value, type);
}

// One schema argument of a host-graph node from the FX node's Python value (ValueRef for node results).
fg::ArgTemplate arg_template(fg::HostGraph& graph, const c10::Argument& arg, py::handle value) {
  fg::ArgTemplate a;
  if (py::isinstance<fg::ValueRef>(value)) {
    a.kind = fg::ArgTemplate::Kind::Ref;
    a.ref = value.cast<fg::ValueRef>();
    return a;
  }
  auto list_type = arg.type()->cast<c10::ListType>();
  if (list_type && (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value))) {
    bool has_ref = false;
    for (py::handle e : value) has_ref |= py::isinstance<fg::ValueRef>(e);
    if (has_ref) {
      a.kind = fg::ArgTemplate::Kind::List;
      a.element_type = list_type->getElementType();
      for (py::handle e : value) {
        fg::ElementTemplate et;
        if (py::isinstance<fg::ValueRef>(e)) {
          et.is_ref = true;
          et.ref = e.cast<fg::ValueRef>();
        } else {
          et.constant = constant_ivalue(e, a.element_type);
          if (et.constant.isTensor()) graph.hold_constant(et.constant.toTensor());
        }
        a.elements.push_back(std::move(et));
      }
      return a;
    }
  }
  a.constant = constant_ivalue(value, arg.type());
  if (a.constant.isTensor()) graph.hold_constant(a.constant.toTensor());
  if (a.constant.isTensorList()) {
    for (const at::Tensor& t : a.constant.toTensorVector()) graph.hold_constant(t);
  }
  return a;
}

int32_t add_host_node(fg::HostGraph& graph, const std::string& name, const std::string& overload,
                      const py::sequence& args, const py::dict& kwargs) {
  c10::OperatorHandle op = fg::find_operator(name, overload);
  const auto& schema = op.schema();
  const auto& formals = schema.arguments();
  TORCH_CHECK(args.size() <= formals.size(), "fusegraph host graph: ", schema, " got ", args.size(),
              " positional arguments");
  size_t used_kwargs = 0;
  std::vector<fg::ArgTemplate> templates;
  for (size_t i = 0; i < formals.size(); ++i) {
    const auto& formal = formals[i];
    if (i < args.size()) {
      templates.push_back(arg_template(graph, formal, args[i]));
    } else if (kwargs.contains(formal.name())) {
      templates.push_back(arg_template(graph, formal, kwargs[py::str(formal.name())]));
      ++used_kwargs;
    } else {
      TORCH_CHECK(formal.default_value().has_value(), "fusegraph host graph: ", schema, ": argument '",
                  formal.name(), "' is missing and has no default");
      fg::ArgTemplate a;
      a.constant = *formal.default_value();
      templates.push_back(std::move(a));
    }
  }
  TORCH_CHECK(used_kwargs == kwargs.size(), "fusegraph host graph: ", schema, " got unknown keyword arguments ",
              std::string(py::repr(kwargs)));
  return graph.add_node(op, std::move(templates));
}

fg::Eviction parse_eviction(const std::string& s) {
  if (s == "fifo") return fg::Eviction::Fifo;
  if (s == "lru") return fg::Eviction::Lru;
  TORCH_CHECK_VALUE(false, "fusegraph: graph_eviction is '", s, "'; expected 'fifo' or 'lru'");
  return fg::Eviction::Fifo;
}

void bind_graph(py::module_& m) {
  py::class_<fg::ValueRef>(m, "ValueRef", "A host-graph value: the result of node `slot` (element `item` of it).")
      .def(py::init([](int32_t slot, int32_t item) { return fg::ValueRef{slot, item}; }), py::arg("slot"),
           py::arg("item") = -1)
      .def_readonly("slot", &fg::ValueRef::slot)
      .def_readonly("item", &fg::ValueRef::item)
      .def("__repr__", [](const fg::ValueRef& r) {
        return "ValueRef(" + std::to_string(r.slot) + (r.item >= 0 ? ", " + std::to_string(r.item) : "") + ")";
      });

  py::enum_<fg::FrozenMatch>(m, "FrozenMatch")
      .value("SAME", fg::FrozenMatch::kSame)
      .value("CHANGED", fg::FrozenMatch::kChanged)
      .value("OTHER", fg::FrozenMatch::kOther);

  py::class_<fg::FrozenGuard, std::shared_ptr<fg::FrozenGuard>>(
      m, "FrozenGuard", "Per-call check that the parameters a frozen graph folded are the ones passed, unchanged.")
      .def(py::init<std::vector<int64_t>, std::vector<at::Tensor>>(), py::arg("positions"), py::arg("params"))
      .def(
          "check",
          [](const fg::FrozenGuard& g, const py::tuple& args) {
            std::vector<const at::Tensor*> tensors(args.size(), nullptr);
            for (int64_t pos : g.positions()) {
              if (pos >= 0 && static_cast<size_t>(pos) < args.size()) {
                PyObject* h = PyTuple_GET_ITEM(args.ptr(), pos);
                if (THPVariable_Check(h)) tensors[pos] = &THPVariable_Unpack(h);
              }
            }
            return g.check(tensors);
          },
          py::arg("args"), "SAME, CHANGED (same tensors, values changed) or OTHER (other tensors).")
      .def_property_readonly("positions", &fg::FrozenGuard::positions)
      .def("__len__", &fg::FrozenGuard::size);

  py::class_<SlotGuard, std::shared_ptr<SlotGuard>>(
      m, "SlotGuard", "Per-call check that a module tree's parameters, buffers and submodules were not replaced.")
      .def(py::init<>())
      .def("add", &SlotGuard::add, py::arg("dict"), py::arg("key"), py::arg("value"))
      .def("changed", &SlotGuard::changed, "The key of the first slot whose object or storage changed, or ''.")
      .def("__len__", &SlotGuard::size);

  py::class_<fg::Executable, std::shared_ptr<fg::Executable>>(m, "Executable");

  py::class_<fg::HostGraph, fg::Executable, std::shared_ptr<fg::HostGraph>>(m, "HostGraph")
      .def(py::init<int32_t>(), py::arg("num_inputs"))
      .def("add_node", &add_host_node, py::arg("name"), py::arg("overload"), py::arg("args"), py::arg("kwargs"),
           "Appends one operator call; returns the slot of its first result.")
      .def("set_outputs",
           [](fg::HostGraph& g, const py::sequence& outs) {
             std::vector<fg::ArgTemplate> templates;
             for (py::handle h : outs) {
               fg::ArgTemplate a;
               if (py::isinstance<fg::ValueRef>(h)) {
                 a.kind = fg::ArgTemplate::Kind::Ref;
                 a.ref = h.cast<fg::ValueRef>();
               } else {
                 a.constant = plain_ivalue(h);
                 if (a.constant.isTensor()) g.hold_constant(a.constant.toTensor());
               }
               templates.push_back(std::move(a));
             }
             g.set_outputs(std::move(templates));
           })
      .def("finalize", &fg::HostGraph::finalize)
      // Without the GIL: a graph may hold collectives (c10d functional ops) whose backend threads (gloo's
      // workers, a ProcessGroup's watchdog) take the GIL while this thread waits on them; holding it here
      // deadlocked 2 runs in 10 on 2 gloo ranks. The GraphCache's call path releases it too.
      .def("run",
           [](fg::HostGraph& g, const std::vector<at::Tensor>& inputs) {
             std::vector<c10::IValue> out;
             {
               py::gil_scoped_release nogil;
               out = g.run(inputs);
             }
             return to_py_list(out);
           })
      .def("run_timed",
           [](fg::HostGraph& g, const std::vector<at::Tensor>& inputs) {
             std::vector<double> seconds;
             double release_seconds = 0.0;
             std::vector<c10::IValue> out;
             {
               py::gil_scoped_release nogil;
               out = g.run_timed(inputs, &seconds, &release_seconds);
             }
             return py::make_tuple(to_py_list(out), seconds, release_seconds);
           },
           "run() that also returns each instruction's own seconds (its callBoxed) and the seconds spent "
           "releasing dead values (tensor frees): (outputs, seconds, release_seconds)")
      .def_property_readonly("num_instructions", &fg::HostGraph::num_instructions)
      .def_property_readonly("constant_bytes", &fg::HostGraph::constant_bytes);

  py::class_<PyExecutable, fg::Executable, std::shared_ptr<PyExecutable>>(m, "PyExecutable")
      .def(py::init<py::object, py::list, bool, bool, py::object>(), py::arg("run_fn"), py::arg("outputs"),
           py::arg("binds_inputs"), py::arg("outputs_are_fresh"), py::arg("copy_fn") = py::none());

  py::class_<fg::GraphCache, std::shared_ptr<fg::GraphCache>>(m, "GraphCache")
      .def(py::init([](int64_t max_entries, const std::string& eviction, int64_t memory_budget, bool recapture,
                       bool safe_outputs) {
             TORCH_CHECK_VALUE(max_entries >= 0, "fusegraph: graph_max_entries is ", max_entries, "; expected >= 0");
             TORCH_CHECK_VALUE(memory_budget >= 0, "fusegraph: graph_memory_budget is ", memory_budget,
                               "; expected >= 0");
             fg::CacheOptions o;
             o.max_entries = max_entries;
             o.eviction = parse_eviction(eviction);
             o.memory_budget = memory_budget;
             o.recapture = recapture;
             o.safe_outputs = safe_outputs;
             return std::make_shared<fg::GraphCache>(o);
           }),
           py::arg("max_entries") = 0, py::arg("eviction") = "fifo", py::arg("memory_budget") = 0,
           py::arg("recapture") = true, py::arg("safe_outputs") = true)
      .def(
          "call",
          [](fg::GraphCache& c, const py::sequence& leaves, bool check_drift, bool tensors_only) -> py::tuple {
            Keyed k = key_leaves(leaves, tensors_only);
            if (k.status != kKeyed) return py::make_tuple(k.status, py::none(), py::none(), 0, 0, py::list(), k.why);
            fg::CallResult r;
            {
              // Other Python threads run while the graph replays (a Python driver's executable re-takes the
              // GIL itself). The runner's lock serialises calls of one runner before they get here.
              py::gil_scoped_release nogil;
              r = c.call(k.sig, k.tensors, check_drift);
            }
            py::object user = r.user ? *static_cast<py::object*>(r.user.get()) : py::none();
            py::object outs = r.status == fg::LookupStatus::Replayed ? py::object(to_py_list(r.outputs)) : py::none();
            return py::make_tuple(static_cast<int>(r.status), outs, user, r.copied, r.skipped, r.drifted, r.failure);
          },
          py::arg("leaves"), py::arg("check_drift") = false, py::arg("tensors_only") = false,
          "Replays the entry for these flat arguments: (status 0=replayed 1=miss 2=failed, outputs, user, "
          "copied, skipped, drifted positions, failure reason). Not keyed: status 3 (with "
          "tensors_only, a leaf is not a tensor), 4 (a tensor subclass, or a tensor requiring grad under grad "
          "mode), 5 (a value that cannot be keyed; the reason names it).")
      .def(
          "insert",
          [](fg::GraphCache& c, const py::sequence& leaves, std::vector<at::Tensor> static_inputs,
             std::shared_ptr<fg::Executable> exe, int64_t memory_bytes, py::object user) {
            std::vector<at::Tensor> tensors;
            fg::Signature sig = signature_of(leaves, &tensors);
            return c.insert(std::move(sig), std::move(static_inputs), std::move(tensors), std::move(exe),
                            memory_bytes, hold_py(std::move(user)));
          },
          py::arg("leaves"), py::arg("static_inputs"), py::arg("executable"), py::arg("memory_bytes"),
          py::arg("user") = py::none(), "Adds an entry; returns the ids of the entries evicted.")
      .def("record_failure",
           [](fg::GraphCache& c, const py::sequence& leaves, std::string reason) {
             c.record_failure(signature_of(leaves, nullptr), std::move(reason));
           })
      .def("mismatch_error", [](fg::GraphCache& c, const py::sequence& leaves) {
        return c.mismatch_error(signature_of(leaves, nullptr));
      })
      .def_static("describe_signature",
                  [](const py::sequence& leaves) { return signature_of(leaves, nullptr).describe(); })
      .def("clear", &fg::GraphCache::clear)
      .def("__len__", &fg::GraphCache::size)
      .def("entry_ids", &fg::GraphCache::entry_ids)
      .def("counters", [](const fg::GraphCache& c) {
        fg::Counters k = c.counters();
        py::dict d;
        d["graphs_captured"] = k.captured;
        d["replays"] = k.replays;
        d["inputs_copied"] = k.inputs_copied;
        d["inputs_skipped"] = k.inputs_skipped;
        d["evictions"] = k.evictions;
        d["recaptures"] = k.recaptures;
        d["fallback_calls"] = k.fallback_calls;
        d["graph_memory_bytes"] = k.memory_bytes;
        return d;
      });
}

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
  m.def("cpu_capability", [] { return std::string(fusegraph::cpu::capability_name(fusegraph::cpu::current_capability())); },
        "The instruction set the CPU kernels run with (DEFAULT, AVX2 or AVX512).");
  m.def("has_cuda_kernels", [] {
#ifdef FUSEGRAPH_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  fusegraph::set_autograd_hook(&autograd_hook);
  py::module_ graph = m.def_submodule("graph", "graph runtime: GraphCache, HostGraph, PyExecutable");
  bind_graph(graph);
}
