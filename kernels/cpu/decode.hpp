// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CPU decode runner (decode.cpp) on arguments already validated, for the one other caller that validates them
// itself: the prefill, which hands a batch of one query row per sequence to the decode (prefill.cpp, after
// check_prefill). Internal to libkvpager_kernels.
#include <cstdint>

#include "kvpager/kernels/attention.hpp"

namespace kvpager::kernels::detail {

/// The decode of decode.cpp for every pool dtype, fp8 included, on arguments check_decode (or check_prefill, for a
/// batch of one row per sequence) accepted; returns a KVPAGER_STATUS_* code (OUT_OF_MEMORY or a workspace too small
/// are still found here, before anything is written).
std::int32_t decode_validated(const kvpager::decode_params& p) noexcept;

}  // namespace kvpager::kernels::detail
