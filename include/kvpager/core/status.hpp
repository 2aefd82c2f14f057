// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Error values. Running out of blocks is an ordinary outcome and bad input is reported, never thrown: every
/// fallible call returns a `status` or a `result<T>`, and a failed call leaves the object it was called on exactly
/// as it was (strong guarantee).

#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

#include "kvpager/core/assert.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

/// What went wrong. `out_of_blocks` is a normal capacity result; everything else is a caller error.
enum class errc : std::int32_t {
  ok = 0,
  out_of_blocks,       ///< not enough free blocks; nothing was allocated
  unknown_sequence,    ///< the sequence id was never added, or was already freed
  duplicate_sequence,  ///< the sequence id is already live
  invalid_argument,    ///< a count, size or length out of range (zero, negative, too large)
  invalid_block_size,  ///< block size is not a positive power of two
  invalid_pool_size,   ///< a pool of zero (usable) blocks, or a negative size
  invalid_block,       ///< a block id outside the pool, or not in the state the call needs
  double_free,         ///< releasing a block whose reference count is already zero
  buffer_too_small,    ///< a caller-provided export buffer cannot hold the output
  pending_append,      ///< the sequence has tokens appended in this step whose bytes are not written yet
  unsupported,         ///< the composed policies do not provide this operation
  host_pool_full,      ///< not enough free host (swap) blocks; nothing was swapped
  sequence_swapped,    ///< the sequence is swapped out to host memory (or, for swap_in, is not)
  out_of_memory,       ///< host memory for the library's own bookkeeping could not be allocated; nothing changed
  device_error,        ///< the device (CUDA runtime, driver or a launch) failed; the call may succeed when retried
  stale_prefix_hit,    ///< a prefix_hit from match_prefix no longer describes the cache (it changed since)
  transport_error,     ///< a KV transport failed: no peer at the address, a peer that is gone, a refused remote key
  timed_out,           ///< an operation did not finish within its deadline (a transfer, a connection)
};

/// Stable, human-readable name of an error code.
[[nodiscard]] constexpr const char* to_string(errc e) noexcept {
  switch (e) {
    case errc::ok: return "ok";
    case errc::out_of_blocks: return "out_of_blocks";
    case errc::unknown_sequence: return "unknown_sequence";
    case errc::duplicate_sequence: return "duplicate_sequence";
    case errc::invalid_argument: return "invalid_argument";
    case errc::invalid_block_size: return "invalid_block_size";
    case errc::invalid_pool_size: return "invalid_pool_size";
    case errc::invalid_block: return "invalid_block";
    case errc::double_free: return "double_free";
    case errc::buffer_too_small: return "buffer_too_small";
    case errc::pending_append: return "pending_append";
    case errc::unsupported: return "unsupported";
    case errc::host_pool_full: return "host_pool_full";
    case errc::sequence_swapped: return "sequence_swapped";
    case errc::out_of_memory: return "out_of_memory";
    case errc::device_error: return "device_error";
    case errc::stale_prefix_hit: return "stale_prefix_hit";
    case errc::transport_error: return "transport_error";
    case errc::timed_out: return "timed_out";
  }
  return "unknown_error";
}

/// Outcome of a call: a code, a static message naming the call and the problem, and one integer of context
/// (the offending value, or for out_of_blocks the number of blocks that were needed). Trivially copyable.
class [[nodiscard]] status {
 public:
  constexpr status() noexcept = default;
  constexpr status(errc code, const char* message, std::int64_t detail = 0) noexcept
      : code_(code), message_(message), detail_(detail) {}

  [[nodiscard]] constexpr bool ok() const noexcept { return code_ == errc::ok; }
  constexpr explicit operator bool() const noexcept { return ok(); }
  [[nodiscard]] constexpr errc code() const noexcept { return code_; }
  /// "call: what is wrong"; "ok" on success. Points to static storage.
  [[nodiscard]] constexpr const char* message() const noexcept { return message_; }
  [[nodiscard]] constexpr std::int64_t detail() const noexcept { return detail_; }

  friend constexpr bool operator==(const status& s, errc e) noexcept { return s.code_ == e; }

 private:
  errc code_ = errc::ok;
  const char* message_ = "ok";
  std::int64_t detail_ = 0;
};

/// Success.
[[nodiscard]] constexpr status ok_status() noexcept { return status{}; }

/// A value or the status explaining why there is none. Never throws; reading the value of a failed result is an
/// invariant violation (KVPAGER_ASSERT).
template <class T>
class [[nodiscard]] result {
  static_assert(!std::is_reference_v<T>, "result<T&> is not supported; use result<T*> or a span");

 public:
  /// A failed result; `s` must not be ok.
  constexpr result(status s) noexcept : status_(s) {  // NOLINT(google-explicit-constructor)
    KVPAGER_ASSERT(!s.ok(), "result constructed from an ok status without a value");
  }
  constexpr result(errc code, const char* message, std::int64_t detail = 0) noexcept
      : result(status{code, message, detail}) {}
  /// A successful result holding `value`.
  constexpr result(T value) noexcept(std::is_nothrow_move_constructible_v<T>)  // NOLINT
      : value_(std::move(value)) {}

  [[nodiscard]] constexpr bool ok() const noexcept { return value_.has_value(); }
  [[nodiscard]] constexpr bool has_value() const noexcept { return value_.has_value(); }
  constexpr explicit operator bool() const noexcept { return value_.has_value(); }
  [[nodiscard]] constexpr status error() const noexcept { return status_; }
  [[nodiscard]] constexpr errc code() const noexcept { return status_.code(); }

  [[nodiscard]] T& value() & noexcept {
    KVPAGER_ASSERT(ok(), "result::value() on a failed result");
    return *value_;
  }
  [[nodiscard]] const T& value() const& noexcept {
    KVPAGER_ASSERT(ok(), "result::value() on a failed result");
    return *value_;
  }
  /// On an rvalue (a result returned by a call) the value is moved out and returned by value, so
  /// `for (auto b : *cache.block_table(id))` and `auto&& v = make().value()` never refer into the destroyed
  /// temporary.
  [[nodiscard]] T value() && noexcept(std::is_nothrow_move_constructible_v<T>) {
    KVPAGER_ASSERT(ok(), "result::value() on a failed result");
    return std::move(*value_);
  }
  /// A const rvalue cannot be moved from: the value is copied out.
  [[nodiscard]] T value() const&& noexcept(std::is_nothrow_copy_constructible_v<T>) {
    KVPAGER_ASSERT(ok(), "result::value() on a failed result");
    return *value_;
  }
  T& operator*() & noexcept { return value(); }
  const T& operator*() const& noexcept { return value(); }
  /// By value on rvalues, as value() &&.
  T operator*() && noexcept(std::is_nothrow_move_constructible_v<T>) { return std::move(*this).value(); }
  T operator*() const&& noexcept(std::is_nothrow_copy_constructible_v<T>) { return std::move(*this).value(); }
  /// Member access. On an rvalue the pointer is valid until the end of the full expression, as for any
  /// temporary: `make()->size()` is fine; keep a reference to a member only of a named result.
  T* operator->() noexcept { return &value(); }
  const T* operator->() const noexcept { return &value(); }

 private:
  status status_{};
  std::optional<T> value_;
};

KVPAGER_NAMESPACE_END
