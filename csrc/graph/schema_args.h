#pragma once
// Building a host-graph node from an operator schema and an FX node's arguments: positional and keyword
// arguments matched to the schema's formals (defaults filled in), node results as references, constants
// converted to the schema's types. The argument values are the front end's (Python objects for fusegraph._C,
// plain C++ values in the tests), seen through ArgSource.
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/host_graph.h"

namespace fusegraph::graph {

// One argument value of a node as the front end holds it.
class ArgSource {
 public:
  virtual ~ArgSource() = default;
  // The result of an earlier node (or a graph input).
  virtual std::optional<ValueRef> ref() const = 0;
  // A list or tuple: its elements; nullopt for any other value.
  virtual std::optional<std::vector<std::unique_ptr<ArgSource>>> elements() const = 0;
  // A plain bool, int or float (not a tensor): the value; nullopt otherwise.
  virtual std::optional<at::Scalar> number() const = 0;
  // The value as a constant of the schema type `type` (throws when it is not one).
  virtual c10::IValue to_ivalue(const c10::TypePtr& type) const = 0;
};

// The constant for a schema argument of type `type`. A number where the schema wants a Tensor (make_fx records
// `x * 2` as mul.Tensor(x, 2)) becomes a wrapped-number tensor, exactly as the Python argument parser makes it,
// so type promotion (and therefore the result) is the same as in the FX graph's own execution.
c10::IValue constant_ivalue(const ArgSource& value, const c10::TypePtr& type);

// One schema argument of a host-graph node (a reference, a list mixing references and constants, or a
// constant, whose tensors the graph holds).
ArgTemplate arg_template(HostGraph& graph, const c10::Argument& formal, const ArgSource& value);

// Appends the call `name`.`overload`(args, kwargs) to `graph`; returns the slot of its first result. Throws
// naming the schema for too many positional arguments, a missing argument without default, or unknown keywords.
int32_t add_schema_node(HostGraph& graph, const std::string& name, const std::string& overload,
                        const std::vector<const ArgSource*>& args,
                        const std::vector<std::pair<std::string, const ArgSource*>>& kwargs);

}  // namespace fusegraph::graph
