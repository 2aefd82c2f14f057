// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// fp8 E4M3 (OCP FP8 "E4M3FN", the format of NVIDIA's __nv_fp8_e4m3 and vLLM's fp8_e4m3 KV cache) <-> float, in
/// portable C++ usable from host code and from CUDA device code (kernels/cuda/device_fp8.cuh). Layout S.EEEE.MMM,
/// exponent bias 7, no infinities; S.1111.111 is NaN (0x7F, 0xFF); the largest finite magnitude is 448 (0x7E), the
/// smallest subnormal 2^-9 (0x01). float_to_e4m3 rounds to nearest, ties to even, and saturates: a finite value or
/// an infinity beyond +-448 becomes +-448 (what __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) does); NaN stays
/// NaN (sign kept). e4m3_to_float is exact (every e4m3 value is a float).

#include <cstdint>
#include <cstring>

#include "kvpager/core/config.hpp"

#if defined(__CUDACC__)
#define KVPAGER_FP8_HOST_DEVICE __host__ __device__
#else
#define KVPAGER_FP8_HOST_DEVICE
#endif

KVPAGER_NAMESPACE_BEGIN
namespace detail {

/// The largest finite e4m3 magnitude, and its code (0x7E; with the sign bit 0xFE).
inline constexpr float e4m3_max = 448.0F;
inline constexpr std::uint8_t e4m3_max_code = 0x7E;
/// The canonical NaN code (0x7F; 0xFF is NaN too).
inline constexpr std::uint8_t e4m3_nan_code = 0x7F;

[[nodiscard]] KVPAGER_FP8_HOST_DEVICE inline std::uint32_t fp8_float_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u = 0;  // memcpy, not std::bit_cast: the same code compiles in nvcc's host pass
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
[[nodiscard]] KVPAGER_FP8_HOST_DEVICE inline float fp8_bits_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// The float value of e4m3 code `b` (exact; NaN for S.1111.111).
[[nodiscard]] KVPAGER_FP8_HOST_DEVICE inline float e4m3_to_float(std::uint8_t b) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80U) << 24;
  const std::uint32_t exp = (b >> 3) & 0xFU, mant = b & 0x7U;
  if ((b & 0x7FU) == 0x7FU) return fp8_bits_float(sign | 0x7FC00000U);  // NaN
  if (exp == 0) {  // subnormal: mant x 2^-9 (exact in float)
    const float v = static_cast<float>(mant) * 0.001953125F;
    return sign != 0 ? -v : v;
  }
  return fp8_bits_float(sign | ((exp + 120U) << 23) | (mant << 20));
}

/// `f` rounded to the nearest e4m3 value, ties to even, saturated to +-448 (infinities too); NaN -> NaN (sign kept).
[[nodiscard]] KVPAGER_FP8_HOST_DEVICE inline std::uint8_t float_to_e4m3(float f) noexcept {
  const std::uint32_t x = fp8_float_bits(f);
  const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80U);
  const std::uint32_t mag = x & 0x7FFFFFFFU;
  if (mag > 0x7F800000U) return static_cast<std::uint8_t>(sign | e4m3_nan_code);  // NaN
  if (mag > 0x43E00000U) return static_cast<std::uint8_t>(sign | e4m3_max_code);  // beyond 448 (inf included)
  const int e = static_cast<int>(mag >> 23) - 127;                                // unbiased exponent
  const std::uint32_t mant = mag & 0x7FFFFFU;
  if (e >= -6) {  // normal in e4m3: keep 3 mantissa bits, round the other 20 to nearest even
    std::uint32_t r = (static_cast<std::uint32_t>(e + 7) << 3) | (mant >> 20);
    const std::uint32_t rem = mant & 0xFFFFFU;
    if (rem > 0x80000U || (rem == 0x80000U && (r & 1U) != 0)) ++r;  // a carry into the exponent is still right
    return static_cast<std::uint8_t>(sign | r);
  }
  // Subnormal in e4m3 (or zero): the value in units of 2^-9, M x 2^(e - 23) / 2^-9 = M >> (14 - e).
  const int shift = 14 - e;  // >= 21
  if (shift > 25) return sign;  // below 2^-11: rounds to zero (and fp32 subnormals, e = -127)
  const std::uint32_t m = mant | 0x800000U;
  std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1U << shift) - 1U), halfway = 1U << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1U) != 0)) ++q;  // q = 8 is the smallest normal: still right
  return static_cast<std::uint8_t>(sign | q);
}

}  // namespace detail
KVPAGER_NAMESPACE_END
