#include "common/output.h"

#include <ATen/ATen.h>

#include <atomic>
#include <limits>

namespace fusegraph {

namespace {
std::atomic<bool> g_poison{false};
}

void set_poison_outputs(bool on) { g_poison.store(on, std::memory_order_relaxed); }
bool poison_outputs() { return g_poison.load(std::memory_order_relaxed); }

at::Tensor new_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor out = at::empty(sizes, options);
  if (poison_outputs() && out.numel() > 0) {
    out.fill_(std::numeric_limits<double>::quiet_NaN());
  }
  return out;
}

}  // namespace fusegraph
