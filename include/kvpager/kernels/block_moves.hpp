// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// C++ interface of the CPU block-move kernels: one params struct per operation and one call each, returning
/// kvpager::status (kernel_status of the C ABI's code). The C functions kvpager_cpu_kv_append, kvpager_cpu_kv_append_fp8,
/// kvpager_cpu_copy_blocks and kvpager_cpu_swap_blocks (kvpager/c/kernels.h) fill these structs and call the same
/// operation, so each call is validated once, by one check. fp8 is a dtype value, not a family: an append into a pool
/// of dtype KVPAGER_DTYPE_FP8_E4M3 quantizes its fp32/fp16/bf16 K/V with the layer's scales. Implemented in
/// libkvpager_kernels (kvpager::kernels).

#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/kernels/attention.hpp"
#include "kvpager/kernels/export.hpp"

KVPAGER_NAMESPACE_BEGIN

/// kv_append: new tokens' K and V written into the pool through the slot mapping.
struct append_params {
  /// The pool written (through the view's strides: HND, NHD, ...; its `data` is written although the view holds it
  /// as const). dtype fp32, fp16, bf16 or fp8 E4M3.
  paged_kv_view kv{};
  const void* key = nullptr;    ///< [num_tokens, kv.num_kv_heads, kv.head_dim] of src_dtype, contiguous
  const void* value = nullptr;  ///< same shape and dtype
  const std::int64_t* slot_mapping = nullptr;  ///< [num_tokens]: block * block_size + offset; a negative slot is skipped
  std::int32_t num_tokens = 0;
  /// dtype of key and value: -1 (the default) = kv.dtype, the only choice for an fp32/fp16/bf16 pool (-1 or kv.dtype;
  /// another value is UNSUPPORTED_DTYPE); an fp8 pool needs fp32, fp16 or bf16 here (-1 or fp8: UNSUPPORTED_DTYPE, in
  /// the geometry's order, as the plain kv_append answers dtype 3; another value: after the geometry) and stores
  /// e4m3(x / k_scale) for K and e4m3(x / v_scale) for V (round to nearest even, saturated to +-448, NaN kept).
  std::int32_t src_dtype = -1;
  float k_scale = 1.0F, v_scale = 1.0F;  ///< fp8 pools only (finite and > 0, else invalid_argument)
};

/// Runs kv_append. Checks, in the C functions' order, before anything is written: for a plain pool num_tokens
/// (>= 0), the geometry (as kvpager_can_implement: BAD_HEADS, UNSUPPORTED_HEAD_DIM, UNSUPPORTED_DTYPE,
/// UNSUPPORTED_BLOCK_SIZE, INVALID_ARGUMENT), src_dtype; for an fp8 pool num_tokens and the scales, the geometry,
/// src_dtype (UNSUPPORTED_DTYPE); then the view's extent, the key/value size within int64 and the pointers (NULL only
/// with num_tokens = 0; INVALID_ARGUMENT), and every slot (INVALID_BLOCK for slot >= num_blocks x block_size).
[[nodiscard]] KVPAGER_KERNELS_EXPORT status kv_append_cpu(const append_params& p) noexcept;

/// copy_blocks: whole blocks copied within each layer's pool (copy-on-write, copying forks).
struct copy_params {
  void* const* layers = nullptr;      ///< num_layers pools of num_blocks blocks of block_bytes bytes
  std::int32_t num_layers = 0;
  const std::int64_t* pairs = nullptr;  ///< [num_pairs, 2] (src, dst); no destination is also a source
  std::int32_t num_pairs = 0;
  std::int32_t num_blocks = 0;
  std::int64_t block_bytes = 0;
};

/// Runs copy_blocks (kvpager_cpu_copy_blocks documents the checks); every id is checked before anything is copied.
[[nodiscard]] KVPAGER_KERNELS_EXPORT status copy_blocks_cpu(const copy_params& p) noexcept;

/// swap_blocks: whole blocks copied from one pool to another (device <-> host), runs of consecutive pairs merged.
struct swap_params {
  void* dst = nullptr;
  std::int32_t dst_blocks = 0;
  const void* src = nullptr;
  std::int32_t src_blocks = 0;
  std::int64_t block_bytes = 0;
  const std::int64_t* pairs = nullptr;  ///< [num_pairs, 2] (src block, dst block)
  std::int32_t num_pairs = 0;
};

/// Runs swap_blocks (kvpager_cpu_swap_blocks documents the checks); every id is checked before anything is copied.
[[nodiscard]] KVPAGER_KERNELS_EXPORT status swap_blocks_cpu(const swap_params& p) noexcept;

KVPAGER_NAMESPACE_END
