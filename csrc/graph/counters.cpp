#include "graph/counters.h"

namespace fusegraph::graph {

void Counters::add(Seconds s, double x) {
  std::atomic<double>& v = seconds_[static_cast<int>(s)];
  double old = v.load(std::memory_order_relaxed);
  while (!v.compare_exchange_weak(old, old + x, std::memory_order_relaxed)) {
  }
}

const std::array<std::string_view, kNumCounts>& Counters::count_names() {
  static const std::array<std::string_view, kNumCounts> names = {
      "graphs_compiled",   "graphs_captured",      "replays",             "inputs_copied",    "inputs_skipped",
      "evictions",         "recaptures",           "eager_calls",         "frozen_recompiles",
      "weight_invalidations", "bucket_padded_calls", "bucket_overflows", "graph_memory_bytes"};
  return names;
}

const std::array<std::string_view, kNumSeconds>& Counters::seconds_names() {
  static const std::array<std::string_view, kNumSeconds> names = {"capture_seconds", "compile_seconds"};
  return names;
}

}  // namespace fusegraph::graph
