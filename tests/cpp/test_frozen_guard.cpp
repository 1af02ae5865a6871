// FrozenGuard: identity, version counter and storage of each folded parameter, checked per call.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "graph/frozen_guard.h"

namespace {

namespace fg = fusegraph::graph;

TEST(FrozenGuard, SameTensorsMatch) {
  at::Tensor a = at::randn({4}), b = at::randn({2, 3}), x = at::randn({5});
  fg::FrozenGuard guard({0, 2}, {a, b});
  EXPECT_EQ(guard.check({&a, &x, &b}), fg::FrozenMatch::kSame);
}

TEST(FrozenGuard, OtherTensorIsOther) {
  at::Tensor a = at::randn({4}), a2 = a.clone(), x = at::randn({5});
  fg::FrozenGuard guard({0}, {a});
  EXPECT_EQ(guard.check({&a2, &x}), fg::FrozenMatch::kOther);
  // a view of the same storage is another tensor too (another impl)
  at::Tensor view = a.view({4});
  EXPECT_EQ(guard.check({&view}), fg::FrozenMatch::kOther);
  EXPECT_EQ(guard.check({nullptr}), fg::FrozenMatch::kOther);
  EXPECT_EQ(guard.check({}), fg::FrozenMatch::kOther);
}

TEST(FrozenGuard, InPlaceWriteIsChanged) {
  at::Tensor a = at::randn({4});
  fg::FrozenGuard guard({0}, {a});
  a.add_(1);
  EXPECT_EQ(guard.check({&a}), fg::FrozenMatch::kChanged);
}

TEST(FrozenGuard, NewStorageIsChanged) {
  at::Tensor a = at::randn({4});
  fg::FrozenGuard guard({0}, {a});
  a.set_(at::randn({4}));  // what Python's `p.data = other` does underneath: same tensor, other storage
  EXPECT_EQ(guard.check({&a}), fg::FrozenMatch::kChanged);
}

TEST(FrozenGuard, OtherWinsOverChanged) {
  at::Tensor a = at::randn({4}), b = at::randn({4}), b2 = at::randn({4});
  fg::FrozenGuard guard({0, 1}, {a, b});
  a.add_(1);
  EXPECT_EQ(guard.check({&a, &b2}), fg::FrozenMatch::kOther);
}

TEST(FrozenGuard, MismatchedLengthsAreRejected) {
  EXPECT_THROW(fg::FrozenGuard({0, 1}, {at::randn({1})}), c10::Error);
}

}  // namespace
