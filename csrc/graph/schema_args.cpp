#include "graph/schema_args.h"

#include <ATen/ScalarOps.h>
#include <c10/util/Exception.h>

namespace fusegraph::graph {

c10::IValue constant_ivalue(const ArgSource& value, const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  if (t->kind() == c10::TypeKind::TensorType) {
    if (std::optional<at::Scalar> scalar = value.number()) {
      at::Tensor tensor = c10::scalar_to_tensor(*scalar);
      tensor.unsafeGetTensorImpl()->set_wrapped_number(true);
      return tensor;
    }
  }
  return value.to_ivalue(type);
}

ArgTemplate arg_template(HostGraph& graph, const c10::Argument& formal, const ArgSource& value) {
  ArgTemplate a;
  if (std::optional<ValueRef> ref = value.ref()) {
    a.kind = ArgTemplate::Kind::Ref;
    a.ref = *ref;
    return a;
  }
  if (auto list_type = formal.type()->cast<c10::ListType>()) {
    if (auto elements = value.elements()) {
      bool has_ref = false;
      for (const auto& e : *elements) has_ref |= e->ref().has_value();
      if (has_ref) {
        a.kind = ArgTemplate::Kind::List;
        a.element_type = list_type->getElementType();
        for (const auto& e : *elements) {
          ElementTemplate et;
          if (std::optional<ValueRef> ref = e->ref()) {
            et.is_ref = true;
            et.ref = *ref;
          } else {
            et.constant = constant_ivalue(*e, a.element_type);
            if (et.constant.isTensor()) graph.hold_constant(et.constant.toTensor());
          }
          a.elements.push_back(std::move(et));
        }
        return a;
      }
    }
  }
  a.constant = constant_ivalue(value, formal.type());
  if (a.constant.isTensor()) graph.hold_constant(a.constant.toTensor());
  if (a.constant.isTensorList()) {
    for (const at::Tensor& t : a.constant.toTensorVector()) graph.hold_constant(t);
  }
  return a;
}

int32_t add_schema_node(HostGraph& graph, const std::string& name, const std::string& overload,
                        const std::vector<const ArgSource*>& args,
                        const std::vector<std::pair<std::string, const ArgSource*>>& kwargs) {
  c10::OperatorHandle op = find_operator(name, overload);
  const auto& schema = op.schema();
  const auto& formals = schema.arguments();
  TORCH_CHECK(args.size() <= formals.size(), "fusegraph host graph: ", schema, " got ", args.size(),
              " positional arguments");
  std::vector<bool> used(kwargs.size(), false);
  auto keyword = [&](const std::string& formal) -> const ArgSource* {
    for (size_t k = 0; k < kwargs.size(); ++k) {
      if (kwargs[k].first == formal) {
        used[k] = true;
        return kwargs[k].second;
      }
    }
    return nullptr;
  };
  std::vector<ArgTemplate> templates;
  for (size_t i = 0; i < formals.size(); ++i) {
    const auto& formal = formals[i];
    if (i < args.size()) {
      templates.push_back(arg_template(graph, formal, *args[i]));
    } else if (const ArgSource* value = keyword(formal.name())) {
      templates.push_back(arg_template(graph, formal, *value));
    } else {
      TORCH_CHECK(formal.default_value().has_value(), "fusegraph host graph: ", schema, ": argument '",
                  formal.name(), "' is missing and has no default");
      ArgTemplate a;
      a.constant = *formal.default_value();
      templates.push_back(std::move(a));
    }
  }
  std::string unknown;
  for (size_t k = 0; k < kwargs.size(); ++k) {
    if (!used[k]) unknown += (unknown.empty() ? "'" : ", '") + kwargs[k].first + "'";
  }
  TORCH_CHECK(unknown.empty(), "fusegraph host graph: ", schema, " got unknown keyword arguments ", unknown);
  return graph.add_node(op, std::move(templates));
}

}  // namespace fusegraph::graph
