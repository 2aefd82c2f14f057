// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// id_map: open-addressing hash map from 64-bit sequence ids to dense int32 handles. Linear probing with
/// backward-shift deletion (no tombstones), power-of-two table at most half full. Lookups and erases never
/// allocate; an insert allocates only when the table doubles (amortized O(1)).

#include <cstdint>
#include <vector>

#include "kvpager/core/assert.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

class id_map {
 public:
  id_map() { rehash(16); }

  [[nodiscard]] std::int32_t size() const noexcept { return size_; }

  /// The handle stored for `key`, or -1.
  [[nodiscard]] std::int32_t find(std::uint64_t key) const noexcept {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      const entry& e = slots_[i];
      if (e.value < 0) return -1;
      if (e.key == key) return e.value;
    }
  }

  /// Inserts key -> value (value >= 0); the key must not be present.
  void insert(std::uint64_t key, std::int32_t value) {
    KVPAGER_ASSERT(value >= 0, "id_map values must be non-negative");
    if (static_cast<std::size_t>(size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    place(key, value);
    ++size_;
  }

  /// Sizes the table so that `n` keys fit without another allocation (the next inserts up to n never allocate).
  void reserve(std::int32_t n) {
    std::size_t want = slots_.size();
    while (static_cast<std::size_t>(n) * 2 > want) want *= 2;
    if (want != slots_.size()) rehash(want);
  }

  /// Removes `key` if present; returns whether it was.
  bool erase(std::uint64_t key) noexcept {
    std::size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].value < 0) return false;
      if (slots_[i].key == key) break;
    }
    // Backward-shift: pull later entries of the probe run into the hole when their home allows it.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; slots_[j].value >= 0; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].key);
      // Entry j may move to `hole` iff its home is not in the cyclic range (hole, j].
      const bool home_in_range = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
      if (!home_in_range) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = entry{};
    --size_;
    return true;
  }

 private:
  struct entry {
    std::uint64_t key = 0;
    std::int32_t value = -1;
  };

  [[nodiscard]] std::size_t home(std::uint64_t key) const noexcept {
    // Fibonacci hashing of a murmur-style finalizer: consecutive ids spread over the table.
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return static_cast<std::size_t>(key * 0x9E3779B97F4A7C15ULL >> 20) & mask_;
  }

  void place(std::uint64_t key, std::int32_t value) noexcept {
    std::size_t i = home(key);
    while (slots_[i].value >= 0) {
      KVPAGER_ASSERT(slots_[i].key != key, "id_map::insert of a key that is already present");
      i = (i + 1) & mask_;
    }
    slots_[i] = entry{key, value};
  }

  void rehash(std::size_t new_size) {
    std::vector<entry> old;
    old.swap(slots_);
    slots_.assign(new_size, entry{});
    mask_ = new_size - 1;
    for (const entry& e : old)
      if (e.value >= 0) place(e.key, e.value);
  }

  std::vector<entry> slots_;
  std::size_t mask_ = 0;
  std::int32_t size_ = 0;
};

KVPAGER_NAMESPACE_END
