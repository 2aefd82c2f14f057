// SPDX-License-Identifier: Apache-2.0
// CPU decode (and prefill) over an fp8 E4M3 KV pool against the same call over an fp16 pool, same shapes, same run
// (issue 12, point 3): decode is bound by the KV bytes it reads, and fp8 halves them. items_per_second is KV tokens attended per
// second (batch x context per call), directly comparable between the two; bytes_per_second is the KV bytes actually
// read (1 byte per element for fp8, 2 for fp16). bench/RESULTS.md records the ratios and the command.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/float16.hpp>
#include <kvpager/kernels/float8.hpp>

#include <benchmark/benchmark.h>

#include "roofline.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace {

struct shape {
  std::int32_t batch, hq, hkv, dim, bs;
};
constexpr shape kGqa4{8, 32, 8, 128, 16};  // Llama-3-8B-like: 32 query heads over 8 KV heads
constexpr shape kMha{2, 32, 32, 128, 16};  // Llama-2-7B-like
constexpr shape kOne{1, 32, 8, 128, 16};   // one sequence: 256 tokens stay in cache (compute cost per token)

struct setup {
  shape s;
  std::int32_t context, max_blocks, num_blocks;
  std::vector<std::uint8_t> kv;  // fp16 (2 bytes per element) or fp8 (1)
  std::vector<std::uint16_t> q, out;
  std::vector<std::int32_t> table, lens;
  setup(shape sh, std::int32_t ctx, bool fp8) : s(sh), context(ctx) {
    max_blocks = (ctx + s.bs - 1) / s.bs;
    num_blocks = s.batch * max_blocks;
    const auto elems = static_cast<std::size_t>(num_blocks) * 2 * static_cast<std::size_t>(s.hkv * s.bs * s.dim);
    kv.resize(elems * (fp8 ? 1 : 2));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uni(-1.0F, 1.0F);
    // 256 random values in [-1, 1], picked per element by a cheap generator (filling hundreds of MB with mt19937
    // would dominate the benchmark's run time); fp8 stores x / 0.005 (the scales passed below).
    std::uint8_t codes[256];
    std::uint16_t halves[256];
    for (int i = 0; i < 256; ++i) {
      const float x = uni(rng);
      codes[i] = kvpager::detail::float_to_e4m3(x / 0.005F);
      halves[i] = kvpager::detail::float_to_half(x);
    }
    std::uint32_t r = 12345;
    for (std::size_t i = 0; i < elems; ++i) {
      r = r * 1664525U + 1013904223U;
      const std::uint32_t pick = r >> 24;
      if (fp8) {
        kv[i] = codes[pick];
      } else {
        std::memcpy(kv.data() + 2 * i, &halves[pick], 2);
      }
    }
    q.resize(static_cast<std::size_t>(s.batch * s.hq * s.dim));
    for (auto& x : q) x = kvpager::detail::float_to_half(uni(rng));
    out.resize(q.size());
    table.resize(static_cast<std::size_t>(s.batch) * static_cast<std::size_t>(max_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(1));
    lens.assign(static_cast<std::size_t>(s.batch), ctx);
  }
  [[nodiscard]] std::int64_t tokens() const { return std::int64_t{s.batch} * context; }
  [[nodiscard]] std::int64_t kv_bytes(std::int64_t elem) const { return tokens() * 2 * s.hkv * s.dim * elem; }
};

template <bool Fp8>
void BM_Decode(benchmark::State& state, shape sh) {
  setup st(sh, static_cast<std::int32_t>(state.range(0)), Fp8);
  const auto threads = static_cast<std::int32_t>(state.range(1));
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const auto rc =
        Fp8 ? kvpager_cpu_paged_attention_decode_fp8(st.out.data(), st.q.data(), st.kv.data(), st.table.data(),
                                                     st.lens.data(), sh.batch, sh.hq, sh.hkv, sh.dim, sh.bs,
                                                     st.max_blocks, st.num_blocks, 0.088F, KVPAGER_DTYPE_FP16, 0.005F,
                                                     0.005F, threads)
            : kvpager_cpu_paged_attention_decode(st.out.data(), st.q.data(), st.kv.data(), st.table.data(),
                                                 st.lens.data(), sh.batch, sh.hq, sh.hkv, sh.dim, sh.bs, st.max_blocks,
                                                 st.num_blocks, 0.088F, KVPAGER_DTYPE_FP16, threads);
    if (rc != 0) state.SkipWithError("kernel failed");
    benchmark::DoNotOptimize(st.out.data());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.SetItemsProcessed(state.iterations() * st.tokens());
  state.SetBytesProcessed(state.iterations() * st.kv_bytes(Fp8 ? 1 : 2));
  // Against the roofline of this run (bench/roofline.hpp): the all-cores streaming read for the calls on all cores,
  // the one-core in-cache (L2) read for the one-thread call whose pool stays in the caches.
  const kvbench::roofline& r = kvbench::measured_roofline();
  const double bound = threads == 1 ? r.l2_read_gbs_one : r.read_gbs_all;
  if (bound > 0) {
    state.counters["of_read"] =
        static_cast<double>(state.iterations()) * static_cast<double>(st.kv_bytes(Fp8 ? 1 : 2)) / seconds / (bound * 1e9);
    state.SetLabel(threads == 1 ? "bound=l2_read_one" : "bound=read_all");
  }
}

void BM_DecodeFp16(benchmark::State& state, shape sh) { BM_Decode<false>(state, sh); }
void BM_DecodeFp8(benchmark::State& state, shape sh) { BM_Decode<true>(state, sh); }

/// Prefill of the last q_len tokens of every sequence (range(1)) over its context (range(0)), all cores: fp16 KV
/// (kvpager_cpu_paged_attention_prefill) or fp8 (kvpager_cpu_paged_attention_prefill_fp8), fp16 query and output.
/// items_per_second: query rows per second; bytes_per_second: the KV bytes of the pool's visible part.
template <bool Fp8>
void BM_Prefill(benchmark::State& state, shape sh) {
  setup st(sh, static_cast<std::int32_t>(state.range(0)), Fp8);
  const auto q_len = static_cast<std::int32_t>(state.range(1));
  std::vector<std::int32_t> qo(static_cast<std::size_t>(sh.batch) + 1);
  for (std::size_t s = 0; s < qo.size(); ++s) qo[s] = static_cast<std::int32_t>(s) * q_len;
  std::vector<std::uint16_t> q(static_cast<std::size_t>(sh.batch * q_len * sh.hq * sh.dim), 0x3000), out(q.size());
  for (auto _ : state) {
    const auto rc =
        Fp8 ? kvpager_cpu_paged_attention_prefill_fp8(out.data(), q.data(), st.kv.data(), qo.data(), st.table.data(),
                                                      st.lens.data(), sh.batch, sh.hq, sh.hkv, sh.dim, sh.bs,
                                                      st.max_blocks, st.num_blocks, 0.088F, -1, 0.0F,
                                                      KVPAGER_DTYPE_FP16, 0.005F, 0.005F, 0)
            : kvpager_cpu_paged_attention_prefill(out.data(), q.data(), st.kv.data(), qo.data(), st.table.data(),
                                                  st.lens.data(), sh.batch, sh.hq, sh.hkv, sh.dim, sh.bs, st.max_blocks,
                                                  st.num_blocks, 0.088F, -1, 0.0F, KVPAGER_DTYPE_FP16, 0);
    if (rc != 0) state.SkipWithError("kernel failed");
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * sh.batch * q_len);
  state.SetBytesProcessed(state.iterations() * st.kv_bytes(Fp8 ? 1 : 2));
}

void BM_PrefillFp16(benchmark::State& state, shape sh) { BM_Prefill<false>(state, sh); }
void BM_PrefillFp8(benchmark::State& state, shape sh) { BM_Prefill<true>(state, sh); }

}  // namespace

// The fastest repetition of each is the figure least disturbed by other load on a shared machine (bench/RESULTS.md).
double fastest(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end()); }

BENCHMARK_CAPTURE(BM_DecodeFp16, gqa4_fp16, kGqa4)
    ->Name("decode_b8_gqa4_d128/fp16_kv_baseline")->Args({2048, 0})->Args({8192, 0})->UseRealTime()->ComputeStatistics("min", fastest);
BENCHMARK_CAPTURE(BM_DecodeFp8, gqa4_fp8, kGqa4)
    ->Name("decode_b8_gqa4_d128/fp8_kv")->Args({2048, 0})->Args({8192, 0})->UseRealTime()->ComputeStatistics("min", fastest);
BENCHMARK_CAPTURE(BM_DecodeFp16, mha_fp16, kMha)
    ->Name("decode_b2_mha_d128/fp16_kv_baseline")->Args({2048, 0})->Args({8192, 0})->UseRealTime()->ComputeStatistics("min", fastest);
BENCHMARK_CAPTURE(BM_DecodeFp8, mha_fp8, kMha)
    ->Name("decode_b2_mha_d128/fp8_kv")->Args({2048, 0})->Args({8192, 0})->UseRealTime()->ComputeStatistics("min", fastest);

// In cache, one thread: what converting and computing costs per token when memory is not the limit.
BENCHMARK_CAPTURE(BM_DecodeFp16, one_fp16, kOne)
    ->Name("decode_b1_gqa4_d128_in_cache_one_thread/fp16_kv_baseline")->Args({256, 1})->UseRealTime()->ComputeStatistics("min", fastest);
BENCHMARK_CAPTURE(BM_DecodeFp8, one_fp8, kOne)
    ->Name("decode_b1_gqa4_d128_in_cache_one_thread/fp8_kv")->Args({256, 1})->UseRealTime()->ComputeStatistics("min", fastest);

// Prefill chunks over a cached context: q_len 16 (KV-bound: few rows per KV byte) and 256 (compute-bound).
BENCHMARK_CAPTURE(BM_PrefillFp16, gqa4_fp16, kGqa4)
    ->Name("prefill_b8_gqa4_d128/fp16_kv_baseline")->Args({2048, 16})->Args({2048, 256})->UseRealTime()->ComputeStatistics("min", fastest);
BENCHMARK_CAPTURE(BM_PrefillFp8, gqa4_fp8, kGqa4)
    ->Name("prefill_b8_gqa4_d128/fp8_kv")->Args({2048, 16})->Args({2048, 256})->UseRealTime()->ComputeStatistics("min", fastest);

// The host's roofline is measured first (bench/roofline.hpp): the kvpager-roofline line on stderr, roofline_* in the
// context, and the bounds of_read divides by.
int main(int argc, char** argv) { return kvbench::roofline_main(argc, argv); }
