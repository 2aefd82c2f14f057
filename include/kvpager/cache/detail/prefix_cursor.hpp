// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Prefix cursors: where each sequence stands in the sharing policy's hash chain, and what a cache does with that
/// position. Look a prompt's cached prefix up (match_prefix's count, a prefix_hit's freshness and the hit blocks an
/// admission takes from it), commit the full blocks a sequence fills, and give a fork the position its tokens
/// allow. With a sharing policy that caches no content the cursor is an empty type and these do nothing.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpager/cache/cache_types.hpp"
#include "kvpager/cache/detail/sequence_table.hpp"
#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

struct no_cursor {
  friend bool operator==(const no_cursor&, const no_cursor&) = default;
};
template <class S>
struct cursor_of {
  using type = no_cursor;
};
template <content_cache S>
struct cursor_of<S> {
  using type = typename S::cursor;
};

/// The hash-chain position type of sharing policy `S` (an empty type when `S` caches no content).
template <class S>
using prefix_cursor_t = typename cursor_of<S>::type;

/// A commit hook that does nothing (prefix_cursors::commit_prompt, extend).
struct no_commit_hook {
  template <class... Args>
  void operator()(const Args&...) const noexcept {}
};

/// Prefix-cursor operations over sharing policy `S`, for blocks of `block_size` tokens.
template <sharing_policy S>
struct prefix_cursors {
  using cursor = prefix_cursor_t<S>;
  using state = sequence_state<cursor>;

  std::int32_t block_size = default_block_size;

  /// Tokens of block `i` of `tokens`.
  [[nodiscard]] std::span<const token_id> block_tokens(std::span<const token_id> tokens,
                                                       std::int32_t i) const noexcept {
    return tokens.subspan(static_cast<std::size_t>(i) * static_cast<std::size_t>(block_size),
                          static_cast<std::size_t>(block_size));
  }

  /// Walks the longest cached prefix of full blocks of a prompt, capped so its last token is always computed:
  /// calls `on_hit(b)` per hit block, in order, and leaves `cur` after the last hit. Returns the hit blocks.
  /// Changes nothing in `share`. With a prehashed_content_cache and `hashes`, the hashes it knows are used, not
  /// computed again, and the hash of the first block it misses (if it computed it) is kept in `*hashes`.
  template <class OnHit>
  std::int32_t walk(const S& share, cursor& cur, std::span<const token_id> tokens, std::uint64_t extra_key,
                    OnHit&& on_hit, prompt_hashes* hashes = nullptr) const {
    std::int32_t hits = 0;
    if constexpr (content_cache<S>) {
      cur = share.first_cursor(extra_key);
      const std::int32_t max_blocks = (static_cast<std::int32_t>(tokens.size()) - 1) / block_size;
      if (hashes != nullptr) hashes->miss_at = -1;
      for (; hits < max_blocks; ++hits) {
        const auto t = block_tokens(tokens, hits);
        block_id b = no_block;
        if constexpr (prehashed_content_cache<S>) {
          if (hashes != nullptr) {
            const std::uint64_t* known = hashes->find(hits);
            const std::uint64_t h = known != nullptr ? *known : share.hash(cur, t);
            b = share.lookup(cur, h, t);
            if (b == no_block && known == nullptr) {
              hashes->miss = h;
              hashes->miss_at = hits;
            }
          } else {
            b = share.lookup(cur, t);
          }
        } else {
          b = share.lookup(cur, t);
        }
        if (b == no_block) break;
        on_hit(b);
      }
    }
    return hits;
  }

  /// errc::invalid_argument naming `Call` unless the prompt has 1 to 2^31-1 tokens.
  template <detail::call_name Call>
  static status check_prompt(std::span<const token_id> tokens) noexcept {
    if (tokens.empty() || tokens.size() > static_cast<std::size_t>(INT32_MAX))
      return status{errc::invalid_argument,
                    detail::joined<Call, ": the prompt must have 1 to 2^31-1 tokens">::value.data(),
                    static_cast<std::int64_t>(tokens.size())};
    return ok_status();
  }

  /// match_prefix's answer for a prompt (not empty): walks its cached prefix (see walk; `on_hit(b)` sees each hit)
  /// and counts the blocks admitting it takes, where `consumes(b)` tells whether hit block `b` takes capacity (it
  /// sits evictable in the free queue).
  template <class Consumes, class OnHit>
  prefix_match match(const S& share, std::span<const token_id> tokens, std::uint64_t extra_key, Consumes&& consumes,
                     OnHit&& on_hit, prompt_hashes* hashes = nullptr) const {
    prefix_match m;
    cursor cur{};
    m.blocks = walk(
        share, cur, tokens, extra_key,
        [&](block_id b) {
          on_hit(b);
          if (consumes(b)) ++m.blocks_to_allocate;
        },
        hashes);
    m.tokens = m.blocks * block_size;
    m.blocks_to_allocate += blocks_for_tokens(static_cast<std::int64_t>(tokens.size()), block_size) - m.blocks;
    return m;
  }

  /// Whether the sharing policy counts its content changes (prefix_caching::generation()).
  static constexpr bool has_generation = requires(const S& sp) {
    { sp.generation() } -> std::convertible_to<std::uint64_t>;
  };
  /// The sharing policy's generation (0 without one).
  [[nodiscard]] static std::uint64_t generation(const S& share) noexcept {
    if constexpr (has_generation)
      return share.generation();
    else
      return 0;
  }

  /// Whether `hit` still answers a lookup of `num_tokens` tokens (at most those looked up) under `extra_key`: made
  /// with that key, and (content caches) at the policy's current generation.
  [[nodiscard]] static bool fresh(const S& share, const prefix_hit& hit, std::size_t num_tokens,
                                  std::uint64_t extra_key) noexcept {
    return hit.num_tokens >= 1 && static_cast<std::size_t>(hit.num_tokens) >= num_tokens &&
           hit.extra_key == extra_key && (!content_cache<S> || hit.generation == generation(share));
  }

  /// The lookup an admission of `n` tokens takes from fresh `hit` (its hit blocks up to the cap below the last
  /// token; `on_hit(b)` sees each, in order): leaves `cur` after the last one taken.
  template <class OnHit>
  void take(const S& share, cursor& cur, const prefix_hit& hit, std::int32_t n, std::uint64_t extra_key,
            OnHit&& on_hit) const {
    const std::int32_t taken = std::min(hit.match.blocks, (n - 1) / block_size);
    for (std::int32_t i = 0; i < taken; ++i) on_hit(hit.blocks[static_cast<std::size_t>(i)]);
    if constexpr (content_cache<S>)
      cur = taken == 0 ? share.first_cursor(extra_key)
                       : share.cursor_after(hit.blocks[static_cast<std::size_t>(taken - 1)]);
  }

  /// After a prompt was added to `s` (its first `first_new` blocks were hits and `cur` stands after them): commits
  /// the prompt's other full blocks, keeps the tokens of its partial last block, and stores the cursor. `hashes`:
  /// block hashes known from its lookup or its request (a prehashed_content_cache commits with them).
  /// `on_commit(b, i, tokens)` sees each block `b` (block `i` of the sequence) after its commit (the KV cache events).
  template <class OnCommit = no_commit_hook>
  void commit_prompt(S& share, state& s, cursor cur, std::span<const token_id> tokens, std::int32_t first_new,
                     const prompt_hashes& hashes = {}, OnCommit&& on_commit = {}) const {
    if constexpr (content_cache<S>) {
      const auto n = static_cast<std::int32_t>(tokens.size());
      const std::int32_t full = n / block_size;
      for (std::int32_t i = first_new; i < full; ++i) {
        const auto b = s.blocks[static_cast<std::size_t>(i)];
        if constexpr (prehashed_content_cache<S>) {
          if (const std::uint64_t* h = hashes.find(i); h != nullptr && share.valid(cur)) {
            share.commit(b, cur, *h, block_tokens(tokens, i));
            on_commit(b, i, block_tokens(tokens, i));
            continue;
          }
        }
        share.commit(b, cur, block_tokens(tokens, i));
        on_commit(b, i, block_tokens(tokens, i));
      }
      s.partial.assign(tokens.begin() + static_cast<std::ptrdiff_t>(full) * block_size, tokens.end());
      s.cursor = cur;
    }
  }

  /// After `tokens` were appended to `s` at position `first`: commits every block they fill (if `s` still
  /// caches: it was added with token ids and never appended to by count).
  template <class OnCommit = no_commit_hook>
  void extend(S& share, state& s, std::span<const token_id> tokens, std::int32_t first, OnCommit&& on_commit = {}) const {
    if constexpr (content_cache<S>) {
      if (!share.valid(s.cursor)) return;
      std::int32_t pos = first;
      for (const token_id t : tokens) {
        s.partial.push_back(t);
        ++pos;
        if (static_cast<std::int32_t>(s.partial.size()) == block_size) {
          const std::int32_t i = (pos - 1) / block_size;
          const block_id b = s.blocks[static_cast<std::size_t>(i)];
          share.commit(b, s.cursor, s.partial);
          on_commit(b, i, std::span<const token_id>(s.partial));
          s.partial.clear();
        }
      }
    }
  }

  /// The chained hashes of `s`'s leading cached full blocks into `out` (emptied first; nothing without a
  /// prehashed_content_cache), read from the policy without hashing. Allocates only when `out` grows.
  void hashes_of(const S& share, const state& s, std::vector<std::uint64_t>& out) const {
    out.clear();
    if constexpr (prehashed_content_cache<S>) {
      const std::int32_t full = s.num_tokens / block_size;
      for (std::int32_t i = 0; i < full; ++i) {
        const block_id b = s.blocks[static_cast<std::size_t>(i)];
        if (!share.is_cached(b)) break;
        out.push_back(share.block_hash(b));
      }
    }
  }

  /// Stops caching `s`'s later blocks (their token ids are unknown).
  static void stop(state& s) noexcept {
    s.cursor = cursor{};
    s.partial.clear();
  }

  /// The child's position after forking `tokens` tokens of `p`: it keeps caching only if the content of its
  /// partial block is known (the fork point is block-aligned, or inside the parent's own partial block).
  void inherit(const S& share, state& c, const state& p, std::int32_t tokens) const {
    stop(c);
    if constexpr (content_cache<S>) {
      if (!share.valid(p.cursor)) return;
      const std::int32_t full = tokens / block_size;
      const std::int32_t rest = tokens % block_size;
      const std::int32_t parent_full = p.num_tokens / block_size;
      if (rest != 0 && full != parent_full) return;  // the partial block's tokens are not kept
      if (full == parent_full) {
        c.cursor = p.cursor;
      } else if (full == 0) {
        c.cursor = share.first_cursor(p.extra_key);
      } else {
        c.cursor = share.cursor_after(p.blocks[static_cast<std::size_t>(full - 1)]);  // invalid if not cached
      }
      c.partial.assign(p.partial.begin(), p.partial.begin() + rest);
      c.extra_key = p.extra_key;
    }
  }
};

}  // namespace detail
KVPAGER_NAMESPACE_END
