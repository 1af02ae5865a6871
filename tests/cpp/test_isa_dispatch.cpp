// The CPU instruction-set dispatch (ops/cpu/isa_dispatch.h) picks the best registered kernel and never an empty slot.
#include <ATen/Version.h>
#include <gtest/gtest.h>

#include "ops/cpu/isa_dispatch.h"
#include "ops/gelu.h"

namespace {

TEST(CpuDispatch, CapabilityIsKnown) {
  const auto cap = fusegraph::cpu::current_capability();
  EXPECT_GE(static_cast<int>(cap), 0);
  EXPECT_LT(static_cast<int>(cap), static_cast<int>(fusegraph::cpu::Capability::NUM));
}

TEST(CpuDispatch, EveryCapabilityHasGeluKernels) {
  for (int c = 0; c < fusegraph::cpu::kBuiltCapabilities; ++c) {
    EXPECT_NE(fusegraph::gelu_tanh_stub.table[c], nullptr) << "capability " << c;
    EXPECT_NE(fusegraph::fast_gelu_stub.table[c], nullptr) << "capability " << c;
  }
}

TEST(CpuDispatch, OnlyTheBuiltCapabilitiesHaveKernels) {
  // x86-64 builds DEFAULT, AVX2 and AVX512; other architectures DEFAULT alone (CMakeLists.txt), whatever ATen
  // reports there (SVE256 on an SVE CPU): the stub then runs DEFAULT, which is NEON on aarch64.
#if defined(__x86_64__) || defined(_M_X64)
  EXPECT_EQ(fusegraph::cpu::kBuiltCapabilities, 3);
#else
  EXPECT_EQ(fusegraph::cpu::kBuiltCapabilities, 1);
  EXPECT_EQ(fusegraph::cpu::current_capability(), fusegraph::cpu::Capability::DEFAULT)
      << "ATen reports " << at::get_cpu_capability();
#endif
  for (int c = fusegraph::cpu::kBuiltCapabilities; c < static_cast<int>(fusegraph::cpu::Capability::NUM); ++c) {
    EXPECT_EQ(fusegraph::gelu_tanh_stub.table[c], nullptr) << "capability " << c;
  }
  EXPECT_NE(fusegraph::gelu_tanh_stub.get("gelu_tanh"), nullptr);
}

using Fn = int (*)();
int one() { return 1; }
int two() { return 2; }

TEST(CpuDispatch, FallsBackToLowerCapability) {
  fusegraph::cpu::KernelStub<Fn> stub = {};
  stub.table[0] = &one;
  EXPECT_EQ(stub.get("one")(), 1);
  stub.table[static_cast<int>(fusegraph::cpu::current_capability())] = &two;
  EXPECT_EQ(stub.get("two")(), 2);
}

TEST(CpuDispatch, EmptyStubRaises) {
  fusegraph::cpu::KernelStub<Fn> stub = {};
  EXPECT_THROW(stub.get("nothing"), c10::Error);
}

}  // namespace
