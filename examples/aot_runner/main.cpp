// fusegraph_aot_runner: runs an AOTInductor package made by fusegraph.aot.package from C++, with no Python.
//
//   fusegraph_aot_runner PACKAGE.pt2 INPUTS.pt [EXPECTED.pt] [--rtol R] [--atol A] [--runs N]
//
// INPUTS.pt / EXPECTED.pt: a list of tensors saved by Python's torch.save (the package's flat inputs, in order;
// the eager model's flat outputs). Checks the package can run here (csrc/aot/package_check.h: torch, CPU, the
// fused ops registered - this program links libfusegraph_ops, which registers them), checks the inputs, runs the
// package N times (default 2), and compares every run's outputs with EXPECTED: |got - want| <= atol + rtol *
// max|want| per output. Exit status 0 when all hold; 1 with a message naming what failed.
#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "aot/package_check.h"

namespace {

std::vector<at::Tensor> load_tensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value = torch::pickle_load(bytes);
  std::vector<at::Tensor> out;
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isList() || value.isTuple()) {
    for (const c10::IValue& v : value.isList() ? value.toListRef().vec() : value.toTupleRef().elements().vec()) {
      if (!v.isTensor()) throw std::runtime_error(path + ": expected a list of tensors");
      out.push_back(v.toTensor());
    }
  } else {
    throw std::runtime_error(path + ": expected a tensor or a list of tensors (torch.save)");
  }
  return out;
}

int run(int argc, char** argv) {
  std::vector<std::string> positional;
  double rtol = 1e-5, atol = 0.0;
  int runs = 2;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--rtol" || a == "--atol" || a == "--runs") && i + 1 < argc) {
      const char* v = argv[++i];
      if (a == "--rtol") rtol = std::atof(v);
      else if (a == "--atol") atol = std::atof(v);
      else runs = std::atoi(v);
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() < 2 || positional.size() > 3 || runs < 1) {
    std::cerr << "usage: fusegraph_aot_runner PACKAGE.pt2 INPUTS.pt [EXPECTED.pt] [--rtol R] [--atol A] [--runs N]\n";
    return 2;
  }
  const std::string& package = positional[0];
  auto t0 = std::chrono::steady_clock::now();
  // the metadata first, from the archive: loading the package's .so needs the torch, the CPU and the ops it checks
  fusegraph::aot::Metadata metadata =
      torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(package, "model");
  std::string problems = fusegraph::aot::package_problems(metadata, package);
  if (!problems.empty()) {
    std::cerr << "cannot run this package here:\n" << problems;
    return 1;
  }
  torch::inductor::AOTIModelPackageLoader loader(package);
  auto t1 = std::chrono::steady_clock::now();
  // checked, and laid out as the package's code indexes them
  std::vector<at::Tensor> inputs = fusegraph::aot::prepare_inputs(metadata, load_tensors(positional[1]));
  std::cout << "package " << package << ": fused ops " << metadata["fusegraph.ops"] << "; loaded in "
            << std::chrono::duration<double>(t1 - t0).count() << " s; " << at::get_num_threads() << " threads\n";

  std::vector<at::Tensor> expected;
  if (positional.size() == 3) expected = load_tensors(positional[2]);
  bool ok = true;
  for (int r = 0; r < runs; ++r) {
    auto s = std::chrono::steady_clock::now();
    std::vector<at::Tensor> outputs = loader.run(inputs);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    std::cout << "run " << r + 1 << ": " << outputs.size() << " outputs in " << seconds << " s\n";
    if (expected.empty()) continue;
    if (outputs.size() != expected.size()) {
      std::cerr << "run " << r + 1 << ": " << outputs.size() << " outputs, expected " << expected.size() << "\n";
      return 1;
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      at::Tensor got = outputs[i].to(at::kDouble), want = expected[i].to(at::kDouble);
      if (got.sizes() != want.sizes()) {
        std::cerr << "output " << i << " has shape " << got.sizes() << ", expected " << want.sizes() << "\n";
        return 1;
      }
      const double scale = want.abs().max().item<double>();
      const double err = (got - want).abs().max().item<double>();
      const bool fits = err <= atol + rtol * scale && !std::isnan(err);
      ok = ok && fits;
      std::cout << "  output " << i << " " << got.sizes() << ": max |got - want| " << err << " (scale " << scale
                << ", allowed " << atol + rtol * scale << ")" << (fits ? "" : "  MISMATCH") << "\n";
    }
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
