#include "aot/package_check.h"

#include <ATen/cpu/Utils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

#include <sstream>

namespace fusegraph::aot {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

std::string get(const Metadata& m, const char* key) {
  auto it = m.find(key);
  return it == m.end() ? std::string() : it->second;
}

struct InputSpec {
  std::string name, dtype, device;
  std::vector<std::string> dims;  // "7" or "lo:hi"
};

std::vector<InputSpec> parse_inputs(const Metadata& m) {
  std::vector<InputSpec> specs;
  for (const std::string& entry : split(get(m, "fusegraph.inputs"), ';')) {
    std::vector<std::string> f = split(entry, '|');
    TORCH_CHECK(f.size() == 4 || f.size() == 3, "fusegraph.aot: malformed fusegraph.inputs entry '", entry,
                "' in the package's metadata; expected name|dtype|device|dims");
    specs.push_back({f[0], f[1], f[2], f.size() == 4 ? split(f[3], ',') : std::vector<std::string>{}});
  }
  return specs;
}

bool dim_fits(const std::string& spec, int64_t size) {
  auto colon = spec.find(':');
  if (colon == std::string::npos) return std::stoll(spec) == size;
  const std::string hi = spec.substr(colon + 1);
  return size >= std::stoll(spec.substr(0, colon)) && (hi == "inf" || size <= std::stoll(hi));
}

std::string shape_text(const std::vector<std::string>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + dims[i];
  return s + "]";
}

}  // namespace

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

std::string package_problems(const Metadata& m, const std::string& path) {
  std::ostringstream why;
  if (get(m, "fusegraph.torch").empty()) {
    why << path << " was not made by fusegraph.aot.package (its metadata has no fusegraph.torch)\n";
    return why.str();
  }
  const std::string here = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  if (get(m, "fusegraph.torch") != here) {
    why << path << " was compiled with torch " << get(m, "fusegraph.torch") << "; this process runs torch " << here
        << ": make the package again with this torch\n";
  }
  if (get(m, "fusegraph.device") == "cpu") {
    auto caps = at::cpu::get_cpu_capabilities();
    std::string missing;
    for (const std::string& flag : split(get(m, "fusegraph.cpu_flags"), ',')) {
      auto it = caps.find(flag);
      if (it == caps.end() || !it->second.isBool() || !it->second.toBool()) missing += (missing.empty() ? "" : ", ") + flag;
    }
    if (!missing.empty()) {
      why << path << "'s code was compiled for a CPU with " << missing << ", which this CPU lacks: make the "
          << "package on this class of CPU, or for an older one (GUIDE: fusegraph.aot, the cpp.march option)\n";
    }
  }
  for (const std::string& op : split(get(m, "fusegraph.ops"), ',')) {
    auto dot = op.find('.');
    const std::string name = op.substr(0, dot);
    const std::string overload = dot == std::string::npos ? "" : op.substr(dot + 1);
    if (!c10::Dispatcher::singleton().findSchema({name, overload == "default" ? "" : overload}).has_value()) {
      why << path << " calls the operator " << op << ", which is not registered in this process: load fusegraph's "
          << "ops library (link libfusegraph_ops, or `import fusegraph` in Python)\n";
    }
  }
  return why.str();
}

void check_inputs(const Metadata& m, const std::vector<at::Tensor>& inputs) {
  std::vector<InputSpec> specs = parse_inputs(m);
  if (specs.empty()) return;  // a package without the record: nothing to check against
  TORCH_CHECK(inputs.size() == specs.size(), "fusegraph.aot: the package takes ", specs.size(), " tensor inputs; got ",
              inputs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const InputSpec& s = specs[i];
    const at::Tensor& t = inputs[i];
    TORCH_CHECK(t.defined(), "fusegraph.aot: input ", i, " '", s.name, "' is undefined; expected a ", s.dtype,
                " tensor of shape ", shape_text(s.dims));
    TORCH_CHECK(dtype_name(t.scalar_type()) == s.dtype, "fusegraph.aot: input ", i, " '", s.name, "' has dtype ",
                dtype_name(t.scalar_type()), "; the package expects ", s.dtype);
    TORCH_CHECK(t.device().str() == s.device || (s.device == "cuda" && t.is_cuda()), "fusegraph.aot: input ", i,
                " '", s.name, "' is on ", t.device().str(), "; the package expects ", s.device);
    bool fits = static_cast<size_t>(t.dim()) == s.dims.size();
    for (size_t d = 0; fits && d < s.dims.size(); ++d) fits = dim_fits(s.dims[d], t.size(static_cast<int64_t>(d)));
    TORCH_CHECK(fits, "fusegraph.aot: input ", i, " '", s.name, "' has shape ", t.sizes(),
                "; the package expects ", shape_text(s.dims), " (a dynamic dim as lo:hi)");
  }
}

}  // namespace fusegraph::aot
