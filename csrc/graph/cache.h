#pragma once
// The graph runtime's core (SPEC §4): entries keyed per input signature, FIFO/LRU eviction by count and
// by measured memory, the copy plan (zero-copy skip or copy into the static buffer), safe outputs; it counts
// into the Counters of the Stats it reports to (counters.h). A *driver* only captures and replays: it hands the
// cache an Executable. Knows nothing of Python (the Python drivers plug in through csrc/python/).
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "graph/counters.h"

namespace fusegraph::graph {

// One argument of a call, as the cache keys it: a tensor's shape, dtype and device, or a non-tensor's value.
struct ArgSignature {
  bool is_tensor = false;
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::ScalarType::Undefined;
  at::Device device = at::Device(at::kCPU);
  std::string value;  // non-tensor: rendered by the caller: type + exact value, or type + identity; a static
                      // tensor (CacheOptions::static_positions): its data address
  // A tensor sharing its storage with another tensor argument (Signature::add_aliasing): `alias_of` is the position
  // of the first such argument (-1 for that first one and for tensors that share nothing), `strides` its strides
  // (empty for tensors that share nothing).
  int32_t alias_of = -1;
  std::vector<int64_t> strides;

  bool operator==(const ArgSignature& o) const {
    return is_tensor == o.is_tensor && sizes == o.sizes && dtype == o.dtype && device == o.device &&
           value == o.value && alias_of == o.alias_of && strides == o.strides;
  }
  std::string describe() const;  // "tensor(shape=[2, 3], dtype=Float, device=cpu)" or the value
};

struct Signature {
  std::vector<ArgSignature> args;
  bool grad_mode = false;      // autograd was enabled for the call (a graph captured without it differs)
  size_t hash = 0;
  // Objects keyed by identity (modules, functions, enum members...), held by the front end so that an
  // address is never reused while a signature naming it lives. Not part of the comparison.
  std::shared_ptr<void> held;

  static Signature of_tensor(const at::Tensor& t);  // helper for tests
  void add_tensor(const at::Tensor& t);
  void add_value(std::string value);
  // Keys which tensor arguments share storage (`tensors`: the tensor arguments in order, as added). A graph is
  // traced on separate buffers; replayed on one memory for two arguments, a write through one must be read through
  // the other. Such a call is a signature of its own, keyed with the sharing tensors' strides, so its entry binds
  // them as they are and never re-lays one out into a temporary (which would cut the sharing). Returns false when
  // a tensor sharing storage with another may overlap itself (an expanded view, or a layout not provably free of
  // overlap): the front end would capture it on a dense copy, cutting the sharing, so such a call is not captured.
  // Call before finish().
  bool add_aliasing(const std::vector<at::Tensor>& tensors);
  bool has_aliasing() const;
  void finish();  // computes the hash
  bool operator==(const Signature& o) const {
    return hash == o.hash && grad_mode == o.grad_mode && args == o.args;
  }
  std::string describe() const;
};

struct SignatureHash {
  size_t operator()(const Signature& s) const { return s.hash; }
};

// A captured graph for one signature. Device drivers replay on static buffers; the host graph binds the
// caller's tensors directly (binds_inputs) and returns fresh tensors.
class Executable {
 public:
  virtual ~Executable() = default;
  // run on `inputs` (static buffers, or the caller's tensors when binds_inputs()); returns the outputs
  virtual std::vector<c10::IValue> run(const std::vector<at::Tensor>& inputs) = 0;
  virtual bool binds_inputs() const { return false; }
  // outputs are new tensors on every run (no clone needed for safe_output_mode)
  virtual bool outputs_are_fresh() const { return false; }
  // copy srcs into dsts (same sizes/dtype pairwise). Groups are formed by the cache: every group has one
  // dtype, one shape and one stride pattern, so a batched copy (_foreach_copy_) is one launch per group.
  virtual void copy_inputs(const std::vector<std::vector<at::Tensor>>& dst_groups,
                           const std::vector<std::vector<at::Tensor>>& src_groups);
  // outputs that must be cloned in safe mode although outputs_are_fresh() (e.g. aliases of constants)
  virtual bool needs_clone(const at::Tensor&) const { return false; }
};

enum class Eviction { Fifo, Lru };

// Validated by the front end (fusegraph.CompilationConfig, naming the setting); the cache only asserts them.
struct CacheOptions {
  int64_t max_entries = 0;      // >0: at most this many entries
  Eviction eviction = Eviction::Fifo;
  int64_t memory_budget = 0;    // bytes; >0: evict until the entries' measured memory fits
  bool recapture = true;        // false: a second signature raises
  bool safe_outputs = true;     // clone outputs (unless the executable's are fresh)
  int64_t max_failed = 1024;    // how many failed signatures are remembered (FIFO)
  // Tensor inputs (indices among the call's tensors) held where they live: a graph's parameters and buffers.
  // Their data address is part of the signature, so a static-buffer executable replays on them in place (never
  // copied; in-place edits are read) and another tensor there (a replaced parameter, another module instance)
  // is another signature: a capture of its own. Only for static-buffer drivers (the host graph binds any tensor).
  std::vector<int64_t> static_positions;
};

struct Entry {
  uint64_t id = 0;
  Signature signature;
  std::vector<at::Tensor> static_inputs;  // empty when the executable binds inputs
  std::vector<int64_t> captured_addresses; // data_ptr of each tensor input at capture (debug drift check)
  std::vector<std::vector<int64_t>> captured_strides;  // binds_inputs: the strides the graph was built for
  std::shared_ptr<Executable> executable;
  int64_t memory_bytes = 0;
  std::shared_ptr<void> user;  // the front end's data (e.g. the output tree), opaque here
};

// What a call found: a replay (outputs filled), no entry, or a signature whose capture failed before. The
// last three are the front end's: the call's arguments could not be keyed, so it never reached the cache
// (csrc/python/keys.cpp); one enum, so that a call's outcome is one value on both sides of the boundary.
enum class LookupStatus {
  Replayed,
  Miss,
  Failed,
  NotFlat,        // keying flat tensors only, a leaf was not a tensor: flatten the arguments and key them again
  SpecialTensor,  // a tensor subclass, or a tensor that requires grad under grad mode
  Unkeyable,      // a value that is neither a tensor, an immutable value nor keyed by identity
};

struct CallResult {
  LookupStatus status = LookupStatus::Miss;
  std::vector<c10::IValue> outputs;
  std::shared_ptr<void> user;
  std::string failure;               // Failed: the recorded reason
  int64_t copied = 0, skipped = 0;
  std::vector<int64_t> drifted;      // with check_drift, static-buffer entries: positions not at the captured address
};

class GraphCache {
 public:
  // Counts into `counters` (those of the Stats this cache reports to; a fresh set when null).
  explicit GraphCache(CacheOptions options, std::shared_ptr<Counters> counters = nullptr);

  // Replays the entry for `sig` if there is one. `tensors` are the call's tensor arguments in order.
  // Raises the mismatch error when recapture is off and the signature differs from the captured one.
  CallResult call(const Signature& sig, const std::vector<at::Tensor>& tensors, bool check_drift = false);

  // Adds a captured entry; returns the ids of the entries evicted to make room (never the new one).
  std::vector<uint64_t> insert(Signature sig, std::vector<at::Tensor> static_inputs,
                               std::vector<at::Tensor> capture_inputs, std::shared_ptr<Executable> executable,
                               int64_t memory_bytes, std::shared_ptr<void> user);
  void record_failure(const Signature& sig, std::string reason, const std::vector<at::Tensor>& tensors = {});
  // The error a call with `sig` raises under recapture=false (empty when allowed).
  std::string mismatch_error(const Signature& sig, const std::vector<at::Tensor>& tensors = {}) const;
  // `sig` with the data address of each static tensor (CacheOptions::static_positions) in its key.
  Signature keyed(const Signature& sig, const std::vector<at::Tensor>& tensors) const;

  void clear();
  size_t size() const;
  std::vector<uint64_t> entry_ids() const;  // oldest first in the eviction order
  int64_t memory_bytes() const;             // measured memory of this cache's resident entries
  const std::shared_ptr<Counters>& counters() const { return counters_; }
  const CacheOptions& options() const { return options_; }

 private:
  using Order = std::list<std::shared_ptr<Entry>>;
  std::vector<uint64_t> evict_locked(const Entry* keep);
  std::string mismatch_error_locked(const Signature& sig) const;
  void add_memory(int64_t bytes);  // this cache's and the counters' graph_memory_bytes; lock held

  CacheOptions options_;
  mutable std::recursive_mutex mutex_;
  Order order_;  // eviction order: front is evicted first (insertion order; LRU moves hits to the back)
  std::unordered_map<Signature, Order::iterator, SignatureHash> index_;
  std::unordered_map<Signature, std::string, SignatureHash> failed_;
  std::list<Signature> failed_order_;
  std::unique_ptr<Signature> first_signature_;  // recapture=false compares against this
  uint64_t next_id_ = 1;
  int64_t memory_bytes_ = 0;
  std::shared_ptr<Counters> counters_;  // shared with the Stats (and the other caches reporting to it)
};

// Bytes of the distinct storages among `tensors` (a storage shared by several tensors counts once).
int64_t storage_bytes(const std::vector<at::Tensor>& tensors);

}  // namespace fusegraph::graph
