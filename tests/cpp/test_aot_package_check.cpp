// What a fused AOT package needs of the process (csrc/aot/package_check.h): the CPU flags a package compiled for an
// x86-64 level requires of another CPU (an AVX2-only one), the metadata's numbers named when malformed, and a file
// that is not a whole package refused by name.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/headeronly/version.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "aot/package_check.h"

namespace {

namespace aot = fusegraph::aot;

std::string torch_version() { return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR); }

// cpuinfo's flags on an AVX2-only CPU (a Haswell server: no AVX-512, no AMX).
const std::vector<std::string> kHaswell = {"aes", "avx", "avx2", "bmi", "bmi2", "clflush", "f16c", "fma3",
                                           "lzcnt", "popcnt", "sse", "sse2", "sse3", "sse4_1", "sse4_2", "ssse3"};

// fusegraph.cpu_flags of a package compiled with cpp.march x86-64-v3 (fusegraph/aot.py's _X86_64_LEVELS).
const char* kX86_64_V3 = "avx,avx2,bmi,bmi2,f16c,fma3,lzcnt,popcnt,sse,sse2,sse3,sse4_1,sse4_2,ssse3";

TEST(AotPackageCheck, AnX86_64_V3PackageRunsOnAnAvx2OnlyCpu) {
  aot::Metadata m{{"fusegraph.torch", torch_version()}, {"fusegraph.device", "cpu"},
                  {"fusegraph.cpu_flags", kX86_64_V3}, {"fusegraph.ops", ""}};
  EXPECT_EQ(aot::package_problems_for_cpu(m, "v3.pt2", kHaswell), "");
  // a package compiled for this CPU's AVX-512 is refused there, naming what it lacks
  m["fusegraph.cpu_flags"] = std::string(kX86_64_V3) + ",avx512_f,amx_tile";
  const std::string why = aot::package_problems_for_cpu(m, "native.pt2", kHaswell);
  EXPECT_NE(why.find("native.pt2's code was compiled for a CPU with avx512_f, amx_tile, which this CPU lacks"),
            std::string::npos)
      << why;
}

TEST(AotPackageCheck, AMalformedDimNamesTheField) {
  const aot::Metadata m{{"fusegraph.inputs", "x|float32|cpu|s0*1+0=2:sixteen,8|c"}};
  try {
    aot::check_inputs(m, {at::zeros({4, 8})});
    FAIL() << "a malformed dim was accepted";
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("malformed dim 's0*1+0=2:sixteen'"), std::string::npos) << what;
    EXPECT_NE(what.find("'sixteen' is not an integer"), std::string::npos) << what;
  }
  const aot::Metadata strides{{"fusegraph.inputs", "x|float32|cpu|4,8|s:8,one"}};
  try {
    aot::check_inputs(strides, {at::zeros({4, 8})});
    FAIL() << "a malformed stride was accepted";
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("layout 's:8,one' of input 'x'"), std::string::npos) << what;
  }
}

TEST(AotPackageCheck, AFileThatIsNotAWholePackageIsNamed) {
  const std::string missing = ::testing::TempDir() + "fg_no_such_package.pt2";
  std::remove(missing.c_str());
  EXPECT_EQ(aot::package_file_problems(missing), "no package at " + missing + " (cannot open it)\n");
  const std::string junk = ::testing::TempDir() + "fg_junk_package.pt2";
  std::ofstream(junk) << "not a zip archive";
  const std::string why = aot::package_file_problems(junk);
  EXPECT_EQ(why.rfind(junk + " is not a whole .pt2 package", 0), 0u) << why;
  std::remove(junk.c_str());
}

}  // namespace
