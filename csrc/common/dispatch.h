#pragma once
// Dtype dispatch over the three dtypes fusegraph ops support: float32, bfloat16, float16.
#include <ATen/Dispatch.h>

#define FG_DISPATCH_FLOAT_TYPES(TYPE, NAME, ...)                                             \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)                   \
                                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__)            \
                                         AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))
