// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// kv_geometry: the shape of one layer's paged KV pool (blocks, tokens per block, KV heads, head dim, element type),
/// stated once and handed from the cache configuration to every kernel-facing type: kv_layout and paged_kv_view
/// derive from it, and kvpager::can_implement (kvpager/kernels/can_implement.hpp) says whether the compiled kernels
/// run it. A plain value type; it checks nothing itself.

#include <cstdint>
#include <optional>

#include "kvpager/core/checked_math.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/dtype.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// The shape of one layer's paged KV pool. Sizes derived from it (kv_layout) are computed in 64 bits.
struct kv_geometry {
  std::int32_t num_blocks = 0;     ///< blocks in the pool
  std::int32_t block_size = default_block_size;  ///< tokens per block (the kernels run 8, 16 and 32)
  std::int32_t num_kv_heads = 1;   ///< KV heads (query heads are a multiple, chosen per call)
  std::int32_t head_dim = 128;     ///< elements per head (the kernels run 64, 80, 96, 112, 128 and 256)
  kv_dtype dtype = kv_dtype::f16;  ///< element type

  friend constexpr bool operator==(const kv_geometry&, const kv_geometry&) = default;
};

namespace detail {
/// 2 x block_size x num_kv_heads x head_dim x element bytes x num_layers in checked int64 arithmetic; 0 for a
/// non-positive dimension or layer count, -1 where the product does not fit.
[[nodiscard]] constexpr std::int64_t block_bytes_or_flag(const kv_geometry& g, std::int32_t num_layers) noexcept {
  if (g.block_size <= 0 || g.num_kv_heads <= 0 || g.head_dim <= 0 || num_layers <= 0) return 0;
  std::int64_t b = 2 * std::int64_t{elem_bytes(g.dtype)};
  for (const std::int64_t f : {std::int64_t{g.block_size}, std::int64_t{g.num_kv_heads}, std::int64_t{g.head_dim},
                               std::int64_t{num_layers}}) {
    const std::optional<std::int64_t> p = checked_mul(b, f);
    if (!p) return -1;
    b = *p;
  }
  return b;
}
}  // namespace detail

/// Bytes one block of geometry `g` holds over `num_layers` layers, K and V: 2 x block_size x num_kv_heads x head_dim
/// x elem_bytes(dtype) x num_layers, in checked arithmetic; 0 for a non-positive dimension or layer count and for a
/// block whose bytes do not fit in int64 (checked_block_bytes says which). The one statement of a block's size:
/// kv_layout, the monitor's kv_bytes_per_block and the swap cost model's kv_block_bytes are this function.
/// Llama-2-7B in fp16 (32 KV heads, head dim 128, 16 tokens a block, 32 layers): 8 MiB.
[[nodiscard]] constexpr std::int64_t block_bytes(const kv_geometry& g, std::int32_t num_layers = 1) noexcept {
  const std::int64_t b = detail::block_bytes_or_flag(g, num_layers);
  return b > 0 ? b : 0;
}

/// block_bytes with its errors: errc::invalid_argument for a non-positive dimension or layer count, or a block
/// whose bytes do not fit in int64.
[[nodiscard]] inline result<std::int64_t> checked_block_bytes(const kv_geometry& g,
                                                              std::int32_t num_layers = 1) noexcept {
  const std::int64_t b = detail::block_bytes_or_flag(g, num_layers);
  if (b == 0)
    return status{errc::invalid_argument, "block_bytes: block size, KV heads, head dim and layers must be positive"};
  if (b < 0) return status{errc::invalid_argument, "block_bytes: the block's bytes do not fit in 64 bits", g.block_size};
  return b;
}

KVPAGER_NAMESPACE_END
