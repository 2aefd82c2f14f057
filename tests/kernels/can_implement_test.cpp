// SPDX-License-Identifier: Apache-2.0
// One geometry from cache to kernel, checked up front: kv_layout and paged_kv_view derive from a kv_geometry, and
// can_implement (C: kvpager_can_implement) accepts a geometry exactly when every decode and kv_append call over it
// accepts it (for an fp8 pool: the _fp8 ones, while the plain ones answer UNSUPPORTED_DTYPE), with the same code when it does not (CPU and, in a CUDA build, the CUDA entry points' host checks).
#include <kvpager/c/kernels.h>
#include <kvpager/core/geometry.hpp>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/can_implement.hpp>
#include <kvpager/kernels/kernel_status.hpp>
#include <kvpager/kernels/kv_layout.hpp>
#include <kvpager/cache/cache_types.hpp>
#include <kvpager/cache/compositions.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

using namespace kvpager;

namespace {

constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();

/// Every combination of valid and invalid values of each field.
std::vector<kv_geometry> geometry_matrix() {
  std::vector<kv_geometry> all;
  for (const std::int32_t blocks : {-1, 0, 1, 1000, kMax})
    for (const std::int32_t bs : {-16, 0, 1, 2, 4, 8, 12, 16, 32, 64, 128})
      for (const std::int32_t heads : {-2, 0, 1, 8, 1 << 20})
        for (const std::int32_t dim : {0, 32, 64, 80, 96, 100, 112, 128, 192, 256, 512})
          for (const std::int32_t dtype : {-1, 0, 1, 2, 3})
            all.push_back({blocks, bs, heads, dim, static_cast<kv_dtype>(dtype)});
  return all;
}

std::int32_t dt(const kv_geometry& g) { return static_cast<std::int32_t>(g.dtype); }

/// Each kernel entry point that takes a pool, called with nothing to do (no sequences, no tokens): its answer is its
/// verdict on the geometry alone.
std::int32_t cpu_decode_rc(const kv_geometry& g) {
  const std::int32_t hq = g.num_kv_heads > 0 && g.num_kv_heads <= kMax / 2 ? 2 * g.num_kv_heads : 1;
  return kvpager_cpu_paged_attention_decode(nullptr, nullptr, nullptr, nullptr, nullptr, 0, hq, g.num_kv_heads,
                                            g.head_dim, g.block_size, 1, g.num_blocks, 0.1F, dt(g), 1);
}
std::int32_t cxx_decode_rc(const kv_geometry& g) {
  decode_params p;
  p.kv = paged_kv_view::hnd(nullptr, g);
  if (g.dtype == kv_dtype::fp8_e4m3) p.q_dtype = KVPAGER_DTYPE_FP16;  // an fp8 pool's query and output dtype
  p.num_q_heads = g.num_kv_heads > 0 && g.num_kv_heads <= kMax / 2 ? 2 * g.num_kv_heads : 1;
  const status s = paged_attention_decode_cpu(p);
  return s.ok() ? KVPAGER_STATUS_OK : static_cast<std::int32_t>(s.detail());
}
std::int32_t cpu_append_rc(const kv_geometry& g) {
  return kvpager_cpu_kv_append(nullptr, nullptr, nullptr, nullptr, 0, g.num_kv_heads, g.head_dim, g.block_size,
                               g.num_blocks, dt(g));
}
std::int32_t cuda_decode_rc(const kv_geometry& g) {
  const std::int32_t hq = g.num_kv_heads > 0 && g.num_kv_heads <= kMax / 2 ? 2 * g.num_kv_heads : 1;
  return kvpager_cuda_paged_attention_decode(nullptr, nullptr, nullptr, nullptr, nullptr, 0, hq, g.num_kv_heads,
                                             g.head_dim, g.block_size, 1, g.num_blocks, 0.1F, dt(g), nullptr, nullptr);
}
std::int32_t cpu_decode_fp8_rc(const kv_geometry& g) {
  const std::int32_t hq = g.num_kv_heads > 0 && g.num_kv_heads <= kMax / 2 ? 2 * g.num_kv_heads : 1;
  return kvpager_cpu_paged_attention_decode_fp8(nullptr, nullptr, nullptr, nullptr, nullptr, 0, hq, g.num_kv_heads,
                                                g.head_dim, g.block_size, 1, g.num_blocks, 0.1F, KVPAGER_DTYPE_FP16,
                                                1.0F, 1.0F, 1);
}
std::int32_t cpu_prefill_fp8_rc(const kv_geometry& g) {
  const std::int32_t hq = g.num_kv_heads > 0 && g.num_kv_heads <= kMax / 2 ? 2 * g.num_kv_heads : 1;
  return kvpager_cpu_paged_attention_prefill_fp8(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, hq,
                                                 g.num_kv_heads, g.head_dim, g.block_size, 1, g.num_blocks, 0.1F, -1,
                                                 0.0F, KVPAGER_DTYPE_FP16, 1.0F, 1.0F, 1);
}
std::int32_t cpu_append_fp8_rc(const kv_geometry& g) {
  return kvpager_cpu_kv_append_fp8(nullptr, nullptr, nullptr, nullptr, 0, g.num_kv_heads, g.head_dim, g.block_size,
                                   g.num_blocks, KVPAGER_DTYPE_FP16, 1.0F, 1.0F);
}
std::int32_t cuda_decode_fp8_rc(const kv_geometry& g) {
  const std::int32_t hq = g.num_kv_heads > 0 && g.num_kv_heads <= kMax / 2 ? 2 * g.num_kv_heads : 1;
  return kvpager_cuda_paged_attention_decode_fp8(nullptr, nullptr, nullptr, nullptr, nullptr, 0, hq, g.num_kv_heads,
                                                 g.head_dim, g.block_size, 1, g.num_blocks, 0.1F, KVPAGER_DTYPE_FP16,
                                                 1.0F, 1.0F, nullptr, nullptr);
}
std::int32_t cuda_append_fp8_rc(const kv_geometry& g) {
  return kvpager_cuda_kv_append_fp8(nullptr, nullptr, nullptr, nullptr, 0, g.num_kv_heads, g.head_dim, g.block_size,
                                    g.num_blocks, KVPAGER_DTYPE_FP16, 1.0F, 1.0F, nullptr, nullptr);
}
std::int32_t cuda_append_rc(const kv_geometry& g) {
  return kvpager_cuda_kv_append(nullptr, nullptr, nullptr, nullptr, 0, g.num_kv_heads, g.head_dim, g.block_size,
                                g.num_blocks, dt(g), nullptr, nullptr);
}

}  // namespace

TEST(CanImplement, AgreesWithDecodeAndAppendOnEveryGeometry) {
  std::int32_t accepted = 0, rejected = 0;
  for (const kv_geometry& g : geometry_matrix()) {
    const std::int32_t rc = kvpager_can_implement(g.num_blocks, g.block_size, g.num_kv_heads, g.head_dim, dt(g));
    const auto where = ::testing::Message() << "blocks " << g.num_blocks << " bs " << g.block_size << " heads "
                                            << g.num_kv_heads << " dim " << g.head_dim << " dtype " << dt(g);
    ASSERT_EQ(cxx_decode_rc(g), rc) << where;
    if (g.dtype == kv_dtype::fp8_e4m3) {
      // fp8 pools: the _fp8 functions agree; the plain ones refuse the dtype (or an earlier field, same order).
      ASSERT_EQ(cpu_decode_fp8_rc(g), rc) << where;
      ASSERT_EQ(cpu_prefill_fp8_rc(g), rc) << where;
      ASSERT_EQ(cpu_append_fp8_rc(g), rc) << where;
      const std::int32_t plain = rc == KVPAGER_STATUS_BAD_HEADS || rc == KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM
                                     ? rc
                                     : KVPAGER_STATUS_UNSUPPORTED_DTYPE;
      ASSERT_EQ(cpu_decode_rc(g), plain) << where;
      ASSERT_EQ(cpu_append_rc(g), plain) << where;
      if (KVPAGER_TEST_HAS_CUDA) {
        ASSERT_EQ(cuda_decode_fp8_rc(g), rc) << where;
        ASSERT_EQ(cuda_append_fp8_rc(g), rc) << where;
        ASSERT_EQ(cuda_decode_rc(g), plain) << where;
        ASSERT_EQ(cuda_append_rc(g), plain) << where;
      }
    } else {
      ASSERT_EQ(cpu_decode_rc(g), rc) << where;
      ASSERT_EQ(cpu_append_rc(g), rc) << where;
      if (KVPAGER_TEST_HAS_CUDA) {  // host-side checks: no device needed
        ASSERT_EQ(cuda_decode_rc(g), rc) << where;
        ASSERT_EQ(cuda_append_rc(g), rc) << where;
      }
    }
    const status s = can_implement(g);
    ASSERT_EQ(s.ok(), rc == KVPAGER_STATUS_OK) << where;
    if (!s.ok()) {
      ASSERT_EQ(s.code(), kernel_errc(rc)) << where;
      ASSERT_EQ(s.detail(), rc) << where;
    }
    (rc == KVPAGER_STATUS_OK ? accepted : rejected) += 1;
  }
  EXPECT_GT(accepted, 0) << "the matrix must contain supported geometries";
  EXPECT_GT(rejected, accepted);
}

TEST(KvAppend, RejectsEveryGeometryDecodeRejects) {
  for (const kv_geometry& g : geometry_matrix()) {
    const std::int32_t decode = cpu_decode_rc(g), append = cpu_append_rc(g);
    ASSERT_EQ(append == KVPAGER_STATUS_OK, decode == KVPAGER_STATUS_OK)
        << "bs " << g.block_size << " heads " << g.num_kv_heads << " dim " << g.head_dim << " dtype " << dt(g);
    ASSERT_EQ(append, decode);
  }
}

TEST(CanImplement, AcceptsTheKernelsBlockSizesOnly) {
  kv_geometry g{64, 16, 8, 128, kv_dtype::f16};
  for (const std::int32_t bs : {8, 16, 32}) {
    g.block_size = bs;
    EXPECT_TRUE(can_implement(g).ok()) << bs;
  }
  // Powers of two the cache accepts but no kernel runs: refused when the cache is created, not at the first decode.
  for (const std::int32_t bs : {1, 2, 4, 64, 128, 256}) {
    g.block_size = bs;
    const status s = can_implement(g);
    EXPECT_EQ(s.code(), errc::unsupported) << bs;
    EXPECT_EQ(s.detail(), KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE) << bs;
  }
}

TEST(CanImplement, ReportsTheFirstFailingCheckInTheKernelsOrder) {
  // heads, head dim, dtype, block size, then the pool: each geometry breaks the later checks too.
  EXPECT_EQ(can_implement({0, 3, 0, 7, static_cast<kv_dtype>(9)}).detail(), KVPAGER_STATUS_BAD_HEADS);
  EXPECT_EQ(can_implement({0, 3, 1, 7, static_cast<kv_dtype>(9)}).detail(), KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM);
  EXPECT_EQ(can_implement({0, 3, 1, 64, static_cast<kv_dtype>(9)}).detail(), KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  EXPECT_EQ(can_implement({0, 3, 1, 64, kv_dtype::bf16}).detail(), KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE);
  EXPECT_EQ(can_implement({0, 8, 1, 64, kv_dtype::bf16}).detail(), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(can_implement({0, 8, 1, 64, kv_dtype::bf16}).code(), errc::invalid_argument);
  EXPECT_EQ(can_implement({kMax, 32, 1 << 20, 256, kv_dtype::f32}).code(), errc::invalid_argument) << "pool beyond int64";
  EXPECT_TRUE(can_implement({1, 8, 1, 64, kv_dtype::bf16}).ok());
}

TEST(KvGeometry, LayoutDerivesFromIt) {
  for (const kv_dtype t : {kv_dtype::f32, kv_dtype::f16, kv_dtype::bf16}) {
    const kv_geometry g{100, 32, 4, 96, t};
    const kv_layout l = kv_layout::of(g);
    EXPECT_EQ(l.num_blocks, 100);
    EXPECT_EQ(l.block_size, 32);
    EXPECT_EQ(l.num_kv_heads, 4);
    EXPECT_EQ(l.head_dim, 96);
    EXPECT_EQ(l.elem_bytes, t == kv_dtype::f32 ? 4 : 2);
    EXPECT_EQ(l.block_bytes(), std::int64_t{2} * 4 * 32 * 96 * elem_bytes(t));
  }
}

TEST(KvGeometry, ViewsDeriveFromItAndGiveItBack) {
  const kv_geometry g{10, 16, 2, 128, kv_dtype::bf16};
  int dummy = 0;
  const paged_kv_view h = paged_kv_view::hnd(&dummy, g);
  const paged_kv_view expect_h = paged_kv_view::hnd(&dummy, KVPAGER_DTYPE_BF16, 10, 2, 16, 128);
  EXPECT_EQ(h.stride_block, expect_h.stride_block);
  EXPECT_EQ(h.stride_kv, expect_h.stride_kv);
  EXPECT_EQ(h.stride_head, expect_h.stride_head);
  EXPECT_EQ(h.stride_token, expect_h.stride_token);
  EXPECT_EQ(h.geometry(), g);
  const paged_kv_view n = paged_kv_view::nhd(&dummy, g);
  EXPECT_EQ(n.stride_token, paged_kv_view::nhd(&dummy, KVPAGER_DTYPE_BF16, 10, 2, 16, 128).stride_token);
  EXPECT_EQ(n.geometry(), g);
  EXPECT_EQ(kv_layout::of(g).block_bytes() / elem_bytes(g.dtype), h.stride_block);
}

// The cache accepts any power-of-two block size; can_implement is where a size the kernels do not run is refused,
// before the cache is created from the same geometry (cache_config_for).
TEST(CanImplement, RefusesABlockSizeTheCacheWouldAccept) {
  for (const std::int32_t bs : {4, 64, 128}) {
    const kvpager::kv_geometry g{.num_blocks = 64, .block_size = bs, .num_kv_heads = 4, .head_dim = 128,
                                 .dtype = kvpager::kv_dtype::f16};
    EXPECT_TRUE(kvpager::validate(kvpager::cache_config_for(g))) << bs;
    EXPECT_EQ(kvpager::can_implement(g).code(), kvpager::errc::unsupported) << bs;
  }
  const kvpager::kv_geometry ok{.num_blocks = 64, .block_size = 16, .num_kv_heads = 4, .head_dim = 128,
                                .dtype = kvpager::kv_dtype::f16};
  EXPECT_TRUE(kvpager::can_implement(ok));
  EXPECT_TRUE(kvpager::validate(kvpager::cache_config_for(ok)));
}

// Issue 22, point 1: create(cfg, can_implement) learns at creation that the kernels cannot run a pool, with the
// kernels' own verdict, and builds nothing; a geometry they run creates the cache as before.
TEST(CanImplement, CacheCreationChecksTheGeometryWhenAsked) {
  const kv_geometry ok{64, 16, 8, 128, kv_dtype::f16};
  auto c = vllm_v1_cache::create(cache_config_for(ok, {.reserved_blocks = 1}), can_implement);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->geometry(), ok);
  EXPECT_TRUE(can_implement(c->geometry()));
  for (const kv_geometry bad : {kv_geometry{64, 16, 8, 100, kv_dtype::f16}, kv_geometry{64, 64, 8, 128, kv_dtype::f16},
                                kv_geometry{64, 16, 8, 128, static_cast<kv_dtype>(9)}}) {
    const auto r = vllm_v1_cache::create(cache_config_for(bad, {.reserved_blocks = 1}), can_implement);
    ASSERT_FALSE(r) << bad.head_dim << " " << bad.block_size;
    EXPECT_EQ(r.code(), can_implement(bad).code());
    EXPECT_TRUE(vllm_v1_cache::create(cache_config_for(bad, {.reserved_blocks = 1})))
        << "without the check the cache itself accepts any power-of-two block size";
  }
}
