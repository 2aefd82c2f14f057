// SPDX-License-Identifier: Apache-2.0
// CPU block moves of the C ABI: kv_append (new tokens' K/V through the slot mapping; kv_append_fp8 quantizes them
// into an fp8 E4M3 pool), copy_blocks (within each
// layer's pool) and swap_blocks (between two pools). Every argument and every id is checked (kernels/common/checks.hpp)
// before a byte is written.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/float16.hpp"
#include "kvpager/kernels/float8.hpp"
#include "kernels/common/checks.hpp"

extern "C" {

int32_t kvpager_cpu_kv_append(void* kv_cache, const void* key, const void* value, const int64_t* slot_mapping,
                              int32_t num_tokens, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                              int32_t num_blocks, int32_t dtype) {
  if (const int32_t rc = kvpager::kernels::detail::check_append(kv_cache, key, value, slot_mapping, num_tokens, num_kv_heads,
                                                       head_dim, block_size, num_blocks, dtype);
      rc != KVPAGER_STATUS_OK)
    return rc;
  const std::int64_t slots = std::int64_t{num_blocks} * block_size;
  for (int32_t t = 0; t < num_tokens; ++t)
    if (slot_mapping[t] >= slots) return KVPAGER_STATUS_INVALID_BLOCK;
  // Every offset below is inside the pool or the key/value arrays, whose sizes check_append bounded in int64.
  const std::int64_t row = std::int64_t{head_dim} * kvpager::kernels::detail::elem_bytes(dtype);  // bytes
  const std::int64_t head_stride = std::int64_t{block_size} * row, half = std::int64_t{num_kv_heads} * head_stride;
  auto* cache = static_cast<std::byte*>(kv_cache);
  const auto* k = static_cast<const std::byte*>(key);
  const auto* v = static_cast<const std::byte*>(value);
  for (int32_t t = 0; t < num_tokens; ++t) {
    const int64_t s = slot_mapping[t];
    if (s < 0) continue;
    const std::int64_t b = s / block_size, off = s % block_size;
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      const std::int64_t src = (std::int64_t{t} * num_kv_heads + h) * row;
      const std::int64_t dst = b * 2 * half + h * head_stride + off * row;
      std::memcpy(cache + dst, k + src, static_cast<std::size_t>(row));
      std::memcpy(cache + dst + half, v + src, static_cast<std::size_t>(row));
    }
  }
  return KVPAGER_STATUS_OK;
}

int32_t kvpager_cpu_kv_append_fp8(void* kv_cache, const void* key, const void* value, const int64_t* slot_mapping,
                                  int32_t num_tokens, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                                  int32_t num_blocks, int32_t src_dtype, float k_scale, float v_scale) {
  namespace kd = kvpager::kernels::detail;
  if (const int32_t rc = kd::check_append_fp8(kv_cache, key, value, slot_mapping, num_tokens, num_kv_heads, head_dim,
                                              block_size, num_blocks, src_dtype, k_scale, v_scale);
      rc != KVPAGER_STATUS_OK)
    return rc;
  const std::int64_t slots = std::int64_t{num_blocks} * block_size;
  for (int32_t t = 0; t < num_tokens; ++t)
    if (slot_mapping[t] >= slots) return KVPAGER_STATUS_INVALID_BLOCK;
  // Offsets in elements; the pool has one byte per element. Every offset is inside the buffers check_append_fp8
  // bounded in int64.
  const std::int64_t D = head_dim, head_stride = std::int64_t{block_size} * D, half = std::int64_t{num_kv_heads} * head_stride;
  auto* cache = static_cast<std::uint8_t*>(kv_cache);
  auto load = [src_dtype](const void* base, std::int64_t i) {
    if (src_dtype == KVPAGER_DTYPE_FP32) return static_cast<const float*>(base)[i];
    const std::uint16_t x = static_cast<const std::uint16_t*>(base)[i];
    return src_dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::half_to_float(x) : kvpager::detail::bf16_to_float(x);
  };
  for (int32_t t = 0; t < num_tokens; ++t) {
    const int64_t s = slot_mapping[t];
    if (s < 0) continue;
    const std::int64_t b = s / block_size, off = s % block_size;
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      const std::int64_t src = (std::int64_t{t} * num_kv_heads + h) * D;
      std::uint8_t* dst = cache + b * 2 * half + h * head_stride + off * D;
      for (std::int64_t d = 0; d < D; ++d) {
        dst[d] = kvpager::detail::float_to_e4m3(load(key, src + d) / k_scale);
        dst[half + d] = kvpager::detail::float_to_e4m3(load(value, src + d) / v_scale);
      }
    }
  }
  return KVPAGER_STATUS_OK;
}

int32_t kvpager_cpu_copy_blocks(void* const* kv_caches, int32_t num_layers, const int64_t* block_mapping,
                                int32_t num_pairs, int32_t num_blocks, int64_t block_bytes) {
  if (const int32_t rc = kvpager::kernels::detail::check_copy(kv_caches, num_layers, block_mapping, num_pairs, num_blocks,
                                                     block_bytes, kvpager::kernels::detail::memory::host);
      rc != KVPAGER_STATUS_OK)
    return rc;
  for (int32_t l = 0; l < num_layers && num_pairs > 0; ++l) {
    auto* cache = static_cast<std::byte*>(kv_caches[l]);
    for (int32_t p = 0; p < num_pairs; ++p) {
      const int64_t src = block_mapping[2 * std::int64_t{p}], dst = block_mapping[2 * std::int64_t{p} + 1];
      if (src == dst) continue;  // nothing to copy (and memcpy must not be given overlapping regions)
      std::memcpy(cache + dst * block_bytes, cache + src * block_bytes, static_cast<std::size_t>(block_bytes));
    }
  }
  return KVPAGER_STATUS_OK;
}

int32_t kvpager_cpu_swap_blocks(void* dst, int32_t dst_blocks, const void* src, int32_t src_blocks, int64_t block_bytes,
                                const int64_t* pairs, int32_t num_pairs) {
  if (const int32_t rc = kvpager::kernels::detail::check_swap(dst, dst_blocks, src, src_blocks, block_bytes, pairs, num_pairs);
      rc != KVPAGER_STATUS_OK)
    return rc;
  return kvpager::kernels::detail::for_each_run(pairs, num_pairs, [&](int64_t from, int64_t to, int64_t n) {
    auto* d = static_cast<std::byte*>(dst) + to * block_bytes;
    const auto* s = static_cast<const std::byte*>(src) + from * block_bytes;
    if (d != s) std::memmove(d, s, static_cast<std::size_t>(n * block_bytes));  // a run onto itself copies nothing
    return KVPAGER_STATUS_OK;
  });
}

}  // extern "C"
