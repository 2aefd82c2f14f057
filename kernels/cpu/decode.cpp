// SPDX-License-Identifier: Apache-2.0
// CPU paged decode attention of the C ABI and of the C++ interface (GQA/MQA, fp32/fp16/bf16 and fp8 E4M3 pools, fp32
// accumulation); the block moves (kv_append, copy_blocks, swap_blocks) are in block_moves.cpp. Every argument is
// validated once (check_decode, params_checks.hpp) before any KV memory is touched. Decode work items are
// (sequence, range of KV heads, split), handed to the process-wide worker pool (worker_pool.hpp); each item reads its
// heads' rows once for their whole query-head groups, block by block over all its heads. One kernel,
// decode_tiled.inc, compiled per path (AVX-512 with and without AVX512-BF16, AVX2, portable), chosen at run time.
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <thread>
#include <type_traits>
#include <vector>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/attention.hpp"
#include "kvpager/kernels/float16.hpp"
#include "kvpager/kernels/kernel_status.hpp"
#include "kernels/common/checks.hpp"
#include "kernels/common/decode_math.hpp"
#include "kernels/cpu/c_args.hpp"
#include "kernels/cpu/cpu_path.hpp"
#include "kernels/cpu/decode.hpp"
#include "kernels/cpu/element_ops.hpp"
#include "kernels/cpu/page_tables.hpp"
#include "kernels/cpu/params_checks.hpp"
#include "kernels/cpu/vec_ops.hpp"
#include "worker_pool.hpp"

namespace {

using kvpager::kernels::detail::parallel_for;

// ------------------------------------------------------------------------------------------- x86 vector paths
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVPAGER_HAVE_X86_PATHS 1
#endif

using kvpager::kernels::detail::page_block_at;
using kvpager::kernels::detail::page_length;

}  // namespace

#if defined(KVPAGER_HAVE_X86_PATHS)
// Each path is compiled under its own #pragma GCC target, in its own namespace, and reached only after the CPU was
// checked at run time; the library itself targets baseline x86-64 (no -march=native).
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace {
namespace avx2_path {
struct isa : kvpager::kernels::detail::avx2_vec {
  static constexpr int score_tokens = reduce_tokens;  // 2 tokens x 4 heads = 8 accumulators of 16 registers
  static constexpr int acc_vectors = 2;              // 4 heads x 2 vectors in registers while accumulating V
};
#include "decode_tiled.inc"
}  // namespace avx2_path
}  // namespace
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
namespace {
namespace avx512_path {
struct isa : kvpager::kernels::detail::avx512_vec {
  static constexpr int score_tokens = reduce_tokens;  // 4 tokens x 4 heads = 16 accumulators of 32 registers
  static constexpr int acc_vectors = 4;              // 4 heads x 4 vectors in registers while accumulating V
};
#include "decode_tiled.inc"
}  // namespace avx512_path
}  // namespace
#pragma GCC pop_options

// AVX-512 plus AVX512_BF16: the same kernel, with bf16 KV read by vdpbf16ps (decode_tiled.inc, KVPAGER_TILED_DPBF16);
// fp32 and fp16 KV take the AVX-512 code. (AVX512_FP16 and AMX would be further paths chosen the same way; there are
// none: the CPUs this was measured on have neither, and code that cannot be run here is not shipped.)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")
namespace {
namespace avx512bf16_path {
using isa = avx512_path::isa;
#define KVPAGER_TILED_DPBF16 1
#include "decode_tiled.inc"
#undef KVPAGER_TILED_DPBF16
}  // namespace avx512bf16_path
}  // namespace
#pragma GCC pop_options
#endif  // KVPAGER_HAVE_X86_PATHS

namespace {

// ------------------------------------------------------------------------------------------- portable path
// The same kernel over scalar_vec (one float per "vector"; the compiler may vectorize around it): CPUs without the
// x86 paths and KVPAGER_CPU_DISPATCH=portable.
namespace portable_path {
struct isa : kvpager::kernels::detail::scalar_vec {
  static constexpr int score_tokens = reduce_tokens;  // 2 tokens x 4 heads
  static constexpr int acc_vectors = 4;
};
#include "decode_tiled.inc"
}  // namespace portable_path

/// Partial states over tokens [t0, t1) of sequence seq for KV heads [h0, h1): m, l and acc of each head's group of
/// query heads, one group after another (decode_tiled.inc's decode_range).
using chunk_fn = void (*)(const kvpager::decode_params&, std::int32_t seq, std::int32_t h0, std::int32_t h1,
                          std::int32_t t0, std::int32_t t1, float* scratch, float* m, float* l, float* acc);

using kvpager::kernels::detail::cpu_path;

/// Writes row `row` of the output: D floats times `scale`, converted to the dtype.
using store_fn = void (*)(void* out, std::int64_t row, const float* src, float scale, std::int32_t dtype, std::int64_t D);

struct chunk_kernel {
  chunk_fn fn;
  store_fn store;
  std::int64_t scratch_floats;
  float unit8;  ///< what the path's fp8 loads are divided by (the output of an fp8 pool is multiplied back)
};
/// The kernel of the CPU's path for work items of up to `heads` KV heads.
chunk_kernel pick_chunk(std::int32_t group, std::int64_t D, std::int32_t heads) {
  switch (kvpager::kernels::detail::pick_cpu_path()) {
#if defined(KVPAGER_HAVE_X86_PATHS)
    case cpu_path::avx512bf16:
      return {&avx512bf16_path::decode_chunk, &avx512bf16_path::store_row,
              avx512bf16_path::scratch_floats(group, D, heads), avx512bf16_path::isa::unit8};
    case cpu_path::avx512:
      return {&avx512_path::decode_chunk, &avx512_path::store_row, avx512_path::scratch_floats(group, D, heads),
              avx512_path::isa::unit8};
    case cpu_path::avx2:
      return {&avx2_path::decode_chunk, &avx2_path::store_row, avx2_path::scratch_floats(group, D, heads),
              avx2_path::isa::unit8};
#endif
    default:
      return {&portable_path::decode_chunk, &portable_path::store_row, portable_path::scratch_floats(group, D, heads),
              portable_path::isa::unit8};
  }
}

/// A thread's buffers of decode work items, reused across calls.
struct item_buffers {
  std::vector<float> scratch, m, l, acc;
};
/// The calling thread's buffers, or `own` (the caller's, for this item only) once the thread's thread_local objects
/// have been destroyed: a decode called from a static object's destructor at exit runs after the main thread's
/// thread_locals are gone, and must not touch them.
item_buffers& buffers_or(item_buffers& own) noexcept {
  thread_local bool destroyed = false;  // trivially destructible: still readable after the buffers' destructor ran
  thread_local struct holder {
    item_buffers b;
    holder() noexcept = default;
    holder(const holder&) = delete;
    holder& operator=(const holder&) = delete;
    ~holder() { destroyed = true; }
  } buffers;
  return destroyed ? own : buffers.b;
}

}  // namespace

namespace {

/// The decode itself, returning a KVPAGER_STATUS_* code (the C function returns it, the C++ one maps it).
std::int32_t decode_cpu(const kvpager::decode_params& p) noexcept {
  if (const std::int32_t rc = kvpager::kernels::detail::check_decode(p); rc != KVPAGER_STATUS_OK) return rc;
  return kvpager::kernels::detail::decode_validated(p);
}

}  // namespace

namespace kvpager::kernels::detail {

cpu_path pick_cpu_path() noexcept {
  static const cpu_path path = [] {
    cpu_path best = cpu_path::portable;
#if defined(KVPAGER_HAVE_X86_PATHS)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
      best = cpu_path::avx2;
      if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        best = __builtin_cpu_supports("avx512bf16") ? cpu_path::avx512bf16 : cpu_path::avx512;
    }
#endif
    const char* cap = std::getenv("KVPAGER_CPU_DISPATCH");
    if (cap == nullptr) return best;
    const cpu_path limit = std::strcmp(cap, "avx512bf16") == 0 ? cpu_path::avx512bf16
                           : std::strcmp(cap, "avx512") == 0   ? cpu_path::avx512
                           : std::strcmp(cap, "avx2") == 0     ? cpu_path::avx2
                                                               : cpu_path::portable;
    return std::min(best, limit);
  }();
  return path;
}

bool decode_prefetch_nta() noexcept {
  static const bool nta = [] {
    if (const char* e = std::getenv("KVPAGER_DECODE_PREFETCH"); e != nullptr) return std::strcmp(e, "nta") == 0;
#if defined(KVPAGER_HAVE_X86_PATHS)
    __builtin_cpu_init();
    if (!__builtin_cpu_is("amd")) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
    const unsigned base = (eax >> 8) & 0xFU;
    const unsigned family = base == 0xFU ? base + ((eax >> 20) & 0xFFU) : base;
    return family >= 0x1AU;  // Zen 5 and later
#else
    return false;
#endif
  }();
  return nta;
}

std::int32_t decode_validated(const kvpager::decode_params& p) noexcept {
  const auto& kv = p.kv;
  // An fp8 pool: the query and output are of q_dtype and the output carries the V scale; otherwise both are of the
  // pool's dtype.
  const bool fp8 = kv.dtype == KVPAGER_DTYPE_FP8_E4M3;
  const std::int32_t out_dtype = fp8 ? p.q_dtype : kv.dtype;
  const std::int64_t D = kv.head_dim, hkv = kv.num_kv_heads;
  const std::int32_t group = p.num_q_heads / kv.num_kv_heads;
  std::int32_t max_len = 0;
  std::int64_t total_len = 0;
  for (std::int32_t s = 0; s < p.num_seqs; ++s) {  // the tokens each sequence reads: its window
    const std::int32_t full = page_length(p.pages, s, kv.block_size);
    const std::int32_t len = full - window_start(full, p.window_left);
    max_len = std::max(max_len, len);
    total_len += len;
  }
  // With all cores requested, a call this small (a few microseconds of work) runs on the calling thread: waking
  // workers would cost more than they save (bench_kernels decode_..._short).
  const std::int32_t threads = p.num_threads == 0 && total_len < 8192 && total_len * p.num_q_heads < 8192 ? 1 : p.num_threads;
  // Work items: (sequence, range of KV heads, split of the tokens). All the KV heads of a sequence in one item while
  // the sequences and splits give every thread work twice over: the item then reads whole blocks (K and V of every
  // head), long contiguous runs, instead of one head's 4 KiB pieces of each (the memory side of issue 12, point 7).
  // Fewer sequences than that: the heads split into ranges, then the tokens.
  const std::int32_t tcount = threads > 0 ? threads : static_cast<std::int32_t>(std::max(1U, std::thread::hardware_concurrency()));
  const std::int64_t want_items = 2 * std::int64_t{tcount};
  const std::int32_t splits = p.num_splits > 0 ? p.num_splits : kvpager::plan_decode(p.num_seqs, 1, max_len, threads);
  const std::int64_t whole = std::max<std::int64_t>(1, std::int64_t{p.num_seqs} * splits);  // items of all heads
  auto head_ranges = static_cast<std::int32_t>(std::clamp<std::int64_t>((want_items + whole - 1) / whole, 1, hkv));
  // At most kMaxItemHeads per item: an item's buffers (queries, accumulators, prefetch runs) grow with its heads, and
  // 32 heads already read runs of 32 rows per block (64 KiB at fp16, head_dim 128).
  constexpr std::int64_t kMaxItemHeads = 32;
  const auto heads_per_item =
      static_cast<std::int32_t>(std::min<std::int64_t>((hkv + head_ranges - 1) / head_ranges, kMaxItemHeads));
  head_ranges = static_cast<std::int32_t>((hkv + heads_per_item - 1) / heads_per_item);
  const chunk_kernel kernel = pick_chunk(group, D, heads_per_item);
  const float v_unit = fp8 ? p.v_scale * kernel.unit8 : 1.0F;  // the output's factor besides 1 / l
  const auto scratch_floats = static_cast<std::size_t>(kernel.scratch_floats);
  // Partial states [seq][q head][split]: m, l, acc[D], merged below; without splits each item stores its output. In
  // the caller's workspace when given (checked before anything is written), else allocated here without throwing: a
  // workspace the machine cannot hold is OUT_OF_MEMORY, never an abort.
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
  auto state = [&](std::int64_t seq, std::int64_t qh, std::int64_t split) {
    return part + ((seq * p.num_q_heads + qh) * splits + split) * (D + 2);
  };
  parallel_for(std::int64_t{p.num_seqs} * head_ranges * splits, threads, [&](std::int64_t item) {
    item_buffers own;
    item_buffers& b = buffers_or(own);
    if (b.scratch.size() < scratch_floats) b.scratch.resize(scratch_floats);
    auto& m = b.m;
    auto& l = b.l;
    auto& acc = b.acc;
    const auto rows = static_cast<std::size_t>(heads_per_item) * static_cast<std::size_t>(group);
    m.resize(rows);
    l.resize(rows);
    acc.resize(rows * static_cast<std::size_t>(D));
    const auto seq = static_cast<std::int32_t>(item / (std::int64_t{head_ranges} * splits));
    const auto h0 = static_cast<std::int32_t>(item / splits % head_ranges * heads_per_item);
    const auto h1 = static_cast<std::int32_t>(std::min<std::int64_t>(hkv, h0 + heads_per_item));
    const auto split = static_cast<std::int32_t>(item % splits);
    const std::int32_t len = page_length(p.pages, seq, kv.block_size);
    std::int32_t t0 = 0, t1 = 0;
    split_range_from(window_start(len, p.window_left), len, kv.block_size, splits, split, t0, t1);
    kernel.fn(p, seq, h0, h1, t0, t1, b.scratch.data(), m.data(), l.data(), acc.data());
    const std::int32_t n = (h1 - h0) * group;  // query heads h0 * group .. h1 * group
    for (std::int32_t r = 0; r < n; ++r) {
      const auto i = static_cast<std::size_t>(r);
      const std::int64_t qh = std::int64_t{h0} * group + r;
      if (splits == 1) {  // the whole sequence: normalize and store here, no merge pass
        const std::int64_t row = std::int64_t{seq} * p.num_q_heads + qh;
        kernel.store(p.out, row, acc.data() + r * D, l[i] > 0.0F ? v_unit / l[i] : 0.0F, out_dtype, D);
        if (p.lse != nullptr) p.lse[row] = lse_of(m[i], l[i]);
        continue;
      }
      float* st = state(seq, qh, split);
      st[0] = m[i];
      st[1] = l[i];
      std::memcpy(st + 2, acc.data() + r * D, static_cast<std::size_t>(D) * sizeof(float));
    }
  });
  if (splits == 1) return KVPAGER_STATUS_OK;
  // Merge the splits in fp32: out = sum_i exp(m_i - M) acc_i / sum_i exp(m_i - M) l_i.
  parallel_for(std::int64_t{p.num_seqs} * p.num_q_heads, threads, [&](std::int64_t row) {
    const std::int64_t seq = row / p.num_q_heads, qh = row % p.num_q_heads;
    float M = -std::numeric_limits<float>::infinity();
    for (std::int32_t i = 0; i < splits; ++i)
      if (state(seq, qh, i)[1] > 0.0F) M = std::max(M, state(seq, qh, i)[0]);
    float L = 0.0F;
    item_buffers own;
    std::vector<float>& o = buffers_or(own).acc;
    o.assign(static_cast<std::size_t>(D), 0.0F);
    if (M != -std::numeric_limits<float>::infinity()) {
      for (std::int32_t i = 0; i < splits; ++i) {
        const float* st = state(seq, qh, i);
        if (st[1] <= 0.0F) continue;
        const float w = std::exp(st[0] - M);
        L += w * st[1];
        for (std::int64_t d = 0; d < D; ++d) o[static_cast<std::size_t>(d)] += w * st[2 + d];
      }
    }
    kernel.store(p.out, row, o.data(), L > 0.0F ? v_unit / L : 0.0F, out_dtype, D);
    if (p.lse != nullptr) p.lse[row] = lse_of(M, L);
  });
  return KVPAGER_STATUS_OK;
}

}  // namespace kvpager::kernels::detail

extern "C" {

const char* kvpager_cpu_decode_path(void) {
  switch (kvpager::kernels::detail::pick_cpu_path()) {
    case cpu_path::avx512bf16: return "avx512bf16";
    case cpu_path::avx512: return "avx512";
    case cpu_path::avx2: return "avx2";
    default: return "portable";
  }
}

int32_t kvpager_cpu_paged_attention_decode(void* out, const void* query, const void* kv_cache,
                                           const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                           int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                           int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                           float scale, int32_t dtype, int32_t num_threads) {
  return kvpager_cpu_paged_attention_decode_ex(out, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads,
                                               num_kv_heads, head_dim, block_size, max_blocks_per_seq, num_blocks, scale,
                                               -1, 0.0F, dtype, num_threads);
}

// The C decode functions fill a decode_params and run the C++ operation, whose one check (check_decode) validates the
// call; the plain functions pass `dtype` as the query dtype too (an fp8 `dtype` is then UNSUPPORTED_DTYPE in the
// geometry's order), the fp8 functions an fp8 pool with their q_dtype and scales.
int32_t kvpager_cpu_paged_attention_decode_ex(void* out, const void* query, const void* kv_cache,
                                              const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                              int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                              int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                              float scale, int32_t window_left, float logits_soft_cap, int32_t dtype,
                                              int32_t num_threads) {
  if (max_blocks_per_seq <= 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  auto p = kvpager::kernels::detail::dense_params<kvpager::decode_params>(
      out, query, kv_cache, dtype, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim, block_size,
      max_blocks_per_seq, num_blocks, scale, window_left, logits_soft_cap, num_threads);
  p.q_dtype = dtype;
  return decode_cpu(p);
}

int32_t kvpager_cpu_paged_attention_decode_fp8_ex(void* out, const void* query, const void* kv_cache,
                                                  const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                                  int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                                  int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                                  float scale, int32_t window_left, float logits_soft_cap,
                                                  int32_t q_dtype, float k_scale, float v_scale, int32_t num_threads) {
  if (max_blocks_per_seq <= 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  auto p = kvpager::kernels::detail::dense_params<kvpager::decode_params>(
      out, query, kv_cache, KVPAGER_DTYPE_FP8_E4M3, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads,
      head_dim, block_size, max_blocks_per_seq, num_blocks, scale, window_left, logits_soft_cap, num_threads);
  p.q_dtype = kvpager::kernels::detail::fp8_entry_io_dtype(q_dtype);
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  return decode_cpu(p);
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

int32_t kvpager_cpu_decode(const kvpager_decode_args* args) {
  kvpager_decode_args a;
  if (const int32_t rc = kvpager::kernels::detail::read_c_args(args, a); rc != KVPAGER_STATUS_OK) return rc;
  if (a.kv.reserved != 0 || a.reserved != 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  auto p = kvpager::kernels::detail::attention_params_of<kvpager::decode_params>(a);
  p.num_splits = a.num_splits;
  p.workspace = a.workspace;
  p.workspace_bytes = a.workspace_bytes;
  return decode_cpu(p);
}

}  // extern "C"

KVPAGER_NAMESPACE_BEGIN

std::int32_t plan_decode(std::int32_t num_seqs, std::int32_t num_kv_heads, std::int32_t max_seq_len,
                         std::int32_t threads) noexcept {
  const std::int64_t t = threads > 0 ? std::int64_t{threads} : std::int64_t{std::max(1U, std::thread::hardware_concurrency())};
  const std::int64_t items = std::int64_t{std::max(num_seqs, 1)} * std::max(num_kv_heads, 1);
  if (items >= 2 * t) return 1;
  const std::int64_t want = (2 * t + items - 1) / items;     // enough work items for every thread, twice
  const std::int64_t cap = std::max<std::int64_t>(1, max_seq_len / 256);  // chunks of 256+ tokens
  return static_cast<std::int32_t>(std::clamp<std::int64_t>(want, 1, std::min<std::int64_t>(cap, max_planned_splits)));
}

std::int64_t decode_workspace_size(const decode_params& p) noexcept {
  return kernels::detail::decode_workspace_bytes(p.num_seqs, p.num_q_heads, p.kv.head_dim,
                                                 p.num_splits == 0 ? max_planned_splits : p.num_splits);
}

status paged_attention_decode_cpu(const decode_params& p) noexcept { return kernel_status(decode_cpu(p)); }

KVPAGER_NAMESPACE_END
