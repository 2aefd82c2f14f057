// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// detail::chunk_array: fixed-length arrays ("chunks") of T allocated one at a time without throwing, up to a
/// limit set at reset(); the table of chunks is reserved up front, so growing never reallocates it and an element's
/// address never changes. prefix_caching keeps its content entries in one. Each chunk is owned by a move-only handle
/// of its own (not std::unique_ptr: <memory> costs every consumer of the cache ~1 G instructions to compile with
/// g++ 12, bench/RESULTS.md "Compile cost").

#include <algorithm>
#include <cstddef>
#include <new>
#include <utility>
#include <vector>

#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

namespace detail {
/// Copies are deep.
template <class T>
class chunk_array {
  /// One chunk, freed with delete[].
  class owned {
   public:
    owned() = default;
    explicit owned(T* p) noexcept : p_(p) {}
    owned(owned&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
    owned& operator=(owned&& o) noexcept {
      if (this != &o) {
        delete[] p_;
        p_ = std::exchange(o.p_, nullptr);
      }
      return *this;
    }
    owned(const owned&) = delete;
    owned& operator=(const owned&) = delete;
    ~owned() { delete[] p_; }
    [[nodiscard]] T* get() const noexcept { return p_; }

   private:
    T* p_ = nullptr;
  };

 public:
  chunk_array() = default;
  chunk_array(const chunk_array& o) : chunk_len_(o.chunk_len_), max_chunks_(o.max_chunks_) {
    chunks_.reserve(max_chunks_);
    for (const auto& c : o.chunks_) {
      chunks_.emplace_back(new T[chunk_len_]);  // default-initialized, as make_unique_for_overwrite
      std::copy_n(c.get(), chunk_len_, chunks_.back().get());
    }
  }
  chunk_array(chunk_array&&) noexcept = default;
  chunk_array& operator=(const chunk_array& o) {
    if (this != &o) *this = chunk_array(o);
    return *this;
  }
  chunk_array& operator=(chunk_array&&) noexcept = default;
  ~chunk_array() = default;

  /// Frees every chunk; later chunks hold `chunk_len` elements, at most `max_chunks` of them. Allocates the table.
  void reset(std::size_t chunk_len, std::size_t max_chunks) {
    chunks_.clear();
    chunks_.shrink_to_fit();
    chunks_.reserve(max_chunks);
    chunk_len_ = chunk_len;
    max_chunks_ = max_chunks;
  }
  /// Appends one chunk (default-initialized elements); false if the limit is reached or memory is short.
  [[nodiscard]] bool grow() noexcept {
    if (chunks_.size() >= max_chunks_) return false;
    T* p = new (std::nothrow) T[chunk_len_];
    if (p == nullptr) return false;
    chunks_.emplace_back(p);  // capacity reserved: does not allocate
    return true;
  }
  [[nodiscard]] std::size_t num_chunks() const noexcept { return chunks_.size(); }
  [[nodiscard]] T* chunk(std::size_t i) const noexcept { return chunks_[i].get(); }
  /// Bytes held: the chunks and the table.
  [[nodiscard]] std::size_t bytes() const noexcept {
    return chunks_.size() * chunk_len_ * sizeof(T) + chunks_.capacity() * sizeof(owned);
  }

 private:
  std::vector<owned> chunks_;
  std::size_t chunk_len_ = 0;
  std::size_t max_chunks_ = 0;
};
}  // namespace detail

KVPAGER_NAMESPACE_END
