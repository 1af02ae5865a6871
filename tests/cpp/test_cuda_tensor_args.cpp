// Host side of the CUDA launches: tensors -> RowLayout + Operands (csrc/ops/cuda/tensor_args.h). Needs no
// GPU, only the CUDA runtime header, so it builds where torch has CUDA (the device check, or a CUDA torch
// build without a GPU) and compiles to nothing elsewhere.
#if __has_include(<cuda_runtime_api.h>)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "ops/cuda/tensor_args.h"

namespace fusegraph::cuda {
namespace {

std::optional<RowLayout> plan(const std::vector<at::Tensor>& ts, Operand* ops) {
  switch (ts.size()) {
    case 1: return plan_rows(ts[0].sizes(), {&ts[0]}, ops);
    case 2: return plan_rows(ts[0].sizes(), {&ts[0], &ts[1]}, ops);
    default: return plan_rows(ts[0].sizes(), {&ts[0], &ts[1], &ts[2]}, ops);
  }
}

TEST(CudaTensorArgs, ContiguousLeadingDimsCoalesceIntoOne) {
  const at::Tensor x = at::empty({2, 9, 4, 64});
  Operand op;
  const auto layout = plan({x}, &op);
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(layout->ndim, 1);
  EXPECT_EQ(layout->sizes[0], 72);
  EXPECT_EQ(layout->rows, 72);
  EXPECT_EQ(layout->cols, 64);
  EXPECT_EQ(op.outer_strides[0], 64);
  EXPECT_EQ(op.inner_stride, 1);
  EXPECT_EQ(op.data, x.const_data_ptr());
  EXPECT_EQ(op.dtype, DType::Float32);
}

TEST(CudaTensorArgs, TransposedViewKeepsItsStrides) {
  const at::Tensor x = at::empty({2, 9, 4, 64}, at::kBFloat16).transpose(1, 2);  // [2,4,9,64]
  Operand op;
  const auto layout = plan({x}, &op);
  ASSERT_TRUE(layout.has_value());
  ASSERT_EQ(layout->ndim, 3);
  EXPECT_EQ(layout->rows, 72);
  EXPECT_EQ(op.outer_strides[0], 9 * 4 * 64);
  EXPECT_EQ(op.outer_strides[1], 64);
  EXPECT_EQ(op.outer_strides[2], 4 * 64);
  EXPECT_EQ(op.dtype, DType::BFloat16);
}

TEST(CudaTensorArgs, ChunkedModulationIsReadThroughStrideZero) {
  const at::Tensor x = at::empty({3, 5, 16});
  const at::Tensor emb = at::empty({3, 1, 6 * 16}, at::kHalf);
  const at::Tensor scale = emb.narrow(-1, 16, 16).expand({3, 5, 16});
  Operand ops[2];
  const auto layout = plan({x, scale}, ops);
  ASSERT_TRUE(layout.has_value());
  ASSERT_EQ(layout->ndim, 2);  // the batch dim and the token dim cannot merge for scale
  EXPECT_EQ(layout->sizes[0], 3);
  EXPECT_EQ(layout->sizes[1], 5);
  EXPECT_EQ(ops[0].outer_strides[0], 80);
  EXPECT_EQ(ops[0].outer_strides[1], 16);
  EXPECT_EQ(ops[1].outer_strides[0], 96);
  EXPECT_EQ(ops[1].outer_strides[1], 0);
  EXPECT_EQ(ops[1].inner_stride, 1);
  EXPECT_EQ(ops[1].data, emb.const_data_ptr<at::Half>() + 16);
}

TEST(CudaTensorArgs, RowBroadcastHasInnerStrideZero) {
  const at::Tensor a = at::empty({4, 7, 32});
  const at::Tensor gate = at::empty({4, 7, 1}).expand({4, 7, 32});
  Operand ops[2];
  const auto layout = plan({a, gate}, ops);
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(layout->ndim, 1);
  EXPECT_EQ(ops[1].inner_stride, 0);
  EXPECT_EQ(ops[1].outer_strides[0], 1);
}

TEST(CudaTensorArgs, SizeOneDimsAndZeroDimTensors) {
  const at::Tensor x = at::empty({1, 5, 1, 8});
  Operand op;
  auto layout = plan({x}, &op);
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(layout->ndim, 1);
  EXPECT_EQ(layout->rows, 5);
  const at::Tensor s = at::empty({});
  layout = plan({s}, &op);
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(layout->ndim, 0);
  EXPECT_EQ(layout->rows, 1);
  EXPECT_EQ(layout->cols, 1);
  EXPECT_EQ(op.inner_stride, 0);
}

TEST(CudaTensorArgs, EmptyTensorHasNoRows) {
  const at::Tensor x = at::empty({3, 0, 8});
  Operand op;
  const auto layout = plan({x}, &op);
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(layout->rows, 0);
}

TEST(CudaTensorArgs, TooManyLeadingDimsAskForACopy) {
  // Eight leading dims in reverse memory order: none merge, more than kMaxOuterDims.
  const at::Tensor x = at::empty({2, 3, 2, 3, 2, 3, 2, 3, 4}).permute({7, 6, 5, 4, 3, 2, 1, 0, 8});
  Operand op;
  EXPECT_FALSE(plan({x}, &op).has_value());
  const at::Tensor y = x.contiguous();
  EXPECT_TRUE(plan({y}, &op).has_value());
}

}  // namespace
}  // namespace fusegraph::cuda
#endif
