// fusegraph.linear: F.linear(x, weight, bias) through oneDNN's matmul on the plain (unpacked) weight.
//
// Why: ATen's CPU addmm runs float32 through the BLAS torch was built with (MKL's sgemm), which on some CPUs is
// far from what the hardware does: on this project's AMD Zen 5 (AVX-512) MKL takes a code path 2.1-2.4x slower
// than oneDNN's brgemm matmul on the same weight (docs/BENCHMARKS.md, "GEMM kernels"). oneDNN is already in
// every CPU build of torch (the `mkldnn` operators Inductor's freezing uses); its `_linear_pointwise` accepts the
// module's own [N, K] weight, so no packed copy is made and an in-place weight edit is read by the next call.
// bf16/fp16: where the CPU has no native 16-bit dot products (AVX2, AVX-512 without AVX512-BF16), ATen's 16-bit
// matmul runs 2.2-17x slower than widening to float32 (BENCHMARKS §1.3); this op widens the operands and runs the
// float32 GEMM.
// The fusion pass decides where this op is used (fusegraph/fusion/patterns/linear.py: a table measured per CPU
// class); the op itself runs anywhere: float32, bf16 and fp16 CPU tensors through oneDNN when torch has it,
// everything else through at::linear.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <sys/mman.h>

#include <algorithm>
#include <optional>
#include <string_view>

#include "ops/checks.h"
#include "ops/gemv.h"
#include "ops/output.h"

namespace fusegraph {

namespace {

constexpr const char* kOp = "linear";

using LinearPointwise = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                   std::string_view, c10::List<std::optional<at::Scalar>>,
                                   std::optional<std::string_view>);

// oneDNN's linear (mkldnn::_linear_pointwise), or nullopt in a torch built without oneDNN. Looked up once.
const std::optional<c10::TypedOperatorHandle<LinearPointwise>>& onednn_linear() {
  static const std::optional<c10::TypedOperatorHandle<LinearPointwise>> handle =
      []() -> std::optional<c10::TypedOperatorHandle<LinearPointwise>> {
    if (!at::hasMKLDNN()) return std::nullopt;
    auto op = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
    if (!op.has_value()) return std::nullopt;
    return op->typed<LinearPointwise>();
  }();
  return handle;
}

at::Tensor linear_reference(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  check_gemv_args(x, weight, bias, kOp);
  at::Tensor out = new_output(linear_out_sizes(x, weight), x.options());
  if (out.numel() == 0) return out;
  return out.copy_(at::linear(x, weight, bias));
}

// bf16/fp16 on a CPU class without native 16-bit dot products: the operands widened to float32 exactly, one
// float32 GEMM (oneDNN) per block of weight rows, rounded once to the input dtype - the math of ATen's own 16-bit
// matmul (float32 accumulation), at float32 GEMM speed.
//
// Memory: the float32 operands live in a per-thread workspace, mapped outside malloc's heap, that is grown once and
// reused by every later call (`WidenWorkspace`), never in per-call allocations. Per-call buffers of several MiB stayed
// in glibc's heap (it raises its mmap threshold after the first large free and then serves such buffers from the
// heap, which keeps the pages): part of what held a bf16 FLUX.1 block's resident memory over plain torch.compile's
// + 5 % of the weights (BENCHMARKS §1.3). Returning them to the kernel instead (MALLOC_MMAP_THRESHOLD_) cost 21-23 %
// of the speed in page faults. The workspace is bounded: a weight block is about kBlockBytes of float32 rows, and
// the activation is widened in tiles of at most kTileBytes of rows (one tile up to FLUX.1's MLP at 682 tokens), so
// each thread that ran the op holds at most kTileBytes + kBlockBytes (rounded to 2 MiB). Only oneDNN's float32
// result of one block (rows x kBlockBytes / K floats) is allocated per block.
constexpr int64_t kTileBytes = int64_t{32} << 20;   // the widened activation tile
constexpr int64_t kBlockBytes = int64_t{4} << 20;   // the widened weight block

// A float32 buffer of the widened GEMM in an anonymous mapping of its own, outside malloc's heap (held there, a
// buffer of several MiB pinned the heap: freed memory above it could not be returned), per thread; it only grows,
// in whole 2 MiB steps, to the largest block seen, and is unmapped when its thread ends.
class MappedFloats {
 public:
  MappedFloats() = default;
  MappedFloats(const MappedFloats&) = delete;
  MappedFloats& operator=(const MappedFloats&) = delete;
  ~MappedFloats() { release(); }

  // A [rows, cols] float32 view of the buffer (valid until the next take).
  at::Tensor take(int64_t rows, int64_t cols) {
    const size_t need = static_cast<size_t>(rows * cols) * sizeof(float);
    if (need > bytes_) {
      release();
      const size_t step = size_t{2} << 20;
      const size_t bytes = (need + step - 1) / step * step;
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      TORCH_CHECK(p != MAP_FAILED, "linear: could not map ", bytes, " bytes for the float32 operands of a widened ",
                  "bf16/fp16 GEMM");
      data_ = p;
      bytes_ = bytes;
    }
    return at::from_blob(data_, {rows, cols}, at::TensorOptions().dtype(at::kFloat));
  }

 private:
  void release() {
    if (data_ != nullptr) munmap(data_, bytes_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

struct WidenWorkspace {
  MappedFloats x, w;
};

at::Tensor linear_widened(const at::Tensor& x_in, const at::Tensor& w_in, const std::optional<at::Tensor>& bias_in,
                          const c10::TypedOperatorHandle<LinearPointwise>& onednn) {
  thread_local WidenWorkspace ws;
  const std::vector<int64_t> sizes = linear_out_sizes(x_in, w_in);
  const int64_t n = w_in.size(0), k = w_in.size(1);
  const at::Tensor x = x_in.reshape({-1, k});
  const int64_t m = x.size(0);
  const bool has_bias = bias_in.has_value() && bias_in->defined();
  const int64_t block = std::min<int64_t>(n, std::max<int64_t>(64, (kBlockBytes / (k * 4) + 63) / 64 * 64));
  const int64_t tile = m * k * 4 <= kTileBytes ? m : std::max<int64_t>(64, kTileBytes / (k * 4));
  at::Tensor out = new_output({m, n}, x_in.options());
  for (int64_t i = 0; i < m; i += tile) {
    const int64_t rows = std::min(tile, m - i);
    at::Tensor xf = ws.x.take(rows, k);
    xf.copy_(x.narrow(0, i, rows));
    for (int64_t j = 0; j < n; j += block) {
      const int64_t len = std::min(block, n - j);
      at::Tensor wf = ws.w.take(len, k);
      wf.copy_(w_in.narrow(0, j, len));
      // oneDNN allocates this block's float32 result itself (rows x ~4 MiB / K floats): its matmul has no
      // output argument that torch exports.
      const at::Tensor of = onednn.call(xf, wf, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(),
                                        std::string_view(""));
      at::Tensor dst = out.narrow(0, i, rows).narrow(1, j, len);
      if (has_bias) {
        at::add_out(dst, of, bias_in->narrow(0, j, len));  // float32 sum, rounded once into the output
      } else {
        dst.copy_(of);
      }
    }
  }
  return out.view(sizes);
}

at::Tensor linear_cpu(const at::Tensor& x_in, const at::Tensor& w_in, const std::optional<at::Tensor>& bias_in) {
  check_gemv_args(x_in, w_in, bias_in, kOp);
  const auto& onednn = onednn_linear();
  const std::vector<int64_t> sizes = linear_out_sizes(x_in, w_in);
  if (!onednn.has_value() || x_in.numel() == 0 || x_in.size(-1) == 0 || w_in.size(0) == 0) {
    return linear_reference(x_in, w_in, bias_in);
  }
  if (x_in.scalar_type() == at::kBFloat16 || x_in.scalar_type() == at::kHalf) {
    return linear_widened(x_in, w_in, bias_in, *onednn);
  }
  if (x_in.scalar_type() != at::kFloat) return linear_reference(x_in, w_in, bias_in);
  // oneDNN writes a fresh contiguous [M, N] (its own allocation: nothing here to poison) from x as contiguous
  // rows [M, K] and the weight's contiguous [N, K].
  const at::Tensor x = x_in.reshape({-1, x_in.size(-1)}).contiguous();
  const at::Tensor w = w_in.contiguous();
  std::optional<at::Tensor> bias;
  if (bias_in.has_value() && bias_in->defined()) bias = bias_in->contiguous();
  at::Tensor out = onednn->call(x, w, bias, "none", c10::List<std::optional<at::Scalar>>(), std::string_view(""));
  return out.view(sizes);
}

}  // namespace

TORCH_LIBRARY_IMPL(fusegraph, CPU, m) { m.impl("linear", &linear_cpu); }

// Every other device (CUDA, NPU): at::linear (cuBLAS / the device's own GEMM); the fusion pass only uses the op on
// CPU sites.
TORCH_LIBRARY_IMPL(fusegraph, CompositeExplicitAutograd, m) { m.impl("linear", &linear_reference); }

}  // namespace fusegraph
