#pragma once
// The ops' Autograd kernel (csrc/ops/autograd.cpp). Gradients are needed rarely and their formulas are Python
// (fusegraph/ops/_autograd.py); the check that they are not needed runs on every call, so it is C++.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <functional>

namespace fusegraph {

// Runs `op` with autograd on the arguments on `stack` (replaced by its result). Installed by the Python
// extension (csrc/python/module.cpp); without it a call that needs gradients raises.
using AutogradHook = std::function<void(const c10::OperatorHandle& op, torch::jit::Stack* stack)>;
void set_autograd_hook(AutogradHook hook);

}  // namespace fusegraph
