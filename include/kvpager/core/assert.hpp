// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// KVPAGER_ASSERT: checks of internal invariants (never of user input, which gets an error value instead).
/// A broken invariant calls the installed handler; the default prints the failed expression and aborts.
/// Replace it with set_assert_handler (for example to throw, log, or record in a test).

#include <cstdio>
#include <cstdlib>

#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Called with the failed expression, a message, and the source location. If it returns, execution continues
/// past the broken invariant and the library's behaviour is unspecified.
using assert_handler = void (*)(const char* expr, const char* message, const char* file, int line);

/// The handler used until set_assert_handler installs another: prints to stderr and calls std::abort().
inline void default_assert_handler(const char* expr, const char* message, const char* file, int line) noexcept {
  std::fprintf(stderr, "kvpager: internal invariant violated: %s (%s) at %s:%d\n", expr, message, file, line);
  std::abort();
}

namespace detail {
// The slot is read and written with the compiler's atomic builtins (GCC, Clang), not std::atomic: libstdc++'s C++20
// <atomic> costs every consumer of the core ~0.65 G instructions to compile (bench/RESULTS.md, "Compile cost").
inline assert_handler& assert_handler_slot() noexcept {
  static assert_handler slot = &default_assert_handler;
  return slot;
}
[[gnu::cold, gnu::noinline]] inline void assert_fail(const char* expr, const char* message, const char* file,
                                                     int line) {
  __atomic_load_n(&assert_handler_slot(), __ATOMIC_ACQUIRE)(expr, message, file, line);
}
}  // namespace detail

/// Installs `handler` (nullptr restores the default) and returns the previous one. Thread-safe.
inline assert_handler set_assert_handler(assert_handler handler) noexcept {
  return __atomic_exchange_n(&detail::assert_handler_slot(), handler != nullptr ? handler : &default_assert_handler,
                             __ATOMIC_ACQ_REL);
}

/// The handler currently installed.
[[nodiscard]] inline assert_handler get_assert_handler() noexcept {
  return __atomic_load_n(&detail::assert_handler_slot(), __ATOMIC_ACQUIRE);
}

KVPAGER_NAMESPACE_END

#if KVPAGER_ENABLE_ASSERTS
#define KVPAGER_ASSERT(cond, message) \
  (KVPAGER_LIKELY(cond) ? void(0) : ::kvpager::detail::assert_fail(#cond, message, __FILE__, __LINE__))
#else
#define KVPAGER_ASSERT(cond, message) void(0)
#endif
