// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers shared by the benchmarks: a failed call aborts the benchmark run (it would measure nothing).

#include <kvpager/kvpager.hpp>

#include <cstdlib>
#include <utility>

namespace kvbench {

template <class T>
T must(kvpager::result<T> r) {
  if (!r) std::abort();
  return std::move(*r);
}
inline void must(kvpager::status s) {
  if (!s) std::abort();
}

}  // namespace kvbench
