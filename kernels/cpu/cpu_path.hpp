// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CPU kernels' instruction-set path, chosen once per process (decode.cpp): decode and prefill dispatch on this
// enum with a switch that names every path, so a new path cannot fall through to another kernel unnoticed (a string
// compare against "avx512" once sent the AVX512-BF16 path's prefill and fp8 decode to the portable code).
// kvpager_cpu_decode_path() names it for callers. Internal to libkvpager_kernels.

namespace kvpager::kernels::detail {

/// From narrowest to widest: portable C++, AVX2 + FMA + F16C, AVX-512 F/BW/DQ/VL, AVX-512 plus AVX512_BF16.
enum class cpu_path { portable, avx2, avx512, avx512bf16 };

/// The widest path this CPU runs, capped by KVPAGER_CPU_DISPATCH=portable|avx2|avx512|avx512bf16 if set.
cpu_path pick_cpu_path() noexcept;
/// Whether the decode's prefetch ahead is non-temporal (prefetchnta) rather than into L2 (prefetcht1): on AMD family
/// 26 (Zen 5) nta measured 8-14% faster at 4096 tokens and the same elsewhere (bench/RESULTS.md, issue 27); T1 stays
/// where it was measured best (Zen 4, issue 12) and on every other CPU. KVPAGER_DECODE_PREFETCH=t1|nta overrides.
bool decode_prefetch_nta() noexcept;

}  // namespace kvpager::kernels::detail
