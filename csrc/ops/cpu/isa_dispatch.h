#pragma once
// Run-time choice of CPU kernel by instruction set. On x86-64 each csrc/ops/cpu/*_kernel.cpp is compiled three
// times (CMakeLists.txt): DEFAULT, AVX2 (+FMA, F16C) and AVX512 (F/BW/VL/DQ), each time with
// CPU_CAPABILITY set to that name, so at::vec::Vectorized takes that width. A kernel file registers its
// function with FG_REGISTER_CPU_KERNEL; the op calls stub.get(), which picks the best version this CPU
// (and ATen's ATEN_CPU_CAPABILITY override) allows. Binaries stay portable: no -march=native.
#include <c10/util/Exception.h>

namespace fusegraph::cpu {

enum class Capability : int { DEFAULT = 0, AVX2 = 1, AVX512 = 2, NUM = 3 };

// How many capabilities this build has kernels for: the first N of the enum. CMakeLists.txt builds all three on
// x86-64 and DEFAULT alone elsewhere (on aarch64 at::vec makes DEFAULT NEON); the others' slots stay empty there.
#ifndef FUSEGRAPH_CPU_CAPS
#error "FUSEGRAPH_CPU_CAPS is set by CMakeLists.txt (the number of CPU capabilities built)"
#endif
inline constexpr int kBuiltCapabilities = FUSEGRAPH_CPU_CAPS;
static_assert(kBuiltCapabilities >= 1 && kBuiltCapabilities <= static_cast<int>(Capability::NUM));

// The capability ATen itself runs at (honours ATEN_CPU_CAPABILITY=default|avx2|avx512); read once.
Capability current_capability();
const char* capability_name(Capability c);

template <typename Fn>
struct KernelStub {
  // Constant-initialised (no constructor runs), so kernel files may register during static init in any order.
  Fn table[static_cast<int>(Capability::NUM)];

  Fn get(const char* name) const {
    for (int c = static_cast<int>(current_capability()); c >= 0; --c) {
      if (table[c] != nullptr) return table[c];
    }
    TORCH_CHECK(false, "fusegraph: no CPU kernel registered for ", name);
  }
};

}  // namespace fusegraph::cpu

// In an op's .cpp:           FG_DEFINE_CPU_STUB(rms_norm_stub, rms_norm_fn);
// In its header:             FG_DECLARE_CPU_STUB(rms_norm_stub, rms_norm_fn);
// In its *_kernel.cpp:       FG_REGISTER_CPU_KERNEL(rms_norm_stub, &rms_norm_kernel);
#define FG_DECLARE_CPU_STUB(stub, fn_type) extern ::fusegraph::cpu::KernelStub<fn_type> stub
#define FG_DEFINE_CPU_STUB(stub, fn_type) ::fusegraph::cpu::KernelStub<fn_type> stub = {}
#define FG_CONCAT_INNER(a, b) a##b
#define FG_CONCAT(a, b) FG_CONCAT_INNER(a, b)
#define FG_REGISTER_CPU_KERNEL(stub, fn)                                                          \
  static const bool FG_CONCAT(fg_registered_, __LINE__) = [] {                                    \
    stub.table[static_cast<int>(::fusegraph::cpu::Capability::CPU_CAPABILITY)] = (fn);            \
    return true;                                                                                  \
  }()
