// SPDX-License-Identifier: Apache-2.0
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace kvpager;

TEST(Status, DefaultIsOk) {
  const status s;
  EXPECT_TRUE(s.ok());
  EXPECT_TRUE(static_cast<bool>(s));
  EXPECT_EQ(s.code(), errc::ok);
  EXPECT_STREQ(s.message(), "ok");
}

TEST(Status, CarriesCodeMessageAndDetail) {
  const status s{errc::out_of_blocks, "x: not enough", 42};
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s == errc::out_of_blocks);
  EXPECT_STREQ(s.message(), "x: not enough");
  EXPECT_EQ(s.detail(), 42);
}

TEST(Status, EveryCodeHasADistinctName) {
  std::vector<std::string> names;
  for (int i = 0; i <= static_cast<int>(errc::timed_out); ++i) names.emplace_back(to_string(static_cast<errc>(i)));
  for (std::size_t i = 0; i < names.size(); ++i)
    for (std::size_t j = i + 1; j < names.size(); ++j) EXPECT_NE(names[i], names[j]);
  EXPECT_EQ(names[1], "out_of_blocks");
  EXPECT_STREQ(to_string(static_cast<errc>(999)), "unknown_error");
}

TEST(Result, HoldsValueOrError) {
  result<int> good = 5;
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 5);
  result<int> bad = status{errc::invalid_argument, "nope"};
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), errc::invalid_argument);
  EXPECT_STREQ(bad.error().message(), "nope");
}

TEST(Result, Assignment) {
  result<std::vector<int>> r = std::vector<int>{1, 2};
  r = status{errc::out_of_blocks, "x"};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.code(), errc::out_of_blocks);
  r = std::vector<int>{3};
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 1U);
  const result<std::vector<int>> copy = r;
  result<std::vector<int>> other = status{errc::invalid_argument, "y"};
  other = copy;
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)[0], 3);
}

TEST(Result, MoveOnlyValues) {
  result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  result<std::unique_ptr<int>> moved = std::move(r);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(**moved, 7);
  std::unique_ptr<int> out = std::move(moved).value();
  EXPECT_EQ(*out, 7);
}

namespace {
int g_failures = 0;
const char* g_last_message = nullptr;
void recording_handler(const char* /*expr*/, const char* message, const char* /*file*/, int /*line*/) {
  ++g_failures;
  g_last_message = message;
}
}  // namespace

TEST(Assert, HandlerIsReplaceable) {
  g_failures = 0;
  const assert_handler previous = set_assert_handler(&recording_handler);
  EXPECT_EQ(get_assert_handler(), &recording_handler);
  KVPAGER_ASSERT(1 + 1 == 2, "holds");
  EXPECT_EQ(g_failures, 0);
  KVPAGER_ASSERT(1 + 1 == 3, "arithmetic broke");
  EXPECT_EQ(g_failures, 1);
  EXPECT_STREQ(g_last_message, "arithmetic broke");
  // A library invariant: reading the value of a failed result.
  result<int> bad = status{errc::invalid_argument, "nope"};
  (void)bad.value();
  EXPECT_EQ(g_failures, 2);
  set_assert_handler(previous);
  EXPECT_EQ(get_assert_handler(), previous);
  set_assert_handler(nullptr);
  EXPECT_EQ(get_assert_handler(), &default_assert_handler);
}

TEST(AssertDeathTest, DefaultHandlerAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(KVPAGER_ASSERT(false, "boom"), "internal invariant violated.*boom");
}

TEST(Version, MacrosAgree) {
  EXPECT_EQ(KVPAGER_VERSION, KVPAGER_VERSION_MAJOR * 10000 + KVPAGER_VERSION_MINOR * 100 + KVPAGER_VERSION_PATCH);
}

// Rvalue access returns the value, not a reference into the temporary result: `*make()` and `make().value()` are
// prvalues, so a range-for over them extends their lifetime instead of iterating freed memory.
static_assert(std::is_same_v<decltype(*std::declval<result<std::vector<int>>>()), std::vector<int>>);
static_assert(std::is_same_v<decltype(std::declval<result<std::vector<int>>>().value()), std::vector<int>>);
static_assert(std::is_same_v<decltype(*std::declval<const result<std::vector<int>>>()), std::vector<int>>);
static_assert(std::is_same_v<decltype(std::declval<const result<std::vector<int>>>().value()), std::vector<int>>);
// Lvalue access still refers into the named result.
static_assert(std::is_same_v<decltype(*std::declval<result<std::vector<int>>&>()), std::vector<int>&>);
static_assert(std::is_same_v<decltype(*std::declval<const result<std::vector<int>>&>()), const std::vector<int>&>);
static_assert(std::is_same_v<decltype(std::declval<result<std::vector<int>>&>().value()), std::vector<int>&>);
static_assert(noexcept(*std::declval<result<std::vector<int>>>()));

namespace {
result<std::vector<int>> make_numbers(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(i * 10);
  return v;
}
}  // namespace

TEST(Result, RvalueAccessReturnsByValue) {
  // Before the fix this read a destroyed vector's heap buffer (an ASan heap-use-after-free in the sanitizer build).
  int sum = 0;
  int count = 0;
  for (int x : *make_numbers(64)) {
    sum += x;
    ++count;
  }
  EXPECT_EQ(count, 64);
  EXPECT_EQ(sum, 10 * 63 * 64 / 2);
  for (int x : make_numbers(3).value()) EXPECT_EQ(x % 10, 0);
  auto&& held = *make_numbers(5);  // a prvalue bound to a reference: extended to the reference's scope
  ASSERT_EQ(held.size(), 5U);
  EXPECT_EQ(held[4], 40);
}

TEST(Result, RvalueAccessMovesTheValueOut) {
  result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  std::unique_ptr<int> p = *std::move(r);  // move-only types come out by value too
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 7);
  EXPECT_EQ(*r, nullptr);  // moved from: the result still holds a (moved-from) value
}
