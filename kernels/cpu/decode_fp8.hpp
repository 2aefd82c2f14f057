// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CPU decode over an fp8 E4M3 pool (decode_fp8.cpp), reached from kvpager_cpu_paged_attention_decode_fp8 and from
// kvpager::paged_attention_decode_cpu when p.kv.dtype is KVPAGER_DTYPE_FP8_E4M3. Internal to libkvpager_kernels.
#include <cstdint>

#include "kvpager/kernels/attention.hpp"

namespace kvpager::kernels::detail {

/// Validates everything (as kvpager_cpu_paged_attention_decode_fp8 documents, page tables and workspace included)
/// before reading KV or writing out, then runs the decode; returns a KVPAGER_STATUS_* code.
std::int32_t decode_fp8_cpu(const kvpager::decode_params& p) noexcept;

}  // namespace kvpager::kernels::detail
