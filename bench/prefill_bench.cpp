// SPDX-License-Identifier: Apache-2.0
// CPU paged prefill (kvpager_cpu_paged_attention_prefill), see bench/RESULTS.md.
//  - Long q_len (compute-bound): achieved FLOP/s against the machine's own fp32 matrix-multiply rate measured in the
//    same run with the same thread count: OpenBLAS sgemm (1024 x 1024 x 1024) when the benchmark was built with a
//    BLAS, and always the fp32 FMA peak (of_fma_peak: the roofline's per-core FMA peak with the vectors of the path
//    the kernels run, 512-bit on the avx512 paths and 256-bit on avx2, times the threads). FLOPs counted are the
//    ones the causal mask requires: 4 x head_dim x num_q_heads x (sum over query rows of the KV positions that row
//    sees), i.e. 2 FLOPs per multiply-add of Q.K^T and of P.V, masked-out scores not counted (for a whole prompt of L
//    tokens: L (L + 1) / 2 positions per head).
//  - Short q_len (decode-like): KV bytes read per second against a tuned streaming read of the same bytes (vector
//    loads, several accumulators, the same thread count).
//  - Issue 27's shapes (prefill_d128_one_thread): q_len 1024 over a 2k cached prefix and whole prompts, GQA 4 and
//    MHA, bf16 and fp32, one thread, against the host's roofline of the same run (bench/roofline.hpp): fp32 against
//    the 512-bit FMA peak, bf16 on the avx512bf16 path against the vdpbf16ps peak and against the ceiling of a
//    prefill whose P.V stays fp32 (BM_PrefillPeak).
// Counters: GFLOPs, KV_GBps, of_sgemm / of_fma_peak / of_stream = the kernel's rate over the baseline's, all from the
// fastest iteration (sgemm and the stream: best of 3 to 10 runs; the FMA peaks: the roofline's, best of 7 passes).
// One-thread rows are timed on the thread's CPU clock.
#include <kvpager/c/kernels.h>

#include <benchmark/benchmark.h>

#include "roofline.hpp"

#include <algorithm>
#include <ctime>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#if defined(KVPAGER_BENCH_HAVE_BLAS)
extern "C" void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
                       const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc);
extern "C" void openblas_set_num_threads(int n) __attribute__((weak));
#endif

namespace {

constexpr std::int32_t hq = 32, hkv = 8, dim = 128, bs = 16;  // GQA 4, a Llama-3-8B layer
constexpr float scale = 0.088F;

unsigned cores() { return std::max(1U, std::thread::hardware_concurrency()); }
unsigned threads_of(std::int64_t arg) { return arg == 0 ? cores() : static_cast<unsigned>(arg); }

/// Seconds on the calling thread's CPU clock when `thread_clock` (a one-thread measurement: the machine's other
/// load does not count against it), on the wall clock otherwise.
double now(bool thread_clock) {
  timespec ts{};
  clock_gettime(thread_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

template <class Fn>
double best_seconds(int reps, Fn fn, bool thread_clock = false) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now(thread_clock);
    fn();
    best = std::min(best, now(thread_clock) - t0);
  }
  return best;
}

/// Runs fn(t) on `threads` threads (t = 0 on the caller) and waits for all.
template <class Fn>
void on_threads(unsigned threads, Fn fn) {
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back([&, t] { fn(t); });
  fn(0U);
  for (auto& th : pool) th.join();
}

/// The host's compute bounds of one core (FLOP/s): the fp32 FMA peaks with 512-bit and 256-bit vectors and the
/// vdpbf16ps peak (0 for a unit the CPU lacks), as the `kvpager-roofline:` line of this run states them
/// (kvbench::measured_roofline); under KVPAGER_BENCH_NO_ROOFLINE, measured here once (kvbench::measure_peaks).
struct core_peaks {
  double fma512, fma256, bf16dot;
};
const core_peaks& host_peaks() {
  static const core_peaks p = [] {
    kvbench::roofline r = kvbench::measured_roofline();
    if (r.cpu_model.empty()) kvbench::measure_peaks(r);  // the roofline was skipped
    return core_peaks{1e9 * r.fma512_gflops_core, 1e9 * r.fma256_gflops_core, 1e9 * r.bf16dot_gflops_core};
  }();
  return p;
}

/// The fp32 FMA peak (FLOP/s) on `threads` cores with the vectors of the path the kernels' dispatch runs: the
/// roofline's 512-bit peak per core on the avx512 paths (avx512bf16 included), its 256-bit one on avx2, times the
/// threads; 0 on another path (no of_fma_peak then).
double fma_peak(unsigned threads) {
  const std::string_view path = kvpager_cpu_decode_path();
  const core_peaks& p = host_peaks();
  return (path.starts_with("avx512") ? p.fma512 : path == "avx2" ? p.fma256 : 0.0) * threads;
}

/// fp32 matrix-multiply rate of the BLAS (0 without one): best of 3 sgemm 1024^3 on `threads` threads.
double sgemm_rate(unsigned threads) {
#if defined(KVPAGER_BENCH_HAVE_BLAS)
  static std::map<unsigned, double> memo;
  if (auto it = memo.find(threads); it != memo.end()) return it->second;
  const int n = 1024;
  std::vector<float> a(static_cast<std::size_t>(n) * n, 0.5F), b(a.size(), 0.25F), c(a.size());
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(static_cast<int>(threads));
  const float one = 1.0F, zero = 0.0F;
  const double s = best_seconds(
      4, [&] { sgemm_("N", "N", &n, &n, &n, &one, a.data(), &n, b.data(), &n, &zero, c.data(), &n); }, threads == 1);
  benchmark::DoNotOptimize(c.data());
  return memo[threads] = 2.0 * n * n * static_cast<double>(n) / s;
#else
  (void)threads;
  return 0.0;
#endif
}

/// A batch of `num_seqs` sequences of kv_len tokens, each with its last q_len as query rows, over `kv_heads` KV heads
/// (32 query heads): fp32 (dtype 0), fp16 (1) or bf16 (2), values in [0.5, 1). An fp32 batch holds exactly the
/// values of the bf16 batch of the same shape, so the two dtypes run the same numbers.
struct batch {
  std::int32_t num_seqs, q_len, kv_len, dtype, kv_heads, max_blocks, num_blocks;
  std::vector<std::uint16_t> kv, q, out;  ///< 16-bit words: two per element for fp32
  std::vector<std::int32_t> table, lens, qo;
  batch(std::int32_t seqs, std::int32_t ql, std::int32_t kvl, std::int32_t dt, std::int32_t heads = hkv)
      : num_seqs(seqs), q_len(ql), kv_len(kvl), dtype(dt), kv_heads(heads) {
    max_blocks = (kvl + bs - 1) / bs;
    num_blocks = seqs * max_blocks;
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> bits(0, 0x3FF);
    const bool f16 = dt == KVPAGER_DTYPE_FP16;
    const std::uint16_t base = f16 ? 0x3800 : 0x3F00;  // ~0.5 in either format
    const std::size_t words = dt == KVPAGER_DTYPE_FP32 ? 2 : 1;
    auto fill = [&](std::vector<std::uint16_t>& v, std::size_t elems) {
      v.assign(elems * words, 0);
      for (std::size_t i = 0; i < elems; ++i) {
        const auto x = static_cast<std::uint16_t>(base | (bits(rng) & (f16 ? 0x3FF : 0x7F)));
        v[i * words + words - 1] = x;  // fp32: the bf16 value's bits in the high half (little endian)
      }
    };
    fill(kv, static_cast<std::size_t>(num_blocks) * 2 * static_cast<std::size_t>(kv_heads) * bs * dim);
    fill(q, static_cast<std::size_t>(seqs) * static_cast<std::size_t>(ql) * hq * dim);
    out.resize(q.size());
    table.resize(static_cast<std::size_t>(num_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    lens.assign(static_cast<std::size_t>(seqs), kvl);
    for (std::int32_t s = 0; s <= seqs; ++s) qo.push_back(s * ql);
  }
  std::int32_t run(std::int32_t threads) {
    return kvpager_cpu_paged_attention_prefill(out.data(), q.data(), kv.data(), qo.data(), table.data(), lens.data(),
                                               num_seqs, hq, kv_heads, dim, bs, max_blocks, num_blocks, scale, -1, 0.0F,
                                               dtype, threads);
  }
  /// FLOPs the causal mask requires: 4 x dim x hq x sum over rows of visible positions.
  [[nodiscard]] double flops() const {
    double visible = 0;
    for (std::int64_t i = 0; i < q_len; ++i) visible += static_cast<double>(kv_len - q_len + i + 1);
    return 4.0 * dim * hq * visible * num_seqs;
  }
  [[nodiscard]] std::int64_t kv_bytes() const {
    return std::int64_t{num_seqs} * kv_len * 2 * kv_heads * dim * (dtype == KVPAGER_DTYPE_FP32 ? 4 : 2);
  }
};

/// Times each iteration by hand (UseManualTime), so the rate and its ratio to the baseline can be counters; one-thread
/// runs on the thread's CPU clock (the kernel runs on the calling thread then), as their baselines are.
/// Returns the fastest iteration's seconds: the rates and ratios compare best with best (the baselines are best-of
/// too), which on a shared machine is what the code can do rather than what the neighbours left it.
template <class Fn>
double timed_loop(benchmark::State& state, Fn fn, bool thread_clock) {
  double best = 1e30;
  for (auto _ : state) {
    const double t0 = now(thread_clock);
    if (fn() != 0) state.SkipWithError("kernel failed");
    const double s = now(thread_clock) - t0;
    state.SetIterationTime(s);
    best = std::min(best, s);
  }
  return best;
}

/// The counters of a prefill's rate against the bound of its arithmetic on `threads` cores, measured in the same run
/// (host_peaks): of_fma512 always; for bf16 on the avx512bf16 path of_bf16dot, ceiling_GFLOPs and of_ceiling (only
/// Q.K^T runs on the dot units; P.V keeps the probabilities in fp32 at the FMA peak, so the call's ceiling is half its
/// FLOPs at each peak, 2 / (1 / bf16dot + 1 / fma512)), and a label naming the bound.
void state_bounds(benchmark::State& state, double rate, std::int32_t dtype, double threads) {
  const core_peaks& peak = host_peaks();
  state.counters["of_fma512"] = rate / (peak.fma512 * threads);
  const bool dot_path = dtype == KVPAGER_DTYPE_BF16 && std::string_view(kvpager_cpu_decode_path()) == "avx512bf16";
  if (dot_path && peak.bf16dot > 0) {
    const double ceiling = threads * 2.0 / (1.0 / peak.bf16dot + 1.0 / peak.fma512);
    state.counters["of_bf16dot"] = rate / (peak.bf16dot * threads);
    state.counters["ceiling_GFLOPs"] = ceiling / 1e9;
    state.counters["of_ceiling"] = rate / ceiling;
    state.SetLabel("bound: QK at bf16dot + PV at fma512");
  } else {
    state.SetLabel("bound: fma512");
  }
}

/// Prefill of a whole prompt (q_len = kv_len) or of a chunk over a cached prefix, bf16, one sequence:
/// args {q_len, kv_len, threads (0 = all cores)}.
void BM_PrefillFlops(benchmark::State& state) {
  batch b(1, static_cast<std::int32_t>(state.range(0)), static_cast<std::int32_t>(state.range(1)), KVPAGER_DTYPE_BF16);
  const auto threads = static_cast<std::int32_t>(state.range(2));
  const double gemm = sgemm_rate(threads_of(threads)), peak = fma_peak(threads_of(threads));
  const double best = timed_loop(state, [&] { return b.run(threads); }, threads == 1);
  const double rate = b.flops() / best;
  state.counters["GFLOPs"] = rate / 1e9;
  if (peak > 0) state.counters["of_fma_peak"] = rate / peak;
  state_bounds(state, rate, KVPAGER_DTYPE_BF16, threads_of(threads));
  if (gemm > 0) {
    state.counters["sgemm_GFLOPs"] = gemm / 1e9;
    state.counters["of_sgemm"] = rate / gemm;
  }
}
BENCHMARK(BM_PrefillFlops)
    ->Name("prefill_bf16_gqa4_d128/causal")
    ->ArgNames({"q_len", "kv_len", "threads"})
    ->Args({256, 256, 1})
    ->Args({1024, 1024, 1})
    ->Args({256, 2048, 1})
    ->Args({1024, 1024, 0})
    ->Args({2048, 2048, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

/// Issue 27, point 3: one thread, head_dim 128, 32 query heads, causal; args {q_len, kv_len, kv_heads, dtype}. Each
/// row against the bound of its arithmetic, measured in the same run (host_peaks):
///  - fp32 (dtype 0), and bf16 on a path without vdpbf16ps (KVPAGER_CPU_DISPATCH=avx512): of_fma512, the share of the
///    512-bit FMA peak;
///  - bf16 on the avx512bf16 path: of_bf16dot, the share of the vdpbf16ps peak; but only Q.K^T runs on the dot
///    units, P.V keeps the probabilities in fp32 (issue 21: P rounded to bf16 is far less accurate) and runs at the
///    FMA peak, so the ceiling of the call is half its FLOPs at each peak, 2 / (1 / bf16dot + 1 / fma512) (~0.67 of
///    the dot peak where it is twice the FMA's); of_ceiling is the share of that.
/// sgemm_GFLOPs / of_sgemm as BM_PrefillFlops (a BLAS's fp32 rate, when built with one).
void BM_PrefillPeak(benchmark::State& state) {
  const auto dtype = static_cast<std::int32_t>(state.range(3));
  batch b(1, static_cast<std::int32_t>(state.range(0)), static_cast<std::int32_t>(state.range(1)), dtype,
          static_cast<std::int32_t>(state.range(2)));
  const double gemm = sgemm_rate(1);
  const double best = timed_loop(state, [&] { return b.run(1); }, true);
  const double rate = b.flops() / best;
  state.counters["GFLOPs"] = rate / 1e9;
  state_bounds(state, rate, dtype, 1.0);
  if (gemm > 0) state.counters["of_sgemm"] = rate / gemm;
}
BENCHMARK(BM_PrefillPeak)
    ->Name("prefill_d128_one_thread/causal")
    ->ArgNames({"q_len", "kv_len", "kv_heads", "dtype"})
    ->Args({1024, 3072, 8, KVPAGER_DTYPE_BF16})  // q_len 1024 over a 2k cached prefix, GQA 4
    ->Args({1024, 3072, 32, KVPAGER_DTYPE_BF16})  // the same, MHA
    ->Args({1024, 3072, 8, KVPAGER_DTYPE_FP32})
    ->Args({1024, 3072, 32, KVPAGER_DTYPE_FP32})
    ->Args({1024, 1024, 8, KVPAGER_DTYPE_FP32})  // a whole 1024-token prompt
    ->Args({1024, 1024, 32, KVPAGER_DTYPE_FP32})
    ->Args({256, 256, 32, KVPAGER_DTYPE_BF16})  // a 256-token MHA prompt (the weak spot of issue 27)
    ->Args({256, 256, 32, KVPAGER_DTYPE_FP32})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

/// The tuned streaming read of `bytes` bytes on `threads` threads (bytes per second): the roofline's read
/// (bench/roofline.hpp: the widest loads the CPU has, each thread its slice) of this very buffer, best of 10 passes.
double stream_rate(const std::uint16_t* data, std::int64_t bytes, unsigned threads);

/// Decode-like calls: q_len rows per sequence over kv_len tokens, batch 8, fp16, all cores: KV bytes per second
/// against the tuned streaming read of the same buffer (q_len 1 runs the decode kernel, see prefill.cpp).
void BM_PrefillShort(benchmark::State& state) {
  batch b(8, static_cast<std::int32_t>(state.range(0)), static_cast<std::int32_t>(state.range(1)), KVPAGER_DTYPE_FP16);
  const double stream = stream_rate(b.kv.data(), b.kv_bytes(), cores());
  const double best = timed_loop(state, [&] { return b.run(0); }, false);
  const double rate = static_cast<double>(b.kv_bytes()) / best;
  state.counters["KV_GBps"] = rate / 1e9;
  state.counters["of_stream"] = rate / stream;
  state.counters["stream_GBps"] = stream / 1e9;
  // From q_len 4 at GQA 4 (16 FLOPs per fp16 KV byte) the call is compute-bound: its FLOP rate against the peak.
  const double flops = b.flops() / best;
  state.counters["GFLOPs"] = flops / 1e9;
  if (const double peak = fma_peak(cores()); peak > 0) state.counters["of_fma_peak"] = flops / peak;
}
BENCHMARK(BM_PrefillShort)
    ->Name("prefill_fp16_b8_gqa4_d128/decode_like")
    ->ArgNames({"q_len", "kv_len"})
    ->Args({1, 4096})
    ->Args({4, 4096})
    ->Args({1, 128})
    ->UseManualTime();

double stream_rate(const std::uint16_t* data, std::int64_t bytes, unsigned threads) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 10; ++i)
    best = std::min(best, kvbench::roofline_detail::read_pass(p, static_cast<std::size_t>(bytes), threads));
  return static_cast<double>(bytes) / best;
}

}  // namespace

// The host's roofline (bench/roofline.hpp) is measured first: its `kvpager-roofline:` line goes to stderr and its
// figures into the benchmark context (`roofline_*`), so every run carries the bounds it is a fraction of.
int main(int argc, char** argv) { return kvbench::roofline_main(argc, argv); }
