// SPDX-License-Identifier: Apache-2.0
// CPU block moves: kv_append (new tokens' K/V through the slot mapping; into an fp8 E4M3 pool, quantized with the
// layer's scales), copy_blocks (within each layer's pool) and swap_blocks (between two pools). One operation each over
// one params struct (kvpager/kernels/block_moves.hpp), validated once (kernels/common/checks.hpp) before a byte is
// written; the C functions fill the struct and forward.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/block_moves.hpp"
#include "kvpager/kernels/float16.hpp"
#include "kvpager/kernels/float8.hpp"
#include "kvpager/kernels/kernel_status.hpp"
#include "kernels/common/checks.hpp"
#include "kernels/cpu/c_args.hpp"
#include "kernels/cpu/page_tables.hpp"

namespace {

namespace kd = kvpager::kernels::detail;

/// The one validation of an append, every pool dtype (checks.hpp's check_append, fp8 a value of kv.dtype), then the
/// view's extent and every slot.
int32_t check_append_params(const kvpager::append_params& p) {
  const kvpager::paged_kv_view& kv = p.kv;
  if (const int32_t rc = kd::check_append(kv.data, p.key, p.value, p.slot_mapping, p.num_tokens, kv.num_kv_heads,
                                          kv.head_dim, kv.block_size, kv.num_blocks, kv.dtype, p.src_dtype, p.k_scale,
                                          p.v_scale);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (kd::view_extent_bytes(kv, kd::elem_bytes(kv.dtype)) < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  const std::int64_t slots = std::int64_t{kv.num_blocks} * kv.block_size;
  for (int32_t t = 0; t < p.num_tokens; ++t)
    if (p.slot_mapping[t] >= slots) return KVPAGER_STATUS_INVALID_BLOCK;
  return KVPAGER_STATUS_OK;
}

/// Calls row(token, head, k offset, v offset) for every written row: the destination element offsets of the K and V
/// rows through the view (view.offset, the one address rule).
template <class Row>
void for_each_row(const kvpager::append_params& p, Row row) {
  const kvpager::paged_kv_view& kv = p.kv;
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const int64_t s = p.slot_mapping[t];
    if (s < 0) continue;
    const std::int64_t b = s / kv.block_size;
    const auto off = static_cast<std::int32_t>(s % kv.block_size);
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) row(t, h, kv.offset(b, 0, h, off), kv.offset(b, 1, h, off));
  }
}

int32_t append(const kvpager::append_params& p) {
  if (const int32_t rc = check_append_params(p); rc != KVPAGER_STATUS_OK) return rc;
  const kvpager::paged_kv_view& kv = p.kv;
  const std::int64_t D = kv.head_dim;
  // Every offset below is inside the pool (view_extent_bytes) or the key/value arrays, whose sizes the checks
  // bounded in int64.
  if (kv.dtype != KVPAGER_DTYPE_FP8_E4M3) {
    const std::int64_t es = kd::elem_bytes(kv.dtype);
    auto* cache = static_cast<std::byte*>(const_cast<void*>(kv.data));
    const auto* k = static_cast<const std::byte*>(p.key);
    const auto* v = static_cast<const std::byte*>(p.value);
    const auto row = static_cast<std::size_t>(D * es);
    for_each_row(p, [&](int32_t t, int32_t h, std::int64_t kd_off, std::int64_t vd_off) {
      const std::int64_t src = (std::int64_t{t} * kv.num_kv_heads + h) * D * es;
      std::memcpy(cache + kd_off * es, k + src, row);
      std::memcpy(cache + vd_off * es, v + src, row);
    });
    return KVPAGER_STATUS_OK;
  }
  auto* cache = static_cast<std::uint8_t*>(const_cast<void*>(kv.data));
  const int32_t src_dtype = p.src_dtype;
  auto load = [src_dtype](const void* base, std::int64_t i) {
    if (src_dtype == KVPAGER_DTYPE_FP32) return static_cast<const float*>(base)[i];
    const std::uint16_t x = static_cast<const std::uint16_t*>(base)[i];
    return src_dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::half_to_float(x) : kvpager::detail::bf16_to_float(x);
  };
  for_each_row(p, [&](int32_t t, int32_t h, std::int64_t kd_off, std::int64_t vd_off) {
    const std::int64_t src = (std::int64_t{t} * kv.num_kv_heads + h) * D;
    for (std::int64_t d = 0; d < D; ++d) {
      cache[kd_off + d] = kvpager::detail::float_to_e4m3(load(p.key, src + d) / p.k_scale);
      cache[vd_off + d] = kvpager::detail::float_to_e4m3(load(p.value, src + d) / p.v_scale);
    }
  });
  return KVPAGER_STATUS_OK;
}

int32_t copy(const kvpager::copy_params& p) {
  if (const int32_t rc = kd::check_copy(p.layers, p.num_layers, p.pairs, p.num_pairs, p.num_blocks, p.block_bytes,
                                        kd::memory::host);
      rc != KVPAGER_STATUS_OK)
    return rc;
  for (int32_t l = 0; l < p.num_layers && p.num_pairs > 0; ++l) {
    auto* cache = static_cast<std::byte*>(p.layers[l]);
    for (int32_t i = 0; i < p.num_pairs; ++i) {
      const int64_t src = p.pairs[2 * std::int64_t{i}], dst = p.pairs[2 * std::int64_t{i} + 1];
      if (src == dst) continue;  // nothing to copy (and memcpy must not be given overlapping regions)
      std::memcpy(cache + dst * p.block_bytes, cache + src * p.block_bytes, static_cast<std::size_t>(p.block_bytes));
    }
  }
  return KVPAGER_STATUS_OK;
}

int32_t swap(const kvpager::swap_params& p) {
  if (const int32_t rc = kd::check_swap(p.dst, p.dst_blocks, p.src, p.src_blocks, p.block_bytes, p.pairs, p.num_pairs);
      rc != KVPAGER_STATUS_OK)
    return rc;
  return kd::for_each_run(p.pairs, p.num_pairs, [&](int64_t from, int64_t to, int64_t n) {
    auto* d = static_cast<std::byte*>(p.dst) + to * p.block_bytes;
    const auto* s = static_cast<const std::byte*>(p.src) + from * p.block_bytes;
    if (d != s) std::memmove(d, s, static_cast<std::size_t>(n * p.block_bytes));  // a run onto itself copies nothing
    return KVPAGER_STATUS_OK;
  });
}

/// The params of a C call: its pool in the default layout, and its tokens.
kvpager::append_params c_append(void* kv_cache, int32_t dtype, int32_t num_blocks, int32_t num_kv_heads,
                                int32_t block_size, int32_t head_dim, const void* key, const void* value,
                                const int64_t* slot_mapping, int32_t num_tokens) {
  kvpager::append_params p;
  p.kv = kvpager::paged_kv_view::hnd(kv_cache, dtype, num_blocks, num_kv_heads, block_size, head_dim);
  p.key = key;
  p.value = value;
  p.slot_mapping = slot_mapping;
  p.num_tokens = num_tokens;
  return p;
}

}  // namespace

KVPAGER_NAMESPACE_BEGIN

status kv_append_cpu(const append_params& p) noexcept { return kernel_status(append(p)); }
status copy_blocks_cpu(const copy_params& p) noexcept { return kernel_status(copy(p)); }
status swap_blocks_cpu(const swap_params& p) noexcept { return kernel_status(swap(p)); }

KVPAGER_NAMESPACE_END

extern "C" {

int32_t kvpager_cpu_kv_append(void* kv_cache, const void* key, const void* value, const int64_t* slot_mapping,
                              int32_t num_tokens, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                              int32_t num_blocks, int32_t dtype) {
  // The plain entry point: key and value of the pool's dtype (an fp8 dtype is then UNSUPPORTED_DTYPE in the geometry's
  // order, as the plain path answers it).
  kvpager::append_params p = c_append(kv_cache, dtype, num_blocks, num_kv_heads, block_size, head_dim, key, value,
                                      slot_mapping, num_tokens);
  p.src_dtype = dtype;
  return append(p);
}

int32_t kvpager_cpu_kv_append_fp8(void* kv_cache, const void* key, const void* value, const int64_t* slot_mapping,
                                  int32_t num_tokens, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                                  int32_t num_blocks, int32_t src_dtype, float k_scale, float v_scale) {
  kvpager::append_params p = c_append(kv_cache, KVPAGER_DTYPE_FP8_E4M3, num_blocks, num_kv_heads, block_size, head_dim,
                                      key, value, slot_mapping, num_tokens);
  p.src_dtype = kd::fp8_entry_io_dtype(src_dtype);
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  return append(p);
}

int32_t kvpager_cpu_append(const kvpager_append_args* args) {
  kvpager_append_args a;
  if (const int32_t rc = kd::read_c_args(args, a); rc != KVPAGER_STATUS_OK) return rc;
  if (a.kv.reserved != 0 || a.reserved != 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  kvpager::append_params p;
  p.kv = kd::view_of(a.kv);
  p.key = a.key;
  p.value = a.value;
  p.slot_mapping = a.slot_mapping;
  p.num_tokens = a.num_tokens;
  p.src_dtype = a.src_dtype;
  p.k_scale = a.k_scale;
  p.v_scale = a.v_scale;
  return append(p);
}

int32_t kvpager_cpu_copy_blocks(void* const* kv_caches, int32_t num_layers, const int64_t* block_mapping,
                                int32_t num_pairs, int32_t num_blocks, int64_t block_bytes) {
  return copy({kv_caches, num_layers, block_mapping, num_pairs, num_blocks, block_bytes});
}

int32_t kvpager_cpu_swap_blocks(void* dst, int32_t dst_blocks, const void* src, int32_t src_blocks, int64_t block_bytes,
                                const int64_t* pairs, int32_t num_pairs) {
  return swap({dst, dst_blocks, src, src_blocks, block_bytes, pairs, num_pairs});
}

}  // extern "C"
