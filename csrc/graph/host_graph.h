#pragma once
// The host graph (SPEC §4): an aten-level FX graph as a C++ program. Each node is an OperatorHandle found
// once, its arguments IValue templates (constants held, tensors referenced by slot), replayed with
// callBoxed in a C++ loop (under c10::InferenceMode when the caller is in inference mode, otherwise with the
// autograd keys excluded, so outputs stay ordinary tensors): no Python per op, the same kernels in the same order as
// the FX graph's own Python execution, so results are bitwise equal. Values are released after their last
// use, as the FX interpreter does. Inputs are bound without copies.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "graph/cache.h"

namespace fusegraph::graph {

// Where an argument's value comes from at run time.
struct ValueRef {
  int32_t slot = -1;  // the value computed by a node (or bound input)
  int32_t item = -1;  // >= 0: element `item` of that (list) value, e.g. getitem on split's Tensor[]
};

// One element of a list argument that mixes references and constants (e.g. index's Tensor?[]).
struct ElementTemplate {
  bool is_ref = false;
  ValueRef ref;
  c10::IValue constant;
};

struct ArgTemplate {
  enum class Kind { Constant, Ref, List };
  Kind kind = Kind::Constant;
  c10::IValue constant;                 // Constant
  ValueRef ref;                         // Ref
  c10::TypePtr element_type;            // List: the schema's element type
  std::vector<ElementTemplate> elements;  // List
};

struct ViewChain;

struct Instruction {
  c10::OperatorHandle op;
  std::vector<ArgTemplate> args;  // one per schema argument, defaults filled in (a folded chain: its root)
  int32_t first_output_slot = 0;  // returns go to consecutive slots
  int32_t num_outputs = 0;
  std::vector<int32_t> release;   // slots whose last use is this instruction
  std::string name;               // "aten::add.Tensor", for errors
  std::shared_ptr<ViewChain> views;  // non-null: a folded view chain ending in `op`
};

// The geometry a folded view chain produced from its root once: replayed as one as_strided of the root when the
// root has the same dtype, sizes and strides again (any storage offset: the chain's views only add to it).
struct ViewMemo {
  c10::ScalarType dtype;
  std::vector<int64_t> root_sizes, root_strides, sizes, strides;
  int64_t offset_delta = 0;
};

// A chain of view ops (view, permute, split + getitem, ...; every argument but the viewed tensor a constant)
// folded into one instruction: the tensor the last op returns, computed from the chain's root. The first run, and
// any run whose root has another geometry, calls the chain's ops; the others replay the memo (ViewMemo).
struct ViewChain {
  std::vector<Instruction> steps;  // the original ops, root side first; each views the previous step's result
  std::vector<int32_t> items;      // per step: the element of the previous (list) result it views, or -1
  std::atomic<const ViewMemo*> memo{nullptr};  // set once (the first run that can be memoised), then read-only
  ~ViewChain() { delete memo.load(); }
};

class HostGraph final : public Executable {
 public:
  explicit HostGraph(int32_t num_inputs) : num_inputs_(num_inputs), num_slots_(num_inputs) {}

  // Builder (the Python front walks the FX graph and calls these in node order).
  // Returns the first slot of the node's results; throws when the op or an argument cannot be represented.
  int32_t add_node(const c10::OperatorHandle& op, std::vector<ArgTemplate> args);
  void set_outputs(std::vector<ArgTemplate> outputs);  // Constant or Ref templates
  // Folds view chains (fold_view_chains), then computes the release lists; call once after set_outputs.
  void finalize();
  void hold_constant(const at::Tensor& t);  // a tensor the graph keeps alive (frozen weights)

  std::vector<c10::IValue> run(const std::vector<at::Tensor>& inputs) override;
  // run() that also measures each instruction's callBoxed (the op's own time, dispatcher included) and the
  // time spent releasing dead values (tensor frees), in seconds
  std::vector<c10::IValue> run_timed(const std::vector<at::Tensor>& inputs, std::vector<double>* seconds,
                                     double* release_seconds);
  bool binds_inputs() const override { return true; }
  bool outputs_are_fresh() const override { return true; }
  bool needs_clone(const at::Tensor& t) const override;

  // The inputs the graph writes in place, directly or through a view of them (ascending; after finalize). Read from
  // the schemas' alias annotations: an op's results alias an input when the op returns an alias of an argument.
  const std::vector<int32_t>& written_inputs() const { return written_inputs_; }
  // The graph run() runs instead when an input this graph writes shares storage with another input of the call.
  // A functionalized graph (GraphRunner's fused trace) defers its writes to its inputs to its end, which is right
  // only while each input is its own memory; `graph` is the same function traced without functionalization (its
  // writes in program order, as eager's).
  void set_alias_fallback(std::shared_ptr<HostGraph> graph);
  bool has_alias_fallback() const { return alias_fallback_ != nullptr; }

  size_t num_instructions() const { return instructions_.size(); }
  // Instructions that are folded view chains, and the view ops they replaced (after finalize).
  size_t num_view_chains() const;
  size_t num_views_folded() const;
  int64_t constant_bytes() const { return storage_bytes(constants_); }
  int32_t num_inputs() const { return num_inputs_; }

 private:
  std::vector<c10::IValue> run_impl(const std::vector<at::Tensor>& inputs, std::vector<double>* seconds,
                                    double* release_seconds);
  c10::IValue materialize(const ArgTemplate& a, const std::vector<c10::IValue>& slots) const;
  static const c10::IValue& deref(const ValueRef& r, const std::vector<c10::IValue>& slots, c10::IValue& scratch);
  // Each view op whose result only other view ops read is dropped; each one a non-view op or the output reads
  // becomes one instruction computing it from the chain's root (ViewChain).
  void fold_view_chains();
  at::Tensor run_view_chain(const Instruction& ins, const std::vector<c10::IValue>& slots) const;
  void find_written_inputs();
  bool written_input_shared(const std::vector<at::Tensor>& inputs) const;

  int32_t num_inputs_;
  int32_t num_slots_;
  std::vector<Instruction> instructions_;
  std::vector<ArgTemplate> outputs_;
  std::vector<at::Tensor> constants_;
  std::unordered_set<const void*> constant_storages_;
  size_t max_args_ = 0;
  bool finalized_ = false;
  std::vector<int32_t> written_inputs_;
  std::shared_ptr<HostGraph> alias_fallback_;
};

// The dispatcher's handle for "aten::add" / "Tensor" (overload "" for .default); throws a clear error.
c10::OperatorHandle find_operator(const std::string& name, const std::string& overload);

}  // namespace fusegraph::graph
