// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// detail::span_of(v): a span over a vector's elements, made from data() and size(). A span converted from the vector
/// itself goes through std::span's range constructor, whose constraints instantiate std::ranges' begin, end, size
/// and data machinery for the vector's type (about 0.2 G compiler instructions the first time in a translation
/// unit, 0.07 G for each further element type, with g++ 12). In a header's non-dependent code (a non-template
/// function, or a call in a template that names none of its parameters) that happens in every translation unit that
/// includes it, used or not; the cache, serving and kernel headers convert through span_of there (bench/RESULTS.md,
/// issue 22; layering.umbrellas_convert_no_vector_to_a_span_for_every_unit keeps it so).

#include <span>
#include <vector>

#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

template <class T, class Alloc>
[[nodiscard]] constexpr std::span<T> span_of(std::vector<T, Alloc>& v) noexcept {
  return {v.data(), v.size()};
}
template <class T, class Alloc>
[[nodiscard]] constexpr std::span<const T> span_of(const std::vector<T, Alloc>& v) noexcept {
  return {v.data(), v.size()};
}

}  // namespace detail
KVPAGER_NAMESPACE_END
