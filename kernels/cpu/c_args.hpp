// SPDX-License-Identifier: Apache-2.0
#pragma once
// The struct-taking C entry points' side of the ABI policy (CHANGELOG, "C ABI policy"; include/kvpager/c/kernels.h):
// reading a caller's struct by its struct_size, and the C views copied into the C++ ones field by field. Internal to
// libkvpager_kernels.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/attention.hpp"

namespace kvpager::kernels::detail {

/// Copies the caller's *in into out when its struct_size (its first field) is at least this library's sizeof(Args)
/// and every byte past that is zero; INVALID_ARGUMENT (out untouched) for a NULL pointer, a smaller size or a non-zero
/// byte past the known fields.
template <class Args>
std::int32_t read_c_args(const Args* in, Args& out) noexcept {
  static_assert(offsetof(Args, struct_size) == 0, "an args struct starts with its size");
  if (in == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  std::uint32_t size = 0;
  std::memcpy(&size, in, sizeof size);
  if (size < sizeof(Args)) return KVPAGER_STATUS_INVALID_ARGUMENT;
  const auto* bytes = reinterpret_cast<const unsigned char*>(in);
  for (std::size_t i = sizeof(Args); i < size; ++i)
    if (bytes[i] != 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  std::memcpy(&out, in, sizeof(Args));
  return KVPAGER_STATUS_OK;
}

inline kvpager::paged_kv_view view_of(const kvpager_kv_view& v) noexcept {
  return {v.data,         v.dtype,     v.num_blocks, v.num_kv_heads, v.block_size,
          v.head_dim,     v.stride_block, v.stride_kv, v.stride_head,  v.stride_token};
}

inline kvpager::page_table_view pages_of(const kvpager_page_table& t) noexcept {
  return {t.block_table, t.row_stride, t.seq_lens, t.indptr, t.indices, t.last_page_len};
}

/// The fields a kvpager_decode_args and a kvpager_prefill_args (Args) share with their params struct (Params).
template <class Params, class Args>
Params attention_params_of(const Args& a) noexcept {
  Params p;
  p.out = a.out;
  p.query = a.query;
  p.lse = a.lse;
  p.kv = view_of(a.kv);
  p.pages = pages_of(a.pages);
  p.num_seqs = a.num_seqs;
  p.num_q_heads = a.num_q_heads;
  p.scale = a.scale;
  p.window_left = a.window_left;
  p.logits_soft_cap = a.logits_soft_cap;
  p.num_threads = a.num_threads;
  p.q_dtype = a.q_dtype;
  p.k_scale = a.k_scale;
  p.v_scale = a.v_scale;
  return p;
}

}  // namespace kvpager::kernels::detail
