#include "ops/cpu/isa_dispatch.h"

#include <ATen/Version.h>

#include <string>

namespace fusegraph::cpu {

Capability current_capability() {
  static const Capability cap = [] {
    const std::string s = at::get_cpu_capability();  // "DEFAULT", "AVX2", "AVX512" (x86), or others elsewhere
    if (s == "AVX512") return Capability::AVX512;
    if (s == "AVX2") return Capability::AVX2;
    return Capability::DEFAULT;
  }();
  return cap;
}

const char* capability_name(Capability c) {
  switch (c) {
    case Capability::AVX512: return "AVX512";
    case Capability::AVX2: return "AVX2";
    default: return "DEFAULT";
  }
}

}  // namespace fusegraph::cpu
