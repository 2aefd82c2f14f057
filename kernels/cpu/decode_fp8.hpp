// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CPU decode over an fp8 E4M3 pool: its checks (decode_fp8.cpp), reached from kvpager_cpu_paged_attention_decode_fp8
// and from kvpager::paged_attention_decode_cpu when p.kv.dtype is KVPAGER_DTYPE_FP8_E4M3, then the one decode runner of
// decode.cpp that every pool dtype shares. Internal to libkvpager_kernels.
#include <cstdint>

#include "kvpager/kernels/attention.hpp"

namespace kvpager::kernels::detail {

/// Validates everything (as kvpager_cpu_paged_attention_decode_fp8 documents, page tables and workspace included)
/// before reading KV or writing out, then runs the decode (decode_validated); returns a KVPAGER_STATUS_* code.
std::int32_t decode_fp8_cpu(const kvpager::decode_params& p) noexcept;

/// The decode of decode.cpp for every pool dtype, fp8 included, on arguments already validated (by decode.cpp's
/// checks, or decode_fp8_cpu's for an fp8 pool); returns a KVPAGER_STATUS_* code (OUT_OF_MEMORY or a workspace too
/// small are still found here, before anything is written).
std::int32_t decode_validated(const kvpager::decode_params& p) noexcept;

}  // namespace kvpager::kernels::detail
