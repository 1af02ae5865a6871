#pragma once
// Dtype dispatch inside a CPU kernel over the three dtypes the kernels read and write: float32, bfloat16,
// float16 (which compiled kernel runs is isa_dispatch.h's run-time choice).
#include <ATen/Dispatch.h>

#define FG_DISPATCH_FLOAT_TYPES(TYPE, NAME, ...)                                             \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)                   \
                                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__)            \
                                         AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))
