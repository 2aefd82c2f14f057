// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// sequence_table: the live sequences of a paged_kv_cache, by id. Dense handles (reused after a free, so a
/// sequence's vectors keep their capacity), an id_map from seq_id to handle, and ONE checked lookup that every
/// public operation goes through: it names the calling operation in its error and checks whether the sequence is
/// swapped out, so "unknown sequence" and "swapped out" read the same everywhere.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/id_map.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {


/// A string literal usable as a template argument: the name of a public operation, e.g. call_name{"fork"}.
template <std::size_t N>
struct call_name {
  char text[N]{};
  constexpr call_name(const char (&s)[N]) noexcept {  // NOLINT(google-explicit-constructor)
    std::copy_n(s, N, text);
  }
};

/// `Call` + `Suffix` as one null-terminated array in static storage (status messages point to static storage).
template <call_name Call, call_name Suffix>
struct joined {
  static constexpr std::size_t size = sizeof(Call.text) - 1 + sizeof(Suffix.text);
  static constexpr auto value = [] {
    std::array<char, size> out{};
    std::copy_n(Call.text, sizeof(Call.text) - 1, out.begin());
    std::copy_n(Suffix.text, sizeof(Suffix.text), out.begin() + (sizeof(Call.text) - 1));
    return out;
  }();
};


/// Where a looked-up sequence's blocks must be for the calling operation.
enum class residency : std::uint8_t {
  any,      ///< on device or swapped out
  device,   ///< not swapped out (errc::sequence_swapped otherwise)
  swapped,  ///< swapped out (errc::sequence_swapped otherwise)
};

/// A step number no step ever has (sequence_state::append_step when nothing is pending).
inline constexpr std::uint64_t no_step = ~std::uint64_t{0};

/// One live sequence. `Cursor` is the sharing policy's hash-chain position (an empty type without content caching).
template <class Cursor>
struct sequence_state {
  std::vector<block_id> blocks;   ///< device block ids, or host block ids while swapped
  std::vector<token_id> partial;  ///< token ids of the last, partly filled block (content caches only)
  seq_id id = 0;
  std::int32_t num_tokens = 0;
  std::int32_t priority = 0;
  std::uint64_t extra_key = 0;
  std::uint64_t append_step = no_step;  ///< step of the last append whose bytes are not written yet
  bool swapped = false;                 ///< blocks holds host block ids
  [[no_unique_address]] Cursor cursor{};  ///< hash chain after the last full block (content caches only)

  /// Back to the state of a fresh handle, keeping the vectors' capacity.
  void clear() noexcept {
    blocks.clear();
    partial.clear();
    cursor = Cursor{};
    num_tokens = 0;
    priority = 0;
    extra_key = 0;
    append_step = no_step;
    swapped = false;
  }
};

/// What sequence_table::checked found: a handle, or the error saying why there is none. Two words, so the lookup
/// on every per-token call costs no more than the handle itself.
class sequence_lookup {
 public:
  constexpr explicit sequence_lookup(std::int32_t handle) noexcept : handle_(handle) {}
  constexpr sequence_lookup(errc code, const char* message) noexcept : message_(message), code_(code) {}
  constexpr explicit operator bool() const noexcept { return message_ == nullptr; }
  /// The handle (precondition: found).
  [[nodiscard]] constexpr std::int32_t operator*() const noexcept { return handle_; }
  [[nodiscard]] constexpr errc code() const noexcept { return message_ == nullptr ? errc::ok : code_; }
  /// The error (an ok status when found).
  [[nodiscard]] constexpr status error() const noexcept {
    return message_ == nullptr ? ok_status() : status{code_, message_};
  }

 private:
  const char* message_ = nullptr;
  std::int32_t handle_ = -1;
  errc code_ = errc::ok;
};

/// Live sequences by id. Handles are dense int32 indices, stable while the sequence lives.
template <class Cursor>
class sequence_table {
 public:
  using state = sequence_state<Cursor>;

  /// Live sequences. O(1).
  [[nodiscard]] std::int32_t size() const noexcept { return index_.size(); }
  /// Whether `id` is live. O(1) expected.
  [[nodiscard]] bool contains(seq_id id) const noexcept { return index_.find(id) >= 0; }
  /// Handle of `id`, or -1. O(1) expected.
  [[nodiscard]] std::int32_t find(seq_id id) const noexcept { return index_.find(id); }

  /// The checked lookup: the handle of live sequence `id`, or errc::unknown_sequence ("<Call>: unknown sequence
  /// id"), or errc::sequence_swapped when the sequence is not where `where` asks. Changes nothing. O(1) expected.
  template <detail::call_name Call>
  [[nodiscard]] sequence_lookup checked(seq_id id, residency where = residency::device) const noexcept {
    const std::int32_t h = index_.find(id);
    if (h < 0) return {errc::unknown_sequence, detail::joined<Call, ": unknown sequence id">::value.data()};
    const bool swapped = seqs_[static_cast<std::size_t>(h)].swapped;
    if (where == residency::device && swapped)
      return {errc::sequence_swapped,
              detail::joined<Call, ": the sequence is swapped out; swap it in first">::value.data()};
    if (where == residency::swapped && !swapped)
      return {errc::sequence_swapped, detail::joined<Call, ": the sequence is not swapped out">::value.data()};
    return sequence_lookup{h};
  }

  /// checked() for each id of a group moved together (swap_out, swap_in), and each listed once
  /// (errc::invalid_argument); for residency::device also errc::pending_append if a sequence has appends of step
  /// `step` whose bytes are not in place yet. Changes nothing. O(group^2) for the duplicate check: groups are small.
  template <detail::call_name Call>
  [[nodiscard]] status checked_group(std::span<const seq_id> group, residency where,
                                     std::uint64_t step) const noexcept {
    for (std::size_t i = 0; i < group.size(); ++i) {
      const auto h = checked<Call>(group[i], where);
      if (!h) return h.error();
      for (std::size_t j = 0; j < i; ++j)
        if (group[j] == group[i])
          return status{errc::invalid_argument, detail::joined<Call, ": a sequence id is listed twice">::value.data()};
      if (where == residency::device && (*this)[*h].append_step == step)
        return status{errc::pending_append,
                      detail::joined<Call, ": the sequence's bytes for this step are not in place yet; call it "
                                           "after begin_step">::value.data()};
    }
    return ok_status();
  }

  [[nodiscard]] state& operator[](std::int32_t h) noexcept { return seqs_[static_cast<std::size_t>(h)]; }
  [[nodiscard]] const state& operator[](std::int32_t h) const noexcept { return seqs_[static_cast<std::size_t>(h)]; }
  /// The state of live sequence `id` (precondition: contains(id)).
  [[nodiscard]] state& at(seq_id id) noexcept { return (*this)[index_.find(id)]; }
  [[nodiscard]] const state& at(seq_id id) const noexcept { return (*this)[index_.find(id)]; }

  /// Adds `id` (precondition: not live) and returns its handle; the state is fresh (clear()). May reallocate the
  /// states: references from operator[] are invalidated, handles are not. Amortized O(1).
  std::int32_t insert(seq_id id) {
    const bool reuse = !free_handles_.empty();
    const std::int32_t h = reuse ? free_handles_.back() : static_cast<std::int32_t>(seqs_.size());
    if (!reuse) seqs_.emplace_back();
    index_.insert(id, h);
    if (reuse) free_handles_.pop_back();
    seqs_[static_cast<std::size_t>(h)].id = id;
    return h;
  }

  /// Removes live sequence `h`; its state is cleared and the handle reused by a later insert. O(1).
  void erase(std::int32_t h) {
    state& s = (*this)[h];
    index_.erase(s.id);
    s.clear();
    free_handles_.push_back(h);
  }

 private:
  std::vector<state> seqs_;
  std::vector<std::int32_t> free_handles_;
  id_map index_;
};

}  // namespace detail
KVPAGER_NAMESPACE_END
