// SPDX-License-Identifier: Apache-2.0
// CPU paged decode attention over an fp8 E4M3 KV pool (KVPAGER_DTYPE_FP8_E4M3; issue 12, point 3): the C function
// kvpager_cpu_paged_attention_decode_fp8 and the fp8 branch of kvpager::paged_attention_decode_cpu. K = e4m3 x
// k_scale, V = e4m3 x v_scale with per-tensor scales; query and output fp32/fp16/bf16 (q_dtype). The point is
// bandwidth: the kernel reads one byte per KV element and converts it in registers. Same validation rules
// (kernels/common/checks.hpp, page_tables.hpp: everything checked before a KV byte is read or an output written), the
// same split-KV plan and fp32 merge and the same worker pool as decode.cpp; the kernel itself (decode_fp8.inc) is
// compiled for AVX-512, AVX2 and portable C++, chosen at run time like decode.cpp's (kvpager_cpu_decode_path, capped
// by KVPAGER_CPU_DISPATCH). Work items are (sequence, KV head, tile of up to kItemHeads query heads, split), so every
// buffer an item needs is on its stack: no allocation besides an optional split workspace.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/attention.hpp"
#include "kvpager/kernels/float16.hpp"
#include "kvpager/kernels/float8.hpp"
#include "kernels/common/checks.hpp"
#include "kernels/common/decode_math.hpp"
#include "kernels/cpu/decode_fp8.hpp"
#include "kernels/cpu/fp8_convert.hpp"
#include "kernels/cpu/element_ops.hpp"
#include "kernels/cpu/vec_ops.hpp"
#include "kernels/cpu/page_tables.hpp"
#include "worker_pool.hpp"

namespace {

/// Query heads per work item (every buffer of an item is on its stack); a larger group is cut into several items.
constexpr std::int32_t kItemHeads = 8;
/// Tokens per online-softmax chunk (a multiple of every path's vector width).
constexpr std::int32_t kChunk = 32;
constexpr std::int64_t kMaxHeadDim = 256;

/// One call's constants, shared by its work items. Strides in bytes (elements of one byte).
struct fp8_call {
  const unsigned char* kv;
  const kvpager::page_table_view* pages;
  const void* query;
  std::int64_t D, bs, stride_block, stride_kv, stride_head, stride_token;
  std::int32_t hq, group, q_dtype;
  float qscale;  ///< scale x k_scale
  float cap;     ///< logit soft cap (0: none)
};

using kvpager::kernels::detail::load_one;
using kvpager::kernels::detail::store_one;

namespace portable_fp8 {
struct isa : kvpager::kernels::detail::scalar_vec {
  static constexpr int score_tokens = reduce_tokens;
  static constexpr int acc_vectors = 4;
};
#include "decode_fp8.inc"
}  // namespace portable_fp8

}  // namespace

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVPAGER_HAVE_X86_FP8_PATHS 1
#endif

#if defined(KVPAGER_HAVE_X86_FP8_PATHS)
// Each path under its own #pragma GCC target, reached only after the CPU was checked at run time (decode.cpp's
// dispatch); the library itself targets baseline x86-64.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace {
namespace avx2_fp8 {
struct isa : kvpager::kernels::detail::avx2_vec {
  static constexpr int score_tokens = reduce_tokens;  // 2 tokens x 4 heads = 8 accumulators of 16 registers
  static constexpr int acc_vectors = 2;
};
#include "decode_fp8.inc"
}  // namespace avx2_fp8
}  // namespace
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
namespace {
namespace avx512_fp8 {
struct isa : kvpager::kernels::detail::avx512_vec {
  static constexpr int score_tokens = reduce_tokens;  // 4 tokens x 4 heads = 16 accumulators of 32 registers
  static constexpr int acc_vectors = 4;
};
#include "decode_fp8.inc"
}  // namespace avx512_fp8
}  // namespace
#pragma GCC pop_options
#endif  // KVPAGER_HAVE_X86_FP8_PATHS

namespace {

using item_fn = void (*)(const fp8_call&, std::int32_t, std::int32_t, std::int32_t, std::int32_t, std::int32_t,
                         std::int32_t, float*, float*, float*);
using store_fn = void (*)(void*, std::int64_t, const float*, float, std::int32_t, std::int64_t);
struct fp8_kernel {
  item_fn item;
  store_fn store;
};

/// The kernel of the path decode.cpp's dispatch chose (the same CPU check and KVPAGER_CPU_DISPATCH cap).
fp8_kernel pick_kernel() noexcept {
#if defined(KVPAGER_HAVE_X86_FP8_PATHS)
  const char* path = kvpager_cpu_decode_path();
  if (std::strcmp(path, "avx512") == 0) return {&avx512_fp8::decode_item, &avx512_fp8::store_row};
  if (std::strcmp(path, "avx2") == 0) return {&avx2_fp8::decode_item, &avx2_fp8::store_row};
#endif
  return {&portable_fp8::decode_item, &portable_fp8::store_row};
}

/// Every argument, page tables included, before any KV memory is read.
std::int32_t validate_fp8(const kvpager::decode_params& p) noexcept {
  namespace kd = kvpager::kernels::detail;
  const auto& kv = p.kv;
  if (p.num_threads < 0 || p.num_splits < 0 || p.workspace_bytes < 0 ||
      reinterpret_cast<std::uintptr_t>(p.workspace) % alignof(float) != 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const std::int32_t rc =
          kd::check_decode_fp8_args(p.num_seqs, p.num_q_heads, kv.num_kv_heads, kv.head_dim, kv.block_size, p.q_dtype,
                                    kv.num_blocks, p.scale, p.k_scale, p.v_scale, std::max(p.num_splits, 1));
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (const std::int32_t rc = kd::check_window_and_cap(p.window_left, p.logits_soft_cap); rc != KVPAGER_STATUS_OK)
    return rc;
  if (kd::view_extent_bytes(kv, 1) < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (p.num_seqs == 0) return KVPAGER_STATUS_OK;
  if (p.out == nullptr || p.query == nullptr || kv.data == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  return kd::check_pages(p.pages, p.num_seqs, kv.block_size, kv.num_blocks);
}

}  // namespace

namespace kvpager::kernels::detail {

std::int32_t decode_fp8_cpu(const kvpager::decode_params& p) noexcept {
  if (const std::int32_t rc = validate_fp8(p); rc != KVPAGER_STATUS_OK) return rc;
  if (p.num_seqs == 0) return KVPAGER_STATUS_OK;
  const auto& kv = p.kv;
  const std::int64_t D = kv.head_dim;
  const std::int32_t hkv = kv.num_kv_heads, group = p.num_q_heads / kv.num_kv_heads;
  const std::int32_t tiles = (group + kItemHeads - 1) / kItemHeads;
  std::int32_t max_len = 0;
  std::int64_t total_len = 0;
  for (std::int32_t s = 0; s < p.num_seqs; ++s) {
    const std::int32_t full = page_length(p.pages, s, kv.block_size);
    const std::int32_t len = full - window_start(full, p.window_left);  // the tokens the query sees
    max_len = std::max(max_len, len);
    total_len += len;
  }
  // A call this small runs on the calling thread (as decode.cpp decides): waking workers would cost more.
  const std::int32_t threads =
      p.num_threads == 0 && total_len < 8192 && total_len * p.num_q_heads < 8192 ? 1 : p.num_threads;
  const auto units = static_cast<std::int32_t>(
      std::min<std::int64_t>(std::int64_t{hkv} * tiles, std::numeric_limits<std::int32_t>::max()));
  const std::int32_t splits = p.num_splits > 0 ? p.num_splits : kvpager::plan_decode(p.num_seqs, units, max_len, threads);
  std::unique_ptr<float[]> owned;
  float* part = nullptr;
  if (splits > 1) {
    const std::int64_t bytes = decode_workspace_bytes(p.num_seqs, p.num_q_heads, kv.head_dim, splits);
    if (p.workspace != nullptr) {
      if (bytes < 0 || p.workspace_bytes < bytes) return KVPAGER_STATUS_INVALID_ARGUMENT;
      part = static_cast<float*>(p.workspace);
    } else {
      if (bytes < 0 || static_cast<std::uint64_t>(bytes) > std::numeric_limits<std::size_t>::max())
        return KVPAGER_STATUS_OUT_OF_MEMORY;
      owned.reset(new (std::nothrow) float[static_cast<std::size_t>(bytes) / sizeof(float)]);
      if (!owned) return KVPAGER_STATUS_OUT_OF_MEMORY;
      part = owned.get();
    }
  }
  auto state = [&](std::int64_t row, std::int64_t split) { return part + (row * splits + split) * (D + 2); };
  const fp8_call c{static_cast<const unsigned char*>(kv.data), &p.pages, p.query, D, kv.block_size, kv.stride_block,
                   kv.stride_kv, kv.stride_head, kv.stride_token, p.num_q_heads, group, p.q_dtype,
                   p.scale * p.k_scale, p.logits_soft_cap};
  const fp8_kernel kernel = pick_kernel();
  const std::int32_t q_dtype = p.q_dtype;
  const float v_scale = p.v_scale;
  parallel_for(std::int64_t{p.num_seqs} * hkv * tiles * splits, threads, [&](std::int64_t it) {
    const auto split = static_cast<std::int32_t>(it % splits);
    const auto tile = static_cast<std::int32_t>(it / splits % tiles);
    const auto h = static_cast<std::int32_t>(it / splits / tiles % hkv);
    const auto seq = static_cast<std::int32_t>(it / splits / tiles / hkv);
    const std::int32_t g0 = tile * kItemHeads, count = std::min(kItemHeads, group - g0);
    std::int32_t t0 = 0, t1 = 0;
    const std::int32_t len = page_length(p.pages, seq, kv.block_size);
    split_range_from(window_start(len, p.window_left), len, kv.block_size, splits, split, t0, t1);
    float m[kItemHeads], l[kItemHeads];
    alignas(64) float acc[kItemHeads * kMaxHeadDim];
    kernel.item(c, seq, h, g0, count, t0, t1, m, l, acc);
    for (std::int32_t g = 0; g < count; ++g) {
      const std::int64_t row = std::int64_t{seq} * p.num_q_heads + std::int64_t{h} * group + g0 + g;
      if (splits == 1) {  // the whole sequence: normalize and store here, no merge pass
        const float f = l[g] > 0.0F ? v_scale / l[g] : 0.0F;
        kernel.store(p.out, row, acc + g * D, f, q_dtype, D);
        if (p.lse != nullptr) p.lse[row] = lse_of(m[g], l[g]);
      } else {
        float* st = state(row, split);
        st[0] = m[g];
        st[1] = l[g];
        for (std::int64_t d = 0; d < D; ++d) st[2 + d] = acc[g * D + d] * v_scale;
      }
    }
  });
  if (splits == 1) return KVPAGER_STATUS_OK;
  // Merge the splits in fp32: out = sum_i exp(m_i - M) acc_i / sum_i exp(m_i - M) l_i.
  parallel_for(std::int64_t{p.num_seqs} * p.num_q_heads, threads, [&](std::int64_t row) {
    float M = -std::numeric_limits<float>::infinity();
    for (std::int32_t i = 0; i < splits; ++i)
      if (state(row, i)[1] > 0.0F) M = std::max(M, state(row, i)[0]);
    float L = 0.0F;
    float o[kMaxHeadDim] = {};
    if (M != -std::numeric_limits<float>::infinity()) {
      for (std::int32_t i = 0; i < splits; ++i) {
        const float* st = state(row, i);
        if (st[1] <= 0.0F) continue;
        const float w = std::exp(st[0] - M);
        L += w * st[1];
        for (std::int64_t d = 0; d < D; ++d) o[d] += w * st[2 + d];
      }
    }
    kernel.store(p.out, row, o, L > 0.0F ? 1.0F / L : 0.0F, q_dtype, D);
    if (p.lse != nullptr) p.lse[row] = lse_of(M, L);
  });
  return KVPAGER_STATUS_OK;
}

}  // namespace kvpager::kernels::detail

extern "C" {

int32_t kvpager_cpu_paged_attention_decode_fp8_ex(void* out, const void* query, const void* kv_cache,
                                                  const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                                  int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                                  int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                                  float scale, int32_t window_left, float logits_soft_cap,
                                                  int32_t q_dtype, float k_scale, float v_scale, int32_t num_threads) {
  if (const int32_t rc = kvpager::kernels::detail::check_dense_decode_fp8(
          out, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim, block_size,
          max_blocks_per_seq, num_blocks, scale, q_dtype, k_scale, v_scale, 1);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (const int32_t rc = kvpager::kernels::detail::check_window_and_cap(window_left, logits_soft_cap);
      rc != KVPAGER_STATUS_OK)
    return rc;
  auto p = kvpager::kernels::detail::dense_params<kvpager::decode_params>(
      out, query, kv_cache, KVPAGER_DTYPE_FP8_E4M3, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim,
      block_size, max_blocks_per_seq, num_blocks, scale, window_left, logits_soft_cap, num_threads);
  p.q_dtype = q_dtype;
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  return kvpager::kernels::detail::decode_fp8_cpu(p);
}

int32_t kvpager_cpu_paged_attention_decode_fp8(void* out, const void* query, const void* kv_cache,
                                               const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                               int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                               int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                               float scale, int32_t q_dtype, float k_scale, float v_scale,
                                               int32_t num_threads) {
  return kvpager_cpu_paged_attention_decode_fp8_ex(out, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads,
                                                   num_kv_heads, head_dim, block_size, max_blocks_per_seq, num_blocks,
                                                   scale, -1, 0.0F, q_dtype, k_scale, v_scale, num_threads);
}

}  // extern "C"
