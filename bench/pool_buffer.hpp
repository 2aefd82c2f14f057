// SPDX-License-Identifier: Apache-2.0
#pragma once
// A KV pool buffer for the kernel benchmarks (no kvpager headers needed).

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>

namespace kvbench {

/// A KV pool for the benchmarks: 2 MiB aligned and, when `huge`, advised to transparent huge pages
/// (madvise(MADV_HUGEPAGE)), as an engine allocates its pool; otherwise 4 KiB pages.
template <class T>
class pool_buffer {
 public:
  void assign(std::size_t n, T value, bool huge) {
    constexpr std::size_t align = std::size_t{2} << 20;
    const std::size_t bytes = (n * sizeof(T) + align - 1) / align * align;
    data_.reset(static_cast<T*>(std::aligned_alloc(align, bytes)));
    if (!data_) std::abort();
    if (huge) (void)madvise(data_.get(), bytes, MADV_HUGEPAGE);
    else (void)madvise(data_.get(), bytes, MADV_NOHUGEPAGE);
    n_ = n;
    std::fill(data_.get(), data_.get() + n, value);
  }
  T* data() { return data_.get(); }
  [[nodiscard]] std::size_t size() const { return n_; }
  T& operator[](std::size_t i) { return data_.get()[i]; }

 private:
  struct deleter {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, deleter> data_;
  std::size_t n_ = 0;
};

}  // namespace kvbench
