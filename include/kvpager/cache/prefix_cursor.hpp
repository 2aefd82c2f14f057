#pragma once
/// \file
/// Prefix cursors: where each sequence stands in the sharing policy's hash chain, and the three things a cache
/// does with that position. Walk a prompt's cached prefix, commit the full blocks a sequence fills, and give a
/// fork the position its tokens allow. With a sharing policy that caches no content the cursor is an empty type and
/// these do nothing.

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvpager/cache/sequence_table.hpp"
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
}  // namespace detail

/// The hash-chain position type of sharing policy `S` (an empty type when `S` caches no content).
template <class S>
using prefix_cursor_t = typename detail::cursor_of<S>::type;

/// Prefix-cursor operations over sharing policy `S`, for blocks of `block_size` tokens.
template <sharing_policy S>
struct prefix_cursors {
  using cursor = prefix_cursor_t<S>;
  using state = sequence_state<cursor>;

  std::int32_t block_size = 16;

  /// Tokens of block `i` of `tokens`.
  [[nodiscard]] std::span<const token_id> block_tokens(std::span<const token_id> tokens,
                                                       std::int32_t i) const noexcept {
    return tokens.subspan(static_cast<std::size_t>(i) * static_cast<std::size_t>(block_size),
                          static_cast<std::size_t>(block_size));
  }

  /// Walks the longest cached prefix of full blocks of a prompt, capped so its last token is always computed:
  /// calls `on_hit(b)` per hit block, in order, and leaves `cur` after the last hit. Returns the hit blocks.
  /// Changes nothing in `share`.
  template <class OnHit>
  std::int32_t walk(const S& share, cursor& cur, std::span<const token_id> tokens, std::uint64_t extra_key,
                    OnHit&& on_hit) const {
    std::int32_t hits = 0;
    if constexpr (content_cache<S>) {
      cur = share.first_cursor(extra_key);
      const std::int32_t max_blocks = (static_cast<std::int32_t>(tokens.size()) - 1) / block_size;
      for (; hits < max_blocks; ++hits) {
        const block_id b = share.lookup(cur, block_tokens(tokens, hits));
        if (b == no_block) break;
        on_hit(b);
      }
    }
    return hits;
  }

  /// The cursor a walk that found `hits` leaves: after the last hit, or the chain's start when there is none.
  void resume(const S& share, cursor& cur, std::span<const block_id> hits, std::uint64_t extra_key) const noexcept {
    if constexpr (content_cache<S>) cur = hits.empty() ? share.first_cursor(extra_key) : share.cursor_after(hits.back());
  }

  /// After a prompt was added to `s` (its first `first_new` blocks were hits and `cur` stands after them): commits
  /// the prompt's other full blocks, keeps the tokens of its partial last block, and stores the cursor.
  void commit_prompt(S& share, state& s, cursor cur, std::span<const token_id> tokens,
                     std::int32_t first_new) const {
    if constexpr (content_cache<S>) {
      const auto n = static_cast<std::int32_t>(tokens.size());
      const std::int32_t full = n / block_size;
      for (std::int32_t i = first_new; i < full; ++i)
        share.commit(s.blocks[static_cast<std::size_t>(i)], cur, block_tokens(tokens, i));
      s.partial.assign(tokens.begin() + static_cast<std::ptrdiff_t>(full) * block_size, tokens.end());
      s.cursor = cur;
    }
  }

  /// After `tokens` were appended to `s` at position `first`: commits every block they fill (if `s` still
  /// caches: it was added with token ids and never appended to by count).
  void extend(S& share, state& s, std::span<const token_id> tokens, std::int32_t first) const {
    if constexpr (content_cache<S>) {
      if (!share.valid(s.cursor)) return;
      std::int32_t pos = first;
      for (const token_id t : tokens) {
        s.partial.push_back(t);
        ++pos;
        if (static_cast<std::int32_t>(s.partial.size()) == block_size) {
          share.commit(s.blocks[static_cast<std::size_t>((pos - 1) / block_size)], s.cursor, s.partial);
          s.partial.clear();
        }
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

KVPAGER_NAMESPACE_END
