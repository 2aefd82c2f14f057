// SPDX-License-Identifier: Apache-2.0
// kvpager-gpu-check: the CUDA kernels on a real GPU with nothing but the CUDA runtime and libkvpager_kernels, for GPU
// machines that lack GoogleTest and Google Benchmark. Correctness: decode (unsplit and split-KV, LSE; over fp8 pools
// with window and cap) against the CPU backend, paged prefill against an fp64 reference (every dtype and head dim,
// window, soft cap, LSE, fp8 KV), kv_append / copy_blocks / swap_blocks bit-exact against the CPU functions; prefill
// FLOP/s against the dense bf16 peak. Bandwidth (CUDA events, best of several runs): decode as KV bytes read per second
// against 4.8 TB/s and a device-to-device cudaMemcpy of the same bytes; copy_blocks against cudaMemcpy; a scattered
// swap-out against one large pinned cudaMemcpy. Exit status: 0 all checks passed, 1 a check failed, 2 no GPU.
// Usage: kvpager-gpu-check [--quick]
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>

#include "kvpager_testing/cuda_compare.hpp"
#include "kvpager_testing/cuda_prefill_compare.hpp"

namespace {

using namespace kvpager_gpu_check;

int failures = 0;
void check(bool ok, const std::string& what) {
  if (!ok) ++failures;
  std::printf("%s %s\n", ok ? "[ ok ]" : "[FAIL]", what.c_str());
}

/// Best time in seconds of fn over `reps` timed runs (after one warm-up), with CUDA events.
template <class Fn>
double best_seconds(int reps, Fn fn) {
  event_timer timer(fn);
  double best = 1e30;
  for (int i = 0; i < reps; ++i) best = std::min(best, timer.seconds(fn));
  return best;
}

void decode_correctness(bool quick) {
  uint32_t seed = 1;
  for (int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 80, 96, 112, 128, 256})
      for (int32_t bs : {8, 16, 32}) {
        if (quick && bs != 16) continue;
        for (int32_t splits : {1, 3}) {
          const auto r = run_decode_case(dtype, d, bs, 8, 2, {1, bs - 1, bs + 1, 97, 513, 4097, 0}, splits, seed++);
          char what[160];
          std::snprintf(what, sizeof what, "decode dtype %d d %d bs %d splits %d: out err %.2e (tol %.0e), lse err %.2e",
                        dtype, d, bs, splits, r.out, gpu_tolerance(dtype), r.lse);
          check(r.calls_ok && r.out <= gpu_tolerance(dtype) && r.lse <= 1e-5, what);
        }
      }
  const std::pair<int32_t, int32_t> heads[] = {{4, 4}, {7, 1}, {24, 2}, {32, 1}};
  for (const auto& [hq, hkv] : heads) {
    const auto r = run_decode_case(KVPAGER_DTYPE_FP16, 128, 16, hq, hkv, {1, 300, 2048, 0}, 16, seed++);
    check(r.calls_ok && r.out <= gpu_tolerance(KVPAGER_DTYPE_FP16) && r.lse <= 1e-5,
          "decode split 16, hq " + std::to_string(hq) + " hkv " + std::to_string(hkv));
  }
  // An fp8 E4M3 pool against the CPU fp8 backend: plain, split, sliding window, soft cap.
  const std::tuple<int32_t, float, int32_t> fp8_variants[] = {{-1, 0.0F, 1}, {-1, 0.0F, 4}, {37, 0.0F, 3}, {100, 1.0F, 2}};
  for (int32_t q_dtype : {KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 128, 256})
      for (const auto& [window, cap, splits] : fp8_variants) {
        const auto r = run_fp8_decode_case(q_dtype, d, 16, 8, 2, {1, 17, 300, 2049, 0}, splits, seed++, window, cap);
        char what[160];
        std::snprintf(what, sizeof what, "decode fp8-kv q dtype %d d %d window %d cap %.1f splits %d: out err %.2e (tol %.0e)",
                      q_dtype, d, window, static_cast<double>(cap), splits, r.out, gpu_tolerance(q_dtype));
        check(r.calls_ok && r.out <= gpu_tolerance(q_dtype), what);
      }
}

void prefill_correctness(bool quick) {
  uint32_t seed = 101;
  for (int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 80, 96, 112, 128, 256})
      for (int32_t bs : {8, 16, 32}) {
        if (quick && bs != 16) continue;
        const uint32_t k = seed++;
        const int32_t window = k % 2 == 0 ? -1 : 45;
        const float cap = (k / 2) % 2 == 0 ? 0.0F : 2.0F;
        for (const bool fp8 : {false, true}) {  // the dtype's own pool, then an fp8 E4M3 pool (prefill_fp8)
          if (fp8 && bs != 16) continue;
          prefill_problem pr(dtype, d, bs, 8, 2, window, cap, {{1, 1}, {bs + 1, bs + 1}, {300, 130}, {97, 0}, {520, 1}}, k,
                             !fp8);
          if (fp8) pr.use_fp8_kv(0.01F, 0.05F);
          const auto r = run_prefill_case(pr);
          char what[240];
          std::snprintf(what, sizeof what,
                        "prefill%s dtype %d d %d bs %d window %d cap %.1f: out err %.2e (tol %.0e), lse err %.2e, flag %d",
                        fp8 ? " fp8-kv" : "", dtype, d, bs, window, static_cast<double>(cap), r.out, gpu_tolerance(dtype),
                        r.lse, r.device_error);
          check(r.calls_ok && r.device_error == 0 && r.out <= gpu_tolerance(dtype) && r.lse <= 1e-3, what);
        }
      }
}

void prefill_throughput(int32_t ctx, int32_t q_len, int32_t batch) {
  const prefill_bench bench(ctx, q_len, batch);
  if (!bench.ok) {
    check(false, "prefill throughput setup (device memory)");
    return;
  }
  int32_t rc = 0;
  const double sec = best_seconds(10, [&] { rc |= bench.run(); });
  const double flops = bench.flops() / sec;
  std::printf("[flop] prefill bf16 gqa4 d128 ctx %d q_len %d batch %d ctas %d: %.1f TFLOP/s = %.2f of the dense bf16 peak\n",
              ctx, q_len, batch, bench.ctas, flops / 1e12, flops / kH200DenseBf16Flops);
  check(rc == 0, "prefill throughput run returned OK");
}

void blocks_correctness() {
  for (const auto& [what, ok] : blocks_vs_cpu()) check(ok, what);
}

void decode_bandwidth(int32_t ctx, int32_t batch) {
  const decode_bench bench(ctx, batch);
  void* copy = nullptr;
  if (!bench.ok || cudaMalloc(&copy, bench.kv_bytes) != cudaSuccess) {
    check(false, "decode bandwidth setup (device memory)");
    cudaFree(copy);
    return;
  }
  int32_t rc = 0;
  const double dec = best_seconds(20, [&] { rc |= bench.run(); });
  const double mem = best_seconds(20, [&] { cudaMemcpyAsync(copy, bench.kv, bench.kv_bytes, cudaMemcpyDeviceToDevice); });
  // A device memcpy reads and writes each byte; decode only reads: compare with the memcpy's bytes moved (2x).
  const auto bytes = static_cast<double>(bench.kv_bytes);
  const double dec_bw = bytes / dec, mem_bw = 2.0 * bytes / mem;
  std::printf("[bw  ] decode fp16 gqa4 d128 ctx %d batch %d splits %d: %.0f GB/s = %.2f of 4.8 TB/s, %.2f of device "
              "memcpy (%.0f GB/s moved)\n",
              ctx, batch, bench.splits, dec_bw / 1e9, dec_bw / 4.8e12, dec_bw / mem_bw, mem_bw / 1e9);
  check(rc == 0, "decode bandwidth run returned OK");
  cudaFree(copy);
}

void block_bandwidth() {
  const int64_t block_bytes = 64 << 10;
  const int32_t pairs_n = 2048, nb = 2 * pairs_n + 16;
  void *pool = nullptr, *a = nullptr, *b = nullptr, *pinned = nullptr;
  cudaMalloc(&pool, static_cast<size_t>(nb) * block_bytes);
  cudaMalloc(&a, static_cast<size_t>(pairs_n) * block_bytes);
  cudaMalloc(&b, static_cast<size_t>(pairs_n) * block_bytes);
  cudaMallocHost(&pinned, static_cast<size_t>(pairs_n) * block_bytes);
  std::vector<int64_t> order(static_cast<size_t>(pairs_n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(2));
  std::vector<int64_t> copy_pairs, swap_pairs;
  for (int32_t i = 0; i < pairs_n; ++i) {
    copy_pairs.insert(copy_pairs.end(), {order[static_cast<size_t>(i)], pairs_n + i});
    swap_pairs.insert(swap_pairs.end(), {order[static_cast<size_t>(i)], i});  // scattered sources: no runs to merge
  }
  auto* dpairs = to_device(copy_pairs);
  auto* dptrs = to_device(std::vector<void*>{pool});
  const double bytes = static_cast<double>(pairs_n) * static_cast<double>(block_bytes);
  const double cp = best_seconds(10, [&] { kvpager_cuda_copy_blocks(dptrs, 1, dpairs, pairs_n, nb, block_bytes, nullptr, nullptr); });
  const double mc = best_seconds(10, [&] { cudaMemcpyAsync(b, a, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice); });
  std::printf("[bw  ] copy_blocks 2048 x 64 KiB: %.0f GB/s, %.2f of one device memcpy of the same bytes (%.0f GB/s)\n",
              bytes / cp / 1e9, mc / cp, bytes / mc / 1e9);
  const double sw = best_seconds(10, [&] {
    kvpager_cuda_swap_blocks(pinned, pairs_n, pool, nb, block_bytes, swap_pairs.data(), pairs_n, nullptr);
  });
  const double pm = best_seconds(10, [&] { cudaMemcpyAsync(pinned, a, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost); });
  std::printf("[bw  ] swap-out 2048 scattered x 64 KiB to pinned host: %.1f GB/s, %.2f of one pinned memcpy (%.1f GB/s)\n",
              bytes / sw / 1e9, pm / sw, bytes / pm / 1e9);
  cudaFreeHost(pinned);
  for (void* p : {pool, a, b, static_cast<void*>(dpairs), static_cast<void*>(dptrs)}) cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (!have_gpu()) {
    std::printf("no CUDA device: nothing checked\n");
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device 0: %s, %d SMs, CPU decode path %s\n", prop.name, prop.multiProcessorCount, kvpager_cpu_decode_path());
  decode_correctness(quick);
  prefill_correctness(quick);
  blocks_correctness();
  for (const auto& [ctx, batch] : {std::pair{4096, 8}, std::pair{16384, 8}, std::pair{32768, 1}, std::pair{32768, 32}})
    decode_bandwidth(ctx, batch);
  block_bandwidth();
  for (const auto& [ctx, q_len, batch] : {std::tuple{1024, 1024, 8}, std::tuple{4096, 4096, 2}, std::tuple{4096, 1024, 8},
                                          std::tuple{8192, 256, 8}})
    prefill_throughput(ctx, q_len, batch);
  std::printf("%d check(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}
