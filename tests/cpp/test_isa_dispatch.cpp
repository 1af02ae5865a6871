// The CPU instruction-set dispatch (ops/cpu/isa_dispatch.h) picks the best registered kernel and never an empty slot.
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
  for (int c = 0; c < static_cast<int>(fusegraph::cpu::Capability::NUM); ++c) {
    EXPECT_NE(fusegraph::gelu_tanh_stub.table[c], nullptr) << "capability " << c;
    EXPECT_NE(fusegraph::fast_gelu_stub.table[c], nullptr) << "capability " << c;
  }
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
