// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// kv_layout: byte offsets of one layer's paged KV pool in the kernels' default layout
/// [num_blocks, 2, num_kv_heads, block_size, head_dim] (K then V in a block), derived from a kv_geometry
/// (kv_layout::of). Offsets in 64 bits. And how a model's pools lie in memory (kv_pool_layout: one per layer, or one
/// block-major pool for every layer).

#include <cstddef>
#include <cstdint>

#include "kvpager/core/config.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

struct kv_layout {
  std::int32_t num_blocks = 0;
  std::int32_t num_kv_heads = 1;
  std::int32_t block_size = default_block_size;
  std::int32_t head_dim = 128;
  std::int32_t elem_bytes = 2;  ///< 2 for fp16/bf16, 4 for fp32, 1 for fp8 E4M3

  /// The layout of a pool of geometry `g` (element size from its dtype).
  [[nodiscard]] static constexpr kv_layout of(const kv_geometry& g) noexcept {
    return {g.num_blocks, g.num_kv_heads, g.block_size, g.head_dim, kvpager::elem_bytes(g.dtype)};
  }

  /// Bytes of one token's K (or V) for one head.
  [[nodiscard]] constexpr std::int64_t row_bytes() const noexcept { return std::int64_t{head_dim} * elem_bytes; }
  /// Bytes of one block (K and V, all heads): 2 x num_kv_heads x block_size x row_bytes(), as core's
  /// block_bytes(geometry) counts them for the geometry the layout was made of.
  [[nodiscard]] constexpr std::int64_t block_bytes() const noexcept {
    return 2 * std::int64_t{num_kv_heads} * block_size * row_bytes();
  }
  [[nodiscard]] constexpr std::int64_t pool_bytes() const noexcept { return std::int64_t{num_blocks} * block_bytes(); }
  /// Byte offset of (block, kv = 0 for K / 1 for V, head, position in block).
  [[nodiscard]] constexpr std::int64_t offset(block_id b, std::int32_t kv, std::int32_t head,
                                              std::int32_t pos) const noexcept {
    return ((std::int64_t{b} * 2 + kv) * num_kv_heads + head) * std::int64_t{block_size} * row_bytes() +
           std::int64_t{pos} * row_bytes();
  }
};

/// How a model's KV pools lie in memory.
enum class kv_pool_layout : std::uint8_t {
  /// One pool per layer: layer l's block b at b x block_bytes of pool l (vLLM's default).
  per_layer,
  /// One pool for all layers, block-major: block b's layers lie together, layer l at (b x num_layers + l) x
  /// block_bytes, so a block's bytes across all layers move as one run (a swap or copy of n blocks is n runs of
  /// num_layers x block_bytes, not n x num_layers pieces; vLLM's cross-layer layout for offloading).
  block_major,
};

KVPAGER_NAMESPACE_END
