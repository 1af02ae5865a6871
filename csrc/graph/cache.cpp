#include "graph/cache.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <c10/util/hash.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>
#include <unordered_set>

namespace fusegraph::graph {

std::string ArgSignature::describe() const {
  if (!is_tensor) return value;
  std::ostringstream os;
  os << "tensor(shape=[";
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? ", " : "") << sizes[i];
  os << "], dtype=" << dtype << ", device=" << device;
  if (!strides.empty()) {
    os << ", strides=[";
    for (size_t i = 0; i < strides.size(); ++i) os << (i ? ", " : "") << strides[i];
    os << "], " << (alias_of >= 0 ? "storage of argument " + std::to_string(alias_of) : std::string("storage shared"));
  }
  os << ")";
  if (!value.empty()) os << value;  // a static tensor's address
  return os.str();
}

void Signature::add_tensor(const at::Tensor& t) {
  ArgSignature a;
  a.is_tensor = true;
  a.sizes = t.sizes().vec();
  a.dtype = t.scalar_type();
  a.device = t.device();
  args.push_back(std::move(a));
}

void Signature::add_value(std::string value) {
  ArgSignature a;
  a.value = std::move(value);
  args.push_back(std::move(a));
}

namespace {

// No two elements of `t` share an address: ATen's quick check, or, where it cannot tell (a column slice, a chunk
// of the last dim), the dims of size > 1 sorted by stride each stepping past the whole extent of the ones inside
// it. Exact for every layout a slice, chunk, transpose or permute makes; false for an expanded (stride-0) view.
bool free_of_overlap(const at::Tensor& t) {
  const at::MemOverlap quick = at::has_internal_overlap(t);
  if (quick != at::MemOverlap::TooHard) return quick == at::MemOverlap::No;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;  // elements spanned by the dims inside
  for (const auto& [stride, size] : dims) {
    if (stride < extent) return false;
    extent = stride * size;
  }
  return true;
}

}  // namespace

bool Signature::add_aliasing(const std::vector<at::Tensor>& tensors) {
  if (tensors.size() < 2) return true;
  // (storage, tensor index), sorted: sharing tensors are neighbours. Most calls share nothing, and this is one
  // sort of a few pointers per call (no Python).
  std::vector<std::pair<const c10::StorageImpl*, int32_t>> by_storage;
  by_storage.reserve(tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    const at::Tensor& t = tensors[k];
    if (t.defined() && t.has_storage() && t.storage().nbytes() > 0) {
      by_storage.emplace_back(t.storage().unsafeGetStorageImpl(), static_cast<int32_t>(k));
    }
  }
  std::sort(by_storage.begin(), by_storage.end());
  std::vector<int32_t> position;  // tensor index -> argument position, made on the first sharing found
  for (size_t b = 0; b < by_storage.size();) {
    size_t e = b + 1;
    while (e < by_storage.size() && by_storage[e].first == by_storage[b].first) ++e;
    if (e - b > 1) {
      if (position.empty()) {
        for (size_t a = 0; a < args.size(); ++a) {
          if (args[a].is_tensor) position.push_back(static_cast<int32_t>(a));
        }
      }
      std::vector<int32_t> members;  // tensor indices, ascending
      for (size_t m = b; m < e; ++m) {
        if (!free_of_overlap(tensors[by_storage[m].second])) return false;
        members.push_back(by_storage[m].second);
      }
      for (size_t m = 0; members.size() > 1 && m < members.size(); ++m) {
        ArgSignature& a = args[position[members[m]]];
        a.strides = tensors[members[m]].strides().vec();
        if (m > 0) a.alias_of = position[members[0]];
      }
    }
    b = e;
  }
  return true;
}

bool Signature::has_aliasing() const {
  return std::any_of(args.begin(), args.end(), [](const ArgSignature& a) { return a.alias_of >= 0; });
}

void Signature::finish() {
  size_t h = c10::get_hash(args.size(), grad_mode);
  for (const auto& a : args) {
    if (a.is_tensor) {
      h = c10::hash_combine(h, c10::get_hash(static_cast<int>(a.dtype), static_cast<int>(a.device.type()),
                                             static_cast<int>(a.device.index())));
      for (int64_t s : a.sizes) h = c10::hash_combine(h, std::hash<int64_t>()(s));
      if (!a.value.empty()) h = c10::hash_combine(h, std::hash<std::string>()(a.value));
      if (!a.strides.empty()) {
        h = c10::hash_combine(h, std::hash<int64_t>()(a.alias_of));
        for (int64_t s : a.strides) h = c10::hash_combine(h, std::hash<int64_t>()(s));
      }
    } else {
      h = c10::hash_combine(h, std::hash<std::string>()(a.value));
    }
  }
  hash = h;
}

Signature Signature::of_tensor(const at::Tensor& t) {
  Signature s;
  s.add_tensor(t);
  s.finish();
  return s;
}

std::string Signature::describe() const {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < args.size(); ++i) os << (i ? ", " : "") << args[i].describe();
  os << ")";
  if (grad_mode) os << " with grad mode on";
  return os.str();
}

void Executable::copy_inputs(const std::vector<std::vector<at::Tensor>>& dst_groups,
                             const std::vector<std::vector<at::Tensor>>& src_groups) {
  for (size_t g = 0; g < dst_groups.size(); ++g) {
    if (dst_groups[g].size() == 1) {
      dst_groups[g][0].copy_(src_groups[g][0]);
    } else {
      at::_foreach_copy_(dst_groups[g], src_groups[g]);
    }
  }
}

int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  int64_t total = 0;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const auto& st = t.storage();
    if (seen.insert(st.unsafeGetStorageImpl()).second) total += static_cast<int64_t>(st.nbytes());
  }
  return total;
}

namespace {

bool same_strides(const at::Tensor& a, const at::Tensor& b) { return a.strides() == b.strides(); }

// The tensor positions whose source must be copied, grouped by (dtype, sizes, strides) so each group is
// one batched copy.
struct CopyGroups {
  std::vector<std::vector<at::Tensor>> dsts, srcs;
};

}  // namespace

GraphCache::GraphCache(CacheOptions options, std::shared_ptr<Counters> counters)
    : options_(options), counters_(counters ? std::move(counters) : std::make_shared<Counters>()) {
  TORCH_INTERNAL_ASSERT(options_.max_entries >= 0 && options_.memory_budget >= 0 && options_.max_failed >= 0,
                        "GraphCache options out of range (the front end validates them)");
}

Signature GraphCache::keyed(const Signature& sig, const std::vector<at::Tensor>& tensors) const {
  if (options_.static_positions.empty() || tensors.empty()) return sig;
  Signature out = sig;
  size_t k = 0, next = 0;  // k: tensor index; static_positions ascending
  const auto& positions = options_.static_positions;
  for (auto& a : out.args) {
    if (!a.is_tensor) continue;
    while (next < positions.size() && positions[next] < static_cast<int64_t>(k)) ++next;
    if (next < positions.size() && positions[next] == static_cast<int64_t>(k) && k < tensors.size()) {
      std::ostringstream os;
      os << "@" << tensors[k].data_ptr();
      a.value = os.str();
    }
    ++k;
  }
  out.finish();
  return out;
}

CallResult GraphCache::call(const Signature& call_sig, const std::vector<at::Tensor>& tensors, bool check_drift) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  CallResult result;
  const Signature sig = keyed(call_sig, tensors);
  auto it = index_.find(sig);
  if (it == index_.end()) {
    auto f = failed_.find(sig);
    if (f != failed_.end()) {
      result.status = LookupStatus::Failed;
      result.failure = f->second;
      counters_->add(Count::eager_calls, 1);
      return result;
    }
    if (!options_.recapture) {
      std::string err = mismatch_error_locked(sig);
      TORCH_CHECK(err.empty(), err);
    }
    result.status = LookupStatus::Miss;
    return result;
  }
  std::shared_ptr<Entry> entry = *it->second;
  if (options_.eviction == Eviction::Lru) order_.splice(order_.end(), order_, it->second);

  Executable& exe = *entry->executable;
  const std::vector<at::Tensor>* run_inputs = &tensors;
  std::vector<at::Tensor> bound;  // binds_inputs: tensors re-laid out to the strides the graph was built for
  if (check_drift && !exe.binds_inputs()) {  // the host graph binds any address: nothing to warn about
    for (size_t i = 0; i < tensors.size() && i < entry->captured_addresses.size(); ++i) {
      if (reinterpret_cast<int64_t>(tensors[i].data_ptr()) != entry->captured_addresses[i]) {
        result.drifted.push_back(static_cast<int64_t>(i));
      }
    }
  }
  // binds_inputs: the positions bound to a re-laid-out temporary, and its version after the copy in
  std::vector<std::pair<size_t, int64_t>> relaid;
  if (exe.binds_inputs()) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].strides() == c10::IntArrayRef(entry->captured_strides[i])) {
        ++result.skipped;
        continue;
      }
      // The graph was built for the captured strides (a folded view chain replays as_strided of them), so a tensor
      // of other strides is bound as a copy of the captured layout. A tensor the graph writes is copied back after
      // the run; the temporary's version counter says which were written (every in-place op and copy_ bumps it, the
      // FX fallback's too), so a graph that only reads pays nothing more. The alternatives cost more: strides in
      // every signature would capture a graph per layout, and refusing the re-layout runs such calls eagerly. The
      // temporary is made a normal tensor even under the caller's inference mode (an inference tensor has no version
      // counter; in-place ops on a normal tensor inside inference mode still bump it). Outputs that view such an
      // input view the temporary: values as eager's, but not the caller's memory (as the clones of a device graph).
      // Tensors sharing storage with another argument are keyed with their strides (Signature::add_aliasing): they
      // never get here, so the copy-back never reorders writes between two views of one memory.
      if (bound.empty()) bound = tensors;
      {
        c10::InferenceMode normal_tensor(false);
        bound[i] = at::empty_strided(tensors[i].sizes(), entry->captured_strides[i], tensors[i].options());
      }
      bound[i].copy_(tensors[i]);
      relaid.emplace_back(i, static_cast<int64_t>(bound[i]._version()));
      ++result.copied;
    }
    if (!bound.empty()) run_inputs = &bound;
  } else {
    // The copy plan: zero-copy when the caller's tensor already is the static buffer.
    std::map<std::tuple<int, std::vector<int64_t>, std::vector<int64_t>>, size_t> group_of;
    CopyGroups groups;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& dst = entry->static_inputs[i];
      const at::Tensor& src = tensors[i];
      if (src.data_ptr() == dst.data_ptr() && same_strides(src, dst)) {
        ++result.skipped;
        continue;
      }
      auto key = std::make_tuple(static_cast<int>(dst.scalar_type()), dst.sizes().vec(), dst.strides().vec());
      auto [g, fresh] = group_of.emplace(std::move(key), groups.dsts.size());
      if (fresh) {
        groups.dsts.emplace_back();
        groups.srcs.emplace_back();
      }
      groups.dsts[g->second].push_back(dst);
      groups.srcs[g->second].push_back(src);
      ++result.copied;
    }
    if (!groups.dsts.empty()) exe.copy_inputs(groups.dsts, groups.srcs);
    run_inputs = &entry->static_inputs;
  }

  result.outputs = exe.run(*run_inputs);
  for (const auto& [i, version] : relaid) {
    if (static_cast<int64_t>(bound[i]._version()) != version) tensors[i].copy_(bound[i]);  // see above
  }
  if (options_.safe_outputs) {
    const bool fresh = exe.outputs_are_fresh();
    for (auto& v : result.outputs) {
      if (v.isTensor() && (!fresh || exe.needs_clone(v.toTensor()))) v = v.toTensor().clone();
    }
  }
  result.status = LookupStatus::Replayed;
  result.user = entry->user;
  counters_->add(Count::replays, 1);
  if (result.copied) counters_->add(Count::inputs_copied, result.copied);
  if (result.skipped) counters_->add(Count::inputs_skipped, result.skipped);
  return result;
}

std::vector<uint64_t> GraphCache::insert(Signature call_sig, std::vector<at::Tensor> static_inputs,
                                         std::vector<at::Tensor> capture_inputs,
                                         std::shared_ptr<Executable> executable, int64_t memory_bytes,
                                         std::shared_ptr<void> user) {
  Signature sig = keyed(call_sig, capture_inputs);
  TORCH_CHECK(executable, "fusegraph: GraphCache.insert needs an executable");
  TORCH_CHECK(executable->binds_inputs() || static_inputs.size() == capture_inputs.size(),
              "fusegraph: GraphCache.insert got ", static_inputs.size(), " static buffers for ",
              capture_inputs.size(), " tensor inputs; expected one per tensor input");
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto entry = std::make_shared<Entry>();
  entry->id = next_id_++;
  entry->static_inputs = std::move(static_inputs);
  for (const auto& t : capture_inputs) {
    entry->captured_addresses.push_back(reinterpret_cast<int64_t>(t.data_ptr()));
    entry->captured_strides.push_back(t.strides().vec());
  }
  entry->executable = std::move(executable);
  entry->memory_bytes = memory_bytes;
  entry->user = std::move(user);

  auto old = index_.find(sig);
  if (old != index_.end()) {  // a second capture of one signature replaces the first
    add_memory(-(*old->second)->memory_bytes);
    order_.erase(old->second);
    index_.erase(old);
  }
  if (!options_.recapture && !first_signature_) first_signature_ = std::make_unique<Signature>(sig);
  if (!order_.empty()) counters_->add(Count::recaptures, 1);  // a capture for a further signature
  entry->signature = sig;
  order_.push_back(entry);
  index_.emplace(std::move(sig), std::prev(order_.end()));
  counters_->add(Count::graphs_captured, 1);
  add_memory(entry->memory_bytes);
  return evict_locked(entry.get());
}

std::vector<uint64_t> GraphCache::evict_locked(const Entry* keep) {
  std::vector<uint64_t> evicted;
  auto over = [&] {
    if (options_.max_entries > 0 && static_cast<int64_t>(order_.size()) > options_.max_entries) return true;
    return options_.memory_budget > 0 && memory_bytes_ > options_.memory_budget;
  };
  auto it = order_.begin();
  while (over() && it != order_.end()) {
    if (it->get() == keep) {  // the newest entry stays even when alone it exceeds the budget
      ++it;
      continue;
    }
    evicted.push_back((*it)->id);
    add_memory(-(*it)->memory_bytes);
    index_.erase((*it)->signature);
    it = order_.erase(it);
    counters_->add(Count::evictions, 1);
  }
  return evicted;
}

void GraphCache::record_failure(const Signature& call_sig, std::string reason,
                                const std::vector<at::Tensor>& tensors) {
  const Signature sig = keyed(call_sig, tensors);
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!options_.recapture && !first_signature_) first_signature_ = std::make_unique<Signature>(sig);
  if (failed_.emplace(sig, std::move(reason)).second) failed_order_.push_back(sig);
  while (options_.max_failed > 0 && static_cast<int64_t>(failed_order_.size()) > options_.max_failed) {
    failed_.erase(failed_order_.front());
    failed_order_.pop_front();
  }
}

std::string GraphCache::mismatch_error(const Signature& sig, const std::vector<at::Tensor>& tensors) const {
  const Signature key = keyed(sig, tensors);
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return mismatch_error_locked(key);
}

std::string GraphCache::mismatch_error_locked(const Signature& sig) const {
  if (options_.recapture || !first_signature_ || *first_signature_ == sig) return "";
  const auto& cap = first_signature_->args;
  size_t n = std::max(cap.size(), sig.args.size());
  for (size_t i = 0; i < n; ++i) {
    std::string c = i < cap.size() ? cap[i].describe() : "nothing";
    std::string g = i < sig.args.size() ? sig.args[i].describe() : "nothing";
    if (i >= cap.size() || i >= sig.args.size() || !(cap[i] == sig.args[i])) {
      return "fusegraph: graph input mismatch at position " + std::to_string(i) + ": captured " + c + ", got " + g +
             " (graph_recapture=False)";
    }
  }
  if (first_signature_->grad_mode != sig.grad_mode) {
    return std::string("fusegraph: graph input mismatch: captured with grad mode ") +
           (first_signature_->grad_mode ? "on" : "off") + ", called with it " + (sig.grad_mode ? "on" : "off") +
           " (graph_recapture=False)";
  }
  return "";
}

void GraphCache::clear() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  index_.clear();
  order_.clear();
  failed_.clear();
  failed_order_.clear();
  // recapture=false: the next capture is the first again. (Only kept then: a signature holds its module arguments.)
  first_signature_.reset();
  add_memory(-memory_bytes_);
}

void GraphCache::add_memory(int64_t bytes) {
  memory_bytes_ += bytes;
  counters_->add(Count::graph_memory_bytes, bytes);
}

size_t GraphCache::size() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return order_.size();
}

std::vector<uint64_t> GraphCache::entry_ids() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  std::vector<uint64_t> ids;
  for (const auto& e : order_) ids.push_back(e->id);
  return ids;
}

int64_t GraphCache::memory_bytes() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return memory_bytes_;
}

}  // namespace fusegraph::graph
