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

#if defined(__x86_64__)
// GCC 12 warns about the deliberately undefined vectors inside some AVX-512 intrinsics (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/attention.hpp"
#include "kvpager/kernels/float16.hpp"
#include "kvpager/kernels/float8.hpp"
#include "kernels/common/checks.hpp"
#include "kernels/common/decode_math.hpp"
#include "kernels/cpu/decode_fp8.hpp"
#include "kernels/cpu/fp8_convert.hpp"
#include "kernels/cpu/element_ops.hpp"
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
struct isa {
  using vec = float;
  static constexpr int W = 1;
  static constexpr int score_tokens = 2;
  static constexpr int acc_vectors = 4;
  static constexpr float unit = 1.0F;  ///< cvt8 returns the e4m3 value / unit
  static vec cvt8(const unsigned char* p) { return kvpager::detail::e4m3_to_float(*p); }
  static vec loadf(const float* p) { return *p; }
  static void storef(float* p, vec v) { *p = v; }
  static vec loadq(const void* base, std::int64_t i, std::int32_t dtype) { return load_one(base, i, dtype); }
  static void storeq(void* base, std::int64_t i, vec v, std::int32_t dtype) { store_one(base, i, v, dtype); }
  static vec zero() { return 0.0F; }
  static vec set1(float x) { return x; }
  static vec add(vec a, vec b) { return a + b; }
  static vec sub(vec a, vec b) { return a - b; }
  static vec mul(vec a, vec b) { return a * b; }
  static vec max(vec a, vec b) { return std::max(a, b); }
  static vec fma(vec a, vec b, vec c) { return a * b + c; }
  static float hsum(vec v) { return v; }
  static float hmax(vec v) { return v; }
  static vec exp(vec x) { return std::exp(x); }
  static void prefetch(const unsigned char* p) { __builtin_prefetch(p); }
  [[gnu::always_inline]] static inline void reduce_store(const vec (&a)[score_tokens][4], int valid, int gt, float* out, std::int64_t ld) {
    for (int t = 0; t < valid; ++t)
      for (int g = 0; g < gt; ++g) out[g * ld + t] = a[t][g];
  }
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
struct isa {
  using vec = __m256;
  static constexpr int W = 8;
  static constexpr int score_tokens = 2;  // 2 tokens x 4 heads = 8 accumulators of 16 registers
  static constexpr int acc_vectors = 2;
  /// cvt8 returns the e4m3 value / 256 (fp8_convert.hpp); the caller folds the 256 into the query scale and the output.
  static constexpr float unit = kvpager::kernels::detail::kE4m3VectorUnit;
  static vec cvt8(const unsigned char* p) { return kvpager::kernels::detail::e4m3x8_div256(p); }
  static vec loadf(const float* p) { return _mm256_loadu_ps(p); }
  static void storef(float* p, vec v) { _mm256_storeu_ps(p, v); }
  /// 8 query elements of dtype as floats.
  static vec loadq(const void* base, std::int64_t i, std::int32_t dtype) {
    if (dtype == KVPAGER_DTYPE_FP32) return _mm256_loadu_ps(static_cast<const float*>(base) + i);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(base) + i));
    if (dtype == KVPAGER_DTYPE_FP16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  /// 8 output elements as dtype (fp16 and bf16 rounded to nearest even by the portable conversions).
  static void storeq(void* base, std::int64_t i, vec v, std::int32_t dtype) {
    if (dtype == KVPAGER_DTYPE_FP32) {
      _mm256_storeu_ps(static_cast<float*>(base) + i, v);
    } else if (dtype == KVPAGER_DTYPE_FP16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(base) + i),
                       _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    } else {
      alignas(32) float f[8];
      _mm256_store_ps(f, v);
      for (int k = 0; k < 8; ++k) store_one(base, i + k, f[k], dtype);
    }
  }
  static vec zero() { return _mm256_setzero_ps(); }
  static vec set1(float x) { return _mm256_set1_ps(x); }
  static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
  static vec max(vec a, vec b) { return _mm256_max_ps(a, b); }
  static vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(vec v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
  }
  static float hmax(vec v) {
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)));
  }
  /// exp within 2 ulp over [-87, 88] (Cephes-style reduction and polynomial); below -87.3 (and -inf) exactly 0.
  static vec exp(vec x0) {
    const vec x1 = _mm256_min_ps(_mm256_max_ps(x0, set1(-87.33654F)), set1(88.37626F));
    const vec fx = _mm256_floor_ps(fma(x1, set1(1.44269504088896341F), set1(0.5F)));
    vec x = _mm256_fnmadd_ps(fx, set1(0.693359375F), x1);
    x = _mm256_fnmadd_ps(fx, set1(-2.12194440e-4F), x);
    vec y = set1(1.9875691500E-4F);
    for (const float c : {1.3981999507E-3F, 8.3334519073E-3F, 4.1665795894E-2F, 1.6666665459E-1F, 5.0000001201E-1F})
      y = fma(y, x, set1(c));
    y = fma(y, mul(x, x), add(x, set1(1.0F)));
    const vec p2 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23));
    return _mm256_and_ps(_mm256_cmp_ps(x0, set1(-87.33654F), _CMP_GE_OQ), mul(y, p2));
  }
  static void prefetch(const unsigned char* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
  /// The 8 dot products of a[t][g] (t < 2, g < 4) with one shuffle tree (decode.cpp's AVX2 reduction); writes
  /// out[g * ld + t] for t < valid, g < gt.
  [[gnu::always_inline]] static inline void reduce_store(const vec (&a)[2][4], int valid, int gt, float* out, std::int64_t ld) {
    vec p[4];
    for (int j = 0; j < 4; ++j)
      p[j] = _mm256_add_ps(_mm256_permute2f128_ps(a[0][j], a[1][j], 0x20), _mm256_permute2f128_ps(a[0][j], a[1][j], 0x31));
    vec b[2];
    for (int j = 0; j < 2; ++j) {
      const __m256d x = _mm256_castps_pd(p[2 * j]), y = _mm256_castps_pd(p[2 * j + 1]);
      b[j] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
    }
    const vec r = _mm256_add_ps(_mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
    alignas(32) float sums[8];  // sums[4 t + g] = dot(t, g)
    _mm256_store_ps(sums, r);
    for (int t = 0; t < valid; ++t)
      for (int g = 0; g < gt; ++g) out[g * ld + t] = sums[4 * t + g];
  }
};
#include "decode_fp8.inc"
}  // namespace avx2_fp8
}  // namespace
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
namespace {
namespace avx512_fp8 {
struct isa {
  using vec = __m512;
  static constexpr int W = 16;
  static constexpr int score_tokens = 4;  // 4 tokens x 4 heads = 16 accumulators of 32 registers
  static constexpr int acc_vectors = 4;
  /// 16 e4m3 bytes as floats / 256 (fp8_convert.hpp), as the AVX2 path.
  static constexpr float unit = kvpager::kernels::detail::kE4m3VectorUnit;
  static vec cvt8(const unsigned char* p) { return kvpager::kernels::detail::e4m3x16_div256(p); }
  static vec loadf(const float* p) { return _mm512_loadu_ps(p); }
  static void storef(float* p, vec v) { _mm512_storeu_ps(p, v); }
  /// 16 query elements of dtype as floats.
  static vec loadq(const void* base, std::int64_t i, std::int32_t dtype) {
    if (dtype == KVPAGER_DTYPE_FP32) return _mm512_loadu_ps(static_cast<const float*>(base) + i);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(base) + i));
    if (dtype == KVPAGER_DTYPE_FP16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  /// 16 output elements as dtype (fp16 rounded to nearest even by F16C, bf16 by the portable conversion).
  static void storeq(void* base, std::int64_t i, vec v, std::int32_t dtype) {
    if (dtype == KVPAGER_DTYPE_FP32) {
      _mm512_storeu_ps(static_cast<float*>(base) + i, v);
    } else if (dtype == KVPAGER_DTYPE_FP16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(base) + i),
                          _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      alignas(64) float f[16];
      _mm512_store_ps(f, v);
      for (int k = 0; k < 16; ++k) store_one(base, i + k, f[k], dtype);
    }
  }
  static vec zero() { return _mm512_setzero_ps(); }
  static vec set1(float x) { return _mm512_set1_ps(x); }
  static vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
  static vec max(vec a, vec b) { return _mm512_max_ps(a, b); }
  static vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static float hsum(vec v) { return _mm512_reduce_add_ps(v); }
  static float hmax(vec v) { return _mm512_reduce_max_ps(v); }
  /// exp as the AVX2 path's.
  static vec exp(vec x0) {
    const vec x1 = _mm512_min_ps(_mm512_max_ps(x0, set1(-87.33654F)), set1(88.37626F));
    const vec fx = _mm512_roundscale_ps(fma(x1, set1(1.44269504088896341F), set1(0.5F)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    vec x = _mm512_fnmadd_ps(fx, set1(0.693359375F), x1);
    x = _mm512_fnmadd_ps(fx, set1(-2.12194440e-4F), x);
    vec y = set1(1.9875691500E-4F);
    for (const float c : {1.3981999507E-3F, 8.3334519073E-3F, 4.1665795894E-2F, 1.6666665459E-1F, 5.0000001201E-1F})
      y = fma(y, x, set1(c));
    y = fma(y, mul(x, x), add(x, set1(1.0F)));
    const vec p2 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x0, set1(-87.33654F), _CMP_GE_OQ), mul(y, p2));
  }
  static void prefetch(const unsigned char* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
  /// The 16 dot products of a[t][g] (t, g < 4) with one shuffle tree (decode.cpp's AVX-512 reduction); writes
  /// out[g * ld + t] for t < valid, g < gt.
  [[gnu::always_inline]] static inline void reduce_store(const vec (&a)[4][4], int valid, int gt, float* out, std::int64_t ld) {
    vec p[8];  // v[4t + g] = a[t][g]; p[j]: lanes 0-1 hold 8 partial sums of v[2j], lanes 2-3 those of v[2j+1]
    for (int j = 0; j < 8; ++j) {
      const vec x = a[(2 * j) / 4][(2 * j) % 4], y = a[(2 * j + 1) / 4][(2 * j + 1) % 4];
      p[j] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
    }
    vec b[4];
    for (int i = 0; i < 4; ++i)
      b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0xDD));
    vec c[2];
    for (int i = 0; i < 2; ++i) {
      const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
      c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    const vec r = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    alignas(64) float sums[16];  // sums[4g + t] = dot(t, g)
    _mm512_store_ps(sums, r);
    for (int g = 0; g < gt; ++g)
      for (int t = 0; t < valid; ++t) out[g * ld + t] = sums[4 * g + t];
  }
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

int32_t kvpager_cpu_paged_attention_decode_fp8(void* out, const void* query, const void* kv_cache,
                                               const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                               int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                               int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                               float scale, int32_t q_dtype, float k_scale, float v_scale,
                                               int32_t num_threads) {
  if (const int32_t rc = kvpager::kernels::detail::check_dense_decode_fp8(
          out, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads, head_dim, block_size,
          max_blocks_per_seq, num_blocks, scale, q_dtype, k_scale, v_scale, 1);
      rc != KVPAGER_STATUS_OK)
    return rc;
  kvpager::decode_params p;
  p.out = out;
  p.query = query;
  p.kv = kvpager::paged_kv_view::hnd(kv_cache, KVPAGER_DTYPE_FP8_E4M3, num_blocks, num_kv_heads, block_size, head_dim);
  p.pages.block_table = block_table;
  p.pages.row_stride = max_blocks_per_seq;
  p.pages.seq_lens = seq_lens;
  p.num_seqs = num_seqs;
  p.num_q_heads = num_q_heads;
  p.scale = scale;
  p.num_threads = num_threads;
  p.q_dtype = q_dtype;
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  return kvpager::kernels::detail::decode_fp8_cpu(p);
}

}  // extern "C"
