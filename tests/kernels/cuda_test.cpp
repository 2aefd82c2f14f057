// CUDA kernels against the CPU backend on the same inputs. Skipped, with a message, where no GPU is present.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/float16.hpp>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace {

bool have_gpu() {
  int32_t n = 0;
  return kvpager_cuda_device_count(&n) == KVPAGER_STATUS_OK && n > 0;
}
#define KVTEST_NEED_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: CUDA kernel tests skipped (they run where a GPU is present)"

template <class T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  if (cudaMalloc(&d, std::max<size_t>(1, v.size() * sizeof(T))) != cudaSuccess) return nullptr;
  cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

}  // namespace

TEST(CudaDecodeAttention, MatchesCpuBackend) {
  KVTEST_NEED_GPU();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uni(-1.0F, 1.0F);
  for (int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 80, 128, 256})
      for (int32_t bs : {8, 16, 32}) {
        const int32_t hq = 8, hkv = 2;
        const std::vector<int32_t> lens = {1, bs - 1, bs + 1, 97, 513, 4097};
        const int32_t maxb = (4097 + bs - 1) / bs;
        int32_t nb = 0;
        for (int32_t len : lens) nb += (len + bs - 1) / bs;
        nb += 3;
        const size_t block_elems = 2ULL * hkv * bs * d;
        std::vector<uint16_t> kv16(static_cast<size_t>(nb) * block_elems), q16(lens.size() * hq * d);
        std::vector<float> kv32(kv16.size()), q32(q16.size());
        for (size_t i = 0; i < kv16.size(); ++i) {
          kv32[i] = uni(rng);
          kv16[i] = dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::float_to_half(kv32[i]) : kvpager::detail::float_to_bf16(kv32[i]);
        }
        for (size_t i = 0; i < q16.size(); ++i) {
          q32[i] = uni(rng);
          q16[i] = dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::float_to_half(q32[i]) : kvpager::detail::float_to_bf16(q32[i]);
        }
        std::vector<int32_t> ids(static_cast<size_t>(nb));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        std::vector<int32_t> table(lens.size() * static_cast<size_t>(maxb), 0);
        size_t next = 0;
        for (size_t s = 0; s < lens.size(); ++s)
          for (int32_t b = 0; b < (lens[s] + bs - 1) / bs; ++b) table[s * static_cast<size_t>(maxb) + static_cast<size_t>(b)] = ids[next++];
        const bool f32 = dtype == KVPAGER_DTYPE_FP32;
        const size_t esz = f32 ? 4 : 2;
        std::vector<unsigned char> kvh(kv16.size() * esz), qh(q16.size() * esz), cpu_out(qh.size()), gpu_out(qh.size());
        std::memcpy(kvh.data(), f32 ? static_cast<const void*>(kv32.data()) : kv16.data(), kvh.size());
        std::memcpy(qh.data(), f32 ? static_cast<const void*>(q32.data()) : q16.data(), qh.size());
        const float scale = 1.0F / std::sqrt(static_cast<float>(d));
        ASSERT_EQ(kvpager_cpu_paged_attention_decode(cpu_out.data(), qh.data(), kvh.data(), table.data(), lens.data(),
                                                     static_cast<int32_t>(lens.size()), hq, hkv, d, bs, maxb, nb, scale, dtype, 0),
                  KVPAGER_STATUS_OK);
        auto* dkv = to_device(kvh);
        auto* dq = to_device(qh);
        auto* dt = to_device(table);
        auto* dl = to_device(lens);
        auto* dout = to_device(gpu_out);
        auto* derr = to_device(std::vector<int32_t>{0});
        ASSERT_EQ(kvpager_cuda_paged_attention_decode(dout, dq, dkv, dt, dl, static_cast<int32_t>(lens.size()), hq, hkv, d, bs,
                                                      maxb, nb, scale, dtype, derr, nullptr),
                  KVPAGER_STATUS_OK);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        gpu_out = to_host(dout, gpu_out.size());
        EXPECT_EQ(to_host(derr, 1)[0], 0);
        double worst = 0;
        for (size_t i = 0; i < q16.size(); ++i) {
          double a, b;
          if (f32) {
            float x, y;
            std::memcpy(&x, cpu_out.data() + 4 * i, 4);
            std::memcpy(&y, gpu_out.data() + 4 * i, 4);
            a = x;
            b = y;
          } else {
            uint16_t x, y;
            std::memcpy(&x, cpu_out.data() + 2 * i, 2);
            std::memcpy(&y, gpu_out.data() + 2 * i, 2);
            a = dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::half_to_float(x) : kvpager::detail::bf16_to_float(x);
            b = dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::half_to_float(y) : kvpager::detail::bf16_to_float(y);
          }
          worst = std::max(worst, std::abs(a - b) / (1.0 + std::abs(a)));
        }
        EXPECT_LE(worst, f32 ? 1e-5 : dtype == KVPAGER_DTYPE_FP16 ? 2e-3 : 1.6e-2) << dtype << " " << d << " " << bs;
        for (void* p : {static_cast<void*>(dkv), static_cast<void*>(dq), static_cast<void*>(dt), static_cast<void*>(dl),
                        static_cast<void*>(dout), static_cast<void*>(derr)})
          cudaFree(p);
      }
}

TEST(CudaBlocks, AppendCopySwapMatchCpu) {
  KVTEST_NEED_GPU();
  const int32_t hkv = 2, d = 64, bs = 16, nb = 8;
  const size_t block_elems = 2ULL * hkv * bs * d;
  std::vector<uint16_t> cache(nb * block_elems, 0), k(3 * hkv * d), v(3 * hkv * d);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<uint16_t>(i);
    v[i] = static_cast<uint16_t>(7 * i);
  }
  const std::vector<int64_t> slots = {5 * bs + 3, -1, 2 * bs};
  auto cpu = cache;
  ASSERT_EQ(kvpager_cpu_kv_append(cpu.data(), k.data(), v.data(), slots.data(), 3, hkv, d, bs, nb, KVPAGER_DTYPE_FP16), 0);
  auto* dc = to_device(cache);
  auto* dk = to_device(k);
  auto* dv = to_device(v);
  auto* ds = to_device(slots);
  ASSERT_EQ(kvpager_cuda_kv_append(dc, dk, dv, ds, 3, hkv, d, bs, nb, KVPAGER_DTYPE_FP16, nullptr, nullptr), 0);
  EXPECT_EQ(to_host(dc, cache.size()), cpu);
  // copy_blocks: 5 -> 1 and 2 -> 3 in one layer.
  const std::vector<int64_t> pairs = {5, 1, 2, 3};
  void* cpu_ptr = cpu.data();
  ASSERT_EQ(kvpager_cpu_copy_blocks(&cpu_ptr, 1, pairs.data(), 2, nb, static_cast<int64_t>(block_elems * 2)), 0);
  auto* dptrs = to_device(std::vector<void*>{dc});
  auto* dpairs = to_device(pairs);
  ASSERT_EQ(kvpager_cuda_copy_blocks(dptrs, 1, dpairs, 2, nb, static_cast<int64_t>(block_elems * 2), nullptr, nullptr), 0);
  EXPECT_EQ(to_host(dc, cache.size()), cpu);
  // swap out blocks 1, 2, 3 (consecutive: one merged copy) to pinned host blocks 4, 5, 6 and back to 5, 6, 7.
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, nb * block_elems * 2), cudaSuccess);
  const std::vector<int64_t> out_pairs = {1, 4, 2, 5, 3, 6};
  ASSERT_EQ(kvpager_cuda_swap_blocks(pinned, nb, dc, nb, static_cast<int64_t>(block_elems * 2), out_pairs.data(), 3, nullptr), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int b = 1; b <= 3; ++b)
    EXPECT_EQ(std::memcmp(static_cast<unsigned char*>(pinned) + (b + 3) * block_elems * 2, cpu.data() + b * block_elems, block_elems * 2), 0);
  EXPECT_EQ(kvpager_cuda_swap_blocks(pinned, nb, dc, nb, static_cast<int64_t>(block_elems * 2), std::vector<int64_t>{0, 8}.data(), 1, nullptr),
            KVPAGER_STATUS_INVALID_BLOCK);
  cudaFreeHost(pinned);
  for (void* p : {static_cast<void*>(dc), static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(ds),
                  static_cast<void*>(dptrs), static_cast<void*>(dpairs)})
    cudaFree(p);
}

#include <kvpager/kvpager.hpp>
#include <kvpager/kernels/cuda_executor.hpp>

TEST(CudaExecutor, RefusesWithoutADeviceOrRunsAPlan) {
  if (!have_gpu()) {
    kvpager::cuda_executor_config cfg;
    EXPECT_EQ(kvpager::cuda_executor::create(cfg).code(), kvpager::errc::unsupported);
    GTEST_SKIP() << "no CUDA device: the executor's plan run is tested where a GPU is present";
  }
  kvpager::kv_layout layout{16, 2, 16, 64, 2};
  void* dev = nullptr;
  void* host = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, static_cast<size_t>(layout.pool_bytes())), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&host, static_cast<size_t>(layout.block_bytes() * 8)), cudaSuccess);
  cudaMemset(dev, 0, static_cast<size_t>(layout.pool_bytes()));
  kvpager::cuda_executor_config cfg;
  cfg.layout = layout;
  cfg.device_pool = dev;
  cfg.host_pool = host;
  cfg.num_host_blocks = 8;
  auto ex = kvpager::cuda_executor::create(cfg);
  ASSERT_TRUE(ex.ok()) << ex.error().message();
  // Same plan on the CPU executor and the CUDA one: the device pool must end up identical.
  auto cache = *kvpager::paged_kv_cache<>::create({16, 16, 0, 0});
  ASSERT_TRUE(cache.add_sequence(1, 20));
  std::vector<int64_t> slots(static_cast<size_t>(cache.slot_mapping_size()));
  ASSERT_TRUE(cache.export_slot_mapping(slots));
  std::vector<uint16_t> k(slots.size() * 2 * 64), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<uint16_t>(i * 3);
    v[i] = static_cast<uint16_t>(i * 5 + 1);
  }
  kvpager::cpu_executor cpu(layout, 8);
  ASSERT_TRUE(cpu.execute(cache.plan(), slots, std::as_bytes(std::span(k)), std::as_bytes(std::span(v))));
  auto* dk = to_device(k);
  auto* dv = to_device(v);
  ASSERT_TRUE((*ex)->execute(cache.plan(), slots, dk, dv));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<std::byte> got(static_cast<size_t>(layout.pool_bytes()));
  cudaMemcpy(got.data(), dev, got.size(), cudaMemcpyDeviceToHost);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), cpu.device_bytes().begin()));
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dev);
  cudaFreeHost(host);
}
