// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The prefix-cache hit agreed across KV cache groups: the longest cached prefix, in whole blocks, from which every
/// group can resume the sequence. A group of kind K can resume after L cached tokens when it holds a cached block for
/// every block that has a token of [K.skipped_tokens(L), L) (concepts/group_kind.hpp): full attention every block
/// before L, a sliding window only the blocks of its last W - 1 tokens, chunked local only the blocks of L's chunk.
/// Blocks wholly before that range may be anything (the null block, another request's block).
///
/// The search is a fixed point: start from the limit, and let each group in turn lower it to the longest length at or
/// below it that the group can resume, until a whole pass lowers nothing. Every group can then resume there, and no
/// longer length works for all (each step keeps every length that all groups can resume). Any number of groups and
/// kinds; O(groups x blocks) lookups of `cached` and O(groups x blocks) steps in all (a group that skips nothing,
/// such as full attention, looks up only up to its first miss). This is the native rule;
/// vLLM's HybridKVCacheCoordinator reaches the same length for its kinds except for a window of 1 token (vLLM still
/// asks for the last cached block) and chunk sizes that are not a multiple of the block size.

#include <cstdint>
#include <vector>

#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Buffers of agreed_hit_tokens, kept between calls so that a warm call allocates nothing.
struct hit_scratch {
  /// Per group, the first block index >= i without a cached block (for a group that skips nothing, index 0 only).
  std::vector<std::int32_t> next_miss;
};

/// The agreed hit, in tokens (a multiple of `block_size`, at most `max_tokens`; vLLM passes the prompt length - 1 so
/// that the last prompt token is computed). `skipped(g, t)` is group g's kind's skipped_tokens(t); `cached(g, i)`
/// says whether group g has a cached block for the sequence's block i (its hash under group g). Preconditions:
/// num_groups >= 1, block_size >= 1, max_tokens >= 0, each `skipped` in [0, t].
template <class Skipped, class Cached>
[[nodiscard]] std::int64_t agreed_hit_tokens(std::int32_t num_groups, std::int32_t block_size, std::int64_t max_tokens,
                                             Skipped&& skipped, Cached&& cached, hit_scratch& scratch) {
  const auto m = static_cast<std::int32_t>(max_tokens / block_size);  // candidate lengths 0..m blocks
  const auto row = static_cast<std::size_t>(m) + 1;
  scratch.next_miss.resize(row * static_cast<std::size_t>(num_groups));
  for (std::int32_t g = 0; g < num_groups; ++g) {
    std::int32_t* nm = scratch.next_miss.data() + row * static_cast<std::size_t>(g);
    if (skipped(g, static_cast<std::int64_t>(m) * block_size) == 0) {
      // skipped_tokens is non-decreasing: this group skips nothing at any candidate length, so only its first miss
      // (next_miss[0]) is ever read. Scan forward to it: a full-attention group asks nothing past its first miss.
      std::int32_t f = 0;
      while (f < m && cached(g, f)) ++f;
      nm[0] = f;
      continue;
    }
    nm[m] = m;
    for (std::int32_t i = m - 1; i >= 0; --i) nm[i] = cached(g, i) ? nm[i + 1] : i;
  }
  // Can group g resume after k blocks? Its needed blocks [first, k) are all cached.
  const auto resumable = [&](std::int32_t g, std::int32_t k) {
    const std::int64_t first = skipped(g, static_cast<std::int64_t>(k) * block_size) / block_size;
    return first >= k || scratch.next_miss[row * static_cast<std::size_t>(g) + static_cast<std::size_t>(first)] >= k;
  };
  std::int32_t cur = m;
  for (bool lowered = true; lowered;) {
    lowered = false;
    for (std::int32_t g = 0; g < num_groups; ++g) {
      std::int32_t k = cur;
      while (k > 0 && !resumable(g, k)) --k;  // 0 always resumes: nothing to read
      if (k < cur) {
        cur = k;
        lowered = true;
      }
    }
  }
  return static_cast<std::int64_t>(cur) * block_size;
}

KVPAGER_NAMESPACE_END
