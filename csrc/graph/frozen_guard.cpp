#include "graph/frozen_guard.h"

#include <c10/util/Exception.h>

namespace fusegraph::graph {

namespace {
// The storage's data pointer without copying the Storage handle (no reference-count traffic on the hot path).
const void* storage_data(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return impl->has_storage() ? impl->unsafe_storage().data() : nullptr;
}
}  // namespace

FrozenGuard::FrozenGuard(std::vector<int64_t> positions, std::vector<at::Tensor> params)
    : positions_(std::move(positions)) {
  TORCH_CHECK(positions_.size() == params.size(), "FrozenGuard: ", positions_.size(), " positions for ",
              params.size(), " parameters");
  folded_.reserve(params.size());
  params_.reserve(params.size());
  for (const auto& p : params) {
    TORCH_CHECK(p.defined(), "FrozenGuard: undefined parameter");
    params_.emplace_back(p.getIntrusivePtr());
    folded_.push_back({p.unsafeGetTensorImpl(), p._version(), storage_data(p)});
  }
}

FrozenMatch FrozenGuard::check(const std::vector<const at::Tensor*>& args) const {
  FrozenMatch result = FrozenMatch::kSame;
  for (size_t i = 0; i < positions_.size(); ++i) {
    const auto pos = static_cast<size_t>(positions_[i]);
    const at::Tensor* t = pos < args.size() ? args[pos] : nullptr;
    if (t == nullptr || !t->defined() || t->unsafeGetTensorImpl() != folded_[i].impl) {
      return FrozenMatch::kOther;
    }
    if (t->_version() != folded_[i].version || storage_data(*t) != folded_[i].data) {
      result = FrozenMatch::kChanged;
    }
  }
  return result;
}

}  // namespace fusegraph::graph
