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
#include "kvpager/kernels/float16.hpp"

namespace {

using kvpager::detail::bf16_to_float;
using kvpager::detail::float_to_bf16;
using kvpager::detail::float_to_half;
using kvpager::detail::half_to_float;

struct fp32_t {
  using storage = float;
  static float load(storage x) noexcept { return x; }
  static storage store(float x) noexcept { return x; }
};
struct fp16_t {
  using storage = std::uint16_t;
  static float load(storage x) noexcept { return half_to_float(x); }
  static storage store(float x) noexcept { return float_to_half(x); }
};
struct bf16_t {
  using storage = std::uint16_t;
  static float load(storage x) noexcept { return bf16_to_float(x); }
  static storage store(float x) noexcept { return float_to_bf16(x); }
};

bool supported_head_dim(std::int32_t d) { return d == 64 || d == 80 || d == 96 || d == 112 || d == 128 || d == 256; }
bool supported_block_size(std::int32_t b) { return b == 8 || b == 16 || b == 32; }

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

struct decode_args {
  void* out;
  const void* query;
  const void* kv_cache;
  const std::int32_t* block_table;
  const std::int32_t* seq_lens;
  std::int32_t num_seqs, num_q_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq;
  float scale;
  std::int32_t num_threads;
};

template <class T>
void decode(const decode_args& a) {
  using S = typename T::storage;
  const auto* q = static_cast<const S*>(a.query);
  const auto* kv = static_cast<const S*>(a.kv_cache);
  auto* out = static_cast<S*>(a.out);
  const std::int64_t D = a.head_dim, bs = a.block_size, hkv = a.num_kv_heads;
  const std::int32_t group = a.num_q_heads / a.num_kv_heads;
  const std::int64_t head_stride = bs * D;          // elements between heads within a K (or V) half-block
  const std::int64_t half_stride = hkv * head_stride;  // between K and V of a block
  parallel_for(std::int64_t{a.num_seqs} * hkv, a.num_threads, [&](std::int64_t item) {
    const std::int64_t seq = item / hkv, h = item % hkv;
    const std::int32_t len = a.seq_lens[seq];
    std::vector<float> qf(static_cast<std::size_t>(group * D)), acc(static_cast<std::size_t>(group * D), 0.0F);
    std::vector<float> m(static_cast<std::size_t>(group), -std::numeric_limits<float>::infinity());
    std::vector<float> l(static_cast<std::size_t>(group), 0.0F);
    std::vector<float> scores(static_cast<std::size_t>(group * bs));
    for (std::int32_t g = 0; g < group; ++g) {
      const S* qrow = q + (seq * a.num_q_heads + h * group + g) * D;
      for (std::int64_t d = 0; d < D; ++d) qf[static_cast<std::size_t>(g * D + d)] = T::load(qrow[d]) * a.scale;
    }
    const std::int32_t* table = a.block_table + seq * a.max_blocks_per_seq;
    for (std::int64_t start = 0; start < len; start += bs) {
      const std::int64_t n = std::min<std::int64_t>(bs, len - start);
      const S* kblock = kv + (std::int64_t{table[start / bs]} * 2 * half_stride) + h * head_stride;
      const S* vblock = kblock + half_stride;
      for (std::int32_t g = 0; g < group; ++g) {
        const float* qg = qf.data() + g * D;
        float* sg = scores.data() + g * bs;
        float block_max = -std::numeric_limits<float>::infinity();
        for (std::int64_t t = 0; t < n; ++t) {
          const S* krow = kblock + t * D;
          float s = 0.0F;
          for (std::int64_t d = 0; d < D; ++d) s += qg[d] * T::load(krow[d]);
          sg[t] = s;
          block_max = std::max(block_max, s);
        }
        const float m_new = std::max(m[static_cast<std::size_t>(g)], block_max);
        const float alpha = std::exp(m[static_cast<std::size_t>(g)] - m_new);  // 0 on the first block
        float* ag = acc.data() + g * D;
        for (std::int64_t d = 0; d < D; ++d) ag[d] *= alpha;
        float lsum = l[static_cast<std::size_t>(g)] * alpha;
        for (std::int64_t t = 0; t < n; ++t) {
          const float p = std::exp(sg[t] - m_new);
          lsum += p;
          const S* vrow = vblock + t * D;
          for (std::int64_t d = 0; d < D; ++d) ag[d] += p * T::load(vrow[d]);
        }
        l[static_cast<std::size_t>(g)] = lsum;
        m[static_cast<std::size_t>(g)] = m_new;
      }
    }
    for (std::int32_t g = 0; g < group; ++g) {
      S* orow = out + (seq * a.num_q_heads + h * group + g) * D;
      const float inv = l[static_cast<std::size_t>(g)] > 0.0F ? 1.0F / l[static_cast<std::size_t>(g)] : 0.0F;
      for (std::int64_t d = 0; d < D; ++d) orow[d] = T::store(acc[static_cast<std::size_t>(g * D + d)] * inv);
    }
  });
}

std::int64_t dtype_bytes(std::int32_t dtype) { return dtype == KVPAGER_DTYPE_FP32 ? 4 : 2; }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVPAGER_HAVE_AVX2_PATH 1
// AVX2 + FMA + F16C path, selected at run time (the library itself targets baseline x86-64). Only intrinsics and
// this file's own static helpers run inside the target("...") functions, so no shared inline code is compiled
// for AVX2 and picked up by baseline callers.
#define KVPAGER_AVX2 __attribute__((target("avx2,fma,f16c")))

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

/// Converts n elements of dtype to float (n a multiple of 8).
KVPAGER_AVX2 void to_float_avx2(const void* src, float* dst, std::int64_t n, std::int32_t dtype) {
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

KVPAGER_AVX2 float dot_avx2(const float* a, const float* b, std::int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i < n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  const __m256 s = _mm256_add_ps(s0, s1);
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

/// exp of 8 floats (Cephes-style range reduction and polynomial, within 2 ulp over [-87, 88]; inputs below are
/// clamped, so exp(-inf) gives ~1e-38 rather than 0: callers only use it for values <= 0 of real scores).
KVPAGER_AVX2 __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654F)), _mm256_set1_ps(88.37626F));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341F), _mm256_set1_ps(0.5F));
  fx = _mm256_floor_ps(fx);
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

/// p[t] = exp(s[t] - m) for t < n (n <= 32), returning their sum.
KVPAGER_AVX2 float exp_sub_avx2(const float* s, float m, float* p, std::int64_t n) {
  const __m256 vm = _mm256_set1_ps(m);
  for (std::int64_t t = 0; t < n; t += 8) {
    alignas(32) float buf[8];
    for (std::int64_t i = 0; i < 8; ++i) buf[i] = t + i < n ? s[t + i] : m;  // pad with m: exp(0), not summed
    _mm256_store_ps(buf, exp256(_mm256_sub_ps(_mm256_load_ps(buf), vm)));
    for (std::int64_t i = 0; i < 8 && t + i < n; ++i) p[t + i] = buf[i];
  }
  float sum = 0.0F;
  for (std::int64_t t = 0; t < n; ++t) sum += p[t];
  return sum;
}

/// acc = alpha * acc + sum_t p[t] * v[t], with acc held in registers 64 floats at a time across the block's tokens.
KVPAGER_AVX2 void accumulate_block_avx2(float* acc, float alpha, const float* p, const float* v, std::int64_t n,
                                        std::int64_t D) {
  const __m256 va = _mm256_set1_ps(alpha);
  std::int64_t c = 0;
  for (; c + 64 <= D; c += 64) {
    __m256 r0 = _mm256_mul_ps(_mm256_loadu_ps(acc + c), va), r1 = _mm256_mul_ps(_mm256_loadu_ps(acc + c + 8), va);
    __m256 r2 = _mm256_mul_ps(_mm256_loadu_ps(acc + c + 16), va), r3 = _mm256_mul_ps(_mm256_loadu_ps(acc + c + 24), va);
    __m256 r4 = _mm256_mul_ps(_mm256_loadu_ps(acc + c + 32), va), r5 = _mm256_mul_ps(_mm256_loadu_ps(acc + c + 40), va);
    __m256 r6 = _mm256_mul_ps(_mm256_loadu_ps(acc + c + 48), va), r7 = _mm256_mul_ps(_mm256_loadu_ps(acc + c + 56), va);
    for (std::int64_t t = 0; t < n; ++t) {
      const __m256 pt = _mm256_set1_ps(p[t]);
      const float* row = v + t * D + c;
      r0 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row), r0);
      r1 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row + 8), r1);
      r2 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row + 16), r2);
      r3 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row + 24), r3);
      r4 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row + 32), r4);
      r5 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row + 40), r5);
      r6 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row + 48), r6);
      r7 = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row + 56), r7);
    }
    _mm256_storeu_ps(acc + c, r0);
    _mm256_storeu_ps(acc + c + 8, r1);
    _mm256_storeu_ps(acc + c + 16, r2);
    _mm256_storeu_ps(acc + c + 24, r3);
    _mm256_storeu_ps(acc + c + 32, r4);
    _mm256_storeu_ps(acc + c + 40, r5);
    _mm256_storeu_ps(acc + c + 48, r6);
    _mm256_storeu_ps(acc + c + 56, r7);
  }
  for (; c < D; c += 8) {  // head dims 80, 96, 112: the remainder, 8 floats at a time
    __m256 r = _mm256_mul_ps(_mm256_loadu_ps(acc + c), va);
    for (std::int64_t t = 0; t < n; ++t) r = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(v + t * D + c), r);
    _mm256_storeu_ps(acc + c, r);
  }
}

KVPAGER_AVX2 void scale_avx2(float* x, float a, std::int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  for (std::int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), va));
}


/// One (sequence, KV head) work item; scratch holds (2 * block_size + 2 * group) * head_dim + group * block_size
/// + 2 * group floats.
template <class T>
KVPAGER_AVX2 void decode_item_avx2(const decode_args& a, std::int32_t dtype, std::int64_t seq, std::int64_t h,
                                   float* scratch) {
  using S = typename T::storage;
  const std::int64_t D = a.head_dim, bs = a.block_size, hkv = a.num_kv_heads;
  const std::int32_t group = a.num_q_heads / a.num_kv_heads;
  const std::int64_t head_stride = bs * D, half_stride = hkv * head_stride;
  float* kf = scratch;
  float* vf = kf + bs * D;
  float* qf = vf + bs * D;
  float* acc = qf + group * D;
  float* scores = acc + group * D;
  float* m = scores + group * bs;
  float* l = m + group;
  const auto* q = static_cast<const S*>(a.query);
  const auto* kv = static_cast<const S*>(a.kv_cache);
  const std::int32_t len = a.seq_lens[seq];
  for (std::int32_t g = 0; g < group; ++g) {
    to_float_avx2(q + (seq * a.num_q_heads + h * group + g) * D, qf + g * D, D, dtype);
    scale_avx2(qf + g * D, a.scale, D);
    for (std::int64_t d = 0; d < D; ++d) acc[g * D + d] = 0.0F;
    m[g] = -__builtin_inff();
    l[g] = 0.0F;
  }
  const std::int32_t* table = a.block_table + seq * a.max_blocks_per_seq;
  for (std::int64_t start = 0; start < len; start += bs) {
    const std::int64_t n = len - start < bs ? len - start : bs;
    const S* kblock = kv + std::int64_t{table[start / bs]} * 2 * half_stride + h * head_stride;
    to_float_avx2(kblock, kf, n * D, dtype);  // each KV block converted once for the whole query-head group
    to_float_avx2(kblock + half_stride, vf, n * D, dtype);
    for (std::int32_t g = 0; g < group; ++g) {
      float* sg = scores + g * bs;
      float block_max = -__builtin_inff();
      for (std::int64_t t = 0; t < n; ++t) {
        sg[t] = dot_avx2(qf + g * D, kf + t * D, D);
        block_max = sg[t] > block_max ? sg[t] : block_max;
      }
      const float m_new = m[g] > block_max ? m[g] : block_max;
      const float alpha = m[g] == -__builtin_inff() ? 0.0F : expf(m[g] - m_new);
      const float lsum = l[g] * alpha + exp_sub_avx2(sg, m_new, sg, n);  // scores become probabilities
      accumulate_block_avx2(acc + g * D, alpha, sg, vf, n, D);
      l[g] = lsum;
      m[g] = m_new;
    }
  }
  auto* out = static_cast<S*>(a.out);
  for (std::int32_t g = 0; g < group; ++g) {
    S* orow = out + (seq * a.num_q_heads + h * group + g) * D;
    const float inv = l[g] > 0.0F ? 1.0F / l[g] : 0.0F;
    for (std::int64_t d = 0; d < D; ++d) orow[d] = T::store(acc[g * D + d] * inv);
  }
}

template <class T>
void decode_avx2(const decode_args& a, std::int32_t dtype) {
  const std::int64_t hkv = a.num_kv_heads;
  const std::int64_t group = a.num_q_heads / a.num_kv_heads;
  const auto floats = static_cast<std::size_t>((2 * a.block_size + 2 * group) * a.head_dim + group * a.block_size + 2 * group);
  parallel_for(std::int64_t{a.num_seqs} * hkv, a.num_threads, [&](std::int64_t item) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < floats) scratch.resize(floats);
    decode_item_avx2<T>(a, dtype, item / hkv, item % hkv, scratch.data());
  });
}
#endif

}  // namespace

extern "C" {

int32_t kvpager_cpu_paged_attention_decode(void* out, const void* query, const void* kv_cache,
                                           const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                           int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                           int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                           float scale, int32_t dtype, int32_t num_threads) {
  if (num_seqs < 0 || max_blocks_per_seq <= 0 || num_blocks <= 0 || num_threads < 0 || !std::isfinite(scale))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_seqs > 0 && (out == nullptr || query == nullptr || kv_cache == nullptr || block_table == nullptr ||
                       seq_lens == nullptr))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_kv_heads <= 0 || num_q_heads <= 0 || num_q_heads % num_kv_heads != 0) return KVPAGER_STATUS_BAD_HEADS;
  if (!supported_head_dim(head_dim)) return KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM;
  if (dtype != KVPAGER_DTYPE_FP32 && dtype != KVPAGER_DTYPE_FP16 && dtype != KVPAGER_DTYPE_BF16)
    return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
  if (!supported_block_size(block_size)) return KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE;
  // Every block a sequence reads, checked before anything is read.
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t len = seq_lens[s];
    if (len < 0 || std::int64_t{len} > std::int64_t{max_blocks_per_seq} * block_size) return KVPAGER_STATUS_SEQ_TOO_LONG;
    const int32_t* row = block_table + std::int64_t{s} * max_blocks_per_seq;
    for (int32_t b = 0; b < (len + block_size - 1) / block_size; ++b)
      if (row[b] < 0 || row[b] >= num_blocks) return KVPAGER_STATUS_INVALID_BLOCK;
  }
  const decode_args a{out, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads,
                      head_dim, block_size, max_blocks_per_seq, scale, num_threads};
#if defined(KVPAGER_HAVE_AVX2_PATH)
  static const bool avx2 = cpu_has_avx2() && std::getenv("KVPAGER_CPU_DISPATCH") == nullptr;
  if (avx2) {
    switch (dtype) {
      case KVPAGER_DTYPE_FP32: decode_avx2<fp32_t>(a, dtype); break;
      case KVPAGER_DTYPE_FP16: decode_avx2<fp16_t>(a, dtype); break;
      default: decode_avx2<bf16_t>(a, dtype); break;
    }
    return KVPAGER_STATUS_OK;
  }
#endif
  switch (dtype) {  // portable path
    case KVPAGER_DTYPE_FP32: decode<fp32_t>(a); break;
    case KVPAGER_DTYPE_FP16: decode<fp16_t>(a); break;
    default: decode<bf16_t>(a); break;
  }
  return KVPAGER_STATUS_OK;
}

int32_t kvpager_cpu_kv_append(void* kv_cache, const void* key, const void* value, const int64_t* slot_mapping,
                              int32_t num_tokens, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                              int32_t num_blocks, int32_t dtype) {
  if (num_tokens < 0 || num_kv_heads <= 0 || head_dim <= 0 || block_size <= 0 || num_blocks <= 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (dtype != KVPAGER_DTYPE_FP32 && dtype != KVPAGER_DTYPE_FP16 && dtype != KVPAGER_DTYPE_BF16)
    return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
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
