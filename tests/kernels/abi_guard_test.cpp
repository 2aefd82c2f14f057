// SPDX-License-Identifier: Apache-2.0
// The CPU entry points of the C ABI (and the C++ decode interface) called with extreme and malformed arguments while
// every buffer sits between PROT_NONE guard pages (abi_cases.hpp): each call must return its documented status code,
// read nothing it must not (a stray read crashes the test) and, on error, change neither the output nor the KV cache.
#include "abi_cases.hpp"

#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>

#include <gtest/gtest.h>

#include "kernels/common/checks.hpp"
#include "kernels/common/decode_math.hpp"

#include <cstdint>
#include <limits>
#include <vector>

namespace {

using namespace kvpager_abi_cases;

int32_t cpu_decode(void* out, const void* q, const void* kv, const int32_t* table, const int32_t* lens, int32_t num_seqs,
                   int32_t hq, int32_t hkv, int32_t d, int32_t bs, int32_t maxb, int32_t nb, float scale, int32_t dtype) {
  return kvpager_cpu_paged_attention_decode(out, q, kv, table, lens, num_seqs, hq, hkv, d, bs, maxb, nb, scale, dtype, 0);
}

const kernels_api cpu_api{"cpu", cpu_decode, kvpager_cpu_kv_append, kvpager_cpu_copy_blocks, kvpager_cpu_swap_blocks, true};

}  // namespace

TEST(KernelAbiGuardPages, CpuDecodeExtremeArguments) { decode_cases(cpu_api); }
TEST(KernelAbiGuardPages, CpuKvAppendExtremeArguments) { append_cases(cpu_api); }
TEST(KernelAbiGuardPages, CpuCopyBlocksExtremeArguments) { copy_cases(cpu_api); }
TEST(KernelAbiGuardPages, CpuSwapBlocksExtremeArguments) { swap_cases(cpu_api); }

// Issue 9, item 2: ceil(seq_len / block_size) in int32 overflowed for a seq_len within block_size of INT32_MAX, so
// that sequence's block ids were never checked.
TEST(CpuDecodeAttention, BlockIdsCheckedForSequencesNearInt32Max) {
  pool p;
  guarded_buffer q(static_cast<std::size_t>(kHq) * kD * 4), out(q.size()), lens(4), table(std::size_t{1} << 29);
  lens.as<int32_t>()[0] = kI32Max - 1;
  for (const int32_t bad : {-1, kNb}) {
    table.as<int32_t>()[(1 << 27) - 1] = bad;  // the last of the 2^27 ids the sequence uses
    EXPECT_EQ(kvpager_cpu_paged_attention_decode(out.as(), q.as(), p.kv.as(), table.as<int32_t>(), lens.as<int32_t>(), 1,
                                                 kHq, kHkv, kD, kBs, 1 << 27, kNb, 0.125F, kF32, 1),
              KVPAGER_STATUS_INVALID_BLOCK)
        << bad;
  }
  EXPECT_EQ(kvpager::kernels::detail::blocks_for(kI32Max, 32), int64_t{1} << 26);
  EXPECT_EQ(kvpager::kernels::detail::check_seq_len(kI32Max, 32, (int64_t{1} << 26) - 1), KVPAGER_STATUS_SEQ_TOO_LONG);
  EXPECT_EQ(kvpager::kernels::detail::check_seq_len(kI32Max, 32, int64_t{1} << 26), KVPAGER_STATUS_OK);
}

// Issue 9, item 2, the C++ CSR path: (pages - 1) * block_size overflowed int32, so 2^27 + 1 pages of 32 tokens
// (2^32 + 16 tokens) read as 16 tokens and the call returned OK. Such a sequence is too long for int32 lengths.
TEST(CpuDecodeAttention, CsrSequenceLongerThanInt32IsSeqTooLong) {
  const int32_t bs = 32;
  guarded_buffer kv(static_cast<std::size_t>(kNb) * 2 * kHkv * bs * kD * 4), q(static_cast<std::size_t>(kHq) * kD * 4),
      out(q.size()), indptr(2 * 4), indices(4), last(4), lse(kHq * 4);
  indptr.as<int32_t>()[0] = 0;
  indptr.as<int32_t>()[1] = (1 << 27) + 1;  // the indices are never read: the length is checked first
  last.as<int32_t>()[0] = 16;
  const auto out_before = out.snapshot();
  kvpager::decode_params p;
  p.out = out.as();
  p.query = q.as();
  p.lse = lse.as<float>();
  p.kv = kvpager::paged_kv_view::hnd(kv.as(), kF32, kNb, kHkv, bs, kD);
  p.pages.indptr = indptr.as<int32_t>();
  p.pages.indices = indices.as<int32_t>();
  p.pages.last_page_len = last.as<int32_t>();
  p.num_seqs = 1;
  p.num_q_heads = kHq;
  EXPECT_EQ(kvpager::paged_attention_decode_cpu(p).detail(), KVPAGER_STATUS_SEQ_TOO_LONG);
  // INT32_MAX tokens exactly is a length like any other: the (zero, so valid) ids are then read, up to the guard.
  indptr.as<int32_t>()[1] = 1 << 26;
  last.as<int32_t>()[0] = 31;
  indices.as<int32_t>()[0] = kNb;  // ... but the first one is bad
  EXPECT_EQ(kvpager::paged_attention_decode_cpu(p).detail(), KVPAGER_STATUS_INVALID_BLOCK);
  // A decreasing or negative indptr.
  indptr.as<int32_t>()[0] = 2;
  indptr.as<int32_t>()[1] = 1;
  EXPECT_EQ(kvpager::paged_attention_decode_cpu(p).detail(), KVPAGER_STATUS_INVALID_ARGUMENT);
  indptr.as<int32_t>()[0] = -1;
  indptr.as<int32_t>()[1] = kI32Max;  // pages would overflow int32
  EXPECT_EQ(kvpager::paged_attention_decode_cpu(p).detail(), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(out.snapshot(), out_before);
}

// Offset products in the C++ interface: strides whose largest offset overflows int64 are rejected, not wrapped.
TEST(CpuDecodeAttention, ViewWhoseOffsetsOverflowInt64IsInvalidArgument) {
  pool pl;
  guarded_buffer q(static_cast<std::size_t>(kHq) * kD * 4), out(q.size()), lens(4), table(4);
  lens.as<int32_t>()[0] = 1;
  kvpager::decode_params p;
  p.out = out.as();
  p.query = q.as();
  p.kv = kvpager::paged_kv_view::hnd(pl.kv.as(), kF32, kNb, kHkv, kBs, kD);
  p.pages.block_table = table.as<int32_t>();
  p.pages.row_stride = 1;
  p.pages.seq_lens = lens.as<int32_t>();
  p.num_seqs = 1;
  p.num_q_heads = kHq;
  const auto out_before = out.snapshot();
  for (const int64_t stride : {std::numeric_limits<int64_t>::max() / 2, std::numeric_limits<int64_t>::max() / 4 + 1,
                               int64_t{-1}}) {
    kvpager::decode_params bad = p;
    bad.kv.stride_block = stride;
    EXPECT_EQ(kvpager::paged_attention_decode_cpu(bad).detail(), KVPAGER_STATUS_INVALID_ARGUMENT) << stride;
    bad = p;
    bad.kv.stride_token = stride;
    EXPECT_EQ(kvpager::paged_attention_decode_cpu(bad).detail(), KVPAGER_STATUS_INVALID_ARGUMENT) << stride;
  }
  kvpager::decode_params bad = p;
  bad.pages.row_stride = std::numeric_limits<int64_t>::max();
  bad.num_seqs = 2;  // 2 rows of INT64_MAX entries
  EXPECT_EQ(kvpager::paged_attention_decode_cpu(bad).detail(), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(out.snapshot(), out_before);
  EXPECT_EQ(kvpager::paged_attention_decode_cpu(p).detail(), KVPAGER_STATUS_OK);
}

// The split of a sequence close to INT32_MAX tokens: contiguous, whole blocks, covering it exactly (the arithmetic
// used to overflow int32). Shared by the CPU backend and the CUDA kernels.
TEST(DecodeMath, SplitRangeCoversSequencesNearInt32Max) {
  for (const int32_t len : {kI32Max, kI32Max - 1, kI32Max - 31, 1000})
    for (const int32_t bs : {8, 16, 32})
      for (const int32_t splits : {1, 2, 3, 7, 64, 256}) {
        int32_t expect_t0 = 0;
        for (int32_t s = 0; s < splits; ++s) {
          int32_t t0 = -1, t1 = -1;
          kvpager::kernels::detail::split_range(len, bs, splits, s, t0, t1);
          ASSERT_EQ(t0, expect_t0) << len << " " << bs << " " << splits << " " << s;
          ASSERT_LE(t0, t1);
          ASSERT_LE(t1, len);
          if (t1 < len) {
            ASSERT_EQ(t1 % bs, 0);
          }
          expect_t0 = t1;
        }
        EXPECT_EQ(expect_t0, len) << len << " " << bs << " " << splits;
      }
}

TEST(KernelSizes, CheckedProductsRejectInt64Overflow) {
  EXPECT_EQ(kvpager::kernels::detail::checked_product({int64_t{1} << 31, int64_t{1} << 31, 2}), -1);
  EXPECT_EQ(kvpager::kernels::detail::checked_product({int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
  EXPECT_EQ(kvpager::kernels::detail::checked_product({3, -1}), -1);
  EXPECT_EQ(kvpager::kernels::detail::checked_sum(std::numeric_limits<int64_t>::max(), 1), -1);
  int64_t bytes = 0;
  EXPECT_EQ(kvpager_cuda_decode_workspace_size(kI32Max, kI32Max, 256, 256, &bytes), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvpager_cuda_decode_workspace_size(kI32Max, 64, 128, 2, &bytes), KVPAGER_STATUS_OK);
  EXPECT_EQ(bytes, int64_t{kI32Max} * 64 * 2 * 130 * 4);
}

// A split workspace the machine cannot hold (here beyond the 47-bit address space) is KVPAGER_STATUS_OUT_OF_MEMORY
// with the output untouched, never an abort: the workspace is allocated without throwing, before anything is written.
TEST(CpuDecodeAttention, SplitWorkspaceThatCannotBeAllocatedIsOutOfMemory) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan's allocator aborts on a request this large instead of returning null";
#else
  constexpr int32_t heads = 1024, seqs = 1 << 22, splits = 256;
  const std::int64_t need = kvpager::kernels::detail::decode_workspace_bytes(seqs, heads, kD, splits);
  ASSERT_GT(need, std::int64_t{1} << 47);
  const auto qbytes = static_cast<std::size_t>(seqs) * heads * kD * 4;  // 1 TiB, reserved but never touched
  guarded_buffer q(qbytes), out(qbytes), lens(static_cast<std::size_t>(seqs) * 4), table(4);
  guarded_buffer kv(static_cast<std::size_t>(kNb) * 2 * heads * kBs * kD * 4);
  kvpager::decode_params p;
  p.out = out.as();
  p.query = q.as();
  p.kv = kvpager::paged_kv_view::hnd(kv.as(), kF32, kNb, heads, kBs, kD);
  p.pages.block_table = table.as<int32_t>();
  p.pages.row_stride = 1;  // every sequence is empty: no row is read
  p.pages.seq_lens = lens.as<int32_t>();
  p.num_seqs = seqs;
  p.num_q_heads = heads;
  p.num_splits = splits;
  out.as<float>()[0] = 42.0F;
  out.as<float>()[qbytes / 4 - 1] = 43.0F;
  EXPECT_EQ(kvpager::paged_attention_decode_cpu(p).detail(), KVPAGER_STATUS_OUT_OF_MEMORY);
  EXPECT_EQ(out.as<float>()[0], 42.0F);
  EXPECT_EQ(out.as<float>()[qbytes / 4 - 1], 43.0F);
#endif
}
