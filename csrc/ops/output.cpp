#include "ops/output.h"

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <limits>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace fusegraph {

namespace {
std::atomic<bool> g_poison{false};

// Large CPU outputs: ask for transparent huge pages on the whole 2 MiB pages inside the fresh buffer.
// Buffers above glibc's mmap threshold arrive as untouched pages, and their first-touch faults (one per
// 4 KiB page) cost as much as the kernel itself: a fresh 192 MiB output written once took 93 ms with 4 KiB
// pages and 49 ms with MADV_HUGEPAGE (copy_ into an existing buffer: 31 ms), measured here with THP in
// "madvise" mode. Advice on this one buffer only (no allocator or process setting changes); a no-op
// when THP is "never" or already "always", and ignored if it fails. The pages are returned as usual
// when the tensor is freed.
void advise_huge_pages(const at::Tensor& out) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  constexpr size_t kMinBytes = size_t{4} << 20;
  if (!out.device().is_cpu() || out.nbytes() < kMinBytes) return;
  const auto begin = reinterpret_cast<uintptr_t>(out.data_ptr());
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t last = (begin + out.nbytes()) & ~(kHuge - 1);
  if (last > first) (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)out;
#endif
}
}

void set_poison_outputs(bool on) { g_poison.store(on, std::memory_order_relaxed); }
bool poison_outputs() { return g_poison.load(std::memory_order_relaxed); }

at::Tensor new_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor out = at::empty(sizes, options);
  advise_huge_pages(out);
  if (poison_outputs() && out.numel() > 0) {
    out.fill_(std::numeric_limits<double>::quiet_NaN());
  }
  return out;
}

}  // namespace fusegraph
