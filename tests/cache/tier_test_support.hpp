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

}  // namespace kvtest
