// CPU kernels of the C ABI: paged decode attention (GQA/MQA, fp32/fp16/bf16 with fp32 accumulation), kv_append and
// copy_blocks. Every argument is validated before any KV memory is touched. Work is split over (sequence, KV head)
// across std::threads; each work item loads a KV head's block once for its whole query-head group.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/attention.hpp"
#include "kvpager/kernels/float16.hpp"
#include "../common/checks.hpp"

namespace {

using kvpager::detail::bf16_to_float;
using kvpager::detail::float_to_bf16;
using kvpager::detail::float_to_half;
using kvpager::detail::half_to_float;

std::int64_t dtype_bytes(std::int32_t dtype) { return dtype == KVPAGER_DTYPE_FP32 ? 4 : 2; }

/// Runs fn(i) for i in [0, n) on up to `threads` threads (0 = all cores), in contiguous chunks.
template <class Fn>
void parallel_for(std::int64_t n, std::int32_t threads, Fn fn) {
  std::int64_t t = threads > 0 ? threads : static_cast<std::int64_t>(std::max(1U, std::thread::hardware_concurrency()));
  t = std::min(t, n);
  if (t <= 1) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(t));
  for (std::int64_t w = 0; w < t; ++w)
    pool.emplace_back([&, w] {
      for (std::int64_t i = n * w / t; i < n * (w + 1) / t; ++i) fn(i);
    });
  for (auto& th : pool) th.join();
}

// ------------------------------------------------------------------------------------------- element ops
float load_one(const void* base, std::int64_t i, std::int32_t dtype) noexcept {
  if (dtype == KVPAGER_DTYPE_FP32) return static_cast<const float*>(base)[i];
  const std::uint16_t x = static_cast<const std::uint16_t*>(base)[i];
  return dtype == KVPAGER_DTYPE_FP16 ? half_to_float(x) : bf16_to_float(x);
}
void store_one(void* base, std::int64_t i, float v, std::int32_t dtype) noexcept {
  if (dtype == KVPAGER_DTYPE_FP32) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<std::uint16_t*>(base)[i] = dtype == KVPAGER_DTYPE_FP16 ? float_to_half(v) : float_to_bf16(v);
  }
}

/// Portable building blocks (the compiler vectorizes what it can).
struct scalar_ops {
  static void to_float(const void* src, std::int32_t dtype, float* dst, std::int64_t n) noexcept {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = load_one(src, i, dtype);
  }
  static float dot(const float* a, const float* b, std::int64_t n) noexcept {
    float s = 0.0F;
    for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
  }
  static float exp_sub(const float* s, float m, float* p, std::int64_t n) noexcept {
    float sum = 0.0F;
    for (std::int64_t t = 0; t < n; ++t) sum += (p[t] = std::exp(s[t] - m));
    return sum;
  }
  static void accumulate(float* acc, float alpha, const float* p, const float* v, std::int64_t n, std::int64_t D) noexcept {
    for (std::int64_t d = 0; d < D; ++d) acc[d] *= alpha;
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t d = 0; d < D; ++d) acc[d] += p[t] * v[t * D + d];
  }
};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVPAGER_HAVE_AVX2_PATH 1
// AVX2 + FMA + F16C, selected at run time (the library targets baseline x86-64). Only intrinsics and this file's
// internal functions run under target("..."), so no shared inline code is compiled for AVX2 and reused elsewhere.
#define KVPAGER_AVX2 __attribute__((target("avx2,fma,f16c")))

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

/// exp of 8 floats: Cephes-style range reduction and polynomial, within 2 ulp over [-87, 88]; smaller inputs are
/// clamped (exp(-inf) gives ~1e-38, never used for a real score).
KVPAGER_AVX2 __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654F)), _mm256_set1_ps(88.37626F));
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341F), _mm256_set1_ps(0.5F)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375F), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4F), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4F);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3F));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3F));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2F));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1F));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1F));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0F)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

struct avx2_ops {
  /// n is a multiple of 8 (every supported head_dim is).
  KVPAGER_AVX2 static void to_float(const void* src, std::int32_t dtype, float* dst, std::int64_t n) noexcept {
    if (dtype == KVPAGER_DTYPE_FP32) {
      const auto* f = static_cast<const float*>(src);
      for (std::int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(f + i));
    } else if (dtype == KVPAGER_DTYPE_FP16) {
      const auto* h = static_cast<const std::uint16_t*>(src);
      for (std::int64_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
    } else {
      const auto* b = static_cast<const std::uint16_t*>(src);
      for (std::int64_t i = 0; i < n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
      }
    }
  }
  KVPAGER_AVX2 static float dot(const float* a, const float* b, std::int64_t n) noexcept {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    std::int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
      s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i < n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    const __m256 sum = _mm256_add_ps(s0, s1);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
  }
  KVPAGER_AVX2 static float exp_sub(const float* s, float m, float* p, std::int64_t n) noexcept {
    const __m256 vm = _mm256_set1_ps(m);
    float sum = 0.0F;
    for (std::int64_t t = 0; t < n; t += 8) {
      alignas(32) float buf[8];
      for (std::int64_t i = 0; i < 8; ++i) buf[i] = t + i < n ? s[t + i] : m;  // padding: exp(0), not used
      _mm256_store_ps(buf, exp256(_mm256_sub_ps(_mm256_load_ps(buf), vm)));
      for (std::int64_t i = 0; i < 8 && t + i < n; ++i) sum += (p[t + i] = buf[i]);
    }
    return sum;
  }
  /// acc = alpha * acc + sum_t p[t] * v[t], acc held in registers 64 floats at a time across the tokens.
  KVPAGER_AVX2 static void accumulate(float* acc, float alpha, const float* p, const float* v, std::int64_t n,
                                      std::int64_t D) noexcept {
    const __m256 va = _mm256_set1_ps(alpha);
    std::int64_t c = 0;
    for (; c + 32 <= D; c += 32) {
      __m256 r0 = _mm256_mul_ps(_mm256_loadu_ps(acc + c), va), r1 = _mm256_mul_ps(_mm256_loadu_ps(acc + c + 8), va);
      __m256 r2 = _mm256_mul_ps(_mm256_loadu_ps(acc + c + 16), va), r3 = _mm256_mul_ps(_mm256_loadu_ps(acc + c + 24), va);
      for (std::int64_t t = 0; t < n; ++t) {
        const __m256 pt = _mm256_set1_ps(p[t]);
        const float* row = v + t * D + c;
        r0 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row), r0);
        r1 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row + 8), r1);
        r2 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row + 16), r2);
        r3 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row + 24), r3);
      }
      _mm256_storeu_ps(acc + c, r0);
      _mm256_storeu_ps(acc + c + 8, r1);
      _mm256_storeu_ps(acc + c + 16, r2);
      _mm256_storeu_ps(acc + c + 24, r3);
    }
    for (; c < D; c += 8) {
      __m256 r = _mm256_mul_ps(_mm256_loadu_ps(acc + c), va);
      for (std::int64_t t = 0; t < n; ++t) r = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(v + t * D + c), r);
      _mm256_storeu_ps(acc + c, r);
    }
  }
};
#endif

// ------------------------------------------------------------------------------------------- decode core
std::int32_t block_at(const kvpager::page_table_view& pt, std::int32_t seq, std::int32_t b) noexcept {
  return pt.block_table != nullptr ? pt.block_table[std::int64_t{seq} * pt.row_stride + b] : pt.indices[pt.indptr[seq] + b];
}
std::int32_t length_of(const kvpager::page_table_view& pt, std::int32_t seq, std::int32_t bs) noexcept {
  if (pt.block_table != nullptr) return pt.seq_lens[seq];
  const std::int32_t pages = pt.indptr[seq + 1] - pt.indptr[seq];
  return pages == 0 ? 0 : (pages - 1) * bs + pt.last_page_len[seq];
}

/// Partial softmax state over tokens [t0, t1) of one sequence for the query-head group of KV head h: m[g], l[g],
/// acc[g * D .. ]. Each K/V block is converted to fp32 once for the whole group. scratch: 2 * block_size * D +
/// group * D + group * block_size floats.
template <class Ops>
inline __attribute__((always_inline)) void decode_chunk(const kvpager::decode_params& p, std::int32_t seq, std::int32_t h,
                                                        std::int32_t t0, std::int32_t t1, float* scratch, float* m,
                                                        float* l, float* acc) {
  const auto& kv = p.kv;
  const std::int64_t D = kv.head_dim, bs = kv.block_size;
  const std::int32_t group = p.num_q_heads / kv.num_kv_heads;
  const std::int64_t esz = dtype_bytes(kv.dtype);
  float* kf = scratch;
  float* vf = kf + bs * D;
  float* qf = vf + bs * D;
  float* scores = qf + group * D;
  const auto* qbase = static_cast<const unsigned char*>(p.query);
  for (std::int32_t g = 0; g < group; ++g) {
    Ops::to_float(qbase + ((std::int64_t{seq} * p.num_q_heads + h * group + g) * D) * esz, kv.dtype, qf + g * D, D);
    for (std::int64_t d = 0; d < D; ++d) qf[g * D + d] *= p.scale;
    for (std::int64_t d = 0; d < D; ++d) acc[g * D + d] = 0.0F;
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.0F;
  }
  const auto* base = static_cast<const unsigned char*>(kv.data);
  for (std::int64_t start = t0; start < t1;) {
    const std::int64_t off = start % bs;
    const std::int64_t n = std::min<std::int64_t>(bs - off, t1 - start);
    const std::int64_t blk = block_at(p.pages, seq, static_cast<std::int32_t>(start / bs));
    const std::int64_t kelem = blk * kv.stride_block + h * kv.stride_head + off * kv.stride_token;
    for (std::int64_t t = 0; t < n; ++t) {
      Ops::to_float(base + (kelem + t * kv.stride_token) * esz, kv.dtype, kf + t * D, D);
      Ops::to_float(base + (kelem + kv.stride_kv + t * kv.stride_token) * esz, kv.dtype, vf + t * D, D);
    }
    for (std::int32_t g = 0; g < group; ++g) {
      float* sg = scores + g * bs;
      float block_max = -std::numeric_limits<float>::infinity();
      for (std::int64_t t = 0; t < n; ++t) {
        sg[t] = Ops::dot(qf + g * D, kf + t * D, D);
        block_max = std::max(block_max, sg[t]);
      }
      const float m_new = std::max(m[g], block_max);
      const float alpha = m[g] == -std::numeric_limits<float>::infinity() ? 0.0F : std::exp(m[g] - m_new);
      const float sum = Ops::exp_sub(sg, m_new, sg, n);  // scores become probabilities
      Ops::accumulate(acc + g * D, alpha, sg, vf, n, D);
      l[g] = l[g] * alpha + sum;
      m[g] = m_new;
    }
    start += n;
  }
}

using chunk_fn = void (*)(const kvpager::decode_params&, std::int32_t, std::int32_t, std::int32_t, std::int32_t, float*,
                          float*, float*, float*);
void chunk_scalar(const kvpager::decode_params& p, std::int32_t seq, std::int32_t h, std::int32_t t0, std::int32_t t1,
                  float* scratch, float* m, float* l, float* acc) {
  decode_chunk<scalar_ops>(p, seq, h, t0, t1, scratch, m, l, acc);
}
#if defined(KVPAGER_HAVE_AVX2_PATH)
KVPAGER_AVX2 void chunk_avx2(const kvpager::decode_params& p, std::int32_t seq, std::int32_t h, std::int32_t t0,
                             std::int32_t t1, float* scratch, float* m, float* l, float* acc) {
  decode_chunk<avx2_ops>(p, seq, h, t0, t1, scratch, m, l, acc);
}
#endif

chunk_fn pick_chunk() {
#if defined(KVPAGER_HAVE_AVX2_PATH)
  static const bool avx2 = cpu_has_avx2() && std::getenv("KVPAGER_CPU_DISPATCH") == nullptr;
  if (avx2) return &chunk_avx2;
#endif
  return &chunk_scalar;
}

std::int32_t validate(const kvpager::decode_params& p) noexcept {
  const auto& kv = p.kv;
  if (p.num_seqs < 0 || p.num_threads < 0 || p.num_splits < 0 || kv.num_blocks <= 0 || !std::isfinite(p.scale))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  const bool dense = p.pages.block_table != nullptr;
  if (p.num_seqs > 0 && (p.out == nullptr || p.query == nullptr || kv.data == nullptr ||
                         (dense ? p.pages.seq_lens == nullptr || p.pages.row_stride <= 0
                                : p.pages.indptr == nullptr || p.pages.indices == nullptr || p.pages.last_page_len == nullptr)))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const std::int32_t rc =
          kvpager_kernels::check_decode_shape(p.num_q_heads, kv.num_kv_heads, kv.head_dim, kv.block_size, kv.dtype);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (kv.stride_block < 0 || kv.stride_kv < 0 || kv.stride_head < 0 || kv.stride_token < 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  for (std::int32_t s = 0; s < p.num_seqs; ++s) {
    std::int32_t blocks = 0;
    if (dense) {
      const std::int32_t len = p.pages.seq_lens[s];
      if (len < 0 || std::int64_t{len} > p.pages.row_stride * kv.block_size) return KVPAGER_STATUS_SEQ_TOO_LONG;
      blocks = (len + kv.block_size - 1) / kv.block_size;
    } else {
      blocks = p.pages.indptr[s + 1] - p.pages.indptr[s];
      if (blocks < 0 || p.pages.indptr[s] < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
      if (blocks > 0 && (p.pages.last_page_len[s] < 1 || p.pages.last_page_len[s] > kv.block_size))
        return KVPAGER_STATUS_SEQ_TOO_LONG;
    }
    for (std::int32_t b = 0; b < blocks; ++b) {
      const std::int32_t id = block_at(p.pages, s, b);
      if (id < 0 || id >= kv.num_blocks) return KVPAGER_STATUS_INVALID_BLOCK;
    }
  }
  return KVPAGER_STATUS_OK;
}

}  // namespace

extern "C" {

int32_t kvpager_cpu_paged_attention_decode(void* out, const void* query, const void* kv_cache,
                                           const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                           int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                           int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                           float scale, int32_t dtype, int32_t num_threads) {
  if (max_blocks_per_seq <= 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  kvpager::decode_params p;
  p.out = out;
  p.query = query;
  p.kv = kvpager::paged_kv_view::hnd(kv_cache, dtype, num_blocks, num_kv_heads, block_size, head_dim);
  p.pages.block_table = block_table;
  p.pages.row_stride = max_blocks_per_seq;
  p.pages.seq_lens = seq_lens;
  p.num_seqs = num_seqs;
  p.num_q_heads = num_q_heads;
  p.scale = scale;
  p.num_threads = num_threads;
  return kvpager::paged_attention_decode_cpu(p);
}

int32_t kvpager_cpu_kv_append(void* kv_cache, const void* key, const void* value, const int64_t* slot_mapping,
                              int32_t num_tokens, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                              int32_t num_blocks, int32_t dtype) {
  if (num_tokens < 0 || num_kv_heads <= 0 || head_dim <= 0 || block_size <= 0 || num_blocks <= 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (!kvpager_kernels::valid_dtype(dtype)) return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
  if (num_tokens > 0 && (kv_cache == nullptr || key == nullptr || value == nullptr || slot_mapping == nullptr))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  const std::int64_t slots = std::int64_t{num_blocks} * block_size;
  for (int32_t t = 0; t < num_tokens; ++t)
    if (slot_mapping[t] >= slots) return KVPAGER_STATUS_INVALID_BLOCK;
  const std::int64_t row = std::int64_t{head_dim} * dtype_bytes(dtype);  // bytes
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

int32_t kvpager_cpu_copy_blocks(void* const* kv_caches, int32_t num_layers, const int64_t* block_mapping,
                                int32_t num_pairs, int32_t num_blocks, int64_t block_bytes) {
  if (num_layers < 0 || num_pairs < 0 || num_blocks <= 0 || block_bytes <= 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_pairs > 0 && num_layers > 0 && (kv_caches == nullptr || block_mapping == nullptr))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  for (int32_t l = 0; l < num_layers && num_pairs > 0; ++l)
    if (kv_caches[l] == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  for (int32_t p = 0; p < 2 * num_pairs; ++p)
    if (block_mapping[p] < 0 || block_mapping[p] >= num_blocks) return KVPAGER_STATUS_INVALID_BLOCK;
  for (int32_t l = 0; l < num_layers; ++l) {
    auto* cache = static_cast<std::byte*>(kv_caches[l]);
    for (int32_t p = 0; p < num_pairs; ++p)
      std::memcpy(cache + block_mapping[2 * p + 1] * block_bytes, cache + block_mapping[2 * p] * block_bytes,
                  static_cast<std::size_t>(block_bytes));
  }
  return KVPAGER_STATUS_OK;
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
  return static_cast<std::int32_t>(std::clamp<std::int64_t>(want, 1, std::min<std::int64_t>(cap, 64)));
}

std::int32_t paged_attention_decode_cpu(const decode_params& p) noexcept {
  if (const std::int32_t rc = validate(p); rc != KVPAGER_STATUS_OK) return rc;
  const auto& kv = p.kv;
  const std::int64_t D = kv.head_dim, hkv = kv.num_kv_heads;
  const std::int32_t group = p.num_q_heads / kv.num_kv_heads;
  std::int32_t max_len = 0;
  for (std::int32_t s = 0; s < p.num_seqs; ++s) max_len = std::max(max_len, length_of(p.pages, s, kv.block_size));
  const std::int32_t splits = p.num_splits > 0 ? p.num_splits : plan_decode(p.num_seqs, kv.num_kv_heads, max_len, p.num_threads);
  const chunk_fn chunk = pick_chunk();
  const auto scratch_floats = static_cast<std::size_t>((2 * kv.block_size + group) * D + group * kv.block_size);
  // Partial states [seq][q head][split]: m, l, acc[D]; merged below (split 1: the merge just normalizes).
  std::vector<float> part(static_cast<std::size_t>(std::int64_t{p.num_seqs} * p.num_q_heads * splits * (D + 2)));
  auto state = [&](std::int64_t seq, std::int64_t qh, std::int64_t split) {
    return part.data() + ((seq * p.num_q_heads + qh) * splits + split) * (D + 2);
  };
  parallel_for(std::int64_t{p.num_seqs} * hkv * splits, p.num_threads, [&](std::int64_t item) {
    thread_local std::vector<float> scratch, m, l, acc;
    if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);
    m.resize(static_cast<std::size_t>(group));
    l.resize(static_cast<std::size_t>(group));
    acc.resize(static_cast<std::size_t>(group * D));
    const auto seq = static_cast<std::int32_t>(item / (hkv * splits));
    const auto h = static_cast<std::int32_t>(item / splits % hkv);
    const auto split = static_cast<std::int32_t>(item % splits);
    const std::int32_t len = length_of(p.pages, seq, kv.block_size);
    const std::int32_t per = (len + splits - 1) / splits;
    const std::int32_t chunk_len = (per + kv.block_size - 1) / kv.block_size * kv.block_size;  // whole blocks
    const std::int32_t t0 = std::min(len, split * chunk_len), t1 = std::min(len, t0 + chunk_len);
    chunk(p, seq, h, t0, t1, scratch.data(), m.data(), l.data(), acc.data());
    for (std::int32_t g = 0; g < group; ++g) {
      float* st = state(seq, h * group + g, split);
      st[0] = m[static_cast<std::size_t>(g)];
      st[1] = l[static_cast<std::size_t>(g)];
      std::memcpy(st + 2, acc.data() + g * D, static_cast<std::size_t>(D) * sizeof(float));
    }
  });
  // Merge the splits in fp32: out = sum_i exp(m_i - M) acc_i / sum_i exp(m_i - M) l_i.
  parallel_for(std::int64_t{p.num_seqs} * p.num_q_heads, p.num_threads, [&](std::int64_t row) {
    const std::int64_t seq = row / p.num_q_heads, qh = row % p.num_q_heads;
    float M = -std::numeric_limits<float>::infinity();
    for (std::int32_t i = 0; i < splits; ++i)
      if (state(seq, qh, i)[1] > 0.0F) M = std::max(M, state(seq, qh, i)[0]);
    float L = 0.0F;
    thread_local std::vector<float> o;
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
    const float inv = L > 0.0F ? 1.0F / L : 0.0F;
    for (std::int64_t d = 0; d < D; ++d) store_one(p.out, row * D + d, o[static_cast<std::size_t>(d)] * inv, kv.dtype);
    if (p.lse != nullptr) p.lse[row] = L > 0.0F ? M + std::log(L) : -std::numeric_limits<float>::infinity();
  });
  return KVPAGER_STATUS_OK;
}

KVPAGER_NAMESPACE_END
