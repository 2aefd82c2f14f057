// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the host tier's cache tests share: their small geometry and prompts of consecutive token ids.

#include <kvpager/kvpager.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

namespace kvtest {

inline constexpr std::int32_t tier_block_size = 4;

/// A pool of `device_blocks` blocks of tier_block_size tokens (block 0 reserved), a swap pool of `host_blocks`, and
/// a host tier of `tier_blocks` written by `w`.
inline kvpager::cache_config tier_config(std::int32_t device_blocks, std::int32_t tier_blocks,
                                         kvpager::tier_write w = kvpager::tier_write::through,
                                         std::int32_t host_blocks = 0) {
  kvpager::cache_config c{tier_block_size, device_blocks, 1, 0, host_blocks};
  c.host_tier.num_blocks = tier_blocks;
  c.host_tier.write = w;
  return c;
}

/// `n` tokens: first, first + 1, ...
inline std::vector<kvpager::token_id> iota_prompt(std::int32_t n, kvpager::token_id first) {
  std::vector<kvpager::token_id> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

/// The reference's view of one host tier block (the model tests of tier_async_test and tier_hybrid_test).
enum class host_state : std::uint8_t { empty, writing, ready, reading };
struct ref_host_block {
  host_state state = host_state::empty;
  std::uint64_t content = 0;  ///< the content id (the emulated value of the block's last token)
};

/// A transfer the emulated engine has not reported yet.
struct in_flight {
  kvpager::tier_done done;
  bool load = false;
  std::int64_t due = 0;              ///< the step from which it may be reported
  std::vector<std::uint64_t> bytes;  ///< a store's bytes as read when the plan ran (write-back, or synchronous)
};

/// The tier transfers of the current plan (swap-outs and swap-ins into tier host blocks: host block ids from
/// num_host_blocks on), reported `ok`.
template <class Cache>
std::vector<kvpager::tier_done> tier_transfers(const Cache& c, bool ok = true) {
  std::vector<kvpager::tier_done> d;
  const kvpager::block_id base = c.config().num_host_blocks;
  for (const kvpager::block_swap& s : c.plan().swap_outs())
    if (s.host >= base) d.push_back({s, ok});
  for (const kvpager::block_swap& s : c.plan().swap_ins())
    if (s.host >= base) d.push_back({s, ok});
  return d;
}

}  // namespace kvtest
