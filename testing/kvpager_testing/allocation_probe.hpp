// SPDX-License-Identifier: Apache-2.0
#pragma once
// Replaces the global operator new and delete of the test executable that includes this header (include it in
// exactly one source file of that executable). Every allocation is counted (`probe::allocations`), live bytes are
// tracked (`probe::live_bytes`), and allocations can be made to fail on demand (`probe::fail_after`,
// `probe::fail_at_least`, reset by a `probe::failure_scope`): the tests that prove a path allocates nothing, or
// survives an allocation failure, share this one replacement.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "kvpager/core/config.hpp"

// The replaced operators are malloc/free underneath; GCC, seeing both after inlining, would call each
// delete-of-new a mismatch.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace probe {
inline std::atomic<std::int64_t> allocations{0};         ///< successful allocations so far
inline std::atomic<std::int64_t> live_bytes{0};          ///< bytes allocated and not yet freed
inline std::atomic<std::int64_t> fail_after{-1};         ///< allocations left before one fails; -1 = never
inline std::atomic<std::size_t> fail_at_least{SIZE_MAX};  ///< allocations of at least this many bytes fail

inline constexpr std::size_t header = 16;  // the size, kept in front of the block; keeps max_align_t alignment

inline void* allocate(std::size_t n) noexcept {
  if (n >= fail_at_least.load()) return nullptr;
  if (fail_after.load() >= 0 && fail_after.fetch_sub(1) == 0) return nullptr;
  if (n > SIZE_MAX - header) return nullptr;
  void* p = std::malloc(n + header);
  if (p == nullptr) return nullptr;
  *static_cast<std::size_t*>(p) = n;
  live_bytes += static_cast<std::int64_t>(n);
  allocations.fetch_add(1, std::memory_order_relaxed);
  return static_cast<char*>(p) + header;
}
inline void release(void* p) noexcept {
  if (p == nullptr) return;
  char* base = static_cast<char*>(p) - header;
  live_bytes -= static_cast<std::int64_t>(*reinterpret_cast<std::size_t*>(base));
  std::free(base);
}
inline void* allocate_or_throw(std::size_t n) {
  if (void* p = allocate(n)) return p;
#if KVPAGER_HAS_EXCEPTIONS
  throw std::bad_alloc();
#else
  std::abort();
#endif
}

/// Stops injected failures when it goes out of scope.
struct failure_scope {
  failure_scope() = default;
  failure_scope(const failure_scope&) = delete;
  failure_scope& operator=(const failure_scope&) = delete;
  ~failure_scope() {
    fail_after = -1;
    fail_at_least = SIZE_MAX;
  }
};
}  // namespace probe

void* operator new(std::size_t n) { return probe::allocate_or_throw(n); }
void* operator new[](std::size_t n) { return probe::allocate_or_throw(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return probe::allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return probe::allocate(n); }
void operator delete(void* p) noexcept { probe::release(p); }
void operator delete[](void* p) noexcept { probe::release(p); }
void operator delete(void* p, std::size_t) noexcept { probe::release(p); }
void operator delete[](void* p, std::size_t) noexcept { probe::release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { probe::release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { probe::release(p); }
