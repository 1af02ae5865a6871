// The graph runtime's cache: keys, FIFO/LRU eviction, memory budget, the copy plan, safe outputs, the
// recapture=false error, and the host graph's C++ loop.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "graph/cache.h"
#include "graph/host_graph.h"

namespace {

namespace fg = fusegraph::graph;

// A fake driver: "replay" doubles the static input into a static output and counts its runs.
class Doubler final : public fg::Executable {
 public:
  Doubler(at::Tensor in, at::Tensor out) : in_(std::move(in)), out_(std::move(out)) {}
  std::vector<c10::IValue> run(const std::vector<at::Tensor>& inputs) override {
    EXPECT_TRUE(inputs[0].is_same(in_));
    at::mul_out(out_, in_, 2);
    ++runs;
    return {out_};
  }
  int runs = 0;

 private:
  at::Tensor in_, out_;
};

fg::Signature sig_of(const at::Tensor& t) { return fg::Signature::of_tensor(t); }

// Inserts a Doubler entry for `example` (eager-capture style: the static buffer is a clone).
uint64_t add_entry(fg::GraphCache& cache, const at::Tensor& example, int64_t bytes = 0,
                   std::vector<uint64_t>* evicted = nullptr) {
  at::Tensor in = example.clone();
  auto exe = std::make_shared<Doubler>(in, at::empty_like(in));
  auto ev = cache.insert(sig_of(example), {in}, {in}, exe, bytes, nullptr);
  if (evicted) *evicted = ev;
  return cache.entry_ids().back();
}

TEST(GraphSignature, KeysShapeDtypeDeviceAndValues) {
  auto a = at::zeros({2, 3});
  EXPECT_EQ(sig_of(a), sig_of(at::ones({2, 3})));  // values don't matter
  EXPECT_FALSE(sig_of(a) == sig_of(at::zeros({3, 2})));
  EXPECT_FALSE(sig_of(a) == sig_of(at::zeros({2, 3}, at::kDouble)));
  EXPECT_EQ(sig_of(a), sig_of(at::zeros({4, 6}).slice(0, 0, 2).slice(1, 0, 3)));  // strides are not keyed
  fg::Signature s1, s2;
  s1.add_tensor(a);
  s1.add_value("int:1");
  s1.finish();
  s2.add_tensor(a);
  s2.add_value("int:2");
  s2.finish();
  EXPECT_FALSE(s1 == s2);
}

TEST(GraphCache, SameSignatureReplaysTheEntry) {
  fg::GraphCache cache({});
  auto x = at::randn({4});
  EXPECT_EQ(cache.call(sig_of(x), {x}).status, fg::LookupStatus::Miss);
  add_entry(cache, x);
  auto y = at::randn({4});
  auto r = cache.call(sig_of(y), {y});
  ASSERT_EQ(r.status, fg::LookupStatus::Replayed);
  EXPECT_TRUE(at::equal(r.outputs[0].toTensor(), y * 2));
  EXPECT_EQ(r.copied, 1);
  EXPECT_EQ(cache.counters()->get(fg::Count::replays), 1);
  EXPECT_EQ(cache.call(sig_of(at::randn({5})), {at::randn({5})}).status, fg::LookupStatus::Miss);
}

TEST(GraphCache, FifoEvictsTheOldest) {
  fg::CacheOptions options;
  options.max_entries = 2;
  fg::GraphCache cache(options);
  auto a = add_entry(cache, at::randn({1}));
  auto b = add_entry(cache, at::randn({2}));
  cache.call(sig_of(at::randn({1})), {at::randn({1})});  // a hit does not matter for FIFO
  std::vector<uint64_t> evicted;
  auto c = add_entry(cache, at::randn({3}), 0, &evicted);
  EXPECT_EQ(evicted, std::vector<uint64_t>{a});
  EXPECT_EQ(cache.entry_ids(), (std::vector<uint64_t>{b, c}));
  EXPECT_EQ(cache.counters()->get(fg::Count::evictions), 1);
}

TEST(GraphCache, LruEvictsTheLeastRecentlyUsed) {
  fg::CacheOptions o;
  o.max_entries = 2;
  o.eviction = fg::Eviction::Lru;
  fg::GraphCache cache(o);
  auto a = add_entry(cache, at::randn({1}));
  auto b = add_entry(cache, at::randn({2}));
  cache.call(sig_of(at::randn({1})), {at::randn({1})});  // a is now the most recent
  std::vector<uint64_t> evicted;
  auto c = add_entry(cache, at::randn({3}), 0, &evicted);
  EXPECT_EQ(evicted, std::vector<uint64_t>{b});
  EXPECT_EQ(cache.entry_ids(), (std::vector<uint64_t>{a, c}));
}

TEST(GraphCache, MemoryBudgetEvictsUntilItFits) {
  fg::CacheOptions o;
  o.memory_budget = 250;
  fg::GraphCache cache(o);
  auto a = add_entry(cache, at::randn({1}), 100);
  auto b = add_entry(cache, at::randn({2}), 100);
  EXPECT_EQ(cache.memory_bytes(), 200);
  std::vector<uint64_t> evicted;
  auto c = add_entry(cache, at::randn({3}), 100, &evicted);
  EXPECT_EQ(evicted, std::vector<uint64_t>{a});
  EXPECT_EQ(cache.memory_bytes(), 200);
  // an entry larger than the whole budget evicts everything else but stays
  auto d = add_entry(cache, at::randn({4}), 1000, &evicted);
  EXPECT_EQ(evicted, (std::vector<uint64_t>{b, c}));
  EXPECT_EQ(cache.entry_ids(), std::vector<uint64_t>{d});
  EXPECT_EQ(cache.counters()->get(fg::Count::graph_memory_bytes), 1000);
  cache.clear();
  EXPECT_EQ(cache.memory_bytes(), 0);
  EXPECT_EQ(cache.counters()->get(fg::Count::graph_memory_bytes), 0);
}

// The caches of one Stats count into its counters: a replay, capture, eviction and memory are counted once,
// and each cache's memory budget is its own.
TEST(GraphCache, CachesShareTheirStatsCounters) {
  auto counters = std::make_shared<fg::Counters>();
  fg::CacheOptions o;
  o.memory_budget = 150;
  fg::GraphCache one(o, counters), two(o, counters);
  add_entry(one, at::randn({1}), 100);
  add_entry(two, at::randn({1}), 100);
  auto x = at::randn({1});
  EXPECT_EQ(one.call(sig_of(x), {x}).status, fg::LookupStatus::Replayed);
  EXPECT_EQ(two.call(sig_of(x), {x}).status, fg::LookupStatus::Replayed);
  EXPECT_EQ(counters->get(fg::Count::graphs_captured), 2);
  EXPECT_EQ(counters->get(fg::Count::replays), 2);
  EXPECT_EQ(counters->get(fg::Count::graph_memory_bytes), 200);
  add_entry(one, at::randn({2}), 100);  // over one's own budget: evicts one's first entry only
  EXPECT_EQ(counters->get(fg::Count::evictions), 1);
  EXPECT_EQ(counters->get(fg::Count::recaptures), 1);
  EXPECT_EQ(counters->get(fg::Count::graph_memory_bytes), 200);
  EXPECT_EQ(one.memory_bytes(), 100);
  one.record_failure(sig_of(at::randn({3})), "boom");
  EXPECT_EQ(one.call(sig_of(at::randn({3})), {at::randn({3})}).status, fg::LookupStatus::Failed);
  EXPECT_EQ(counters->get(fg::Count::eager_calls), 1);
  counters->add(fg::Seconds::capture_seconds, 0.25);
  counters->add(fg::Seconds::capture_seconds, 0.5);
  EXPECT_DOUBLE_EQ(counters->get(fg::Seconds::capture_seconds), 0.75);
}

TEST(GraphCounters, NamesAreTheStatsAttributes) {
  EXPECT_EQ(fg::Counters::count_names()[static_cast<int>(fg::Count::replays)], "replays");
  EXPECT_EQ(fg::Counters::count_names()[fg::kNumCounts - 1], "graph_memory_bytes");
  EXPECT_EQ(fg::Counters::seconds_names()[static_cast<int>(fg::Seconds::compile_seconds)], "compile_seconds");
}

TEST(GraphCache, CopyPlanSkipsTheStaticBuffer) {
  fg::CacheOptions o;
  o.safe_outputs = false;
  fg::GraphCache cache(o);
  auto x = at::randn({8});
  // lazy-capture style: the static buffer shares the caller's storage
  auto exe = std::make_shared<Doubler>(x, at::empty_like(x));
  cache.insert(sig_of(x), {x}, {x}, exe, 0, nullptr);
  auto r = cache.call(sig_of(x), {x});
  EXPECT_EQ(r.skipped, 1);
  EXPECT_EQ(r.copied, 0);
  // another tensor object on the same storage with the same strides is zero-copy too
  auto y = x.as_strided({8}, {1});
  EXPECT_EQ(cache.call(sig_of(y), {y}).skipped, 1);
  auto z = at::randn({16}).slice(0, 0, 16, 2);
  r = cache.call(sig_of(z), {z});
  EXPECT_EQ(r.copied, 1);
  EXPECT_TRUE(at::equal(r.outputs[0].toTensor(), z * 2));
  const fg::Counters& c = *cache.counters();
  EXPECT_EQ(c.get(fg::Count::inputs_skipped), 2);
  EXPECT_EQ(c.get(fg::Count::inputs_copied), 1);
}

TEST(GraphCache, SafeOutputsAreClones) {
  auto x = at::randn({4});
  for (bool safe : {true, false}) {
    fg::CacheOptions o;
    o.safe_outputs = safe;
    fg::GraphCache cache(o);
    auto out = at::empty_like(x);
    auto in = x.clone();
    cache.insert(sig_of(x), {in}, {in}, std::make_shared<Doubler>(in, out), 0, nullptr);
    auto r = cache.call(sig_of(x), {x});
    EXPECT_EQ(r.outputs[0].toTensor().is_same(out), !safe);
  }
}

TEST(GraphCache, RecaptureFalseNamesPositionAndBothSignatures) {
  fg::CacheOptions o;
  o.recapture = false;
  fg::GraphCache cache(o);
  add_entry(cache, at::randn({2, 3}));
  auto y = at::randn({2, 3}, at::kDouble);
  try {
    cache.call(sig_of(y), {y});
    FAIL() << "expected a mismatch error";
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("fusegraph: graph input mismatch at position 0: captured tensor(shape=[2, 3], dtype=Float"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("got tensor(shape=[2, 3], dtype=Double"), std::string::npos) << msg;
  }
}

// A graph captured without autograd is not the one for a call with grad mode on (and the reverse).
TEST(GraphCache, GradModeIsPartOfTheSignature) {
  auto x = at::randn({2, 3});
  fg::Signature off = sig_of(x);
  fg::Signature on;
  on.add_tensor(x);
  on.grad_mode = true;
  on.finish();
  EXPECT_FALSE(off == on);
  EXPECT_NE(on.describe().find("grad mode on"), std::string::npos) << on.describe();
  fg::GraphCache cache({});
  add_entry(cache, x);
  EXPECT_EQ(cache.call(off, {x}).status, fg::LookupStatus::Replayed);
  EXPECT_EQ(cache.call(on, {x}).status, fg::LookupStatus::Miss);
  fg::CacheOptions strict;
  strict.recapture = false;
  fg::GraphCache once(strict);
  add_entry(once, x);
  EXPECT_NE(once.mismatch_error(on).find("captured with grad mode off, called with it on"), std::string::npos)
      << once.mismatch_error(on);
}

TEST(GraphCache, FailedSignaturesAreRemembered) {
  fg::GraphCache cache({});
  auto x = at::randn({3});
  cache.record_failure(sig_of(x), "host sync during capture");
  auto r = cache.call(sig_of(x), {x});
  EXPECT_EQ(r.status, fg::LookupStatus::Failed);
  EXPECT_EQ(r.failure, "host sync during capture");
  EXPECT_EQ(cache.size(), 0u);
}

TEST(HostGraph, RunsOperatorsInACppLoop) {
  // y = relu(x * w + b); returns (y, the view x[0])
  at::Tensor w = at::randn({3}), b = at::randn({3});
  fg::HostGraph g(1);
  auto mul = fg::find_operator("aten::mul", "Tensor");
  auto add = fg::find_operator("aten::add", "Tensor");
  auto relu = fg::find_operator("aten::relu", "");
  auto ref = [](int32_t s) {
    fg::ArgTemplate a;
    a.kind = fg::ArgTemplate::Kind::Ref;
    a.ref = {s, -1};
    return a;
  };
  auto constant = [](c10::IValue v) {
    fg::ArgTemplate a;
    a.constant = std::move(v);
    return a;
  };
  int32_t m = g.add_node(mul, {ref(0), constant(w)});
  int32_t s = g.add_node(add, {ref(m), constant(b), constant(1)});
  int32_t r = g.add_node(relu, {ref(s)});
  g.hold_constant(w);
  g.hold_constant(b);
  g.set_outputs({ref(r)});
  g.finalize();
  EXPECT_EQ(g.num_instructions(), 3u);
  at::Tensor x = at::randn({2, 3});
  auto out = g.run({x});
  EXPECT_TRUE(at::equal(out[0].toTensor(), at::relu(x * w + b)));
  EXPECT_THROW(fg::find_operator("aten::no_such_op", ""), c10::Error);
}

}  // namespace
