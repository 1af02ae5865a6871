#pragma once
// What an AOTInductor package made by fusegraph.aot.package needs of the process that runs it, checked before it
// runs, from the metadata the package carries (AOTIModelPackageLoader::get_metadata(); written by fusegraph/aot.py):
//   fusegraph.torch      "2.13"                   the torch (major.minor) that compiled it
//   fusegraph.device     "cpu" | "cuda"
//   fusegraph.cpu_flags  "avx2,avx512_f,..."      the instruction sets the package's code may use (cpuinfo's names,
//                                                 as at::cpu::get_cpu_capabilities() reports them): those of the
//                                                 x86-64 level cpp.march named (x86-64-v3: AVX2, FMA, ...), else the
//                                                 compiling CPU's (Inductor builds with -march=native)
//   fusegraph.ops        "fusegraph::rms_norm,..." the operators its extern nodes call through the proxy executor
//   fusegraph.inputs     one entry per flat input, ';'-separated: name|dtype|device|dims|layout. A dim is an int,
//                        or a dynamic dim "sym*coef+offset=lo:hi": the exported symbol it is a linear form of
//                        (inputs sharing a symbol must agree on its value) and its range (hi "inf" when unbounded).
//                        The layout is the one the package's code indexes the input with: "c" (contiguous), "cl" /
//                        "cl3d" (channels-last), "s:a,b,..." (static strides).
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

// The same, with the CPU's instruction sets given (cpuinfo's names, those it has): what package_problems checks
// against at::cpu::get_cpu_capabilities(); a test gives another CPU's.
std::string package_problems_for_cpu(const Metadata& metadata, const std::string& path,
                                    const std::vector<std::string>& cpu_flags);

// Why the package file at `path` is not whole, naming the package and its file; empty when it is: readable as a zip
// archive, and every file its extra/fusegraph.files lists ("crc32 size name" lines, written by fusegraph.aot.package:
// AOTInductor's shared object, metadata and weights blob) present, of that size and CRC-32. A damaged shared object
// would crash the process that loads it, a damaged weights blob compute garbage. Reads every listed file in full (the
// loader extracts each of them anyway); `weights` false leaves the weights blob's bytes unread (its size is checked):
// its CRC costs about half what the load itself does. A package without the list (made before it) is not checked.
std::string package_file_problems(const std::string& path, bool weights = true);

// The flat inputs (in the package's order) as the package's code must get them: each checked against
// fusegraph.inputs (dtype, device, shape, a dynamic dim's range and the symbols inputs share), and one laid out
// otherwise than the package expects copied into its layout (the code indexes with the exported strides).
// Throws c10::Error naming the input, the value seen and the value expected.
std::vector<at::Tensor> prepare_inputs(const Metadata& metadata, const std::vector<at::Tensor>& inputs);

// prepare_inputs' checks alone.
void check_inputs(const Metadata& metadata, const std::vector<at::Tensor>& inputs);

// The short dtype name fusegraph.inputs uses ("float32", "bfloat16", ...: torch's Python names).
std::string dtype_name(at::ScalarType t);

}  // namespace fusegraph::aot
