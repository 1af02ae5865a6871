#include "graph/host_graph.h"

#include <ATen/core/stack.h>
#include <ATen/ops/as_strided.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <unordered_set>
#include <c10/util/Exception.h>

namespace fusegraph::graph {

c10::OperatorHandle find_operator(const std::string& name, const std::string& overload) {
  auto op = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(op.has_value(), "fusegraph host graph: no operator ", name, (overload.empty() ? "" : "."), overload,
              " is registered with the dispatcher");
  return *op;
}

int32_t HostGraph::add_node(const c10::OperatorHandle& op, std::vector<ArgTemplate> args) {
  TORCH_CHECK(!finalized_, "fusegraph host graph: add_node after finalize");
  const auto& schema = op.schema();
  TORCH_CHECK(args.size() == schema.arguments().size(), "fusegraph host graph: ", schema.operator_name(), " takes ",
              schema.arguments().size(), " arguments, got ", args.size());
  TORCH_CHECK(!schema.is_vararg() && !schema.is_varret(), "fusegraph host graph: ", schema.operator_name(),
              " has variadic arguments or returns");
  auto check_ref = [&](const ValueRef& r) {
    TORCH_CHECK(r.slot >= 0 && r.slot < num_slots_, "fusegraph host graph: ", schema.operator_name(),
                " refers to value ", r.slot, " which is not computed before it");
  };
  for (const auto& a : args) {
    if (a.kind == ArgTemplate::Kind::Ref) check_ref(a.ref);
    if (a.kind == ArgTemplate::Kind::List) {
      TORCH_CHECK(a.element_type, "fusegraph host graph: list argument without an element type");
      for (const auto& e : a.elements) {
        if (e.is_ref) check_ref(e.ref);
      }
    }
  }
  Instruction ins{op, std::move(args), num_slots_, static_cast<int32_t>(schema.returns().size()), {}, "", nullptr};
  ins.name = schema.name() + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
  max_args_ = std::max(max_args_, std::max(ins.args.size(), static_cast<size_t>(ins.num_outputs)));
  num_slots_ += ins.num_outputs;
  instructions_.push_back(std::move(ins));
  return instructions_.back().first_output_slot;
}

void HostGraph::set_outputs(std::vector<ArgTemplate> outputs) {
  for (const auto& o : outputs) {
    TORCH_CHECK(o.kind != ArgTemplate::Kind::List, "fusegraph host graph: a graph output must be a single value");
    if (o.kind == ArgTemplate::Kind::Ref) {
      TORCH_CHECK(o.ref.slot >= 0 && o.ref.slot < num_slots_, "fusegraph host graph: output refers to value ",
                  o.ref.slot, " which the graph does not compute");
    }
  }
  outputs_ = std::move(outputs);
}

void HostGraph::hold_constant(const at::Tensor& t) {
  if (!t.defined()) return;
  constants_.push_back(t);
  if (t.has_storage()) constant_storages_.insert(t.storage().unsafeGetStorageImpl());
}

namespace {

// View ops whose result's storage offset is the viewed tensor's plus a constant, for a given geometry of the
// viewed tensor and given constant arguments (not as_strided: its offset is absolute; not view.dtype).
const std::unordered_set<std::string>& foldable_view_ops() {
  static const std::unordered_set<std::string> ops{
      "aten::view",        "aten::permute",       "aten::transpose.int", "aten::t",
      "aten::expand",      "aten::slice.Tensor",  "aten::select.int",    "aten::unsqueeze",
      "aten::squeeze",     "aten::squeeze.dim",   "aten::squeeze.dims",  "aten::alias",
      "aten::narrow",      "aten::diagonal",      "aten::unfold",        "aten::split.Tensor",
      "aten::split_with_sizes", "aten::chunk",    "aten::unbind.int"};
  return ops;
}

// A view op of the list above whose only non-constant argument is the tensor it views (its first).
bool is_foldable_view(const Instruction& ins) {
  if (ins.views || ins.num_outputs != 1 || ins.args.empty() || foldable_view_ops().count(ins.name) == 0) return false;
  if (ins.args[0].kind != ArgTemplate::Kind::Ref) return false;
  return std::all_of(ins.args.begin() + 1, ins.args.end(),
                     [](const ArgTemplate& a) { return a.kind == ArgTemplate::Kind::Constant; });
}

bool returns_one_tensor(const Instruction& ins) {
  return ins.op.schema().returns()[0].type()->kind() == c10::TypeKind::TensorType;
}

}  // namespace

void HostGraph::fold_view_chains() {
  const int32_t n = static_cast<int32_t>(instructions_.size());
  std::vector<int32_t> producer(num_slots_, -1);
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t r = 0; r < instructions_[i].num_outputs; ++r) producer[instructions_[i].first_output_slot + r] = i;
  }
  std::vector<bool> foldable(n);
  for (int32_t i = 0; i < n; ++i) foldable[i] = is_foldable_view(instructions_[i]);
  // needed: a view whose result something other than a dropped or folded view reads (a non-view op, the output,
  // or a view kept as it is: one returning a list that a non-view op reads whole or by element)
  std::vector<bool> needed(n, false), kept(n, false);
  std::vector<std::vector<int32_t>> readers(num_slots_);
  auto note = [&](const ValueRef& r, int32_t reader) { readers[r.slot].push_back(reader); };
  for (int32_t i = 0; i < n; ++i) {
    for (const auto& a : instructions_[i].args) {
      if (a.kind == ArgTemplate::Kind::Ref) note(a.ref, i);
      for (const auto& e : a.elements) {
        if (e.is_ref) note(e.ref, i);
      }
    }
  }
  for (const auto& o : outputs_) {
    if (o.kind == ArgTemplate::Kind::Ref) note(o.ref, n);  // n: the output
  }
  for (int32_t i = n - 1; i >= 0; --i) {  // readers come after their producers: decided before them
    if (!foldable[i]) continue;
    const auto& ins = instructions_[i];
    for (int32_t r = 0; r < ins.num_outputs && !needed[i]; ++r) {
      for (int32_t reader : readers[ins.first_output_slot + r]) {
        if (reader == n || !foldable[reader] || kept[reader]) {
          needed[i] = true;
          break;
        }
      }
    }
    kept[i] = needed[i] && !returns_one_tensor(ins);
  }
  std::vector<Instruction> out;
  out.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    if (!foldable[i] || kept[i]) {
      out.push_back(instructions_[i]);
      continue;
    }
    if (!needed[i]) continue;  // only folded views read it: dropped
    // the chain back to its root: the first value not computed by a folded view
    std::vector<int32_t> chain{i};
    for (;;) {
      const int32_t p = producer[instructions_[chain.back()].args[0].ref.slot];
      if (p < 0 || !foldable[p] || kept[p]) break;
      chain.push_back(p);
    }
    std::reverse(chain.begin(), chain.end());
    auto views = std::make_shared<ViewChain>();
    for (int32_t c : chain) {
      views->steps.push_back(instructions_[c]);
      views->steps.back().release.clear();
      views->items.push_back(instructions_[c].args[0].ref.item);
    }
    // the folded instruction's one argument: the first step's reference (an element of a kept list, or a value)
    Instruction folded = instructions_[i];
    folded.args = {instructions_[chain.front()].args[0]};
    views->items[0] = -1;  // the first step views what that reference gives
    folded.views = std::move(views);
    out.push_back(std::move(folded));
  }
  instructions_ = std::move(out);
}

size_t HostGraph::num_view_chains() const {
  return std::count_if(instructions_.begin(), instructions_.end(), [](const Instruction& i) { return i.views; });
}

size_t HostGraph::num_views_folded() const {
  size_t total = 0;
  for (const auto& i : instructions_) total += i.views ? i.views->steps.size() : 0;
  return total;
}

at::Tensor HostGraph::run_view_chain(const Instruction& ins, const std::vector<c10::IValue>& slots) const {
  ViewChain& chain = *ins.views;
  c10::IValue scratch;
  const c10::IValue& root_value = deref(ins.args[0].ref, slots, scratch);
  TORCH_CHECK(root_value.isTensor(), "fusegraph host graph: ", chain.steps.front().name, " views a value that is not "
              "a tensor");
  const at::Tensor& root = root_value.toTensor();
  const ViewMemo* memo = chain.memo.load(std::memory_order_acquire);
  if (memo != nullptr && root.scalar_type() == memo->dtype && root.sizes() == c10::IntArrayRef(memo->root_sizes) &&
      root.strides() == c10::IntArrayRef(memo->root_strides)) {
    return at::as_strided(root, memo->sizes, memo->strides, root.storage_offset() + memo->offset_delta);
  }
  // the ops themselves, root first
  c10::IValue current = root;
  torch::jit::Stack stack;
  for (size_t k = 0; k < chain.steps.size(); ++k) {
    const Instruction& step = chain.steps[k];
    stack.clear();
    const int32_t item = chain.items[k];
    if (item < 0) {
      stack.push_back(std::move(current));
    } else {
      TORCH_CHECK(current.isList(), "fusegraph host graph: getitem on a value that is not a list");
      stack.push_back(current.toListRef().at(item));
    }
    for (size_t a = 1; a < step.args.size(); ++a) stack.push_back(step.args[a].constant);
    step.op.callBoxed(stack);
    TORCH_CHECK(stack.size() == 1, "fusegraph host graph: ", step.name, " returned ", stack.size(), " values");
    current = std::move(stack[0]);
  }
  at::Tensor result = current.toTensor();
  // memoised only for plain strided tensors (a quantized root's per-channel axis moves with permute, which
  // as_strided would not follow; sparse and opaque layouts have no such geometry): the others run the ops each time
  if (memo == nullptr && root.layout() == at::kStrided && !root.is_quantized() && result.has_storage() &&
      root.has_storage() && result.dtype() == root.dtype() && result.storage().is_alias_of(root.storage())) {
    auto* m = new ViewMemo{root.scalar_type(), root.sizes().vec(), root.strides().vec(), result.sizes().vec(),
                           result.strides().vec(), result.storage_offset() - root.storage_offset()};
    const ViewMemo* expected = nullptr;
    if (!chain.memo.compare_exchange_strong(expected, m, std::memory_order_release)) delete m;
  }
  return result;
}

namespace {

bool writes(const c10::AliasInfo* info) {
  if (info == nullptr) return false;
  if (info->isWrite()) return true;
  return std::any_of(info->containedTypes().begin(), info->containedTypes().end(),
                     [](const c10::AliasInfo& c) { return writes(&c); });
}

}  // namespace

void HostGraph::find_written_inputs() {
  // root[s]: the input that value s is (a view of), or -1
  std::vector<int32_t> root(num_slots_, -1);
  for (int32_t i = 0; i < num_inputs_; ++i) root[i] = i;
  std::vector<bool> written(num_inputs_, false);
  for (const auto& ins : instructions_) {
    int32_t aliased = -1;  // the input the results alias
    if (ins.views) {       // a folded view chain: a view of its root
      if (ins.args[0].kind == ArgTemplate::Kind::Ref) aliased = root[ins.args[0].ref.slot];
    } else {
      const auto& schema = ins.op.schema();
      for (size_t a = 0; a < ins.args.size() && a < schema.arguments().size(); ++a) {
        const c10::AliasInfo* info = schema.arguments()[a].alias_info();
        if (info == nullptr) continue;
        std::vector<int32_t> roots;
        if (ins.args[a].kind == ArgTemplate::Kind::Ref) roots.push_back(root[ins.args[a].ref.slot]);
        for (const auto& e : ins.args[a].elements) {
          if (e.is_ref) roots.push_back(root[e.ref.slot]);
        }
        for (int32_t r : roots) {
          if (r < 0) continue;
          if (writes(info)) written[r] = true;
          if (aliased < 0) aliased = r;
        }
      }
      const auto& returns = schema.returns();
      if (std::none_of(returns.begin(), returns.end(), [](const c10::Argument& r) { return r.alias_info(); })) {
        aliased = -1;
      }
    }
    for (int32_t r = 0; r < ins.num_outputs; ++r) root[ins.first_output_slot + r] = aliased;
  }
  written_inputs_.clear();
  for (int32_t i = 0; i < num_inputs_; ++i) {
    if (written[i]) written_inputs_.push_back(i);
  }
}

void HostGraph::set_alias_fallback(std::shared_ptr<HostGraph> graph) {
  TORCH_CHECK(graph.get() != this && (!graph || graph->num_inputs_ == num_inputs_),
              "fusegraph host graph: the alias fallback must be another graph of the same ", num_inputs_,
              " inputs; got one of ", graph ? graph->num_inputs_ : 0);
  alias_fallback_ = std::move(graph);
}

bool HostGraph::written_input_shared(const std::vector<at::Tensor>& inputs) const {
  for (int32_t w : written_inputs_) {
    const at::Tensor& t = inputs[w];
    if (!t.has_storage()) continue;
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (static_cast<int32_t>(j) != w && inputs[j].has_storage() &&
          inputs[j].storage().unsafeGetStorageImpl() == storage) {
        return true;
      }
    }
  }
  return false;
}

void HostGraph::finalize() {
  TORCH_CHECK(!finalized_, "fusegraph host graph: finalize called twice");
  fold_view_chains();
  find_written_inputs();
  // last use of every slot: an instruction index, or "never release" for graph outputs
  const int32_t kKeep = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> last_use(num_slots_, -1);
  auto use = [&](const ValueRef& r, int32_t at) { last_use[r.slot] = std::max(last_use[r.slot], at); };
  for (int32_t i = 0; i < static_cast<int32_t>(instructions_.size()); ++i) {
    for (const auto& a : instructions_[i].args) {
      if (a.kind == ArgTemplate::Kind::Ref) use(a.ref, i);
      for (const auto& e : a.elements) {
        if (e.is_ref) use(e.ref, i);
      }
    }
  }
  for (const auto& o : outputs_) {
    if (o.kind == ArgTemplate::Kind::Ref) last_use[o.ref.slot] = kKeep;
  }
  std::vector<int32_t> producer(num_slots_, -1);
  for (int32_t i = 0; i < static_cast<int32_t>(instructions_.size()); ++i) {
    const auto& ins = instructions_[i];
    for (int32_t r = 0; r < ins.num_outputs; ++r) producer[ins.first_output_slot + r] = i;
  }
  for (int32_t s = 0; s < num_slots_; ++s) {
    if (last_use[s] == kKeep) continue;
    // never read: released right after it is produced; an unused input is left alone (the caller owns it)
    int32_t at = last_use[s] >= 0 ? last_use[s] : producer[s];
    if (at >= 0) instructions_[at].release.push_back(s);
  }
  finalized_ = true;
}

const c10::IValue& HostGraph::deref(const ValueRef& r, const std::vector<c10::IValue>& slots, c10::IValue& scratch) {
  const c10::IValue& v = slots[r.slot];
  if (r.item < 0) return v;
  TORCH_CHECK(v.isList() || v.isTuple(), "fusegraph host graph: getitem on a value that is not a list");
  const size_t n = v.isList() ? v.toListRef().size() : v.toTupleRef().elements().size();
  TORCH_CHECK(static_cast<size_t>(r.item) < n, "fusegraph host graph: getitem ", r.item, " on a list of ", n);
  scratch = v.isList() ? v.toListRef()[r.item] : v.toTupleRef().elements()[r.item];
  return scratch;
}

c10::IValue HostGraph::materialize(const ArgTemplate& a, const std::vector<c10::IValue>& slots) const {
  c10::IValue scratch;
  switch (a.kind) {
    case ArgTemplate::Kind::Constant:
      return a.constant;
    case ArgTemplate::Kind::Ref:
      return deref(a.ref, slots, scratch);
    case ArgTemplate::Kind::List: {
      c10::impl::GenericList list(a.element_type);
      list.reserve(a.elements.size());
      for (const auto& e : a.elements) list.push_back(e.is_ref ? deref(e.ref, slots, scratch) : e.constant);
      return list;
    }
  }
  return {};
}

std::vector<c10::IValue> HostGraph::run(const std::vector<at::Tensor>& inputs) {
  if (alias_fallback_ && static_cast<int32_t>(inputs.size()) == num_inputs_ && written_input_shared(inputs)) {
    return alias_fallback_->run(inputs);
  }
  return run_impl(inputs, nullptr, nullptr);
}

std::vector<c10::IValue> HostGraph::run_timed(const std::vector<at::Tensor>& inputs, std::vector<double>* seconds,
                                              double* release_seconds) {
  seconds->assign(instructions_.size(), 0.0);
  *release_seconds = 0.0;
  return run_impl(inputs, seconds, release_seconds);
}

std::vector<c10::IValue> HostGraph::run_impl(const std::vector<at::Tensor>& inputs, std::vector<double>* seconds,
                                             double* release_seconds) {
  TORCH_CHECK(finalized_, "fusegraph host graph: run before finalize");
  TORCH_CHECK(static_cast<int32_t>(inputs.size()) == num_inputs_, "fusegraph host graph: expected ", num_inputs_,
              " tensor inputs, got ", inputs.size());
  // Autograd work is skipped either way. Under the caller's inference mode we run in c10::InferenceMode;
  // otherwise with the autograd keys excluded (ADInplaceOrView still tracks views and versions), so outputs
  // are ordinary tensors the caller may still mutate in place (inference tensors refuse that outside
  // inference mode). Same kernels either way: bitwise equal results.
  std::optional<c10::InferenceMode> inference;
  std::optional<c10::impl::ExcludeDispatchKeyGuard> below_autograd;
  if (c10::InferenceMode::is_enabled()) {
    inference.emplace();
  } else {
    below_autograd.emplace(c10::autograd_dispatch_keyset);
  }
  std::vector<c10::IValue> slots(num_slots_);
  for (int32_t i = 0; i < num_inputs_; ++i) slots[i] = inputs[i];
  torch::jit::Stack stack;
  stack.reserve(max_args_);
  for (size_t i = 0; i < instructions_.size(); ++i) {
    const Instruction& ins = instructions_[i];
    stack.clear();
    if (ins.views) {  // a folded view chain: one tensor
      auto t0 = seconds ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
      stack.push_back(run_view_chain(ins, slots));
      if (seconds) (*seconds)[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else if (seconds) {
      for (const auto& a : ins.args) stack.push_back(materialize(a, slots));
      auto t0 = std::chrono::steady_clock::now();
      ins.op.callBoxed(stack);
      (*seconds)[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      for (const auto& a : ins.args) stack.push_back(materialize(a, slots));
      ins.op.callBoxed(stack);
    }
    TORCH_CHECK(static_cast<int32_t>(stack.size()) == ins.num_outputs, "fusegraph host graph: ", ins.name,
                " returned ", stack.size(), " values, its schema declares ", ins.num_outputs);
    for (int32_t r = 0; r < ins.num_outputs; ++r) slots[ins.first_output_slot + r] = std::move(stack[r]);
    if (seconds) {
      auto t0 = std::chrono::steady_clock::now();
      for (int32_t s : ins.release) slots[s] = c10::IValue();
      *release_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      for (int32_t s : ins.release) slots[s] = c10::IValue();
    }
  }
  std::vector<c10::IValue> outputs;
  outputs.reserve(outputs_.size());
  for (const auto& o : outputs_) outputs.push_back(materialize(o, slots));
  return outputs;
}

bool HostGraph::needs_clone(const at::Tensor& t) const {
  if (alias_fallback_ && alias_fallback_->needs_clone(t)) return true;  // its constants, when it ran
  return t.has_storage() && constant_storages_.count(t.storage().unsafeGetStorageImpl()) > 0;
}

}  // namespace fusegraph::graph
