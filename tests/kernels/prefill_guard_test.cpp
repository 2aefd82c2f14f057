// SPDX-License-Identifier: Apache-2.0
// The CPU paged prefill (plain and fp8) through the C ABI with every buffer behind PROT_NONE guard pages
// (abi_cases.hpp's guarded_buffer: each ends where a guard page starts), as issue 21's adversarial run called it:
// extreme and malformed arguments get their documented status, nothing outside the buffers is touched (a stray read
// or write crashes the test), the read-only pool is never written, and a refused call leaves `out` byte-identical.
// Valid calls whose rows, positions and block ids sit at the edges of the buffers run without touching a guard page.
#include "abi_cases.hpp"

#include <kvpager/kernels/float8.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

using kvpager_abi_cases::guarded_buffer;

constexpr int32_t kHq = 4, kHkv = 2, kD = 64, kBs = 16, kNb = 6, kMaxb = 3;
constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();

/// Two sequences over a pool of kNb blocks (fp32 or fp8), tables and lengths of exactly the size the call reads.
struct prefill_case {
  bool fp8;
  std::size_t esz;
  guarded_buffer kv, table, lens, indptr, q, out;
  std::vector<unsigned char> out_before;
  prefill_case(bool fp8_, int32_t rows)
      : fp8(fp8_), esz(fp8_ ? 1 : 4),
        kv(static_cast<std::size_t>(kNb) * 2 * kHkv * kBs * kD * (fp8_ ? 1 : 4)),
        table(2 * kMaxb * 4), lens(2 * 4), indptr(3 * 4), q(static_cast<std::size_t>(rows) * kHq * kD * 4),
        out(q.size()) {
    for (std::size_t i = 0; i < kv.size() / esz; ++i) {
      const float x = static_cast<float>(i % 89) / 89.0F - 0.5F;
      if (fp8) {
        kv.as()[i] = kvpager::detail::float_to_e4m3(x * 8.0F);
      } else {
        kv.as<float>()[i] = x;
      }
    }
    kv.read_only();  // prefill never writes the cache
    for (std::size_t i = 0; i < q.size() / 4; ++i) q.as<float>()[i] = 0.01F * static_cast<float>(i % 17);
    const int32_t t[2 * kMaxb] = {5, 0, 3, 1, 4, 2};  // the last block ids of the pool, in any order
    std::memcpy(table.as(), t, sizeof t);
    std::memset(out.as(), 0x5A, out.size());
    out_before = out.snapshot();
  }
  void set(const std::vector<int32_t>& lens_, const std::vector<int32_t>& indptr_) {
    std::memcpy(lens.as(), lens_.data(), 8);
    std::memcpy(indptr.as(), indptr_.data(), 12);
  }
  int32_t call(int32_t num_seqs, int32_t hq = kHq, int32_t hkv = kHkv, int32_t maxb = kMaxb, int32_t nb = kNb,
               float scale = 0.125F, int32_t window = -1, float cap = 0.0F, int32_t threads = 1) {
    if (fp8)
      return kvpager_cpu_paged_attention_prefill_fp8(out.as(), q.as(), kv.as(), indptr.as<int32_t>(),
                                                     table.as<int32_t>(), lens.as<int32_t>(), num_seqs, hq, hkv, kD,
                                                     kBs, maxb, nb, scale, window, cap, KVPAGER_DTYPE_FP32, 1.0F / 8,
                                                     1.0F / 8, threads);
    return kvpager_cpu_paged_attention_prefill(out.as(), q.as(), kv.as(), indptr.as<int32_t>(), table.as<int32_t>(),
                                               lens.as<int32_t>(), num_seqs, hq, hkv, kD, kBs, maxb, nb, scale,
                                               window, cap, KVPAGER_DTYPE_FP32, threads);
  }
  void expect_refused(int32_t rc, int32_t expect, const std::string& what) {
    EXPECT_EQ(rc, expect) << what;
    EXPECT_EQ(out.snapshot(), out_before) << what << ": output written on error";
  }
};

void run_cases(bool fp8) {
  SCOPED_TRACE(fp8 ? "fp8 prefill" : "prefill");
  // Rows up to the whole KV of both sequences: 48 (3 full blocks) and 33.
  prefill_case c(fp8, 48 + 33);
  // Valid: both sequences at their full table, q_len = seq_len and a chunk ending at the last slot, every thread
  // count, windows and caps at their extremes.
  c.set({48, 33}, {0, 48, 81});
  for (const int32_t threads : {1, 2, 0}) EXPECT_EQ(c.call(2, kHq, kHkv, kMaxb, kNb, 0.125F, -1, 0.0F, threads), 0);
  EXPECT_EQ(c.call(2, kHq, kHkv, kMaxb, kNb, 0.125F, 0, std::numeric_limits<float>::max()), 0);
  EXPECT_EQ(c.call(2, kHq, kHkv, kMaxb, kNb, 0.125F, kI32Max, std::numeric_limits<float>::denorm_min()), 0);
  c.set({48, 33}, {0, 1, 34});  // a decode-like row, then a full prompt
  EXPECT_EQ(c.call(2), 0);
  c.set({48, 33}, {0, 0, 0});  // no rows at all
  EXPECT_EQ(c.call(2), 0);
  // Nothing to do: every pointer may be NULL.
  EXPECT_EQ(fp8 ? kvpager_cpu_paged_attention_prefill_fp8(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, kHq,
                                                          kHkv, kD, kBs, kMaxb, kNb, 0.125F, -1, 0.0F,
                                                          KVPAGER_DTYPE_FP32, 1.0F, 1.0F, 1)
                : kvpager_cpu_paged_attention_prefill(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, kHq, kHkv,
                                                      kD, kBs, kMaxb, kNb, 0.125F, -1, 0.0F, KVPAGER_DTYPE_FP32, 1),
            0);

  // Refused, output untouched.
  std::memset(c.out.as(), 0x5A, c.out.size());
  c.set({48, 33}, {1, 48, 81});
  c.expect_refused(c.call(2), KVPAGER_STATUS_INVALID_ARGUMENT, "qo_indptr[0] != 0");
  c.set({48, 33}, {0, 48, 40});
  c.expect_refused(c.call(2), KVPAGER_STATUS_INVALID_ARGUMENT, "decreasing qo_indptr");
  c.set({48, 33}, {0, 48, -5});
  c.expect_refused(c.call(2), KVPAGER_STATUS_INVALID_ARGUMENT, "negative qo_indptr");
  c.set({48, 30}, {0, 48, 81});
  c.expect_refused(c.call(2), KVPAGER_STATUS_INVALID_ARGUMENT, "q_len above seq_len");
  c.set({49, 33}, {0, 48, 81});
  c.expect_refused(c.call(2), KVPAGER_STATUS_SEQ_TOO_LONG, "seq_len past its table row");
  c.set({kI32Max, 33}, {0, 48, 81});
  c.expect_refused(c.call(2), KVPAGER_STATUS_SEQ_TOO_LONG, "seq_len INT32_MAX");
  c.set({48, 33}, {0, kI32Max, kI32Max});
  c.expect_refused(c.call(2), KVPAGER_STATUS_INVALID_ARGUMENT, "q_len INT32_MAX");
  c.set({48, 33}, {0, 48, 81});
  c.expect_refused(c.call(2, kHq, kHkv, kMaxb, 5), KVPAGER_STATUS_INVALID_BLOCK, "block id 5 in a pool of 5");
  c.expect_refused(c.call(2, kHq, kHkv, kMaxb, 0), KVPAGER_STATUS_INVALID_ARGUMENT, "empty pool");
  c.expect_refused(c.call(2, 3, kHkv), KVPAGER_STATUS_BAD_HEADS, "query heads not a multiple");
  c.expect_refused(c.call(2, kHq, 0), KVPAGER_STATUS_BAD_HEADS, "no KV heads");
  c.expect_refused(c.call(-1), KVPAGER_STATUS_INVALID_ARGUMENT, "negative num_seqs");
  c.expect_refused(c.call(2, kHq, kHkv, 0), KVPAGER_STATUS_INVALID_ARGUMENT, "max_blocks_per_seq 0");
  c.expect_refused(c.call(2, kHq, kHkv, kMaxb, kNb, std::numeric_limits<float>::quiet_NaN()),
                   KVPAGER_STATUS_INVALID_ARGUMENT, "NaN scale");
  c.expect_refused(c.call(2, kHq, kHkv, kMaxb, kNb, 0.125F, -2), KVPAGER_STATUS_INVALID_ARGUMENT, "window -2");
  c.expect_refused(c.call(2, kHq, kHkv, kMaxb, kNb, 0.125F, std::numeric_limits<int32_t>::min()),
                   KVPAGER_STATUS_INVALID_ARGUMENT, "window INT32_MIN");
  for (const float cap : {-1.0F, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    c.expect_refused(c.call(2, kHq, kHkv, kMaxb, kNb, 0.125F, -1, cap), KVPAGER_STATUS_INVALID_ARGUMENT,
                     "soft cap " + std::to_string(cap));
  int32_t* t = c.table.as<int32_t>();
  t[1] = -1;
  c.expect_refused(c.call(2), KVPAGER_STATUS_INVALID_BLOCK, "block id -1");
  t[1] = kI32Max;
  c.expect_refused(c.call(2), KVPAGER_STATUS_INVALID_BLOCK, "block id INT32_MAX");
  t[1] = 0;
}

}  // namespace

TEST(KernelAbiGuardPages, CpuPrefillExtremeArguments) { run_cases(false); }
TEST(KernelAbiGuardPages, CpuPrefillFp8ExtremeArguments) { run_cases(true); }
