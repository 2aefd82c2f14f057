// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Copy-on-write: a fork shares its parent's blocks or copies them (fork_blocks), and growth of one block table
/// (grow_for_write): before tokens are appended, a shared, partly filled last block is
/// replaced by a private copy (a fresh block and a (src, dst) copy in the step plan), a cached last block that is
/// about to be overwritten loses its cached content, and new blocks are taken for the tokens past the table's end.
/// All or nothing: the capacity check comes before any change.

#include <cstdint>
#include <span>
#include <vector>

#include "kvpager/cache/detail/step_ledger.hpp"
#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

/// The blocks a table of `num_tokens` tokens needs after `n` more: errc::invalid_argument past 2^31-1 tokens or
/// past `max_blocks_per_seq` (> 0) blocks. Both caches' appends check it first.
[[nodiscard]] inline result<std::int64_t> blocks_after_growth(std::int32_t num_tokens, std::int32_t n,
                                                              std::int32_t block_size,
                                                              std::int32_t max_blocks_per_seq) noexcept {
  const std::int64_t new_total = std::int64_t{num_tokens} + n;
  if (new_total > INT32_MAX)
    return status{errc::invalid_argument, "append_tokens: sequence would exceed 2^31-1 tokens", new_total};
  const std::int64_t total_blocks = blocks_for_tokens(new_total, block_size);
  if (max_blocks_per_seq > 0 && total_blocks > max_blocks_per_seq)
    return status{errc::invalid_argument, "append_tokens: sequence would need more than max_blocks_per_seq blocks",
                  total_blocks};
  return total_blocks;
}

/// What grow_for_write did.
struct write_growth {
  std::int64_t new_blocks = 0;  ///< blocks appended to the table
  bool copied = false;          ///< the last block was copied (copy-on-write)
};

/// grow_for_write's part that takes blocks: copy-on-write of the last block, new blocks at the end.
template <class Store, class Release>
status grow_into_new_blocks(Store& store, step_ledger& ledger, std::vector<block_id>& blocks, Release& release,
                            write_growth& g, bool stale) {
  const std::int64_t need = g.new_blocks + (g.copied ? 1 : 0);
  if (need > store.available()) return status{errc::out_of_blocks, "append_tokens: not enough free blocks", need};
  if (stale) store.evict(blocks.back());
  if (g.copied) {
    const block_id src = blocks.back();
    block_id dst = no_block;
    store.take(std::span<block_id>(&dst, 1));
    ledger.plan_copy(src, dst);
    blocks.back() = dst;
    release(src);  // still referenced by the other sharers
  }
  if (g.new_blocks > 0) {
    const std::size_t old = blocks.size();
    blocks.resize(old + static_cast<std::size_t>(g.new_blocks));
    store.take(std::span<block_id>(blocks).subspan(old));
  }
  return ok_status();
}

/// Makes `blocks` (holding `num_tokens` tokens of `block_size`) ready for writes up to `total_blocks` blocks, over
/// block_store `store` (take, refcount, is_cached, evict, release) and the step's `ledger`; `release(b)` drops the
/// table's reference to a replaced block; `g` says what was done. errc::out_of_blocks (detail = blocks needed) and
/// nothing changed when the store cannot provide them. O(new blocks).
template <class Store, class Release>
status grow_for_write(Store& store, step_ledger& ledger, std::vector<block_id>& blocks, std::int32_t num_tokens,
                      std::int32_t block_size, std::int64_t total_blocks, Release&& release, write_growth& g) {
  g.new_blocks = total_blocks - static_cast<std::int64_t>(blocks.size());
  const bool writes_last = num_tokens % block_size != 0;  // the first new token lands in the last block
  g.copied = writes_last && store.refcount(blocks.back()) > 1;
  // A full block that is cached but ours alone (a fork that ended inside it) is about to change: its cached
  // content must not be handed out again.
  const bool stale = writes_last && !g.copied && store.is_cached(blocks.back());
  if (g.new_blocks == 0 && !g.copied) {  // the common decode step: room in our own last block (kept inline)
    if (stale) store.evict(blocks.back());
    return ok_status();
  }
  return detail::grow_into_new_blocks(store, ledger, blocks, release, g, stale);
}

/// The blocks of a fork: `child` (sized by the caller) gets the first child.size() blocks of `parent`, shared
/// (fork_mode::share: one more reference each) or copied (fork_mode::copy: fresh blocks from `store`, whose
/// available() the caller checked, and a planned copy each). Returns the blocks copied. O(child.size()).
template <fork_mode Mode, class Store>
std::int64_t fork_blocks(Store& store, step_ledger& ledger, std::span<const block_id> parent,
                         std::span<block_id> child) {
  if constexpr (Mode == fork_mode::share) {
    for (std::size_t i = 0; i < child.size(); ++i) {
      child[i] = parent[i];
      store.add_ref(parent[i]);
    }
    return 0;
  } else {
    store.take(child);
    for (std::size_t i = 0; i < child.size(); ++i) ledger.plan_copy(parent[i], child[i]);
    return static_cast<std::int64_t>(child.size());
  }
}

}  // namespace detail
KVPAGER_NAMESPACE_END
