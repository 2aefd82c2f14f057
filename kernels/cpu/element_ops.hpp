// SPDX-License-Identifier: Apache-2.0
#pragma once
// One element of a query, output or KV row of dtype fp32, fp16 or bf16, read or written as float: the scalar access
// the CPU kernels (decode.cpp, prefill.cpp) share for their portable paths and their edges.
#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/float16.hpp"

namespace kvpager::kernels::detail {

inline float load_one(const void* base, std::int64_t i, std::int32_t dtype) noexcept {
  if (dtype == KVPAGER_DTYPE_FP32) return static_cast<const float*>(base)[i];
  const std::uint16_t x = static_cast<const std::uint16_t*>(base)[i];
  return dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::half_to_float(x) : kvpager::detail::bf16_to_float(x);
}

inline void store_one(void* base, std::int64_t i, float v, std::int32_t dtype) noexcept {
  if (dtype == KVPAGER_DTYPE_FP32) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<std::uint16_t*>(base)[i] =
        dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::float_to_half(v) : kvpager::detail::float_to_bf16(v);
  }
}

}  // namespace kvpager::kernels::detail
