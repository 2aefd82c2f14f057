// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// kv_geometry: the shape of one layer's paged KV pool (blocks, tokens per block, KV heads, head dim, element type),
/// stated once and handed from the cache configuration to every kernel-facing type: kv_layout and paged_kv_view
/// derive from it, and kvpager::can_implement (kvpager/kernels/can_implement.hpp) says whether the compiled kernels
/// run it. A plain value type; it checks nothing itself.

#include <cstdint>

#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Element type of the KV cache (and, for f32/f16/bf16, of the query and output of decode). The values are the C
/// ABI's dtype codes (KVPAGER_DTYPE_FP32/FP16/BF16/FP8_E4M3 in kvpager/c/kernels.h), so a cast crosses the boundary
/// unchanged. fp8_e4m3 is a KV-cache type only (OCP E4M3FN with per-tensor scales; the kernels' _fp8 functions).
enum class kv_dtype : std::int32_t { f32 = 0, f16 = 1, bf16 = 2, fp8_e4m3 = 3 };

/// Bytes of one element: 4 for f32, 1 for fp8_e4m3, 2 for f16 and bf16 (and for a value outside the enumerators,
/// which the kernels reject).
[[nodiscard]] constexpr std::int32_t elem_bytes(kv_dtype t) noexcept {
  return t == kv_dtype::f32 ? 4 : t == kv_dtype::fp8_e4m3 ? 1 : 2;
}

/// The shape of one layer's paged KV pool. Sizes derived from it (kv_layout) are computed in 64 bits.
struct kv_geometry {
  std::int32_t num_blocks = 0;     ///< blocks in the pool
  std::int32_t block_size = 16;    ///< tokens per block (the kernels run 8, 16 and 32)
  std::int32_t num_kv_heads = 1;   ///< KV heads (query heads are a multiple, chosen per call)
  std::int32_t head_dim = 128;     ///< elements per head (the kernels run 64, 80, 96, 112, 128 and 256)
  kv_dtype dtype = kv_dtype::f16;  ///< element type

  friend constexpr bool operator==(const kv_geometry&, const kv_geometry&) = default;
};

KVPAGER_NAMESPACE_END
