#include "aot/package_check.h"

#include <ATen/cpu/Utils.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>
#include <caffe2/serialize/inline_container.h>
// crc32_fast: defined here, in this one translation unit (the header holds the definitions; libtorch's are hidden)
#include <caffe2/serialize/crc_alt.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <tuple>

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

// One dim of an exported input: a size, or a range; a dynamic dim also names its symbol and the linear form the dim
// is of it (torch.export's Dim and derived Dims: `2*B`, `B+1`), so inputs sharing a symbol are checked together.
struct DimSpec {
  std::string text;             // as shown in errors: "7" or "lo:hi"
  std::string form;             // the linear form, "s0*2+1"; "" for a static dim or a legacy range
  std::string symbol;           // "" for a static dim or a legacy range without one
  int64_t coef = 1, offset = 0;
  int64_t lo = 0, hi = -1;      // hi -1: unbounded; lo == hi for a static dim
};

// A number of the package's metadata; a malformed one is an error naming the field and the text (std::stoll's own
// says only "stoll").
int64_t number(const std::string& text, const std::string& field, const char* expected) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TORCH_CHECK(!text.empty() && used == text.size(), "fusegraph.aot: malformed ", field,
              " in the package's metadata: '", text, "' is not an integer; expected ", expected);
  return value;
}

DimSpec parse_dim(const std::string& text) {
  DimSpec d;
  d.text = text;
  std::string range = text;
  const auto eq = text.find('=');
  if (eq != std::string::npos) {  // symbol*coef+offset=lo:hi
    const std::string form = text.substr(0, eq);
    const auto star = form.find('*'), plus = form.find('+', star == std::string::npos ? 0 : star);
    TORCH_CHECK(star != std::string::npos && plus != std::string::npos,
                "fusegraph.aot: malformed dim '", text, "' in the package's metadata; expected symbol*coef+offset=lo:hi");
    d.form = form;
    d.symbol = form.substr(0, star);
    const char* form_text = "symbol*coef+offset=lo:hi";
    d.coef = number(form.substr(star + 1, plus - star - 1), "dim '" + text + "'", form_text);
    d.offset = number(form.substr(plus + 1), "dim '" + text + "'", form_text);
    range = text.substr(eq + 1);
    d.text = range;
  }
  const auto colon = range.find(':');
  const char* range_text = "a size, or lo:hi (hi an integer or inf)";
  if (colon == std::string::npos) {
    d.lo = d.hi = number(range, "dim '" + text + "'", range_text);
  } else {
    const std::string hi = range.substr(colon + 1);
    d.lo = number(range.substr(0, colon), "dim '" + text + "'", range_text);
    d.hi = hi == "inf" ? -1 : number(hi, "dim '" + text + "'", range_text);
  }
  return d;
}

struct InputSpec {
  std::string name, dtype, device;
  std::vector<DimSpec> dims;
  // The layout the package's code indexes the input with: "c" (contiguous), "cl" / "cl3d" (channels-last),
  // "s:a,b,..." (these strides), "" (not recorded: a package from before layouts were; taken as contiguous).
  std::string layout;
};

std::vector<InputSpec> parse_inputs(const Metadata& m) {
  std::vector<InputSpec> specs;
  for (const std::string& entry : split(get(m, "fusegraph.inputs"), ';')) {
    std::vector<std::string> f = split(entry, '|');
    TORCH_CHECK(f.size() >= 3 && f.size() <= 5, "fusegraph.aot: malformed fusegraph.inputs entry '", entry,
                "' in the package's metadata; expected name|dtype|device|dims|layout");
    InputSpec s{f[0], f[1], f[2], {}, f.size() == 5 ? f[4] : std::string()};
    if (f.size() >= 4) {
      for (const std::string& dim : split(f[3], ',')) s.dims.push_back(parse_dim(dim));
    }
    specs.push_back(std::move(s));
  }
  return specs;
}

bool dim_fits(const DimSpec& d, int64_t size) { return size >= d.lo && (d.hi < 0 || size <= d.hi); }

std::string shape_text(const std::vector<DimSpec>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + dims[i].text;
  return s + "]";
}

// The strides the package's code indexes an input of these sizes with (layout as in InputSpec).
std::vector<int64_t> layout_strides(const std::string& layout, at::IntArrayRef sizes, const std::string& name) {
  if (layout.rfind("s:", 0) == 0) {
    std::vector<int64_t> strides;
    for (const std::string& v : split(layout.substr(2), ',')) {
      strides.push_back(number(v, "layout '" + layout + "' of input '" + name + "'", "s:stride,stride,..."));
    }
    TORCH_CHECK(strides.size() == sizes.size(), "fusegraph.aot: input '", name, "' has layout '", layout,
                "' in the package's metadata, for ", strides.size(), " dims; the input has ", sizes.size());
    return strides;
  }
  std::vector<int64_t> order(sizes.size());  // dims from the innermost (stride 1) out
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(order.size() - 1 - i);
  if ((layout == "cl" && sizes.size() == 4) || (layout == "cl3d" && sizes.size() == 5)) {
    order.assign({1});  // channels innermost, then the spatial dims from the last, then the batch
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 2; --d) order.push_back(d);
    order.push_back(0);
  } else {
    TORCH_CHECK(layout.empty() || layout == "c", "fusegraph.aot: input '", name, "' has layout '", layout,
                "' in the package's metadata, which this fusegraph does not know (c, cl, cl3d, s:...)");
  }
  std::vector<int64_t> strides(sizes.size());
  int64_t step = 1;
  for (int64_t d : order) {
    strides[d] = step;
    step *= std::max<int64_t>(sizes[d], 1);
  }
  return strides;
}

// Same addressing: every dim of more than one element has the expected stride (a size-1 dim's stride is never used).
bool same_layout(const at::Tensor& t, const std::vector<int64_t>& strides) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) != strides[d]) return false;
  }
  return true;
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
  std::vector<std::string> flags;
  for (const auto& [name, value] : at::cpu::get_cpu_capabilities()) {
    if (value.isBool() && value.toBool()) flags.push_back(name);
  }
  return package_problems_for_cpu(m, path, flags);
}

std::string package_problems_for_cpu(const Metadata& m, const std::string& path,
                                    const std::vector<std::string>& cpu_flags) {
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
    std::string missing;
    for (const std::string& flag : split(get(m, "fusegraph.cpu_flags"), ',')) {
      if (std::find(cpu_flags.begin(), cpu_flags.end(), flag) == cpu_flags.end()) {
        missing += (missing.empty() ? "" : ", ") + flag;
      }
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

std::vector<at::Tensor> prepare_inputs(const Metadata& m, const std::vector<at::Tensor>& inputs) {
  std::vector<InputSpec> specs = parse_inputs(m);
  if (specs.empty()) return inputs;  // a package without the record: nothing to check against
  TORCH_CHECK(inputs.size() == specs.size(), "fusegraph.aot: the package takes ", specs.size(), " tensor inputs; got ",
              inputs.size());
  // symbol -> (its value, the input and dim that gave it)
  std::unordered_map<std::string, std::tuple<int64_t, size_t, int64_t>> symbols;
  std::vector<at::Tensor> out;
  out.reserve(inputs.size());
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
    for (size_t d = 0; d < s.dims.size(); ++d) {
      const DimSpec& dim = s.dims[d];
      if (dim.symbol.empty()) continue;
      const int64_t size = t.size(static_cast<int64_t>(d));
      TORCH_CHECK(dim.coef > 0 && (size - dim.offset) % dim.coef == 0, "fusegraph.aot: input ", i, " '", s.name,
                  "' has size ", size, " in dim ", d, "; the package expects ", dim.coef, "*", dim.symbol, "+",
                  dim.offset);
      const int64_t value = (size - dim.offset) / dim.coef;
      auto [it, first] = symbols.try_emplace(dim.symbol, value, i, static_cast<int64_t>(d));
      if (!first) {
        const auto& [seen, j, dj] = it->second;
        TORCH_CHECK(seen == value, "fusegraph.aot: input ", i, " '", s.name, "' dim ", d, " (", size,
                    ") gives the exported symbol ", dim.symbol, " = ", value, ", but input ", j, " '", specs[j].name,
                    "' dim ", dj, " (", inputs[j].size(dj), ") gave ", dim.symbol, " = ", seen,
                    ": the package was exported with these dims tied (", specs[j].dims[dj].form, " and ", dim.form,
                    ")");
      }
    }
    // The package's code indexes each input with the exported layout: another one (a slice, a transposed or
    // expanded view) is copied into it, as eager would read it.
    const std::vector<int64_t> strides = layout_strides(s.layout, t.sizes(), s.name);
    out.push_back(same_layout(t, strides) ? t : at::empty_strided(t.sizes(), strides, t.options()).copy_(t));
  }
  return out;
}

void check_inputs(const Metadata& m, const std::vector<at::Tensor>& inputs) { prepare_inputs(m, inputs); }

std::string package_file_problems(const std::string& path, bool weights) {
  using caffe2::serialize::PyTorchStreamReader;
  const std::string damaged = path + " is damaged: ";
  std::unique_ptr<PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<PyTorchStreamReader>(path);
  } catch (const c10::Error& e) {
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
      std::fclose(f);
      return path + " is not a whole .pt2 package (a zip archive; one cut short?): " + e.what_without_backtrace() +
             "\n";
    }
    return "no package at " + path + " (cannot open it)\n";
  }
  const std::string list = "extra/fusegraph.files";
  std::string current = list;  // the file being read, for an error from the reader
  try {
    if (!reader->hasRecord(list)) return "";  // a package from before the list
    auto [data, size] = reader->getRecord(list);
    const std::string manifest(static_cast<const char*>(data.get()), size);
    std::unordered_map<std::string, std::string> records;  // file name -> the record's name in the archive
    for (const std::string& record : reader->getAllRecords()) {
      const auto slash = record.rfind('/');
      records.emplace(slash == std::string::npos ? record : record.substr(slash + 1), record);
    }
    std::vector<char> buf(size_t{4} << 20);
    for (const std::string& line : split(manifest, '\n')) {
      if (line.empty()) continue;
      const auto a = line.find(' '), b = a == std::string::npos ? a : line.find(' ', a + 1);
      const std::string malformed =
          damaged + "its " + list + " has the line '" + line + "'; expected 'crc32 size name'\n";
      if (b == std::string::npos) return malformed;
      const std::string name = line.substr(b + 1);
      uint32_t want_crc = 0;
      size_t want_size = 0;
      try {
        want_crc = static_cast<uint32_t>(std::stoul(line.substr(0, a), nullptr, 16));
        want_size = std::stoull(line.substr(a + 1, b - a - 1));
      } catch (const std::exception&) {
        return malformed;
      }
      auto it = records.find(name);
      if (it == records.end()) return damaged + "its file " + name + " is missing (the package was written with it)\n";
      current = it->second;
      const size_t got_size = reader->getRecordSize(current);
      if (got_size != want_size) {
        return damaged + "its file " + current + " has " + std::to_string(got_size) + " bytes; the package was " +
               "written with " + std::to_string(want_size) + "\n";
      }
      if (!weights && name.size() > 5 && name.compare(name.size() - 5, 5, ".blob") == 0) continue;
      uint32_t crc = 0;
      auto chunks = reader->createChunkReaderIter(current, got_size, buf.size());
      for (size_t n; (n = chunks.next(buf.data())) > 0;) crc = crc32_fast(buf.data(), n, crc);
      if (crc != want_crc) {
        char text[64];
        std::snprintf(text, sizeof(text), "CRC-32 %08x; the package was written with %08x", crc, want_crc);
        return damaged + "its file " + current + " reads back with " + text + "\n";
      }
    }
  } catch (const c10::Error& e) {
    return damaged + "its file " + current + " does not read back: " + e.what_without_backtrace() + "\n";
  }
  return "";
}

}  // namespace fusegraph::aot
