// fusegraph_aot_runner: runs an AOTInductor package made by fusegraph.aot.package from C++, with no Python.
//
//   fusegraph_aot_runner PACKAGE.pt2 INPUTS.pt [EXPECTED.pt] [--rtol R] [--atol A] [--runs N] [--no-weights-crc]
//
// INPUTS.pt / EXPECTED.pt: a list of tensors saved by Python's torch.save (the package's flat inputs, in order;
// the eager model's flat outputs, None where the model returns None: the package's output there is an undefined
// tensor). Checks the package file is whole and can run here (csrc/aot/package_check.h: its files' CRC-32s, torch,
// CPU, the fused ops registered - this program links libfusegraph_ops, which registers them), checks the inputs,
// runs the package N times (default 2), and compares every run's outputs with EXPECTED: |got - want| <= atol + rtol
// * max|want| per output. Exit status 0 when all hold; 1 with a message naming what failed; 2 for a malformed
// command line. --no-weights-crc: the package's files are checked as written (present, size, CRC-32) but the weights
// blob's CRC, which reads it whole (about half the load's own time), for a package checked once on arrival.
#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "aot/package_check.h"

namespace {

// A tensor or a list of tensors saved by torch.save; a None in the list is an undefined tensor (a model's None
// output). `what` names the argument in errors ("INPUTS", "EXPECTED").
std::vector<at::Tensor> load_tensors(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(what + " " + path + ": cannot open it");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    throw std::runtime_error(what + " " + path + " is not a tensor or a list of tensors saved by torch.save (" +
                             e.what_without_backtrace() + ")");
  }
  std::vector<at::Tensor> out;
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isList() || value.isTuple()) {
    const std::vector<c10::IValue> items =
        value.isList() ? value.toListRef().vec() : value.toTupleRef().elements().vec();
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].isNone()) {
        out.emplace_back();  // undefined: a None output
      } else if (items[i].isTensor()) {
        out.push_back(items[i].toTensor());
      } else {
        throw std::runtime_error(what + " " + path + ": item " + std::to_string(i) + " is a " +
                                 items[i].tagKind() + "; expected a list of tensors (None for a None output)");
      }
    }
  } else {
    throw std::runtime_error(what + " " + path + " holds a " + value.tagKind() +
                             "; expected a tensor or a list of tensors (torch.save)");
  }
  return out;
}

// A command-line value, whole: "1.5" is not a run count, nor "1e-5x" a tolerance (atof/atoi would take a prefix).
double parse_number(const std::string& option, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || !(v >= 0)) {
    throw std::invalid_argument(option + " takes a number >= 0; got '" + text + "'");
  }
  return v;
}

int parse_count(const std::string& option, const std::string& text) {
  size_t used = 0;
  long v = 0;
  try {
    v = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || v < 1 || v > 1000000) {
    throw std::invalid_argument(option + " takes a whole number of runs >= 1; got '" + text + "'");
  }
  return static_cast<int>(v);
}

const char* kUsage =
    "usage: fusegraph_aot_runner PACKAGE.pt2 INPUTS.pt [EXPECTED.pt] [--rtol R] [--atol A] [--runs N] "
    "[--no-weights-crc]\n";

// One output against its expected value: true when it holds (printed either way).
bool compare(size_t i, const at::Tensor& output, const at::Tensor& expected, double rtol, double atol) {
  if (!output.defined() || !expected.defined()) {  // a None output: undefined in the package's outputs
    const bool fits = output.defined() == expected.defined();
    std::cout << "  output " << i << ": " << (output.defined() ? "a tensor" : "None") << ", expected "
              << (expected.defined() ? "a tensor" : "None") << (fits ? "" : "  MISMATCH") << "\n";
    return fits;
  }
  at::Tensor got = output.to(at::kDouble), want = expected.to(at::kDouble);
  if (got.sizes() != want.sizes()) {
    std::cout << "  output " << i << " has shape " << got.sizes() << ", expected " << want.sizes() << "  MISMATCH\n";
    return false;
  }
  // an output with no elements has nothing to differ in (max() of nothing is an error)
  const double scale = want.numel() ? want.abs().max().item<double>() : 0.0;
  const double err = want.numel() ? (got - want).abs().max().item<double>() : 0.0;
  const bool fits = err <= atol + rtol * scale && !std::isnan(err);
  std::cout << "  output " << i << " " << got.sizes() << ": max |got - want| " << err << " (scale " << scale
            << ", allowed " << atol + rtol * scale << ")" << (fits ? "" : "  MISMATCH") << "\n";
  return fits;
}

int run(int argc, char** argv) {
  std::vector<std::string> positional;
  double rtol = 1e-5, atol = 0.0;
  int runs = 2;
  bool weights_crc = true;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--rtol" || a == "--atol" || a == "--runs") {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        const std::string v = argv[++i];
        if (a == "--rtol") rtol = parse_number(a, v);
        else if (a == "--atol") atol = parse_number(a, v);
        else runs = parse_count(a, v);
      } else if (a == "--no-weights-crc") {
        weights_crc = false;
      } else if (a.size() > 1 && a[0] == '-') {
        throw std::invalid_argument("unknown option '" + a + "'; expected --rtol, --atol, --runs or --no-weights-crc");
      } else {
        positional.push_back(a);
      }
    }
    if (positional.size() < 2 || positional.size() > 3) {
      throw std::invalid_argument("expected 2 or 3 files (PACKAGE.pt2 INPUTS.pt [EXPECTED.pt]); got " +
                                  std::to_string(positional.size()));
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "fusegraph_aot_runner: " << e.what() << "\n" << kUsage;
    return 2;
  }
  const std::string& package = positional[0];
  auto t0 = std::chrono::steady_clock::now();
  // the file whole first: a damaged shared object would crash this process when loaded, a damaged weights blob
  // compute garbage
  std::string damaged = fusegraph::aot::package_file_problems(package, weights_crc);
  auto t_checked = std::chrono::steady_clock::now();
  if (!damaged.empty()) {
    std::cerr << "fusegraph_aot_runner: " << damaged;
    return 1;
  }
  // the metadata first, from the archive: loading the package's .so needs the torch, the CPU and the ops it checks
  fusegraph::aot::Metadata metadata;
  try {
    metadata = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(package, "model");
  } catch (const c10::Error& e) {
    std::cerr << "fusegraph_aot_runner: PACKAGE " << package << ": cannot read its metadata (an AOTInductor package "
              << "made by fusegraph.aot.package?): " << e.what_without_backtrace() << "\n";
    return 1;
  }
  std::string problems = fusegraph::aot::package_problems(metadata, package);
  if (!problems.empty()) {
    std::cerr << "cannot run this package here:\n" << problems;
    return 1;
  }
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  try {
    loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(package);
  } catch (const c10::Error& e) {
    std::cerr << "fusegraph_aot_runner: PACKAGE " << package << ": cannot load it: " << e.what_without_backtrace()
              << "\n";
    return 1;
  }
  auto t1 = std::chrono::steady_clock::now();
  // checked, and laid out as the package's code indexes them
  std::vector<at::Tensor> inputs = fusegraph::aot::prepare_inputs(metadata, load_tensors(positional[1], "INPUTS"));
  std::cout << "package " << package << ": fused ops " << metadata["fusegraph.ops"] << "; files checked in "
            << std::chrono::duration<double>(t_checked - t0).count() << " s, loaded in "
            << std::chrono::duration<double>(t1 - t_checked).count() << " s; " << at::get_num_threads() << " threads\n";

  std::vector<at::Tensor> expected;
  if (positional.size() == 3) expected = load_tensors(positional[2], "EXPECTED");
  bool ok = true;
  for (int r = 0; r < runs; ++r) {
    auto s = std::chrono::steady_clock::now();
    std::vector<at::Tensor> outputs = loader->run(inputs);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    std::cout << "run " << r + 1 << ": " << outputs.size() << " outputs in " << seconds << " s\n";
    if (positional.size() < 3) continue;
    if (outputs.size() != expected.size()) {
      std::cerr << "run " << r + 1 << ": " << outputs.size() << " outputs, expected " << expected.size() << "\n";
      return 1;
    }
    for (size_t i = 0; i < outputs.size(); ++i) ok = compare(i, outputs[i], expected[i], rtol, atol) && ok;
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const c10::Error& e) {
    std::cerr << "fusegraph_aot_runner: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "fusegraph_aot_runner: " << e.what() << "\n";
    return 1;
  }
}
