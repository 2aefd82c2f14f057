// SPDX-License-Identifier: Apache-2.0
#pragma once
// The vector operations the CPU attention kernels are written in, once per instruction set: scalar_vec (one float
// per "vector", the portable paths), avx2_vec (8 lanes, AVX2 + FMA + F16C) and avx512_vec (16 lanes, AVX-512
// F/BW/DQ/VL). decode.cpp and prefill.cpp each derive their per-path `isa` from one of these, adding
// only their own tile shapes, and compile their kernel (decode_tiled.inc, prefill_tiled.inc) once per
// path; vec_math.inc adds exp, tanh and the soft cap on top of whichever `isa` is in scope.
//
// The x86 structs are defined under their own #pragma GCC target, so their members carry that target; they are
// called only from code compiled for the same (or a wider) target, which the runtime dispatch reaches only after
// checking the CPU (kvpager_cpu_decode_path). The library itself targets baseline x86-64. Internal to
// libkvpager_kernels.
//
// Conversions: fp16 by the hardware (F16C, round to nearest even); bf16 widened exactly and narrowed to nearest even
// with a NaN kept quiet (the same rule as kvpager::detail::float_to_bf16, which the scalar path uses); fp8 E4M3 via
// fp8_convert.hpp (the vector paths return the e4m3 value / unit8, the caller folds unit8 into its scales).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/float8.hpp"
#include "kernels/cpu/element_ops.hpp"
#include "kernels/cpu/fp8_convert.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVPAGER_HAVE_X86_VEC_OPS 1
// GCC 12 warns about the deliberately undefined vectors inside some AVX-512 intrinsics (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace kvpager::kernels::detail {

/// One float per vector: the portable paths (the compiler may still vectorize the loops around them).
struct scalar_vec {
  using vec = float;
  static constexpr int W = 1;
  /// The score tile reduce_store takes: tokens x 4 query heads.
  static constexpr int reduce_tokens = 2;
  /// Element i of a KV row of dtype DT (fp8: value / unit8).
  template <int DT>
  static vec load(const unsigned char* row, std::int64_t i) {
    if constexpr (DT == KVPAGER_DTYPE_FP8_E4M3) return load8(row + i);
    return load_one(row, i, DT);
  }
  template <int DT>
  static void store(unsigned char* dst, std::int64_t i, vec v) {
    store_one(dst, i, v, DT);
  }
  /// Element i of a row of the run-time dtype (fp32, fp16, bf16) as float, and back.
  static vec loadq(const void* base, std::int64_t i, std::int32_t dtype) { return load_one(base, i, dtype); }
  static void storeq(void* base, std::int64_t i, vec v, std::int32_t dtype) { store_one(base, i, v, dtype); }
  /// One e4m3 byte as its value / unit8.
  static constexpr float unit8 = 1.0F;
  static vec load8(const unsigned char* p) { return kvpager::detail::e4m3_to_float(*p); }
  static vec loadf(const float* p) { return *p; }
  static void storef(float* p, vec v) { *p = v; }
  static vec zero() { return 0.0F; }
  static vec set1(float x) { return x; }
  static vec add(vec a, vec b) { return a + b; }
  static vec sub(vec a, vec b) { return a - b; }
  static vec mul(vec a, vec b) { return a * b; }
  static vec div(vec a, vec b) { return a / b; }
  static vec max(vec a, vec b) { return a > b ? a : b; }  // b where either is NaN, as maxps
  static vec min(vec a, vec b) { return a < b ? a : b; }
  static vec fma(vec a, vec b, vec c) { return a * b + c; }
  static vec fnma(vec a, vec b, vec c) { return c - a * b; }
  static vec floor(vec v) { return std::floor(v); }
  static vec pow2i(vec n) { return std::ldexp(1.0F, static_cast<int>(n)); }
  static vec zero_below(vec x, float limit, vec y) { return x >= limit ? y : 0.0F; }
  static vec abs(vec v) { return std::fabs(v); }
  static vec copysign(vec mag, vec sgn) { return std::copysign(mag, sgn); }
  static vec select_lt(vec x, float limit, vec a, vec b) { return x < limit ? a : b; }
  static float hsum(vec v) { return v; }
  /// Lane i gets lane i ^ d (d a power of two below W): here there is one lane and no such d.
  static vec swap_lanes(vec v, int /*d*/) { return v; }
  static void prefetch(const unsigned char* p) { __builtin_prefetch(p); }
  /// out[t * lt + g] = a[t][g] for t < valid, g < gt.
  static void reduce_store(const vec (&a)[reduce_tokens][4], int valid, int gt, float* out, std::int64_t lt) {
    for (int t = 0; t < valid; ++t)
      for (int g = 0; g < gt; ++g) out[t * lt + g] = a[t][g];
  }
};

#if defined(KVPAGER_HAVE_X86_VEC_OPS)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
struct avx2_vec {
  using vec = __m256;
  static constexpr int W = 8;
  static constexpr int reduce_tokens = 2;  // 2 tokens x 4 heads = 8 accumulators of 16 registers
  template <int DT>
  static vec load(const unsigned char* row, std::int64_t i) {
    if constexpr (DT == KVPAGER_DTYPE_FP32) {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
    } else if constexpr (DT == KVPAGER_DTYPE_FP8_E4M3) {
      return load8(row + i);
    } else {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const std::uint16_t*>(row) + i));
      if constexpr (DT == KVPAGER_DTYPE_FP16) return _mm256_cvtph_ps(h);
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
  template <int DT>
  static void store(unsigned char* dst, std::int64_t i, vec v) {
    if constexpr (DT == KVPAGER_DTYPE_FP32) {
      _mm256_storeu_ps(reinterpret_cast<float*>(dst) + i, v);
    } else {
      __m128i h;
      if constexpr (DT == KVPAGER_DTYPE_FP16) {
        h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
      } else {
        const __m256i x = _mm256_castps_si256(v);
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
        const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
        r = _mm256_blendv_epi8(r, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
        h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(reinterpret_cast<std::uint16_t*>(dst) + i), h);
    }
  }
  static vec loadq(const void* base, std::int64_t i, std::int32_t dtype) {
    const auto* p = static_cast<const unsigned char*>(base);
    if (dtype == KVPAGER_DTYPE_FP32) return load<KVPAGER_DTYPE_FP32>(p, i);
    return dtype == KVPAGER_DTYPE_FP16 ? load<KVPAGER_DTYPE_FP16>(p, i) : load<KVPAGER_DTYPE_BF16>(p, i);
  }
  static void storeq(void* base, std::int64_t i, vec v, std::int32_t dtype) {
    auto* p = static_cast<unsigned char*>(base);
    if (dtype == KVPAGER_DTYPE_FP32) {
      store<KVPAGER_DTYPE_FP32>(p, i, v);
    } else if (dtype == KVPAGER_DTYPE_FP16) {
      store<KVPAGER_DTYPE_FP16>(p, i, v);
    } else {
      store<KVPAGER_DTYPE_BF16>(p, i, v);
    }
  }
  static constexpr float unit8 = kE4m3VectorUnit;
  static vec load8(const unsigned char* p) { return e4m3x8_div256(p); }
  static vec loadf(const float* p) { return _mm256_loadu_ps(p); }
  static void storef(float* p, vec v) { _mm256_storeu_ps(p, v); }
  static vec zero() { return _mm256_setzero_ps(); }
  static vec set1(float x) { return _mm256_set1_ps(x); }
  static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
  static vec div(vec a, vec b) { return _mm256_div_ps(a, b); }
  static vec max(vec a, vec b) { return _mm256_max_ps(a, b); }
  static vec min(vec a, vec b) { return _mm256_min_ps(a, b); }
  static vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static vec fnma(vec a, vec b, vec c) { return _mm256_fnmadd_ps(a, b, c); }  // c - a * b
  static vec floor(vec v) { return _mm256_floor_ps(v); }
  /// 2^n for integral-valued n in the normal exponent range.
  static vec pow2i(vec n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  /// y where x >= limit, 0 elsewhere (and where x is NaN).
  static vec zero_below(vec x, float limit, vec y) {
    return _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(limit), _CMP_GE_OQ), y);
  }
  static vec abs(vec v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0F), v); }
  static vec copysign(vec mag, vec sgn) {
    return _mm256_or_ps(_mm256_and_ps(_mm256_set1_ps(-0.0F), sgn), _mm256_andnot_ps(_mm256_set1_ps(-0.0F), mag));
  }
  /// a where x < limit, b elsewhere.
  static vec select_lt(vec x, float limit, vec a, vec b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, _mm256_set1_ps(limit), _CMP_LT_OQ));
  }
  static float hsum(vec v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
  }
  static void prefetch(const unsigned char* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
  /// Lane i gets lane i ^ d, d in {4, 2, 1}.
  static vec swap_lanes(vec v, int d) {
    if (d == 4) return _mm256_permute2f128_ps(v, v, 0x01);
    return d == 2 ? _mm256_permute_ps(v, 0x4E) : _mm256_permute_ps(v, 0xB1);
  }
  /// The 8 dot products of a[t][g] (t < 2, g < 4) with one shuffle tree; writes out[t * lt + g] for t < valid,
  /// g < gt. Always inline: out of line, the accumulators would go through the stack (bench/RESULTS.md).
  [[gnu::always_inline]] static inline void reduce_store(const vec (&a)[2][4], int valid, int gt, float* out,
                                                         std::int64_t lt) {
    vec p[4];  // p[j]: 128-bit lane 0 holds the 4 partial sums of v[2j], lane 1 those of v[2j+1]; v[2g+t] = a[t][g]
    for (int j = 0; j < 4; ++j)
      p[j] = _mm256_add_ps(_mm256_permute2f128_ps(a[0][j], a[1][j], 0x20), _mm256_permute2f128_ps(a[0][j], a[1][j], 0x31));
    vec b[2];  // b[j]: lane i holds 2 partial sums of v[4j + i] for i < 4 (as pairs)
    for (int j = 0; j < 2; ++j) {
      const __m256d x = _mm256_castps_pd(p[2 * j]), y = _mm256_castps_pd(p[2 * j + 1]);
      b[j] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
    }
    const vec r = _mm256_add_ps(_mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
    alignas(32) float sums[8];  // sums[4 t + g] = dot(t, g)
    _mm256_store_ps(sums, r);
    for (int t = 0; t < valid; ++t)
      for (int g = 0; g < gt; ++g) out[t * lt + g] = sums[4 * t + g];
  }
};
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
struct avx512_vec {
  using vec = __m512;
  static constexpr int W = 16;
  static constexpr int reduce_tokens = 4;  // 4 tokens x 4 heads = 16 accumulators of 32 registers
  template <int DT>
  static vec load(const unsigned char* row, std::int64_t i) {
    if constexpr (DT == KVPAGER_DTYPE_FP32) {
      return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + i);
    } else if constexpr (DT == KVPAGER_DTYPE_FP8_E4M3) {
      return load8(row + i);
    } else {
      const __m256i h =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const std::uint16_t*>(row) + i));
      if constexpr (DT == KVPAGER_DTYPE_FP16) return _mm512_cvtph_ps(h);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
  template <int DT>
  static void store(unsigned char* dst, std::int64_t i, vec v) {
    if constexpr (DT == KVPAGER_DTYPE_FP32) {
      _mm512_storeu_ps(reinterpret_cast<float*>(dst) + i, v);
    } else {
      __m256i h;
      if constexpr (DT == KVPAGER_DTYPE_FP16) {
        h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      } else {
        const __m512i x = _mm512_castps_si512(v);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)), 16);
        const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
        r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), nan);
        h = _mm512_cvtepi32_epi16(r);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(reinterpret_cast<std::uint16_t*>(dst) + i), h);
    }
  }
  static vec loadq(const void* base, std::int64_t i, std::int32_t dtype) {
    const auto* p = static_cast<const unsigned char*>(base);
    if (dtype == KVPAGER_DTYPE_FP32) return load<KVPAGER_DTYPE_FP32>(p, i);
    return dtype == KVPAGER_DTYPE_FP16 ? load<KVPAGER_DTYPE_FP16>(p, i) : load<KVPAGER_DTYPE_BF16>(p, i);
  }
  static void storeq(void* base, std::int64_t i, vec v, std::int32_t dtype) {
    auto* p = static_cast<unsigned char*>(base);
    if (dtype == KVPAGER_DTYPE_FP32) {
      store<KVPAGER_DTYPE_FP32>(p, i, v);
    } else if (dtype == KVPAGER_DTYPE_FP16) {
      store<KVPAGER_DTYPE_FP16>(p, i, v);
    } else {
      store<KVPAGER_DTYPE_BF16>(p, i, v);
    }
  }
  static constexpr float unit8 = kE4m3VectorUnit;
  static vec load8(const unsigned char* p) { return e4m3x16_div256(p); }
  static vec loadf(const float* p) { return _mm512_loadu_ps(p); }
  static void storef(float* p, vec v) { _mm512_storeu_ps(p, v); }
  static vec zero() { return _mm512_setzero_ps(); }
  static vec set1(float x) { return _mm512_set1_ps(x); }
  static vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
  static vec div(vec a, vec b) { return _mm512_div_ps(a, b); }
  static vec max(vec a, vec b) { return _mm512_max_ps(a, b); }
  static vec min(vec a, vec b) { return _mm512_min_ps(a, b); }
  static vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static vec fnma(vec a, vec b, vec c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
  static vec floor(vec v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  /// 2^n for integral-valued n in the normal exponent range.
  static vec pow2i(vec n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  /// y where x >= limit, 0 elsewhere (and where x is NaN).
  static vec zero_below(vec x, float limit, vec y) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(limit), _CMP_GE_OQ), y);
  }
  /// v rounded to the nearest integer (ties to even).
  static vec round_nearest(vec v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  /// y * 2^floor(n) (vscalefps: gradual underflow to 0, no exponent arithmetic of our own).
  static vec scalef(vec y, vec n) { return _mm512_scalef_ps(y, n); }
  static vec abs(vec v) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7FFFFFFF)));
  }
  static vec copysign(vec mag, vec sgn) {
    const __m512i m = _mm512_set1_epi32(0x7FFFFFFF);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(mag), m),
                                               _mm512_andnot_si512(m, _mm512_castps_si512(sgn))));
  }
  /// a where x < limit, b elsewhere.
  static vec select_lt(vec x, float limit, vec a, vec b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(limit), _CMP_LT_OQ), b, a);
  }
  static float hsum(vec v) { return _mm512_reduce_add_ps(v); }
  static void prefetch(const unsigned char* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
  /// Lane i gets lane i ^ d, d in {8, 4, 2, 1}.
  static vec swap_lanes(vec v, int d) {
    if (d == 8) return _mm512_shuffle_f32x4(v, v, 0x4E);
    if (d == 4) return _mm512_shuffle_f32x4(v, v, 0xB1);
    return d == 2 ? _mm512_permute_ps(v, 0x4E) : _mm512_permute_ps(v, 0xB1);
  }
  /// The 16 dot products of a[t][g] (t, g < 4) with one shuffle tree; writes out[t * lt + g] for t < valid,
  /// g < gt.
  /// Always inline: out of line, the 16 accumulators went through the stack and a GQA-4 fp16 decode took 41 ns
  /// instead of 27 per (token, KV head) (bench/RESULTS.md).
  [[gnu::always_inline]] static inline void reduce_store(const vec (&a)[4][4], int valid, int gt, float* out,
                                                         std::int64_t lt) {
    // v[4t + g] = a[t][g]. p[j]: 128-bit lanes 0-1 hold 8 partial sums of v[2j], lanes 2-3 those of v[2j+1].
    vec p[8];
    for (int j = 0; j < 8; ++j) {
      const vec x = a[(2 * j) / 4][(2 * j) % 4], y = a[(2 * j + 1) / 4][(2 * j + 1) % 4];
      p[j] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
    }
    vec b[4];  // b[i]: lane j holds 4 partial sums of v[4i + j]
    for (int i = 0; i < 4; ++i)
      b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0xDD));
    vec c[2];  // c[i]: lane j holds 2 partials of v[8i + j], then 2 of v[8i + 4 + j]
    for (int i = 0; i < 2; ++i) {
      const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
      c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    // r: lane j = [v[j], v[4 + j], v[8 + j], v[12 + j]], so r[4g + t] = dot(t, g).
    const vec r = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    alignas(64) float sums[16];
    _mm512_store_ps(sums, r);
    for (int t = 0; t < valid; ++t)
      for (int g = 0; g < gt; ++g) out[t * lt + g] = sums[4 * g + t];
  }
};
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512bf16")
/// A __m512i as the bf16 vector type of vdpbf16ps, the bits as they are (the AVX512-BF16 decode and prefill).
inline __m512bh as_bh(__m512i x) {
  __m512bh r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}
#pragma GCC pop_options
#endif  // KVPAGER_HAVE_X86_VEC_OPS

}  // namespace kvpager::kernels::detail
