// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// group_kind_variant<Ks...>: one group kind chosen at run time among the compile-time kinds Ks (a std::variant of
/// them). It is itself a group_kind, so a cache whose groups come from a model's config or a trace header (known only
/// at run time) is still composed at compile time: hybrid_kv_cache<any_group_kind> holds full, sliding-window and
/// chunked-local groups; a kind of one's own joins by naming it, `group_kind_variant<full_attention, my_kind>`. Each
/// call dispatches on the variant's index (a jump table, no allocation, no virtual call).

#include <cstdint>
#include <type_traits>
#include <variant>

#include "kvpager/concepts/group_kind.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/groups/group_kinds.hpp"

KVPAGER_NAMESPACE_BEGIN

template <group_kind... Ks>
  requires(sizeof...(Ks) >= 1)
class group_kind_variant {
 public:
  static constexpr const char* kind_name = "variant";

  /// The first kind, default-constructed.
  group_kind_variant() = default;
  /// Holds `k` (one of Ks).
  template <class K>
    requires(std::is_same_v<std::remove_cvref_t<K>, Ks> || ...)
  constexpr group_kind_variant(K&& k) noexcept  // NOLINT(google-explicit-constructor): a kind is its variant
      : v_(std::forward<K>(k)) {}

  [[nodiscard]] constexpr std::int64_t skipped_tokens(std::int64_t computed) const noexcept {
    return visit([computed](const auto& k) noexcept { return k.skipped_tokens(computed); });
  }
  [[nodiscard]] constexpr status validate() const noexcept {
    return visit([](const auto& k) noexcept { return k.validate(); });
  }
  /// The held kind's kind_name.
  [[nodiscard]] constexpr const char* name() const noexcept {
    return visit([](const auto& k) noexcept -> const char* { return std::remove_cvref_t<decltype(k)>::kind_name; });
  }
  /// The held kind if it is a K, else nullptr.
  template <class K>
  [[nodiscard]] constexpr const K* get_if() const noexcept {
    return std::get_if<K>(&v_);
  }
  /// f(held kind): the variant's dispatch, for code that treats some kinds specially.
  template <class F>
  constexpr decltype(auto) visit(F&& f) const noexcept {
    return visit_at<0>(f);
  }

  friend constexpr bool operator==(const group_kind_variant&, const group_kind_variant&) = default;

 private:
  // A chain of index tests instead of std::visit: noexcept (std::visit may throw bad_variant_access) and no
  // function-pointer table for the optimizer to see through.
  template <std::size_t I, class F>
  constexpr decltype(auto) visit_at(F& f) const noexcept {
    if constexpr (I + 1 == sizeof...(Ks)) {
      return f(*std::get_if<I>(&v_));
    } else {
      if (v_.index() == I) return f(*std::get_if<I>(&v_));
      return visit_at<I + 1>(f);
    }
  }

  std::variant<Ks...> v_;
};

/// The shipped kinds, chosen at run time: what kvpager-replay and kvpager-generate build from a trace or a config.
using any_group_kind = group_kind_variant<full_attention, sliding_window, chunked_local>;

static_assert(group_kind<any_group_kind>);

/// The group kind of a layer kind (`size`: the window or chunk in tokens, unused for full attention), as sizing and
/// a model's config describe layers. The kind validates `size` (below 1 is refused by validate()).
[[nodiscard]] constexpr any_group_kind to_group_kind(layer_attention kind, std::int64_t size) noexcept {
  switch (kind) {
    case layer_attention::sliding_window:
      return sliding_window{size};
    case layer_attention::chunked_local:
      return chunked_local{size};
    case layer_attention::full:
      break;
  }
  return full_attention{};
}

KVPAGER_NAMESPACE_END
