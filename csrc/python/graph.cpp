// fusegraph._C.graph: the graph runtime (csrc/graph/*) for the Python front end (fusegraph/graph/): the cache
// with its typed call result, the counters a Stats shares with its caches, the host graph built from FX nodes,
// Python-driven executables and the per-call weight guards.
#include <pybind11/native_enum.h>
#include <structmember.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <algorithm>
#include <array>

#include "graph/cache.h"
#include "graph/counters.h"
#include "graph/frozen_guard.h"
#include "graph/host_graph.h"
#include "graph/schema_args.h"
#include "python/bind.h"
#include "python/keys.h"

namespace fusegraph::python {

namespace py = pybind11;
namespace fg = fusegraph::graph;

namespace {

// Per-call check that the weights a captured graph read are still the ones in the module tree: each
// parameter, buffer, submodule and tensor attribute as a (dict, key, object) slot, plus the storage of each
// tensor (``p.data = other`` swaps it in place). A CUDA graph reads the captured addresses and the host graph
// holds the captured tensors, so in-place writes are seen by both; a replaced object or storage is not.
// One dict lookup and a pointer compare per slot, GIL held.
class SlotGuard {
 public:
  // `container`: a dict (key: any key) or a list (key: an index, a list item holding a module: `LAYERS[0] = other`).
  void add(py::object container, py::object key, py::object value) {
    const bool is_list = PyList_Check(container.ptr());
    if (!is_list && !PyDict_Check(container.ptr())) {
      throw py::type_error("SlotGuard.add: container must be a dict or a list");
    }
    Slot s{std::move(container), std::move(key), std::move(value), nullptr, 0, is_list};
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
      PyObject* now;
      if (s.is_list) {
        const Py_ssize_t i = PyLong_AsSsize_t(s.key.ptr());
        now = (i >= 0 && i < PyList_GET_SIZE(s.dict.ptr())) ? PyList_GET_ITEM(s.dict.ptr(), i) : nullptr;
      } else {
        now = PyDict_GetItemWithError(s.dict.ptr(), s.key.ptr());
        if (now == nullptr && PyErr_Occurred()) throw py::error_already_set();
      }
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
    py::object dict, key, value;  // dict: the container (a dict or a list)
    const c10::StorageImpl* storage;
    int64_t offset;
    bool is_list;
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

py::list to_py_list(std::vector<c10::IValue>&& values) {
  py::list out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    PyList_SET_ITEM(out.ptr(), i, torch::jit::toPyObject(std::move(values[i])).release().ptr());
  }
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

// A host-graph node argument as Python passed it: a ValueRef, a list/tuple, a number or any other constant.
class PyArg final : public fg::ArgSource {
 public:
  explicit PyArg(py::handle value) : value_(value) {}
  std::optional<fg::ValueRef> ref() const override {
    if (!py::isinstance<fg::ValueRef>(value_)) return std::nullopt;
    return value_.cast<fg::ValueRef>();
  }
  std::optional<std::vector<std::unique_ptr<fg::ArgSource>>> elements() const override {
    if (!py::isinstance<py::list>(value_) && !py::isinstance<py::tuple>(value_)) return std::nullopt;
    std::vector<std::unique_ptr<fg::ArgSource>> out;
    for (py::handle e : value_) out.push_back(std::make_unique<PyArg>(e));
    return out;
  }
  std::optional<at::Scalar> number() const override {
    if (THPVariable_Check(value_.ptr())) return std::nullopt;
    if (py::isinstance<py::bool_>(value_)) return at::Scalar(value_.cast<bool>());
    if (py::isinstance<py::int_>(value_)) return at::Scalar(value_.cast<int64_t>());
    if (py::isinstance<py::float_>(value_)) return at::Scalar(value_.cast<double>());
    return std::nullopt;
  }
  c10::IValue to_ivalue(const c10::TypePtr& type) const override { return torch::jit::toIValue(value_, type); }

 private:
  py::handle value_;
};

int32_t add_host_node(fg::HostGraph& graph, const std::string& name, const std::string& overload,
                      const py::sequence& args, const py::dict& kwargs) {
  std::vector<PyArg> arg_values, kwarg_values;
  arg_values.reserve(args.size());
  kwarg_values.reserve(kwargs.size());
  std::vector<const fg::ArgSource*> positional;
  std::vector<std::pair<std::string, const fg::ArgSource*>> keywords;
  for (py::handle a : args) positional.push_back(&arg_values.emplace_back(a));
  for (auto [k, v] : kwargs) keywords.emplace_back(py::cast<std::string>(k), &kwarg_values.emplace_back(v));
  return fg::add_schema_node(graph, name, overload, positional, keywords);
}

// GraphCache.call's answer: a small read-only class written against the C API, because the runner builds and
// reads one on every call (member descriptors: a pybind11 class costs ~0.3 us more per call in getters and
// instance bookkeeping). Every field is set before the object is handed out; nothing in it refers back to it.
struct CallResultObject {
  PyObject_HEAD
  PyObject* status;   // a LookupStatus member
  PyObject* outputs;  // Replayed: the list of outputs; otherwise None
  PyObject* user;     // Replayed: the object given to insert; otherwise None
  PyObject* drifted;  // with check_drift: the positions not at the captured address (a tuple)
  PyObject* failure;  // Failed: the recorded reason; Unkeyable: the argument that cannot be keyed (a str)
  long long copied, skipped;
};

void call_result_dealloc(PyObject* self) {
  auto* r = reinterpret_cast<CallResultObject*>(self);
  for (PyObject* o : {r->status, r->outputs, r->user, r->drifted, r->failure}) Py_XDECREF(o);
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

PyObject* call_result_repr(PyObject* self) {
  auto* r = reinterpret_cast<CallResultObject*>(self);
  return PyUnicode_FromFormat("CallResult(status=%S, copied=%lld, skipped=%lld, failure=%R)", r->status, r->copied,
                              r->skipped, r->failure);
}

PyTypeObject* call_result_type() {
  static PyTypeObject* type = [] {
    static PyMemberDef members[] = {
        {"status", T_OBJECT_EX, offsetof(CallResultObject, status), READONLY, "a LookupStatus"},
        {"outputs", T_OBJECT_EX, offsetof(CallResultObject, outputs), READONLY, "Replayed: the outputs (a list)"},
        {"user", T_OBJECT_EX, offsetof(CallResultObject, user), READONLY, "Replayed: the object given to insert"},
        {"drifted", T_OBJECT_EX, offsetof(CallResultObject, drifted), READONLY,
         "with check_drift: input positions not at the captured address"},
        {"failure", T_OBJECT_EX, offsetof(CallResultObject, failure), READONLY,
         "Failed: the recorded reason; Unkeyable: the argument that cannot be keyed"},
        {"copied", T_LONGLONG, offsetof(CallResultObject, copied), READONLY, "inputs copied"},
        {"skipped", T_LONGLONG, offsetof(CallResultObject, skipped), READONLY, "inputs used in place"},
        {nullptr, 0, 0, 0, nullptr}};
    static PyType_Slot slots[] = {{Py_tp_dealloc, reinterpret_cast<void*>(&call_result_dealloc)},
                                  {Py_tp_repr, reinterpret_cast<void*>(&call_result_repr)},
                                  {Py_tp_members, members},
                                  {Py_tp_doc, const_cast<char*>("What GraphCache.call did (read-only).")},
                                  {0, nullptr}};
    static PyType_Spec spec = {"fusegraph._C.graph.CallResult", sizeof(CallResultObject), 0,
                               Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, slots};
    PyObject* t = PyType_FromSpec(&spec);
    if (t == nullptr) throw py::error_already_set();
    return reinterpret_cast<PyTypeObject*>(t);  // held for the process
  }();
  return type;
}

// A CallResult; takes the given objects over.
py::object make_call_result(py::object status, py::object outputs, py::object user, py::object drifted,
                            const std::string& failure, int64_t copied, int64_t skipped) {
  py::str why(failure);
  PyTypeObject* type = call_result_type();
  PyObject* o = type->tp_alloc(type, 0);
  if (o == nullptr) throw py::error_already_set();
  auto* r = reinterpret_cast<CallResultObject*>(o);
  r->status = status.release().ptr();
  r->outputs = outputs.release().ptr();
  r->user = user.release().ptr();
  r->drifted = drifted.release().ptr();
  r->failure = why.release().ptr();
  r->copied = copied;
  r->skipped = skipped;
  return py::reinterpret_steal<py::object>(o);
}

// The LookupStatus members, looked up once (the enum's own objects, so `status is LookupStatus.Miss` holds).
constexpr size_t kNumStatuses = static_cast<size_t>(fg::LookupStatus::Unkeyable) + 1;
std::array<py::object, kNumStatuses>& status_objects() {
  // leaked: no destructor runs after the interpreter
  static auto* objects = new std::array<py::object, kNumStatuses>();
  return *objects;
}

py::object status_object(fg::LookupStatus s) { return status_objects()[static_cast<size_t>(s)]; }

void bind_counters(py::module_& m) {
  auto cls = py::class_<fg::Counters, std::shared_ptr<fg::Counters>>(
      m, "Counters",
      "The scalar counters of one fusegraph.Stats, shared with the GraphCaches reporting into it (atomics). "
      "Each counter is an attribute; `names` lists them.");
  cls.def(py::init<>());
  py::tuple names(fg::kNumCounts + fg::kNumSeconds);
  for (int i = 0; i < fg::kNumCounts; ++i) {
    const auto c = static_cast<fg::Count>(i);
    const std::string name(fg::Counters::count_names()[i]);
    cls.def_property(name.c_str(), [c](const fg::Counters& k) { return k.get(c); },
                     [c](fg::Counters& k, int64_t n) { k.set(c, n); });
    names[i] = name;
  }
  for (int i = 0; i < fg::kNumSeconds; ++i) {
    const auto s = static_cast<fg::Seconds>(i);
    const std::string name(fg::Counters::seconds_names()[i]);
    cls.def_property(name.c_str(), [s](const fg::Counters& k) { return k.get(s); },
                     [s](fg::Counters& k, double x) { k.set(s, x); });
    names[fg::kNumCounts + i] = name;
  }
  cls.attr("names") = names;
  cls.def(
      "add",
      [](fg::Counters& k, const py::kwargs& amounts) {
        for (auto [key, value] : amounts) {
          const auto name = py::cast<std::string>(key);
          bool found = false;
          for (int i = 0; i < fg::kNumCounts && !found; ++i) {
            if (fg::Counters::count_names()[i] == name) {
              k.add(static_cast<fg::Count>(i), py::cast<int64_t>(value));
              found = true;
            }
          }
          for (int i = 0; i < fg::kNumSeconds && !found; ++i) {
            if (fg::Counters::seconds_names()[i] == name) {
              k.add(static_cast<fg::Seconds>(i), py::cast<double>(value));
              found = true;
            }
          }
          if (!found) throw py::attribute_error("fusegraph: Stats has no counter '" + name + "'");
        }
      },
      "add(name=amount, ...): adds to the named counters atomically.");
}

void bind_call(py::module_& m) {
  py::native_enum<fg::LookupStatus>(m, "LookupStatus", "enum.Enum",
                                    "What GraphCache.call found (the last three: the call was not keyed).")
      .value("Replayed", fg::LookupStatus::Replayed, "replayed the entry: outputs and user are set")
      .value("Miss", fg::LookupStatus::Miss, "no entry for this signature: capture it")
      .value("Failed", fg::LookupStatus::Failed, "this signature's capture failed before: run uncaptured")
      .value("NotFlat", fg::LookupStatus::NotFlat, "tensors_only and a leaf is not a tensor: flatten, call again")
      .value("SpecialTensor", fg::LookupStatus::SpecialTensor,
             "a tensor subclass, or a tensor that requires grad under grad mode")
      .value("Unkeyable", fg::LookupStatus::Unkeyable, "a value that cannot be keyed; failure names it")
      .finalize();
  for (size_t i = 0; i < status_objects().size(); ++i) {
    status_objects()[i] = py::cast(static_cast<fg::LookupStatus>(i));
  }
  m.attr("CallResult") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(call_result_type()));
}

}  // namespace

void bind_graph(py::module_& m) {
  bind_counters(m);
  bind_call(m);
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
      .def("add", &SlotGuard::add, py::arg("container"), py::arg("key"), py::arg("value"))
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
             return to_py_list(std::move(out));
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
             return py::make_tuple(to_py_list(std::move(out)), seconds, release_seconds);
           },
           "run() that also returns each instruction's own seconds (its callBoxed) and the seconds spent "
           "releasing dead values (tensor frees): (outputs, seconds, release_seconds)")
      .def_property_readonly("written_inputs", &fg::HostGraph::written_inputs,
                             "The inputs the graph writes in place, directly or through a view (after finalize)")
      .def("set_alias_fallback", &fg::HostGraph::set_alias_fallback, py::arg("graph"),
           "The graph run() runs instead when an input this graph writes shares storage with another input: the "
           "unfunctionalized trace of a functionalized graph (whose writes to its inputs come at its end)")
      .def_property_readonly("has_alias_fallback", &fg::HostGraph::has_alias_fallback)
      .def_property_readonly("num_instructions", &fg::HostGraph::num_instructions)
      .def_property_readonly("num_view_chains", &fg::HostGraph::num_view_chains,
                             "Instructions that are folded view chains (each one as_strided of its root on replay)")
      .def_property_readonly("num_views_folded", &fg::HostGraph::num_views_folded,
                             "The view ops those chains replaced")
      .def_property_readonly("constant_bytes", &fg::HostGraph::constant_bytes);

  py::class_<PyExecutable, fg::Executable, std::shared_ptr<PyExecutable>>(m, "PyExecutable")
      .def(py::init<py::object, py::list, bool, bool, py::object>(), py::arg("run_fn"), py::arg("outputs"),
           py::arg("binds_inputs"), py::arg("outputs_are_fresh"), py::arg("copy_fn") = py::none());

  py::native_enum<fg::Eviction>(m, "Eviction", "enum.Enum", "Which entry GraphCache evicts first.")
      .value("fifo", fg::Eviction::Fifo)
      .value("lru", fg::Eviction::Lru)
      .finalize();

  py::class_<fg::GraphCache, std::shared_ptr<fg::GraphCache>>(m, "GraphCache")
      .def(py::init([](int64_t max_entries, fg::Eviction eviction, int64_t memory_budget, bool recapture,
                       bool safe_outputs, std::shared_ptr<fg::Counters> counters,
                       std::vector<int64_t> static_positions) {
             fg::CacheOptions o;
             std::sort(static_positions.begin(), static_positions.end());
             o.static_positions = std::move(static_positions);
             o.max_entries = max_entries;
             o.eviction = eviction;
             o.memory_budget = memory_budget;
             o.recapture = recapture;
             o.safe_outputs = safe_outputs;
             return std::make_shared<fg::GraphCache>(o, std::move(counters));
           }),
           py::arg("max_entries") = 0, py::arg("eviction") = fg::Eviction::Fifo, py::arg("memory_budget") = 0,
           py::arg("recapture") = true, py::arg("safe_outputs") = true, py::arg("counters") = nullptr,
           py::arg("static_positions") = std::vector<int64_t>{},
           "Settings as validated by fusegraph.CompilationConfig; counts into `counters` (a Stats' counters); "
           "`static_positions`: tensor inputs held where they live, their address part of the signature.")
      .def(
          "call",
          [](fg::GraphCache& c, const py::sequence& leaves, bool check_drift, bool tensors_only) {
            Keyed k = key_leaves(leaves, tensors_only);
            if (!k.keyed()) {
              return make_call_result(status_object(k.status), py::none(), py::none(), py::tuple(), k.why, 0, 0);
            }
            fg::CallResult r;
            {
              // Other Python threads run while the graph replays (a Python driver's executable re-takes the
              // GIL itself). The runner's lock serialises calls of one runner before they get here.
              py::gil_scoped_release nogil;
              r = c.call(k.sig, k.tensors, check_drift);
            }
            py::object outputs = py::none(), user = py::none();
            if (r.status == fg::LookupStatus::Replayed) {
              outputs = to_py_list(std::move(r.outputs));
              if (r.user) user = *static_cast<py::object*>(r.user.get());
            }
            py::object drifted = r.drifted.empty() ? py::tuple() : py::tuple(py::cast(r.drifted));
            return make_call_result(status_object(r.status), std::move(outputs), std::move(user),
                                    std::move(drifted), r.failure, r.copied, r.skipped);
          },
          py::arg("leaves"), py::arg("check_drift") = false, py::arg("tensors_only") = false,
          "Replays the entry for these flat arguments, or says why not: a CallResult.")
      // Every method that takes the cache's mutex releases the GIL first: a replay holds the mutex without the GIL
      // and its executable may take the GIL (a Python driver's run, a Python kernel in the graph), so a thread
      // waiting for the mutex with the GIL held would deadlock the process. Python objects are converted before.
      .def(
          "insert",
          [](fg::GraphCache& c, const py::sequence& leaves, std::vector<at::Tensor> static_inputs,
             std::shared_ptr<fg::Executable> exe, int64_t memory_bytes, py::object user) {
            std::vector<at::Tensor> tensors;
            fg::Signature sig = signature_of(leaves, &tensors);
            std::shared_ptr<void> held = hold_py(std::move(user));
            py::gil_scoped_release nogil;
            return c.insert(std::move(sig), std::move(static_inputs), std::move(tensors), std::move(exe),
                            memory_bytes, std::move(held));
          },
          py::arg("leaves"), py::arg("static_inputs"), py::arg("executable"), py::arg("memory_bytes"),
          py::arg("user") = py::none(), "Adds an entry; returns the ids of the entries evicted.")
      .def("record_failure",
           [](fg::GraphCache& c, const py::sequence& leaves, std::string reason) {
             std::vector<at::Tensor> tensors;
             fg::Signature sig = signature_of(leaves, &tensors);
             py::gil_scoped_release nogil;
             c.record_failure(sig, std::move(reason), tensors);
           })
      .def("mismatch_error", [](fg::GraphCache& c, const py::sequence& leaves) {
        std::vector<at::Tensor> tensors;
        fg::Signature sig = signature_of(leaves, &tensors);
        py::gil_scoped_release nogil;
        return c.mismatch_error(sig, tensors);
      })
      .def_static("describe_signature",
                  [](const py::sequence& leaves) { return signature_of(leaves, nullptr).describe(); })
      .def("clear", &fg::GraphCache::clear, py::call_guard<py::gil_scoped_release>())
      .def("__len__", &fg::GraphCache::size, py::call_guard<py::gil_scoped_release>())
      .def("entry_ids", &fg::GraphCache::entry_ids, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("memory_bytes",
                             py::cpp_function(&fg::GraphCache::memory_bytes, py::call_guard<py::gil_scoped_release>()),
                             "Measured memory of this cache's resident entries.")
      .def_property_readonly("counters", &fg::GraphCache::counters, "The Counters this cache counts into.");
}

}  // namespace fusegraph::python
