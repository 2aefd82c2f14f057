// SPDX-License-Identifier: Apache-2.0
// Per-step kernel paths allocate nothing: the CPU split decode with a caller's workspace (after the first call has
// grown the calling thread's row buffers) and a step_executor step (run_plan, append). This executable replaces the global operator new
// and counts every allocation; a workspace too small or misaligned is rejected before anything is written.
#include <kvpager/c/kernels.h>
#include <kvpager/core/config.hpp>
#include <kvpager/core/step_plan.hpp>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/step_executor.hpp>
#include <kvpager/kernels/kernel_status.hpp>

#include <gtest/gtest.h>

#include "kvpager_testing/allocation_probe.hpp"
#include "kvpager_testing/decode_problem.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

using namespace kvpager;
using kvpager_gpu_check::decode_problem;

namespace {

/// A split decode (4 splits over 2048 tokens, GQA 4) on the calling thread.
decode_problem split_problem() { return decode_problem(KVPAGER_DTYPE_FP32, 64, 16, 4, 1, {2048, 1500}, 4, 11); }

}  // namespace

TEST(CpuDecodeWorkspace, SteadyStateSplitDecodeAllocatesNothing) {
  const decode_problem pr = split_problem();
  ASSERT_TRUE(pr.cpu_ok);
  std::vector<unsigned char> out(pr.cpu_out.size());
  std::vector<float> lse(pr.cpu_lse.size());
  decode_params p = pr.params(out.data(), lse.data());
  p.num_threads = 1;
  const std::int64_t need = decode_workspace_size(p);
  ASSERT_GT(need, 0);
  std::vector<float> ws(static_cast<std::size_t>(need) / sizeof(float));
  p.workspace = ws.data();
  p.workspace_bytes = need;
  ASSERT_TRUE(paged_attention_decode_cpu(p).ok());  // first call: this thread's row buffers grow
  const std::int64_t before = probe::allocations.load();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(paged_attention_decode_cpu(p).ok());
  EXPECT_EQ(probe::allocations.load() - before, 0) << "a steady-state decode with a workspace allocated";
  EXPECT_EQ(out, pr.cpu_out) << "the workspace changes where partial states live, not the result";
  EXPECT_EQ(lse, pr.cpu_lse);
}

// The counter sees the allocation the workspace removes: without one, the split decode allocates per call.
TEST(CpuDecodeWorkspace, WithoutAWorkspaceTheSplitDecodeAllocatesPerCall) {
  const decode_problem pr = split_problem();
  std::vector<unsigned char> out(pr.cpu_out.size());
  decode_params p = pr.params(out.data(), nullptr);
  p.num_threads = 1;
  ASSERT_TRUE(paged_attention_decode_cpu(p).ok());
  const std::int64_t before = probe::allocations.load();
  ASSERT_TRUE(paged_attention_decode_cpu(p).ok());
  EXPECT_GT(probe::allocations.load() - before, 0);
}

TEST(CpuDecodeWorkspace, TooSmallOrMisalignedIsRejectedAndWritesNothing) {
  const decode_problem pr = split_problem();
  std::vector<unsigned char> out(pr.cpu_out.size(), 0xAB);
  decode_params p = pr.params(out.data(), nullptr);
  const std::int64_t need = decode_workspace_size(p);
  std::vector<float> ws(static_cast<std::size_t>(need) / sizeof(float) + 1, -3.0F);
  p.workspace = ws.data();
  p.workspace_bytes = need - 4;
  EXPECT_EQ(paged_attention_decode_cpu(p).code(), errc::invalid_argument);
  p.workspace = reinterpret_cast<unsigned char*>(ws.data()) + 1;
  p.workspace_bytes = need;
  EXPECT_EQ(paged_attention_decode_cpu(p).code(), errc::invalid_argument);
  p.workspace = ws.data();
  p.workspace_bytes = -1;
  EXPECT_EQ(paged_attention_decode_cpu(p).code(), errc::invalid_argument);
  for (const unsigned char b : out) ASSERT_EQ(b, 0xAB) << "a rejected decode wrote its output";
  for (const float x : ws) ASSERT_EQ(x, -3.0F) << "a rejected decode wrote its workspace";
}

TEST(CpuDecodeWorkspace, SizeWithPlannedSplitsCoversEveryPlan) {
  decode_params p;
  p.num_seqs = 3;
  p.num_q_heads = 8;
  p.kv.head_dim = 128;
  p.num_splits = 0;
  const std::int64_t planned = decode_workspace_size(p);
  EXPECT_EQ(planned, std::int64_t{3} * 8 * max_planned_splits * (128 + 2) * 4);
  for (const std::int32_t threads : {1, 2, 16, 1024})
    for (const std::int32_t len : {0, 300, 4096, 1 << 20}) {
      p.num_splits = plan_decode(p.num_seqs, 1, len, threads);
      EXPECT_LE(decode_workspace_size(p), planned) << threads << " " << len;
    }
  p.num_splits = 1;
  EXPECT_EQ(decode_workspace_size(p), 0);
  p.num_splits = 257;
  EXPECT_EQ(decode_workspace_size(p), -1);
}

TEST(StepExecutor, SteadyStateStepAllocatesNothing) {
  // A whole step over two layers: the plan's moves on every layer, then each layer's appends.
  const kv_geometry g{8, 8, 2, 64, kv_dtype::f16};
  auto pools = host_kv_pools::create(g, 4, 2);
  ASSERT_TRUE(pools.ok()) << pools.error().message();
  step_plan plan;
  plan.add_swap_out({1, 0});
  plan.add_swap_in({2, 3});
  plan.add_copy({4, 5});
  const std::vector<std::int64_t> slots = {0, 9, -1, 63};
  const std::vector<std::byte> k(slots.size() * 2 * 64 * 2, std::byte{1}), v(k.size(), std::byte{2});
  auto step = [&] {
    ASSERT_TRUE(pools->executor().run_plan(plan));
    for (std::int32_t layer = 0; layer < 2; ++layer)
      ASSERT_TRUE(pools->executor().append(layer, slots, k.data(), v.data()));
    ASSERT_TRUE(pools->execute(plan, slots, k, v, 1));
  };
  step();
  const std::int64_t before = probe::allocations.load();
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(probe::allocations.load() - before, 0);
}
