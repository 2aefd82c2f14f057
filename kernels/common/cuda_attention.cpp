// SPDX-License-Identifier: Apache-2.0
// The C++ CUDA attention (kvpager/kernels/cuda_attention.hpp): fills the C CUDA functions' arguments from the CPU's
// params structs and calls them, so a call is checked once, by the C function's host checks (kernels/common/checks.hpp,
// the CPU's order). Compiled in every build: without CUDA the C functions are the stubs (NO_DEVICE).
#include <cstdint>
#include <limits>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/cuda_attention.hpp"
#include "kvpager/kernels/kernel_status.hpp"
#include "kernels/common/checks.hpp"

namespace {

/// Whether the CUDA kernels read `kv` through `pages`: the default layout, contiguous, and a dense table whose row
/// stride fits the C functions' max_blocks_per_seq.
bool cuda_readable(const kvpager::paged_kv_view& kv, const kvpager::page_table_view& pages) noexcept {
  const kvpager::paged_kv_view hnd =
      kvpager::paged_kv_view::hnd(kv.data, kv.dtype, kv.num_blocks, kv.num_kv_heads, kv.block_size, kv.head_dim);
  return kv.stride_block == hnd.stride_block && kv.stride_kv == hnd.stride_kv && kv.stride_head == hnd.stride_head &&
         kv.stride_token == hnd.stride_token && pages.block_table != nullptr &&
         pages.row_stride <= std::numeric_limits<std::int32_t>::max();
}

constexpr const char* kUnreadable =
    "the CUDA kernels read the default (HND, contiguous) layout through a dense block table only";

}  // namespace

KVPAGER_NAMESPACE_BEGIN

status paged_attention_decode_cuda(const decode_params& p, const cuda_launch& launch) noexcept {
  namespace kd = kernels::detail;
  if (!cuda_readable(p.kv, p.pages)) return status(errc::unsupported, kUnreadable);
  const auto& kv = p.kv;
  const auto maxb = static_cast<std::int32_t>(p.pages.row_stride);
  const std::int32_t splits = p.num_splits == 0 ? 1 : p.num_splits;
  if (kd::fp8_path(kv.dtype, p.q_dtype))
    return kernel_status(kvpager_cuda_paged_attention_decode_fp8_split_ex(
        p.out, p.lse, p.query, kv.data, p.pages.block_table, p.pages.seq_lens, p.num_seqs, p.num_q_heads,
        kv.num_kv_heads, kv.head_dim, kv.block_size, maxb, kv.num_blocks, p.scale, p.window_left, p.logits_soft_cap,
        p.q_dtype, p.k_scale, p.v_scale, splits, p.workspace, p.workspace_bytes, launch.error_flag, launch.stream));
  // The plain C function takes one dtype: a query dtype that is not the pool's is refused first, as on the CPU.
  if (p.q_dtype != -1 && p.q_dtype != kv.dtype) return kernel_status(KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  return kernel_status(kvpager_cuda_paged_attention_decode_split_ex(
      p.out, p.lse, p.query, kv.data, p.pages.block_table, p.pages.seq_lens, p.num_seqs, p.num_q_heads,
      kv.num_kv_heads, kv.head_dim, kv.block_size, maxb, kv.num_blocks, p.scale, p.window_left, p.logits_soft_cap,
      kv.dtype, splits, p.workspace, p.workspace_bytes, launch.error_flag, launch.stream));
}

status paged_attention_prefill_cuda(const prefill_params& p, const cuda_launch& launch) noexcept {
  namespace kd = kernels::detail;
  if (!cuda_readable(p.kv, p.pages)) return status(errc::unsupported, kUnreadable);
  const auto& kv = p.kv;
  const auto maxb = static_cast<std::int32_t>(p.pages.row_stride);
  if (kd::fp8_path(kv.dtype, p.q_dtype))
    return kernel_status(kvpager_cuda_paged_attention_prefill_fp8(
        p.out, p.lse, p.query, kv.data, p.qo_indptr, p.pages.block_table, p.pages.seq_lens, p.num_seqs,
        p.num_q_heads, kv.num_kv_heads, kv.head_dim, kv.block_size, maxb, kv.num_blocks, p.scale, p.window_left,
        p.logits_soft_cap, p.q_dtype, p.k_scale, p.v_scale, launch.num_ctas, launch.prefill_workspace,
        launch.prefill_workspace_bytes, launch.error_flag, launch.stream));
  if (p.q_dtype != -1 && p.q_dtype != kv.dtype) return kernel_status(KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  return kernel_status(kvpager_cuda_paged_attention_prefill(
      p.out, p.lse, p.query, kv.data, p.qo_indptr, p.pages.block_table, p.pages.seq_lens, p.num_seqs, p.num_q_heads,
      kv.num_kv_heads, kv.head_dim, kv.block_size, maxb, kv.num_blocks, p.scale, p.window_left, p.logits_soft_cap,
      kv.dtype, launch.num_ctas, launch.prefill_workspace, launch.prefill_workspace_bytes, launch.error_flag,
      launch.stream));
}

KVPAGER_NAMESPACE_END
