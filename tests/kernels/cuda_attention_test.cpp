// SPDX-License-Identifier: Apache-2.0
// The C++ CUDA attention (kvpager/kernels/cuda_attention.hpp) takes the CPU's params: every bad input the host can
// see gets the CPU operation's answer (in a build with CUDA; a build without answers no_device), a view or page table
// the CUDA kernels cannot read is unsupported, and a valid call without a device is no_device. Runs everywhere: the
// GPU results themselves are cuda_test's (against the CPU backend).
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/cuda_attention.hpp>
#include <kvpager/kernels/prefill.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "paged_tables.hpp"

using namespace kvpager;

namespace {

std::int32_t code(const status& st) { return st.ok() ? KVPAGER_STATUS_OK : static_cast<std::int32_t>(st.detail()); }

bool have_device() {
  std::int32_t n = 0;
  return kvpager_cuda_device_count(&n) == KVPAGER_STATUS_OK && n > 0;
}

/// A valid two-sequence batch over a 16-block fp16 pool (host memory: only its shape is read before a launch).
struct batch {
  std::vector<std::uint16_t> pool = std::vector<std::uint16_t>(16 * 2 * 2 * 16 * 64);
  std::vector<std::uint16_t> q = std::vector<std::uint16_t>(40 * 8 * 64), out = q;
  std::vector<std::int32_t> table{0, 1, 2, 3, 4, 5, 6, 7}, lens{20, 64}, qo{0, 8, 40};
  std::vector<std::int64_t> ws = std::vector<std::int64_t>(64);
  prefill_params prefill() {
    prefill_params p;
    p.out = out.data();
    p.query = q.data();
    p.kv = paged_kv_view::hnd(pool.data(), KVPAGER_DTYPE_FP16, 16, 2, 16, 64);
    p.pages.block_table = table.data();
    p.pages.row_stride = 4;
    p.pages.seq_lens = lens.data();
    p.qo_indptr = qo.data();
    p.num_seqs = 2;
    p.num_q_heads = 8;
    p.scale = 0.125F;
    return p;
  }
  decode_params decode() {
    decode_params d = decode_params_of(prefill());
    d.num_splits = 1;
    return d;
  }
  cuda_launch launch() {
    cuda_launch l;
    l.num_ctas = 4;
    l.prefill_workspace = ws.data();
    l.prefill_workspace_bytes = static_cast<std::int64_t>(ws.size() * sizeof(std::int64_t));
    return l;
  }
};

/// The default layout of `kv`'s fields (a bad geometry stays a view the CUDA kernels would read, so that its answer is
/// the geometry check's, not unsupported).
template <class Params>
void relayout(Params& p) {
  p.kv = paged_kv_view::hnd(p.kv.data, p.kv.dtype, p.kv.num_blocks, p.kv.num_kv_heads, p.kv.block_size, p.kv.head_dim);
}

template <class Params>
std::vector<std::function<void(Params&)>> host_visible_breaks() {
  return {
      [](Params& p) { p.num_q_heads = 3; },
      [](Params& p) { p.num_seqs = -1; },
      [](Params& p) { p.kv.head_dim = 100, relayout(p); },
      [](Params& p) { p.kv.block_size = 12, relayout(p); },
      [](Params& p) { p.kv.num_blocks = 0; },
      [](Params& p) { p.q_dtype = KVPAGER_DTYPE_BF16; },
      [](Params& p) { p.q_dtype = KVPAGER_DTYPE_FP8_E4M3; },
      [](Params& p) { p.scale = std::numeric_limits<float>::infinity(); },
      [](Params& p) { p.window_left = -2; },
      [](Params& p) { p.logits_soft_cap = std::numeric_limits<float>::quiet_NaN(); },
      [](Params& p) { p.query = nullptr; },
      [](Params& p) { p.pages.seq_lens = nullptr; },
      // An fp8 pool (reinterpreting the bytes) with each bad query dtype and scale.
      [](Params& p) { p.kv.dtype = KVPAGER_DTYPE_FP8_E4M3; },
      [](Params& p) { p.kv.dtype = KVPAGER_DTYPE_FP8_E4M3, p.q_dtype = 9; },
      [](Params& p) { p.kv.dtype = KVPAGER_DTYPE_FP8_E4M3, p.q_dtype = KVPAGER_DTYPE_FP16, p.v_scale = 0.0F; },
      [](Params& p) { p.kv.dtype = KVPAGER_DTYPE_FP8_E4M3, p.q_dtype = KVPAGER_DTYPE_FP16, p.kv.block_size = 64, relayout(p); },
  };
}

/// What the C++ CUDA call answers for a bad input the CPU answers with `cpu`: the same in a CUDA build; without CUDA
/// the stubs answer no_device, except for what the C++ call answers itself before forwarding (a query dtype that is
/// neither -1 nor the pool's, over a plain pool).
template <class Params>
std::int32_t cuda_answer(const Params& p, std::int32_t cpu) {
  if (kvpager_built_with_cuda() != 0) return cpu;
  const bool own = p.kv.dtype != KVPAGER_DTYPE_FP8_E4M3 && p.q_dtype != -1 && p.q_dtype != p.kv.dtype;
  return own ? cpu : KVPAGER_STATUS_NO_DEVICE;
}

}  // namespace

TEST(CudaAttentionCpp, HostVisibleBadInputGetsTheCpuAnswer) {
  batch b;
  std::int32_t checked = 0;
  for (const auto& brk : host_visible_breaks<decode_params>()) {
    decode_params p = b.decode();
    brk(p);
    const std::int32_t cpu = code(paged_attention_decode_cpu(p));
    ASSERT_NE(cpu, KVPAGER_STATUS_OK) << checked;
    EXPECT_EQ(code(paged_attention_decode_cuda(p, b.launch())), cuda_answer(p, cpu)) << checked;
    ++checked;
  }
  for (const auto& brk : host_visible_breaks<prefill_params>()) {
    prefill_params p = b.prefill();
    brk(p);
    const std::int32_t cpu = code(paged_attention_prefill_cpu(p));
    ASSERT_NE(cpu, KVPAGER_STATUS_OK) << checked;
    EXPECT_EQ(code(paged_attention_prefill_cuda(p, b.launch())), cuda_answer(p, cpu)) << checked;
    ++checked;
  }
  EXPECT_EQ(checked, 32);
}

TEST(CudaAttentionCpp, ViewsTheKernelsCannotReadAreUnsupported) {
  batch b;
  decode_params d = b.decode();
  d.kv = paged_kv_view::nhd(b.pool.data(), KVPAGER_DTYPE_FP16, 16, 2, 16, 64);
  EXPECT_EQ(paged_attention_decode_cuda(d, b.launch()).code(), errc::unsupported);
  prefill_params p = b.prefill();
  p.pages.block_table = nullptr;  // CSR
  std::vector<std::int32_t> indptr{0, 2, 6}, indices{0, 1, 2, 3, 4, 5}, last{4, 16};
  p.pages.indptr = indptr.data();
  p.pages.indices = indices.data();
  p.pages.last_page_len = last.data();
  ASSERT_TRUE(paged_attention_prefill_cpu(p).ok()) << "the CPU reads it";
  EXPECT_EQ(paged_attention_prefill_cuda(p, b.launch()).code(), errc::unsupported);
}

TEST(CudaAttentionCpp, AValidCallWithoutADeviceIsNoDevice) {
  if (have_device()) GTEST_SKIP() << "a CUDA device is present: cuda_test runs these kernels against the CPU backend";
  batch b;
  EXPECT_EQ(code(paged_attention_decode_cuda(b.decode(), b.launch())), KVPAGER_STATUS_NO_DEVICE);
  EXPECT_EQ(code(paged_attention_prefill_cuda(b.prefill(), b.launch())), KVPAGER_STATUS_NO_DEVICE);
  cuda_launch no_grid = b.launch();
  no_grid.num_ctas = 0;
  EXPECT_EQ(code(paged_attention_prefill_cuda(b.prefill(), no_grid)),
            kvpager_built_with_cuda() != 0 ? KVPAGER_STATUS_INVALID_ARGUMENT : KVPAGER_STATUS_NO_DEVICE);
}
