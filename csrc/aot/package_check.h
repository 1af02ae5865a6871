#pragma once
// What an AOTInductor package made by fusegraph.aot.package needs of the process that runs it, checked before it
// runs, from the metadata the package carries (AOTIModelPackageLoader::get_metadata(); written by fusegraph/aot.py):
//   fusegraph.torch      "2.13"                   the torch (major.minor) that compiled it
//   fusegraph.device     "cpu" | "cuda"
//   fusegraph.cpu_flags  "avx2,avx512_f,..."      the compiling CPU's instruction sets (cpuinfo's names, as
//                                                 at::cpu::get_cpu_capabilities() reports them); Inductor's C++
//                                                 code is built for that CPU (-march=native unless told otherwise)
//   fusegraph.ops        "fusegraph::rms_norm,..." the operators its extern nodes call through the proxy executor
//   fusegraph.inputs     one entry per flat input, ';'-separated: name|dtype|device|dims, a dim an int or
//                        "lo:hi" (a dynamic dim's range, hi "inf" when unbounded)
// Used by the Python front (fusegraph.aot.load, through fusegraph._C) and by C++ programs (examples/aot_runner).
// No Python: this is part of libfusegraph_ops.
#include <ATen/core/Tensor.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace fusegraph::aot {

using Metadata = std::unordered_map<std::string, std::string>;

// Every reason this process cannot run the package, one per line; empty when it can. `path` names the package.
std::string package_problems(const Metadata& metadata, const std::string& path);

// Throws c10::Error naming the input, the value seen and the value expected, when `inputs` (the flat inputs, in
// the package's order) do not fit the package's fusegraph.inputs.
void check_inputs(const Metadata& metadata, const std::vector<at::Tensor>& inputs);

// The short dtype name fusegraph.inputs uses ("float32", "bfloat16", ...: torch's Python names).
std::string dtype_name(at::ScalarType t);

}  // namespace fusegraph::aot
