#pragma once
// The scalar counters of one fusegraph.Stats (SPEC §1.3), under the Stats attribute names: the one place they
// live. A Stats owns a Counters and exposes each as an attribute; every GraphCache reporting into that Stats
// shares it and counts its captures, replays, copies, evictions and fallback calls here as they happen; the
// Python front ends add the rest (compiles, bucket calls, seconds...). Lock-free: atomics, relaxed order (each
// counter is a total, read by people, never used to order other memory).
#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

namespace fusegraph::graph {

// Integer counters, in the order Stats lists them.
enum class Count : int {
  graphs_compiled,
  graphs_captured,
  replays,
  inputs_copied,
  inputs_skipped,
  evictions,
  recaptures,
  eager_calls,           // calls run uncaptured (the cache counts those of signatures whose capture failed)
  frozen_recompiles,
  weight_invalidations,
  bucket_padded_calls,
  bucket_overflows,
  graph_memory_bytes,    // measured memory of the resident graphs (a gauge: evictions and clears subtract)
};
constexpr int kNumCounts = static_cast<int>(Count::graph_memory_bytes) + 1;

// Seconds, summed.
enum class Seconds : int { capture_seconds, compile_seconds };
constexpr int kNumSeconds = static_cast<int>(Seconds::compile_seconds) + 1;

class Counters {
 public:
  void add(Count c, int64_t n) { counts_[static_cast<int>(c)].fetch_add(n, std::memory_order_relaxed); }
  void add(Seconds s, double x);
  void set(Count c, int64_t n) { counts_[static_cast<int>(c)].store(n, std::memory_order_relaxed); }
  void set(Seconds s, double x) { seconds_[static_cast<int>(s)].store(x, std::memory_order_relaxed); }
  int64_t get(Count c) const { return counts_[static_cast<int>(c)].load(std::memory_order_relaxed); }
  double get(Seconds s) const { return seconds_[static_cast<int>(s)].load(std::memory_order_relaxed); }

  static const std::array<std::string_view, kNumCounts>& count_names();
  static const std::array<std::string_view, kNumSeconds>& seconds_names();

 private:
  std::array<std::atomic<int64_t>, kNumCounts> counts_{};
  std::array<std::atomic<double>, kNumSeconds> seconds_{};
};

}  // namespace fusegraph::graph
