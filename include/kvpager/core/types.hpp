// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Vocabulary types shared by every layer.

#include <cstdint>

#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Tokens per block wherever kvpager chooses one for the caller (cache_config, kv_geometry, the kernels' views and
/// layouts, sizing requests): vLLM's default, and one of the sizes the compiled kernels run (8, 16, 32). Stated here
/// once; every default block size is this constant.
inline constexpr std::int32_t default_block_size = 16;

/// Physical block id: an index into the paged KV pool. int32 because kernels index block tables as int32 (vLLM,
/// FlashInfer); byte offsets into the pool are always computed in 64 bits.
using block_id = std::int32_t;

/// Sequence id chosen by the engine (any 64-bit value).
using seq_id = std::uint64_t;

/// Token id as the model's tokenizer produces it.
using token_id = std::int32_t;

/// Shape of a block pool, given to every policy when a cache is created.
struct pool_geometry {
  std::int32_t num_blocks = 0;       ///< blocks in the pool, reserved ones included
  std::int32_t block_size = default_block_size;  ///< tokens per block
  std::int32_t reserved_blocks = 0;  ///< blocks [0, reserved) are never handed out
};

/// A layer's attention kind as a model's config names it (full attention, sliding window W, chunked local C): the
/// vocabulary sizing (`sizing/hybrid_sizing.hpp`) and the group kinds (`groups/`: `to_group_kind`) share.
enum class layer_attention : std::uint8_t { full, sliding_window, chunked_local };

/// Marker for "no block" (empty list links, unused block-table entries).
inline constexpr block_id no_block = -1;

/// Number of blocks needed to hold `num_tokens` tokens: ceil(num_tokens / block_size). Both must be positive
/// (or num_tokens zero).
[[nodiscard]] constexpr std::int64_t blocks_for_tokens(std::int64_t num_tokens, std::int64_t block_size) noexcept {
  return (num_tokens + block_size - 1) / block_size;
}

KVPAGER_NAMESPACE_END
