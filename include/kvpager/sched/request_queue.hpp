// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// request_queue: the scheduler's waiting and swapped queues, a ring of request ids. Pushing and popping at both
/// ends is O(1) and allocates only when the queue outgrows every size it had before (std::deque allocates and
/// frees a chunk whenever its ends cross one), so a scheduler step in steady state allocates nothing.

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// A double-ended queue of request ids over one growable ring buffer.
class request_queue {
 public:
  /// Read-only iterator, front to back.
  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = seq_id;
    using difference_type = std::ptrdiff_t;
    using pointer = const seq_id*;
    using reference = const seq_id&;

    const_iterator() = default;
    reference operator*() const noexcept { return (*q_)[i_]; }
    const_iterator& operator++() noexcept {
      ++i_;
      return *this;
    }
    const_iterator operator++(int) noexcept {
      const_iterator old = *this;
      ++i_;
      return old;
    }
    friend bool operator==(const const_iterator& a, const const_iterator& b) noexcept { return a.i_ == b.i_; }

   private:
    friend class request_queue;
    const_iterator(const request_queue* q, std::size_t i) noexcept : q_(q), i_(i) {}
    const request_queue* q_ = nullptr;
    std::size_t i_ = 0;
  };

  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// The i-th id from the front (i < size()).
  [[nodiscard]] const seq_id& operator[](std::size_t i) const noexcept { return buf_[slot(i)]; }
  [[nodiscard]] seq_id front() const noexcept { return buf_[head_]; }
  [[nodiscard]] const_iterator begin() const noexcept { return {this, 0}; }
  [[nodiscard]] const_iterator end() const noexcept { return {this, size_}; }

  void push_back(seq_id id) {
    grow_if_full();
    buf_[slot(size_)] = id;
    ++size_;
  }
  void push_front(seq_id id) {
    grow_if_full();
    head_ = (head_ + buf_.size() - 1) & (buf_.size() - 1);
    buf_[head_] = id;
    ++size_;
  }
  void pop_front() noexcept {
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
  }
  /// Removes the first occurrence of `id`; O(size). Returns whether it was there.
  bool erase(seq_id id) noexcept {
    std::size_t i = 0;
    while (i < size_ && (*this)[i] != id) ++i;
    if (i == size_) return false;
    for (; i + 1 < size_; ++i) buf_[slot(i)] = buf_[slot(i + 1)];
    --size_;
    return true;
  }
  /// Copies the queue, front first, into `out` (whose capacity is reused).
  void copy_to(std::vector<seq_id>& out) const {
    out.resize(size_);
    for (std::size_t i = 0; i < size_; ++i) out[i] = (*this)[i];
  }
  /// Replaces the contents with `ids`, front first (ids.size() must equal size()).
  void assign_same_size(const std::vector<seq_id>& ids) noexcept {
    for (std::size_t i = 0; i < size_; ++i) buf_[slot(i)] = ids[i];
  }

 private:
  [[nodiscard]] std::size_t slot(std::size_t i) const noexcept { return (head_ + i) & (buf_.size() - 1); }

  /// Doubles the ring (a power of two) when it is full, moving the ids to the front of the new buffer.
  void grow_if_full() {
    if (size_ < buf_.size()) return;
    std::vector<seq_id> bigger(buf_.empty() ? 16 : buf_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) bigger[i] = (*this)[i];
    buf_.swap(bigger);
    head_ = 0;
  }

  std::vector<seq_id> buf_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

KVPAGER_NAMESPACE_END
