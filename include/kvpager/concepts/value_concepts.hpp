// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The value requirements the policy concepts put on a policy type (default-constructible, movable, copyable,
/// regular), stated with the type traits instead of the standard library's concepts. `std::movable` and
/// `std::copyable` also require `std::swappable`, whose check instantiates `std::ranges::swap`'s machinery for every
/// type checked; the cache never swaps a policy (it moves or copies it), and these checks run in every translation
/// unit that names a composition: the trait forms cost a translation unit that includes `kvpager/cache.hpp` 0.17 G
/// fewer compiler instructions (bench/RESULTS.md, issue 22).

#include <concepts>
#include <type_traits>

#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

/// Constructible without arguments.
template <class T>
concept default_value = std::is_object_v<T> && std::is_default_constructible_v<T> && std::is_destructible_v<T>;
/// Move-constructible and move-assignable (std::movable without std::swappable).
template <class T>
concept movable_value = std::is_object_v<T> && std::is_move_constructible_v<T> && std::is_move_assignable_v<T>;
/// Copy-constructible and copy-assignable as well (std::copyable without std::swappable).
template <class T>
concept copyable_value = movable_value<T> && std::is_copy_constructible_v<T> && std::is_copy_assignable_v<T>;
/// Copyable, default-constructible and equality-comparable (std::regular without std::swappable).
template <class T>
concept regular_value = copyable_value<T> && default_value<T> && requires(const T& a, const T& b) {
  { a == b } -> std::convertible_to<bool>;
  { a != b } -> std::convertible_to<bool>;
};

}  // namespace detail
KVPAGER_NAMESPACE_END
