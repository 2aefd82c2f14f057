// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// can_implement: whether the compiled kernels run a KV pool of a given geometry (CUTLASS's can_implement step),
/// asked once when an engine creates its cache rather than discovered at the first kernel call. Accepts exactly what
/// every decode and kv_append call accepts (kvpager_can_implement in the C ABI, the same check the kernels run); an
/// fp8_e4m3 geometry is accepted and run by the _fp8 functions (kv_append_fp8, decode_fp8, or
/// paged_attention_decode_cpu with decode_params::k_scale/v_scale/q_dtype).
/// Needs libkvpager_kernels (kvpager::kernels).

#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kvpager/core/config.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/kernels/kernel_status.hpp"

KVPAGER_NAMESPACE_BEGIN

/// ok_status() when the kernels run `g`; otherwise kernel_status of the code the kernels would return for it:
/// errc::invalid_argument for num_kv_heads <= 0 (BAD_HEADS) or a non-positive or oversized pool,
/// errc::unsupported for a head dim, dtype or block size the kernels do not run. Pure arithmetic; never throws.
[[nodiscard]] inline status can_implement(const kv_geometry& g) noexcept {
  return kernel_status(
      kvpager_can_implement(g.num_blocks, g.block_size, g.num_kv_heads, g.head_dim, static_cast<std::int32_t>(g.dtype)));
}

KVPAGER_NAMESPACE_END
