// Building host-graph nodes from operator schemas (csrc/graph/schema_args.h): positional and keyword arguments
// matched to the formals, defaults filled in, numbers as wrapped-number tensors, lists mixing references and
// constants, and the errors for arguments the schema does not take.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "graph/schema_args.h"

namespace {

namespace fg = fusegraph::graph;

// A C++ argument value: a node result, a number, a constant IValue, or a list of those.
class Arg final : public fg::ArgSource {
 public:
  static Arg ref(int32_t slot) {
    Arg a;
    a.ref_ = fg::ValueRef{slot, -1};
    return a;
  }
  static Arg number(at::Scalar s) {
    Arg a;
    a.number_ = s;
    a.constant_ = s.isFloatingPoint() ? c10::IValue(s.toDouble()) : c10::IValue(s.toLong());
    return a;
  }
  static Arg constant(c10::IValue v) {
    Arg a;
    a.constant_ = std::move(v);
    return a;
  }
  static Arg list(std::vector<Arg> elements) {
    Arg a;
    a.list_ = std::move(elements);
    return a;
  }
  std::optional<fg::ValueRef> ref() const override { return ref_; }
  std::optional<std::vector<std::unique_ptr<fg::ArgSource>>> elements() const override {
    if (!list_) return std::nullopt;
    std::vector<std::unique_ptr<fg::ArgSource>> out;
    for (const Arg& e : *list_) out.push_back(std::make_unique<Arg>(e));
    return out;
  }
  std::optional<at::Scalar> number() const override { return number_; }
  c10::IValue to_ivalue(const c10::TypePtr&) const override { return constant_; }

 private:
  std::optional<fg::ValueRef> ref_;
  std::optional<at::Scalar> number_;
  std::optional<std::vector<Arg>> list_;
  c10::IValue constant_;
};

int32_t add(fg::HostGraph& g, const std::string& name, const std::string& overload, const std::vector<Arg>& args,
            const std::vector<std::pair<std::string, Arg>>& kwargs = {}) {
  std::vector<const fg::ArgSource*> positional;
  for (const Arg& a : args) positional.push_back(&a);
  std::vector<std::pair<std::string, const fg::ArgSource*>> keywords;
  for (const auto& [k, v] : kwargs) keywords.emplace_back(k, &v);
  return fg::add_schema_node(g, name, overload, positional, keywords);
}

at::Tensor run1(fg::HostGraph& g, int32_t out, const std::vector<at::Tensor>& inputs) {
  std::vector<fg::ArgTemplate> outs(1);
  outs[0].kind = fg::ArgTemplate::Kind::Ref;
  outs[0].ref = fg::ValueRef{out, -1};
  g.set_outputs(std::move(outs));
  g.finalize();
  return g.run(inputs)[0].toTensor();
}

TEST(SchemaArgs, NumbersForTensorsAreWrappedAndDefaultsFilled) {
  fg::HostGraph g(1);
  // mul.Tensor(x, 2): the 2 is a wrapped number, so a half tensor stays half (type promotion as in eager)
  int32_t m = add(g, "aten::mul", "Tensor", {Arg::ref(0), Arg::number(2)});
  // add.Tensor(m, 1, alpha=3); then sub.Tensor(_, 1) with alpha from its default
  int32_t a = add(g, "aten::add", "Tensor", {Arg::ref(m), Arg::number(1)}, {{"alpha", Arg::number(3)}});
  int32_t s = add(g, "aten::sub", "Tensor", {Arg::ref(a), Arg::number(1)});
  at::Tensor x = at::randn({4}).to(at::kHalf);
  at::Tensor out = run1(g, s, {x});
  EXPECT_EQ(out.scalar_type(), at::kHalf);
  EXPECT_TRUE(at::equal(out, at::sub(at::add(at::mul(x, 2), 1, 3), 1)));
}

TEST(SchemaArgs, ListsMixReferencesAndConstants) {
  fg::HostGraph g(2);
  at::Tensor c = at::ones({2});
  int32_t cat = add(g, "aten::cat", "", {Arg::list({Arg::ref(0), Arg::constant(c), Arg::ref(1)})},
                    {{"dim", Arg::constant(int64_t{0})}});
  at::Tensor x = at::randn({3}), y = at::randn({1});
  EXPECT_TRUE(at::equal(run1(g, cat, {x, y}), at::cat({x, c, y})));
  EXPECT_EQ(g.constant_bytes(), static_cast<int64_t>(c.nbytes()));  // the list's constant tensor is held
}

TEST(SchemaArgs, ArgumentsTheSchemaDoesNotTakeRaiseNamingIt) {
  fg::HostGraph g(1);
  auto message = [&](const std::vector<Arg>& args, const std::vector<std::pair<std::string, Arg>>& kwargs) {
    try {
      add(g, "aten::relu", "", args, kwargs);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({Arg::ref(0), Arg::ref(0)}, {}).find("got 2 positional arguments"), std::string::npos);
  EXPECT_NE(message({}, {}).find("argument 'self' is missing and has no default"), std::string::npos);
  EXPECT_NE(message({Arg::ref(0)}, {{"inplace", Arg::constant(true)}}).find("unknown keyword arguments 'inplace'"),
            std::string::npos);
  EXPECT_EQ(g.num_instructions(), 0u);
}

}  // namespace
