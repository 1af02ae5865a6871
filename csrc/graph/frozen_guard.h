// FrozenGuard: is a graph whose parameters were folded into constants (freezing) still valid for this call?
//
// Dynamo compiles a module class's forward once and, with parameters lifted to graph inputs, reuses the graph
// for every instance of the class (and after any in-place weight update). A frozen graph holds the values it
// was compiled with, so every call must check that the tensors passed at the frozen positions are the very ones
// that were folded, unchanged. The check runs per call on the hot path, so it is C++: per parameter a pointer
// compare (identity), the data pointer (``p.data = other``, which swaps the storage without a version bump) and
// the version counter (in-place writes: copy_, load_state_dict). Writes through ``.data`` bypass the version
// counter and are not seen (fusegraph/freezing.py). Freezing is opt-in (pack_weights, concat_linear,
// enable_freezing on the Inductor route); no default route folds parameters.
#pragma once

#include <ATen/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <vector>

namespace fusegraph::graph {

enum class FrozenMatch : int {
  kSame = 0,        // every frozen parameter is the folded tensor, unchanged
  kChanged = 1,     // the same tensors, but some value changed since (version or storage)
  kOther = 2,       // some position holds another tensor (another module instance, a replaced parameter)
};

class FrozenGuard {
 public:
  // positions[i]: the call-argument index of the tensor params[i] was folded from.
  FrozenGuard(std::vector<int64_t> positions, std::vector<at::Tensor> params);

  // args: the call's arguments; a position past the end or a non-tensor counts as kOther.
  FrozenMatch check(const std::vector<const at::Tensor*>& args) const;

  const std::vector<int64_t>& positions() const { return positions_; }
  size_t size() const { return params_.size(); }

 private:
  struct Folded {
    const c10::TensorImpl* impl;
    int64_t version;
    const void* data;
  };
  std::vector<int64_t> positions_;
  // Held weakly: the guard does not keep a parameter alive (a deleted model's weights are freed), and the weak
  // reference keeps the TensorImpl's allocation, so its address is never reused for another tensor while the guard
  // lives (an identity compare by address stays exact).
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> params_;
  std::vector<Folded> folded_;
};

}  // namespace fusegraph::graph
