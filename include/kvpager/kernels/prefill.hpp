// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// C++ interface of the CPU paged prefill (extend) attention; kvpager_cpu_paged_attention_prefill in
/// kvpager/c/kernels.h wraps it. Each sequence brings q_len new query rows (CSR: qo_indptr) whose K and V were
/// appended to the paged pool before the call; row i of sequence s sits at position p = len(s) - q_len(s) + i and
/// attends causally to KV positions j <= p (and j >= p - window_left when window_left >= 0). The same paged_kv_view
/// (any strides: HND, NHD) and page_table_view (dense or CSR) as decode, and the same optional LSE output, one value
/// per query row and head. Implemented in libkvpager_kernels; errors are kvpager::status through kernel_status().
///
/// Speed: the query rows of a (sequence, KV head) pair, positions x the group's query heads, sit in the vector lanes
/// (16 on AVX-512, 8 on AVX2), so calls with q_len x group of 16 or more use whole vectors; long prompts run at
/// 0.8-0.9 of an sgemm per core (bench/RESULTS.md). A batch of exactly one row per sequence, without window or cap, is
/// handed to the decode kernel.

#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/kernels/attention.hpp"
#include "kvpager/kernels/export.hpp"

KVPAGER_NAMESPACE_BEGIN

struct prefill_params {
  void* out = nullptr;          ///< [qo_indptr[num_seqs], num_q_heads, head_dim], of the query dtype, contiguous
  const void* query = nullptr;  ///< same shape and dtype (q_dtype)
  float* lse = nullptr;         ///< optional [qo_indptr[num_seqs], num_q_heads]: natural log of the softmax denominator
  paged_kv_view kv{};
  page_table_view pages{};      ///< KV length of sequence s (new tokens included), dense or CSR, as for decode
  /// [num_seqs + 1] query row offsets: qo_indptr[0] = 0, never decreasing; q_len(s) = qo_indptr[s+1] - qo_indptr[s]
  /// may be 0 and is at most the sequence's KV length.
  const std::int32_t* qo_indptr = nullptr;
  std::int32_t num_seqs = 0, num_q_heads = 0;
  float scale = 1.0F;
  std::int32_t window_left = -1;   ///< -1: no window; w >= 0: row at position p sees KV positions [p - w, p]
  float logits_soft_cap = 0.0F;    ///< > 0: score = cap * tanh(scale * q.k / cap); 0 = off (finite, >= 0)
  std::int32_t num_threads = 0;    ///< 0 = all cores
  /// dtype of query and out, exactly as decode_params::q_dtype: -1 (the default) = kv.dtype, the only choice for an
  /// fp32/fp16/bf16 pool; an fp8 E4M3 pool runs with fp32, fp16 or bf16 here (with -1 the call is answered as the
  /// plain prefill answers a pool of dtype 3: UNSUPPORTED_DTYPE, after the heads and head-dim checks).
  std::int32_t q_dtype = -1;
  /// fp8 pools only (ignored otherwise): K = e4m3 x k_scale, V = e4m3 x v_scale (per tensor; finite and > 0, else
  /// invalid_argument), as kvpager_cpu_kv_append_fp8 stored them. Window and soft cap work as over any pool.
  float k_scale = 1.0F, v_scale = 1.0F;
};

/// The decode_params with the fields a prefill_params shares (window and cap, the query dtype and scales included):
/// a batch of one query row per sequence is a decode of the same arguments. The decode's own fields (num_splits,
/// workspace) keep their defaults.
[[nodiscard]] constexpr decode_params decode_params_of(const prefill_params& p) noexcept {
  decode_params d;
  d.out = p.out;
  d.query = p.query;
  d.lse = p.lse;
  d.kv = p.kv;
  d.pages = p.pages;
  d.num_seqs = p.num_seqs;
  d.num_q_heads = p.num_q_heads;
  d.scale = p.scale;
  d.window_left = p.window_left;
  d.logits_soft_cap = p.logits_soft_cap;
  d.num_threads = p.num_threads;
  d.q_dtype = p.q_dtype;
  d.k_scale = p.k_scale;
  d.v_scale = p.v_scale;
  return d;
}

/// Runs prefill attention. One check (kernels/cpu/params_checks.hpp) validates everything before reading KV or
/// writing out, in decode's order with the prefill checks after their decode counterparts: the query dtype, num_seqs
/// and scale (and an fp8 pool's scales), heads, pool geometry (decode's checks, same codes), window_left >= -1 and a
/// finite non-negative soft cap, num_threads (>= 0), the view's extent, the pointers (non-null unless num_seqs is 0),
/// qo_indptr (starts at 0, never decreases, query size within int64: INVALID_ARGUMENT), then per sequence its length
/// (SEQ_TOO_LONG, or INVALID_ARGUMENT for a decreasing CSR indptr), q_len <= length (INVALID_ARGUMENT) and every block
/// id (INVALID_BLOCK). On error nothing is written. Allocation: none once
/// the calling and worker threads' buffers have grown to the largest tile shape seen (they are kept per thread).
/// An fp8 pool (q_dtype 0-2) is checked as kvpager_cpu_paged_attention_prefill_fp8 documents and reads one byte per
/// KV element. The C functions fill a prefill_params and call this (one validation per call). Returns kernel_status of the C ABI's code for the same
/// input.
[[nodiscard]] KVPAGER_KERNELS_EXPORT status paged_attention_prefill_cpu(const prefill_params& p) noexcept;

KVPAGER_NAMESPACE_END
