// SPDX-License-Identifier: Apache-2.0
#pragma once
// Vector e4m3 -> fp32 conversions of the CPU kernels over fp8 E4M3 KV pools (decode.cpp, prefill.cpp): one
// definition per instruction set, each under its own target attribute and reached only from code that the runtime
// dispatch (kvpager_cpu_decode_path) chose after checking the CPU. Internal to libkvpager_kernels.
//
// The trick: the e4m3 bits placed in an fp16 (sign at bit 15, exponent and mantissa at bits 7-13) are an fp16 with
// the same exponent field and bias 15 instead of 7, i.e. the value x 2^-8, exactly, subnormals included (F16C
// converts fp16 subnormals exactly, whatever MXCSR's DAZ); S.1111.111 becomes the fp16 NaN. So these return the e4m3
// value / 256 (kE4m3VectorUnit); the caller folds the 256 into its query scale and its output.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns about the deliberately undefined vectors inside some AVX-512 intrinsics (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace kvpager::kernels::detail {

/// What the vector conversions below return, times this, is the e4m3 value.
inline constexpr float kE4m3VectorUnit = 256.0F;

/// 8 e4m3 bytes at p as floats / 256 (AVX2 + F16C).
__attribute__((target("avx2,fma,f16c"))) inline __m256 e4m3x8_div256(const unsigned char* p) noexcept {
  // Sign-extended to 16 bits and shifted left by 7: the magnitude lands at bits 7-13, the sign at bits 14 and 15
  // (a negative byte's extension fills bit 15); clearing bit 14 leaves the fp16.
  const __m128i x = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  __m128i h = _mm_and_si128(_mm_slli_epi16(x, 7), _mm_set1_epi16(static_cast<short>(0xBFFF)));
  const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(x, _mm_set1_epi16(0x7F)), _mm_set1_epi16(0x7F));
  h = _mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7E00)));
  return _mm256_cvtph_ps(h);
}

/// 16 e4m3 bytes at p as floats / 256 (AVX-512 F/BW/VL: 256-bit integer work, one 512-bit conversion).
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c"))) inline __m512 e4m3x16_div256(
    const unsigned char* p) noexcept {
  const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16(static_cast<short>(0xBFFF)));
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(x, _mm256_set1_epi16(0x7F)), _mm256_set1_epi16(0x7F));
  return _mm512_cvtph_ps(_mm256_mask_mov_epi16(h, nan, _mm256_set1_epi16(0x7E00)));
}

}  // namespace kvpager::kernels::detail
#endif
