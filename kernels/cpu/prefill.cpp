// SPDX-License-Identifier: Apache-2.0
// CPU paged prefill (extend) attention of the C ABI and of the C++ interface (kvpager/kernels/prefill.hpp): causal,
// optional sliding window and logit soft cap, GQA/MQA, fp32/fp16/bf16 with fp32 accumulation, and over fp8 E4M3
// pools (kvpager_cpu_paged_attention_prefill_fp8: query/output fp32/fp16/bf16, K/V rows read one byte per element and
// converted into the fp32 tiles, the scales folded into the query scale and the output). Every argument is
// validated before any KV memory is touched. Work items are (sequence, KV head, tile of query positions), handed
// to the process-wide worker pool (worker_pool.hpp) head by head (a head's KV stays in the caches from one item to
// the next), within a head the heaviest tiles (the last positions, which see the most KV) first. The kernel is
// prefill_tiled.inc, compiled four times: AVX-512 with and without AVX512-BF16 (bf16 KV's scores through vdpbf16ps)
// and AVX2 under #pragma GCC target, and a portable one; the path is the one the decode uses (cpu_path.hpp's
// pick_cpu_path: the same CPU check and the same KVPAGER_CPU_DISPATCH cap), so one process never mixes paths.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/attention.hpp"
#include "kvpager/kernels/float16.hpp"
#include "kvpager/kernels/float8.hpp"
#include "kvpager/kernels/kernel_status.hpp"
#include "kvpager/kernels/prefill.hpp"
#include "kernels/common/checks.hpp"
#include "kernels/common/decode_math.hpp"
#include "kernels/cpu/cpu_path.hpp"
#include "kernels/cpu/c_args.hpp"
#include "kernels/cpu/decode.hpp"
#include "kernels/cpu/fp8_convert.hpp"
#include "kernels/cpu/element_ops.hpp"
#include "kernels/cpu/page_tables.hpp"
#include "kernels/cpu/params_checks.hpp"
#include "kernels/cpu/vec_ops.hpp"
#include "worker_pool.hpp"

namespace {

using kvpager::detail::bf16_to_float;
using kvpager::detail::float_to_bf16;
using kvpager::detail::float_to_half;
using kvpager::detail::half_to_float;

using kvpager::kernels::detail::load_one;
using kvpager::kernels::detail::store_one;

using kvpager::kernels::detail::page_block_at;
using kvpager::kernels::detail::page_length;

/// Portable path: one float per "vector"; the same tiled algorithm, which the compiler may still vectorize.
namespace portable_path {
struct isa : kvpager::kernels::detail::scalar_vec {
  static constexpr int MR = 4;          // tokens (scores) or head dims (output) per register tile
  static constexpr int NVB = 4;         // vectors of query rows per register tile
  static constexpr int tile_rows = 16;  // query rows (positions x group heads) a work item aims for
  /// dst[j * ldd + i] = src[i * lds + j] over a W x W block (here one element).
  static void transpose(const float* src, std::int64_t /*lds*/, float* dst, std::int64_t /*ldd*/) { *dst = *src; }
};
#include "prefill_tiled.inc"
}  // namespace portable_path

}  // namespace

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVPAGER_HAVE_X86_PATHS 1
// The vector operations the prefill needs, per instruction set (the conversions round like decode.cpp's: fp16 by
// the hardware, bf16 to nearest even with NaN kept quiet). Each path is compiled under its own #pragma GCC target
// and reached only after the CPU was checked at run time; the library itself targets baseline x86-64.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace {
namespace avx2_path {
struct isa : kvpager::kernels::detail::avx2_vec {
  static constexpr int MR = 4;  // 4 x 3 accumulators + 3 row vectors + 1 broadcast = 16 registers
  static constexpr int NVB = 3;
  static constexpr int tile_rows = 96;  // 96 measured 5-15% faster than 48 at q_len >= 1024 (bench/RESULTS.md)
  /// dst[j * ldd + i] = src[i * lds + j] over an 8 x 8 block (the bits moved as they are).
  static void transpose(const float* src, std::int64_t lds, float* dst, std::int64_t ldd) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // r[4i + c], 128-bit lane k: column 4k + c of rows 4i..4i+3
    for (int i = 0; i < 2; ++i) {
      r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
      r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      _mm256_storeu_ps(dst + c * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
      _mm256_storeu_ps(dst + (4 + c) * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
    }
  }
};
#include "prefill_tiled.inc"
}  // namespace avx2_path
}  // namespace
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
namespace {
namespace avx512_path {
struct isa : kvpager::kernels::detail::avx512_vec {
  static constexpr int MR = 8;  // 8 x 3 accumulators + 3 row vectors + 1 broadcast = 28 of 32 registers
  static constexpr int NVB = 3;
  static constexpr int tile_rows = 96;  // 96 measured 5-15% faster than 48 at q_len >= 1024 (bench/RESULTS.md)
  /// dst[j * ldd + i] = src[i * lds + j] over a 16 x 16 block (the bits moved as they are).
  static void transpose(const float* src, std::int64_t lds, float* dst, std::int64_t ldd) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // r[4q + c], 128-bit lane k: column 4k + c of rows 4q..4q+3
    for (int q = 0; q < 4; ++q) {
      r[4 * q] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
      r[4 * q + 1] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], 0xEE);
      r[4 * q + 2] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
      r[4 * q + 3] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xEE);
    }
    for (int i = 0; i < 2; ++i)
      for (int c = 0; c < 4; ++c) {
        t[8 * i + c] = _mm512_shuffle_f32x4(r[8 * i + c], r[8 * i + 4 + c], 0x88);
        t[8 * i + 4 + c] = _mm512_shuffle_f32x4(r[8 * i + c], r[8 * i + 4 + c], 0xDD);
      }
    for (int j = 0; j < 8; ++j) {
      _mm512_storeu_ps(dst + j * ldd, _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88));
      _mm512_storeu_ps(dst + (8 + j) * ldd, _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD));
    }
  }
};
#include "prefill_tiled.inc"
}  // namespace avx512_path
}  // namespace
#pragma GCC pop_options

// AVX-512 plus AVX512_BF16: the same kernel, with the scores of bf16 KV through vdpbf16ps (prefill_tiled.inc,
// KVPAGER_PREFILL_DPBF16); the other dtypes, and bf16's P.V, run the AVX-512 code.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")
namespace {
namespace avx512bf16_path {
using isa = avx512_path::isa;
#define KVPAGER_PREFILL_DPBF16 1
#include "prefill_tiled.inc"
#undef KVPAGER_PREFILL_DPBF16
}  // namespace avx512bf16_path
}  // namespace
#pragma GCC pop_options
#endif  // KVPAGER_HAVE_X86_PATHS

namespace {

using item_fn = void (*)(const kvpager::prefill_params&, std::int32_t, std::int32_t, std::int32_t, std::int32_t, float*,
                         std::int64_t*);
struct prefill_kernel {
  item_fn fn;
  std::int32_t W, tile_rows;
  std::int64_t (*scratch)(std::int64_t, std::int64_t);
};

/// The decode's path choice (pick_cpu_path: CPU features, capped by KVPAGER_CPU_DISPATCH).
prefill_kernel pick_kernel() {
  static const prefill_kernel k = []() -> prefill_kernel {
    switch (kvpager::kernels::detail::pick_cpu_path()) {
#if defined(KVPAGER_HAVE_X86_PATHS)
      case kvpager::kernels::detail::cpu_path::avx512bf16:
        return {&avx512bf16_path::prefill_item, avx512bf16_path::isa::W, avx512bf16_path::isa::tile_rows,
                &avx512bf16_path::prefill_scratch_floats};
      case kvpager::kernels::detail::cpu_path::avx512:
        return {&avx512_path::prefill_item, avx512_path::isa::W, avx512_path::isa::tile_rows,
                &avx512_path::prefill_scratch_floats};
      case kvpager::kernels::detail::cpu_path::avx2:
        return {&avx2_path::prefill_item, avx2_path::isa::W, avx2_path::isa::tile_rows,
                &avx2_path::prefill_scratch_floats};
#endif
      default:
        return {&portable_path::prefill_item, portable_path::isa::W, portable_path::isa::tile_rows,
                &portable_path::prefill_scratch_floats};
    }
  }();
  return k;
}

/// A thread's buffers, reused across calls; `own` once the thread's thread_locals are gone (a call from a static
/// object's destructor at exit), as decode does.
struct item_buffers {
  std::vector<float> scratch;
  std::vector<std::int64_t> pos, tiles;
  std::vector<float> workspace;  ///< a q_len = 1 batch's decode split workspace
};
item_buffers& buffers_or(item_buffers& own) noexcept {
  thread_local bool destroyed = false;
  thread_local struct holder {
    item_buffers b;
    holder() noexcept = default;
    holder(const holder&) = delete;
    holder& operator=(const holder&) = delete;
    ~holder() { destroyed = true; }
  } buffers;
  return destroyed ? own : buffers.b;
}

/// A batch of one query row per sequence with no window and no soft cap is a decode: run the decode kernel, which
/// vectorizes along head_dim (the tiles here put query rows in the vector lanes, and one row (MHA) or one group
/// fills 1/W to group/W of them), with its split workspace in the calling thread's buffer (grown once, kept; splits
/// happen only with fewer (sequence, KV head) items than twice the threads, so it stays small). When decode gains
/// window and soft cap (issue 12), this shortcut can take those calls too.
/// Over an fp8 pool it is the decode with the call's q_dtype and scales. The arguments are check_prefill's, which
/// cover check_decode's for such a batch, so the decode runs without checking them again (decode_validated).
/// Returns -1 when the batch is not one.
std::int32_t as_decode(const kvpager::prefill_params& p, item_buffers& b) noexcept {
  if (p.window_left >= 0 || p.logits_soft_cap > 0.0F || p.num_seqs == 0) return -1;
  for (std::int32_t s = 0; s < p.num_seqs; ++s)
    if (p.qo_indptr[s + 1] - p.qo_indptr[s] != 1) return -1;
  kvpager::decode_params d = kvpager::decode_params_of(p);
  // The split decode would choose for itself (its rule: a call under 8192 (token, query head) pairs runs on one
  // thread), chosen here so that the workspace is sized for that split only, not for the most any call could take.
  std::int32_t max_len = 0;
  std::int64_t total_len = 0;
  for (std::int32_t s = 0; s < p.num_seqs; ++s) {
    const std::int32_t len = page_length(p.pages, s, p.kv.block_size);
    max_len = std::max(max_len, len);
    total_len += len;
  }
  const std::int32_t threads =
      p.num_threads == 0 && total_len < 8192 && total_len * p.num_q_heads < 8192 ? 1 : p.num_threads;
  d.num_splits = kvpager::plan_decode(p.num_seqs, p.kv.num_kv_heads, max_len, threads);
  const std::int64_t bytes = kvpager::decode_workspace_size(d);
  if (bytes < 0) return -1;
  const auto floats = static_cast<std::size_t>((bytes + 3) / 4);
  if (b.workspace.size() < floats) b.workspace.resize(floats);
  d.workspace = b.workspace.data();
  d.workspace_bytes = bytes;
  return kvpager::kernels::detail::decode_validated(d);
}

/// The prefill of every pool dtype (an fp8 pool with p.q_dtype the query dtype), after its one check.
std::int32_t prefill_cpu(const kvpager::prefill_params& p) noexcept {
  if (const std::int32_t rc = kvpager::kernels::detail::check_prefill(p); rc != KVPAGER_STATUS_OK) return rc;
  item_buffers own_decode;
  if (const std::int32_t rc = as_decode(p, buffers_or(own_decode)); rc >= 0) return rc;
  const auto& kv = p.kv;
  const prefill_kernel kernel = pick_kernel();
  const std::int32_t group = p.num_q_heads / kv.num_kv_heads;
  // Query positions per item: enough rows (positions x group heads) for the register tiles, at least one position.
  const std::int32_t qt = std::max(1, kernel.tile_rows / group);
  const std::int64_t max_rows = std::int64_t{qt} * group;
  const std::int64_t M = (max_rows + kernel.W - 1) / kernel.W * kernel.W;
  const std::int64_t hkv = kv.num_kv_heads;
  // Items per sequence, as a prefix sum in the calling thread's buffer (grown once, then reused).
  item_buffers own_main;
  std::vector<std::int64_t>& first = buffers_or(own_main).tiles;
  first.resize(static_cast<std::size_t>(p.num_seqs) + 1);
  first[0] = 0;
  std::int64_t work = 0;
  for (std::int32_t s = 0; s < p.num_seqs; ++s) {
    const std::int64_t q_len = std::int64_t{p.qo_indptr[s + 1]} - p.qo_indptr[s];
    first[static_cast<std::size_t>(s) + 1] = first[static_cast<std::size_t>(s)] + (q_len + qt - 1) / qt * hkv;
    work += q_len * page_length(p.pages, s, kv.block_size);
  }
  const std::int64_t items = first[static_cast<std::size_t>(p.num_seqs)];
  // With all cores requested, a call this small runs on the calling thread: waking workers would cost more.
  const std::int32_t threads = p.num_threads == 0 && work * p.num_q_heads * kv.head_dim < (std::int64_t{1} << 20) ? 1 : p.num_threads;
  const std::int64_t scratch_floats = kernel.scratch(M, kv.head_dim);
  const std::int64_t* starts = first.data();
  kvpager::kernels::detail::parallel_for(items, threads, [&](std::int64_t item) {
    item_buffers own;
    item_buffers& b = buffers_or(own);
    if (b.scratch.size() < static_cast<std::size_t>(scratch_floats)) b.scratch.resize(static_cast<std::size_t>(scratch_floats));
    if (b.pos.size() < static_cast<std::size_t>(2 * M)) b.pos.resize(static_cast<std::size_t>(2 * M));
    const auto seq = static_cast<std::int32_t>(std::upper_bound(starts, starts + p.num_seqs + 1, item) - starts - 1);
    const std::int64_t local = item - starts[seq];
    const std::int64_t tiles = (starts[seq + 1] - starts[seq]) / hkv;
    // Head by head (each head's KV stays in the caches from one item to the next), and within a head the last
    // positions (most KV to read) first.
    const auto h = static_cast<std::int32_t>(local / tiles);
    const std::int64_t tile = tiles - 1 - local % tiles;
    const std::int32_t q_len = p.qo_indptr[seq + 1] - p.qo_indptr[seq];
    const auto r0 = static_cast<std::int32_t>(tile * qt);
    const std::int32_t r1 = std::min(q_len, r0 + qt);
    kernel.fn(p, seq, h, r0, r1, b.scratch.data(), b.pos.data());
  });
  return KVPAGER_STATUS_OK;
}

}  // namespace

// The C prefill functions fill a prefill_params and run the C++ operation (one check, check_prefill): the plain one
// with `dtype` as the query dtype too (an fp8 `dtype` is UNSUPPORTED_DTYPE in the geometry's order), the fp8 one over
// an fp8 pool with its q_dtype and scales.
extern "C" int32_t kvpager_cpu_paged_attention_prefill(void* out, const void* query, const void* kv_cache,
                                                       const int32_t* qo_indptr, const int32_t* block_table,
                                                       const int32_t* seq_lens, int32_t num_seqs, int32_t num_q_heads,
                                                       int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                                                       int32_t max_blocks_per_seq, int32_t num_blocks, float scale,
                                                       int32_t window_left, float logits_soft_cap, int32_t dtype,
                                                       int32_t num_threads) {
  if (max_blocks_per_seq <= 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  auto p = kvpager::kernels::detail::dense_params<kvpager::prefill_params>(
      out, query, kv_cache, dtype, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim, block_size,
      max_blocks_per_seq, num_blocks, scale, window_left, logits_soft_cap, num_threads);
  p.qo_indptr = qo_indptr;
  p.q_dtype = dtype;
  return prefill_cpu(p);
}

extern "C" int32_t kvpager_cpu_paged_attention_prefill_fp8(void* out, const void* query, const void* kv_cache,
                                                           const int32_t* qo_indptr, const int32_t* block_table,
                                                           const int32_t* seq_lens, int32_t num_seqs,
                                                           int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                                           int32_t block_size, int32_t max_blocks_per_seq,
                                                           int32_t num_blocks, float scale, int32_t window_left,
                                                           float logits_soft_cap, int32_t q_dtype, float k_scale,
                                                           float v_scale, int32_t num_threads) {
  if (max_blocks_per_seq <= 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  auto p = kvpager::kernels::detail::dense_params<kvpager::prefill_params>(
      out, query, kv_cache, KVPAGER_DTYPE_FP8_E4M3, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim,
      block_size, max_blocks_per_seq, num_blocks, scale, window_left, logits_soft_cap, num_threads);
  p.qo_indptr = qo_indptr;
  p.q_dtype = kvpager::kernels::detail::fp8_entry_io_dtype(q_dtype);
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  return prefill_cpu(p);
}

extern "C" int32_t kvpager_cpu_prefill(const kvpager_prefill_args* args) {
  kvpager_prefill_args a;
  if (const int32_t rc = kvpager::kernels::detail::read_c_args(args, a); rc != KVPAGER_STATUS_OK) return rc;
  if (a.kv.reserved != 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  auto p = kvpager::kernels::detail::attention_params_of<kvpager::prefill_params>(a);
  p.qo_indptr = a.qo_indptr;
  return prefill_cpu(p);
}

KVPAGER_NAMESPACE_BEGIN

status paged_attention_prefill_cpu(const prefill_params& p) noexcept { return kernel_status(prefill_cpu(p)); }

KVPAGER_NAMESPACE_END
