// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// vLLM v1's view of KV cache groups, for caches that must decide exactly as vLLM's HybridKVCacheCoordinator:
/// which kinds it knows (vllm_kind_of), which group layouts its layer grouping can produce (check_vllm_layout), and
/// its prefix-cache hit across groups (vllm_agreed_hit), with its per-kind lookups. The rules are those of
/// KVTRACE.md, "Hybrid KV cache groups"; docs/notes/hybrid_notes.md says where each comes from in vLLM's source.
///
/// vLLM's lookups differ from the native rule (groups/agreed_hit.hpp) in two corners: a window of 1 token still
/// asks for the last cached block, and a chunked-local lookup fixes its chunk from the limit it is given. The
/// agreement differs in order: types (groups of one kind and size) are looked up full first, the full type once, and
/// with exactly two types of which the first is full the first lowering is final.

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "kvpager/concepts/group_kind.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/groups/group_kind_variant.hpp"
#include "kvpager/groups/group_kinds.hpp"

KVPAGER_NAMESPACE_BEGIN

/// The kinds vLLM's hybrid manager has (its single-type managers).
enum class vllm_kind_tag : std::uint8_t { full, sliding_window, chunked_local, none };

/// A group as vLLM sees it: its kind and size (window or chunk; 0 for full). Equal values form one vLLM "type".
struct vllm_kind {
  vllm_kind_tag tag = vllm_kind_tag::none;
  std::int64_t size = 0;
  friend constexpr bool operator==(const vllm_kind&, const vllm_kind&) = default;
};

/// vLLM's kind for group kind `k`: the shipped kinds and group_kind_variants of them; vllm_kind_tag::none for a
/// kind vLLM does not have.
template <group_kind K>
[[nodiscard]] constexpr vllm_kind vllm_kind_of(const K& k) noexcept {
  if constexpr (std::is_same_v<K, full_attention>) {
    return {vllm_kind_tag::full, 0};
  } else if constexpr (std::is_same_v<K, sliding_window>) {
    return {vllm_kind_tag::sliding_window, k.window};
  } else if constexpr (std::is_same_v<K, chunked_local>) {
    return {vllm_kind_tag::chunked_local, k.chunk};
  } else if constexpr (requires { k.visit([](const auto&) noexcept { return vllm_kind{}; }); }) {
    return k.visit([](const auto& x) noexcept { return vllm_kind_of(x); });
  } else {
    (void)k;
    return {};
  }
}

/// Whether vLLM's layer grouping can produce this group order (kv_cache_utils.py groups layers by equal spec, in
/// order of first appearance, and splits each spec into groups of the size of the rarest one): one group of any
/// kind; with more, every kind and size known to vLLM, each one's groups adjacent, at least one occurring exactly
/// once, and not all groups identical. errc::invalid_argument naming the rule broken (detail = the offending group).
[[nodiscard]] inline status check_vllm_layout(std::span<const vllm_kind> groups) noexcept {
  if (groups.empty()) return status{errc::invalid_argument, "vLLM layout: no group"};
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (groups[static_cast<std::size_t>(g)].tag == vllm_kind_tag::none)
      return status{errc::invalid_argument, "vLLM layout: a kind vLLM's hybrid manager does not have",
                    static_cast<std::int64_t>(g)};
  if (groups.size() == 1) return ok_status();
  bool once = false;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::size_t count = 0;
    for (std::size_t h = 0; h < groups.size(); ++h) count += groups[static_cast<std::size_t>(h)] == groups[static_cast<std::size_t>(g)] ? 1U : 0U;
    if (count == groups.size())
      return status{errc::invalid_argument, "vLLM layout: identical groups form one group in vLLM", 0};
    once = once || count == 1;
    // Adjacent: a group that starts a new run must not have occurred before it.
    if (g > 0 && !(groups[g - 1] == groups[static_cast<std::size_t>(g)]))
      for (std::size_t h = 0; h + 1 < g; ++h)
        if (groups[static_cast<std::size_t>(h)] == groups[static_cast<std::size_t>(g)])
          return status{errc::invalid_argument, "vLLM layout: groups of one kind and size must be adjacent",
                        static_cast<std::int64_t>(g)};
  }
  if (!once) return status{errc::invalid_argument, "vLLM layout: no kind occurs exactly once (vLLM groups by the rarest)"};
  return ok_status();
}

/// Buffers of vllm_agreed_hit, kept between calls so that a warm call allocates nothing.
struct vllm_hit_scratch {
  std::vector<std::int32_t> type_of;     ///< per group, its type (index into type_first)
  std::vector<std::int32_t> type_first;  ///< per type in lookup order, its first group
  std::vector<std::int32_t> type_nulls;  ///< per type, the NULL entries its last lookup returned
};

namespace detail {

/// One type's lookup (kv_cache_manager's per-kind find_longest_cache_hit) with limit `limit` tokens: the result's
/// length and leading NULL entries, in blocks. `hit(i)`: every group of the type has block i cached.
template <class Hit>
[[nodiscard]] inline std::int64_t vllm_type_lookup(const vllm_kind& k, std::int32_t block_size, std::int64_t limit,
                                                   Hit& hit, std::int32_t& nulls) {
  const std::int64_t m = limit / block_size;
  nulls = 0;
  switch (k.tag) {
    case vllm_kind_tag::sliding_window: {
      const std::int64_t need = (k.size - 1 + block_size - 1) / block_size;  // cdiv(W - 1, bs)
      std::int64_t run = 0;
      for (std::int64_t i = m - 1; i >= 0; --i) {
        if (!hit(i)) {
          run = 0;
          continue;
        }
        if (++run >= need) {  // checked only after a hit (a 1-token window still asks for the last block)
          nulls = static_cast<std::int32_t>(i);
          return i + run;
        }
      }
      return run;  // no full window: the run of hits from block 0
    }
    case vllm_kind_tag::chunked_local: {
      const std::int64_t start = limit > 0 ? limit / k.size * k.size : 0;
      std::int64_t i = start / block_size;
      nulls = static_cast<std::int32_t>(i);
      while (i < m && hit(i)) ++i;
      return i;
    }
    default: {  // full
      std::int64_t i = 0;
      while (i < m && hit(i)) ++i;
      return i;
    }
  }
}

}  // namespace detail

/// vLLM's agreed prefix-cache hit over `groups` (in group order), in tokens, at most `max_tokens` (vLLM: the
/// request's tokens - 1). `cached(g, i)`: group g has block i of the sequence cached (under its hash and g).
/// `nulls[static_cast<std::size_t>(g)]` receives how many leading entries of group g's hit list are the null block; the others, up to
/// hit / block_size, are cached blocks (an admission still skips the entries before the window of the hit's first
/// computed token, which for a window of 1 token includes the last of them: hybrid_kv_cache and docs/KVTRACE.md).
/// One group: that group's lookup with `max_tokens`. Preconditions:
/// check_vllm_layout(groups) holds, block_size >= 1, max_tokens >= 0, nulls.size() == groups.size().
template <class Cached>
[[nodiscard]] std::int64_t vllm_agreed_hit(std::span<const vllm_kind> groups, std::int32_t block_size,
                                           std::int64_t max_tokens, Cached&& cached, std::span<std::int32_t> nulls,
                                           vllm_hit_scratch& scratch) {
  const auto num_groups = static_cast<std::int32_t>(groups.size());
  if (num_groups == 1) {
    auto hit = [&](std::int64_t i) { return cached(0, i); };
    return detail::vllm_type_lookup(groups[0], block_size, max_tokens, hit, nulls[0]) * block_size;
  }
  // Types: groups of equal kind and size, in order of first appearance; then full first (a stable sort).
  scratch.type_first.clear();
  scratch.type_of.assign(static_cast<std::size_t>(num_groups), -1);
  for (const bool want_full : {true, false})
    for (std::int32_t g = 0; g < num_groups; ++g) {
      if ((groups[static_cast<std::size_t>(g)].tag == vllm_kind_tag::full) != want_full || scratch.type_of[static_cast<std::size_t>(g)] >= 0) continue;
      const auto t = static_cast<std::int32_t>(scratch.type_first.size());
      scratch.type_first.push_back(g);
      for (std::int32_t h = g; h < num_groups; ++h)
        if (groups[static_cast<std::size_t>(h)] == groups[static_cast<std::size_t>(g)]) scratch.type_of[static_cast<std::size_t>(h)] = t;
    }
  const auto num_types = static_cast<std::int32_t>(scratch.type_first.size());
  scratch.type_nulls.assign(static_cast<std::size_t>(num_types), 0);
  const bool first_full = groups[static_cast<std::size_t>(scratch.type_first[0])].tag == vllm_kind_tag::full;
  const bool simple = num_types == 2 && first_full;
  std::int64_t hit_len = max_tokens, full_len = -1;
  for (;;) {
    std::int64_t cur = hit_len;
    for (std::int32_t t = 0; t < num_types; ++t) {
      const vllm_kind& k = groups[static_cast<std::size_t>(scratch.type_first[static_cast<std::size_t>(t)])];
      if (k.tag == vllm_kind_tag::full && full_len >= 0) {
        cur = std::min(cur, full_len);
        continue;
      }
      auto hit = [&](std::int64_t i) {
        for (std::int32_t g = scratch.type_first[static_cast<std::size_t>(t)]; g < num_groups; ++g)
          if (scratch.type_of[static_cast<std::size_t>(g)] == t && !cached(g, i)) return false;
        return true;
      };
      cur = detail::vllm_type_lookup(k, block_size, cur, hit, scratch.type_nulls[static_cast<std::size_t>(t)]) * block_size;
      if (k.tag == vllm_kind_tag::full) full_len = cur;
    }
    if (cur >= hit_len) break;
    hit_len = cur;
    if (simple) break;
  }
  for (std::int32_t g = 0; g < num_groups; ++g) {
    const std::int32_t t = scratch.type_of[static_cast<std::size_t>(g)];
    nulls[static_cast<std::size_t>(g)] = std::min<std::int32_t>(scratch.type_nulls[static_cast<std::size_t>(t)], static_cast<std::int32_t>(hit_len / block_size));
  }
  return hit_len;
}

KVPAGER_NAMESPACE_END
