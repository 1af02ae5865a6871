#pragma once
// Allocation of op outputs. In debug-poison mode (tests) outputs are filled with NaN before the kernel
// runs, so an element the kernel forgets to write shows up as NaN instead of stale memory that happens
// to look right.
#include <ATen/core/Tensor.h>

namespace fusegraph {

void set_poison_outputs(bool on);
bool poison_outputs();

// A fresh contiguous tensor of `sizes` with `options`, poisoned when poison mode is on.
at::Tensor new_output(at::IntArrayRef sizes, const at::TensorOptions& options);

}  // namespace fusegraph
