// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// kv_dtype and elem_bytes: the KV element types and their one element-size function, apart from kv_geometry so
/// that the kernels' checks (compiled by nvcc too) can include them alone.

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

KVPAGER_NAMESPACE_END
