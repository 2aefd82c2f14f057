// SPDX-License-Identifier: Apache-2.0
#pragma once
// The host's roofline (issue 27, point 1): the bounds that the CPU kernel figures in bench/RESULTS.md are fractions
// of, measured on the host at the start of every kernel benchmark run rather than assumed from a CPU name.
//  - streaming read: a tuned read (AVX-512 loads where the CPU has avx512f, else AVX2, else 64-bit words; eight
//    independent accumulators, unrolled; AVX-512: each line prefetched into L1 2 KiB ahead) of a 256 MiB buffer (far
//    larger than any L3 here), touched and on transparent huge pages before timing; on all hardware threads (one
//    std::thread each, each reading its own slice) and on one. The bound of a long-context decode.
//  - in-cache read: the same read of a 512 KiB buffer (fits a 1 MiB L2, not an L1) on one core: the bound of a short
//    decode call.
//  - memcpy: one std::memcpy of 256 MiB on one thread, as copied bytes per second (each byte counted once, not once
//    read and once written).
//  - FMA peak per core: 12 independent chains of vfmadd (enough to cover latency x throughput on current cores), one
//    thread, 512-bit (avx512f) and 256-bit (avx2 + fma); 2 FLOP per lane per FMA. The bound of the fp32 prefill.
//  - bf16 dot-product peak per core: 16 independent chains of vdpbf16ps where the CPU has avx512_bf16, 64 FLOP per
//    instruction (32 bf16 products summed pairwise into 16 fp32 lanes). The bound of the bf16 prefill.
// GB and GFLOP are 1e9. Every figure is the best of several passes; a unit the CPU lacks reports 0. Run-time CPU
// checks pick the code (the library and benchmarks target baseline x86-64), so this builds and runs on any CPU.
// The whole measurement takes ~0.4 s (two 256 MiB buffers, freed before it returns), ~2 s where the kernel first has
// to compact memory for their huge pages.
//
// Use: kvbench::measure_roofline() and kvbench::roofline_line(); a benchmark's main is kvbench::roofline_main(), which
// prints the `kvpager-roofline:` line to stderr and adds every figure to Google Benchmark's context (`roofline_*`
// keys in --benchmark_format=json) before running the benchmarks; a benchmark then reads the figures through
// kvbench::measured_roofline() (set_copied_bytes: a copy's of_memcpy). bench_roofline (bench/roofline_bench.cpp) also
// runs each bound as a benchmark of its own.

#include "pool_buffer.hpp"

#include <benchmark/benchmark.h>

#if defined(__x86_64__)
// GCC 12 warns inside some intrinsics' bodies (bug 105593; _mm512_reduce_*, which kernels_bench.cpp uses): the first
// inclusion must be the silenced one.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kvbench {

/// The host's bounds, measured in this process (see the top of bench/roofline.hpp for how).
struct roofline {
  std::string cpu_model;          ///< /proc/cpuinfo's model name, with family and model numbers.
  int threads = 1;                ///< hardware threads: the "all cores" read runs one std::thread on each.
  std::string read_isa;           ///< the loads of the tuned read: "avx512", "avx2" or "scalar".
  double read_gbs_all = 0;        ///< streaming read, all hardware threads, GB/s.
  double read_gbs_one = 0;        ///< streaming read, one thread, GB/s.
  double memcpy_gbs = 0;          ///< one std::memcpy of 256 MiB, one thread, copied GB/s.
  double fma512_gflops_core = 0;  ///< fp32 FMA peak of one core with 512-bit vectors, GFLOP/s (0: no avx512f).
  double fma256_gflops_core = 0;  ///< fp32 FMA peak of one core with 256-bit vectors, GFLOP/s (0: no avx2 + fma).
  double bf16dot_gflops_core = 0; ///< vdpbf16ps peak of one core, GFLOP/s (0: no avx512_bf16).
  double l2_read_gbs_one = 0;     ///< in-cache bound: the tuned read of a 512 KiB buffer (in L2), one thread, GB/s.
};

/// The roofline roofline_main measured in this process (all zero when it was skipped): benchmarks that state a
/// bound besides their own in-run baseline (the decode's FMA bound) read it here.
inline roofline& measured_roofline() {
  static roofline r;
  return r;
}

namespace roofline_detail {

inline constexpr std::size_t stream_bytes = std::size_t{256} << 20;  // >> any L3 on the hosts we run on
inline constexpr std::size_t l2_bytes = std::size_t{512} << 10;      // in a 1 MiB L2 (or larger), out of L1
inline constexpr std::int64_t fma_steps = std::int64_t{1} << 20;     // ~2 ms a pass
inline constexpr int fma_chains = 12, bf16_chains = 16;

/// Seconds on the monotonic clock, or on the calling thread's CPU clock (one-thread compute loops: time the thread
/// waited for a core on this shared machine does not count).
inline double seconds(bool thread_clock = false) {
  timespec ts{};
  clock_gettime(thread_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// Keeps a loop's result alive without a memory round trip inside the loop.
template <class T>
void keep(T v) {
  benchmark::DoNotOptimize(v);
}

/// Sums `bytes` bytes (a multiple of 8) as 64-bit integers: integer adds, so no denormal or NaN slows it down.
using read_fn = std::uint64_t (*)(const unsigned char*, std::size_t);

inline std::uint64_t read_tail(const unsigned char* p, std::size_t i, std::size_t bytes, std::uint64_t s) {
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    s += w;
  }
  return s;
}

#if defined(__x86_64__) && defined(__GNUC__)
/// With each line prefetched into L1 2 KiB ahead: from L2 this reads ~240 GB/s on the Zen 5 here against ~125
/// without (the hardware prefetchers keep up with 256-bit loads but not with 512-bit ones); from memory the same.
/// (A prefetch past the end of the buffer is harmless: it never faults.)
__attribute__((target("avx512f"))) inline std::uint64_t read_avx512(const unsigned char* p, std::size_t bytes) {
  constexpr std::size_t ahead = 2048;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  std::size_t i = 0;
  for (; i + 512 <= bytes; i += 512) {
    for (std::size_t k = 0; k < 512; k += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p + i + ahead + k), _MM_HINT_T0);
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 192));
    a4 = _mm512_add_epi64(a4, _mm512_loadu_si512(p + i + 256));
    a5 = _mm512_add_epi64(a5, _mm512_loadu_si512(p + i + 320));
    a6 = _mm512_add_epi64(a6, _mm512_loadu_si512(p + i + 384));
    a7 = _mm512_add_epi64(a7, _mm512_loadu_si512(p + i + 448));
  }
  a0 = _mm512_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)),
                        _mm512_add_epi64(_mm512_add_epi64(a4, a5), _mm512_add_epi64(a6, a7)));
  alignas(64) std::uint64_t lanes[8];  // (no _mm512_reduce_*: GCC 12 warns inside it, bug 105593)
  _mm512_store_si512(lanes, a0);
  std::uint64_t s = 0;
  for (const auto l : lanes) s += l;
  return read_tail(p, i, bytes, s);
}

/// No software prefetch: on the Zen 5 here it slowed this read from L2 (~250 GB/s against ~200 with it).
__attribute__((target("avx2"))) inline std::uint64_t read_avx2(const unsigned char* p, std::size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  std::size_t i = 0;
  for (; i + 256 <= bytes; i += 256) {
    const auto* q = reinterpret_cast<const __m256i*>(p + i);
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(q));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(q + 1));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(q + 2));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(q + 3));
    a4 = _mm256_add_epi64(a4, _mm256_loadu_si256(q + 4));
    a5 = _mm256_add_epi64(a5, _mm256_loadu_si256(q + 5));
    a6 = _mm256_add_epi64(a6, _mm256_loadu_si256(q + 6));
    a7 = _mm256_add_epi64(a7, _mm256_loadu_si256(q + 7));
  }
  a0 = _mm256_add_epi64(_mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)),
                        _mm256_add_epi64(_mm256_add_epi64(a4, a5), _mm256_add_epi64(a6, a7)));
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a0);
  return read_tail(p, i, bytes, lanes[0] + lanes[1] + lanes[2] + lanes[3]);
}
#endif

inline std::uint64_t read_scalar(const unsigned char* p, std::size_t bytes) {
  std::uint64_t a[8] = {};
  std::size_t i = 0;
  for (; i + 64 <= bytes; i += 64)
    for (std::size_t k = 0; k < 8; ++k) {
      std::uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      a[k] += w;
    }
  std::uint64_t s = 0;
  for (const auto x : a) s += x;
  return read_tail(p, i, bytes, s);
}

/// The widest read this CPU runs, and its name.
inline std::pair<read_fn, const char*> pick_read() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {&read_avx512, "avx512"};
  if (__builtin_cpu_supports("avx2")) return {&read_avx2, "avx2"};
#endif
  return {&read_scalar, "scalar"};
}

/// One read of [p, p + bytes) on `threads` threads (the caller and threads - 1 std::threads), each reading its own
/// slice (cut at 512-byte boundaries); returns the seconds from the first thread's start to the last one's end. The
/// threads are created and lined up before the clock starts.
inline double read_pass(const unsigned char* p, std::size_t bytes, unsigned threads) {
  static const read_fn fn = pick_read().first;
  threads = std::max(1U, threads);
  struct alignas(64) slot {  // one cache line each: no false sharing between the threads' results
    double t0 = 0, t1 = 0;
    std::uint64_t sum = 0;
  };
  std::vector<slot> slots(threads);
  std::atomic<unsigned> ready{0};
  std::atomic<bool> go{false};
  const std::size_t lines = bytes / 512;
  auto body = [&](unsigned t) {
    const std::size_t b = lines * t / threads * 512, e = t + 1 == threads ? bytes : lines * (t + 1) / threads * 512;
    if (t != 0) {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    }
    slots[t].t0 = seconds();
    slots[t].sum = fn(p + b, e - b);
    slots[t].t1 = seconds();
  };
  std::vector<std::thread> team;
  for (unsigned t = 1; t < threads; ++t) team.emplace_back(body, t);
  while (ready.load() != threads - 1) std::this_thread::yield();
  go.store(true, std::memory_order_release);
  body(0);
  for (auto& th : team) th.join();
  double t0 = slots[0].t0, t1 = slots[0].t1;
  std::uint64_t sum = 0;
  for (const auto& s : slots) {
    t0 = std::min(t0, s.t0);
    t1 = std::max(t1, s.t1);
    sum += s.sum;
  }
  keep(sum);
  return t1 - t0;
}

/// `repeats` reads of the same small buffer on the calling thread (warmed first), seconds on its CPU clock.
inline double cached_read_pass(const unsigned char* p, std::size_t bytes, int repeats) {
  static const read_fn fn = pick_read().first;
  std::uint64_t sum = fn(p, bytes);
  const double t0 = seconds(true);
  for (int r = 0; r < repeats; ++r) {
    sum += fn(p, bytes);
    benchmark::ClobberMemory();  // each read really reads (were fn inlined, it could be hoisted out of the loop)
  }
  const double s = seconds(true) - t0;
  keep(sum);
  return s;
}

/// One std::memcpy of `bytes` bytes, seconds.
inline double memcpy_pass(unsigned char* dst, const unsigned char* src, std::size_t bytes) {
  const double t0 = seconds();
  std::memcpy(dst, src, bytes);
  const double s = seconds() - t0;
  keep(dst[bytes / 2]);
  return s;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) inline float fma512_loop(std::int64_t steps) {
  __m512 a[fma_chains];
  for (int i = 0; i < fma_chains; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3F);
  const __m512 x = _mm512_set1_ps(0.999F), y = _mm512_set1_ps(1e-4F);  // converges to 0.1: no denormals
  for (std::int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int i = 0; i < fma_chains; ++i) a[i] = _mm512_fmadd_ps(a[i], x, y);
  }
  for (int i = 1; i < fma_chains; ++i) a[0] = _mm512_add_ps(a[0], a[i]);
  alignas(64) float o[16];
  _mm512_store_ps(o, a[0]);
  return o[0] + o[15];
}

__attribute__((target("avx2,fma"))) inline float fma256_loop(std::int64_t steps) {
  __m256 a[fma_chains];  // 12 chains and 2 constants: within the 16 ymm registers AVX2 has
  for (int i = 0; i < fma_chains; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3F);
  const __m256 x = _mm256_set1_ps(0.999F), y = _mm256_set1_ps(1e-4F);
  for (std::int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int i = 0; i < fma_chains; ++i) a[i] = _mm256_fmadd_ps(a[i], x, y);
  }
  for (int i = 1; i < fma_chains; ++i) a[0] = _mm256_add_ps(a[0], a[i]);
  alignas(32) float o[8];
  _mm256_store_ps(o, a[0]);
  return o[0] + o[7];
}

__attribute__((target("avx512f,avx512bf16"))) inline float bf16dot_loop(std::int64_t steps) {
  __m512 a[bf16_chains];
  for (int i = 0; i < bf16_chains; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i));
  // Each step adds 32 x 2^-14 to a lane: after 2^20 steps ~2^11, far from overflow and never denormal.
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0x1p-7F), _mm512_set1_ps(0x1p-7F));
  for (std::int64_t s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int i = 0; i < bf16_chains; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, x);
  }
  for (int i = 1; i < bf16_chains; ++i) a[0] = _mm512_add_ps(a[0], a[i]);
  alignas(64) float o[16];
  _mm512_store_ps(o, a[0]);
  return o[0] + o[15];
}
#endif

/// Whether this CPU runs each peak loop.
inline bool has_fma512() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}
inline bool has_fma256() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}
inline bool has_bf16dot() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

/// One pass of a peak loop on the calling thread: {FLOPs, seconds on its CPU clock}; {0, 1} where the CPU lacks the
/// unit. kind: 512 (fp32 FMA, zmm), 256 (fp32 FMA, ymm) or 16 (bf16 dot, zmm).
inline std::pair<double, double> peak_pass(int kind, std::int64_t steps = fma_steps) {
  const auto n = static_cast<double>(steps);
#if defined(__x86_64__) && defined(__GNUC__)
  const double t0 = seconds(true);
  if (kind == 512 && has_fma512()) {
    keep(fma512_loop(steps));
    return {n * fma_chains * 16 * 2, seconds(true) - t0};
  }
  if (kind == 256 && has_fma256()) {
    keep(fma256_loop(steps));
    return {n * fma_chains * 8 * 2, seconds(true) - t0};
  }
  if (kind == 16 && has_bf16dot()) {
    keep(bf16dot_loop(steps));
    return {n * bf16_chains * 64, seconds(true) - t0};
  }
#else
  (void)kind;
  (void)n;
#endif
  return {0, 1};
}

/// The best rate (units per second / 1e9) of `passes` calls of pass(), which returns {units, seconds}.
template <class Pass>
double best_rate(int passes, Pass pass) {
  double best = 0;
  for (int i = 0; i < passes; ++i) {
    const auto [units, s] = pass();
    if (s > 0) best = std::max(best, units / s / 1e9);
  }
  return best;
}

/// "model name (family F model M)" from /proc/cpuinfo; "unknown" where there is none.
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name, family, model;
  while (std::getline(in, line) && !line.empty()) {  // the first processor's block
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto key_end = line.find_last_not_of(" \t", colon == 0 ? 0 : colon - 1);
    const std::string key = key_end == std::string::npos ? std::string{} : line.substr(0, key_end + 1);
    const auto b = line.find_first_not_of(" \t", colon + 1);
    const std::string value = b == std::string::npos ? std::string{} : line.substr(b);
    if (key == "model name") name = value;
    else if (key == "cpu family") family = value;
    else if (key == "model") model = value;
  }
  if (name.empty()) return "unknown";
  if (!family.empty()) name += " (family " + family + (model.empty() ? "" : " model " + model) + ")";
  return name;
}

inline unsigned hardware_threads() { return std::max(1U, std::thread::hardware_concurrency()); }

/// The two 256 MiB buffers of the streaming bounds (touched, on transparent huge pages), built once per use.
struct stream_buffers {
  pool_buffer<std::uint64_t> src, dst;
  stream_buffers() {
    src.assign(stream_bytes / 8, 0x0101010101010101ULL, true);
    dst.assign(stream_bytes / 8, 0, true);
  }
  [[nodiscard]] const unsigned char* in() { return reinterpret_cast<const unsigned char*>(src.data()); }
  [[nodiscard]] unsigned char* out() { return reinterpret_cast<unsigned char*>(dst.data()); }
};

}  // namespace roofline_detail

/// Measures the compute bounds alone into `r` (fma512, fma256 and bf16dot per core; ~0.05 s): what a benchmark that
/// states a compute bound needs when the whole roofline was skipped (KVPAGER_BENCH_NO_ROOFLINE).
inline void measure_peaks(roofline& r) {
  namespace d = roofline_detail;
  r.fma512_gflops_core = d::best_rate(7, [] { return d::peak_pass(512); });
  r.fma256_gflops_core = d::best_rate(7, [] { return d::peak_pass(256); });
  r.bf16dot_gflops_core = d::best_rate(7, [] { return d::peak_pass(16); });
}

/// Measures the host's roofline (~0.4 s, ~2 s where huge pages need compacting; allocates and frees two 256 MiB
/// buffers).
inline roofline measure_roofline() {
  namespace d = roofline_detail;
  roofline r;
  r.cpu_model = d::cpu_model();
  r.threads = static_cast<int>(d::hardware_threads());
  r.read_isa = d::pick_read().second;
  {
    d::stream_buffers buf;
    const auto bytes = static_cast<double>(d::stream_bytes);
    (void)d::read_pass(buf.in(), d::stream_bytes, d::hardware_threads());  // first pass: clocks up, TLB warm
    // More passes on all threads: on a shared machine a pass only counts when no other process held a core.
    r.read_gbs_all = d::best_rate(20, [&] {
      return std::pair{bytes, d::read_pass(buf.in(), d::stream_bytes, d::hardware_threads())};
    });
    r.read_gbs_one = d::best_rate(8, [&] { return std::pair{bytes, d::read_pass(buf.in(), d::stream_bytes, 1)}; });
    r.memcpy_gbs =
        d::best_rate(5, [&] { return std::pair{bytes, d::memcpy_pass(buf.out(), buf.in(), d::stream_bytes)}; });
  }
  {
    pool_buffer<std::uint64_t> small;
    small.assign(d::l2_bytes / 8, 1, false);
    const auto* p = reinterpret_cast<const unsigned char*>(small.data());
    constexpr int repeats = 64;  // 32 MiB a pass
    r.l2_read_gbs_one = d::best_rate(15, [&] {
      return std::pair{static_cast<double>(d::l2_bytes) * repeats, d::cached_read_pass(p, d::l2_bytes, repeats)};
    });
  }
  measure_peaks(r);
  return r;
}

/// One line, `kvpager-roofline: key=value ...` with units, then `|` and what the figures count.
inline std::string roofline_line(const roofline& r) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "kvpager-roofline: cpu=\"%s\" threads=%d read_all=%.1fGB/s read_one=%.1fGB/s l2_read_one=%.1fGB/s "
                "memcpy=%.1fGB/s fma512=%.1fGFLOP/s/core fma256=%.1fGFLOP/s/core bf16dot=%.1fGFLOP/s/core | reads: "
                "%s loads, 256 MiB (all threads, one each; or one), 512 KiB in L2 (one); memcpy: one std::memcpy of "
                "256 MiB on one thread, copied bytes/s; FMA: fp32, 2 FLOP per lane; bf16dot: vdpbf16ps, 64 FLOP "
                "each; 0 = no such unit; G = 1e9, best of 5-20 passes",
                r.cpu_model.c_str(), r.threads, r.read_gbs_all, r.read_gbs_one, r.l2_read_gbs_one, r.memcpy_gbs,
                r.fma512_gflops_core, r.fma256_gflops_core, r.bf16dot_gflops_core, r.read_isa.c_str());
  return buf;
}

/// Every figure as a (key, value) pair for benchmark::AddCustomContext: roofline_cpu, roofline_read_all_GBps, ...
inline std::vector<std::pair<std::string, std::string>> roofline_context(const roofline& r) {
  const auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f", v);
    return std::string(b);
  };
  return {{"roofline_cpu", r.cpu_model},
          {"roofline_threads", std::to_string(r.threads)},
          {"roofline_read_isa", r.read_isa},
          {"roofline_read_all_GBps", num(r.read_gbs_all)},
          {"roofline_read_one_GBps", num(r.read_gbs_one)},
          {"roofline_l2_read_one_GBps", num(r.l2_read_gbs_one)},
          {"roofline_memcpy_one_GBps", num(r.memcpy_gbs)},
          {"roofline_fma512_GFLOPps_core", num(r.fma512_gflops_core)},
          {"roofline_fma256_GFLOPps_core", num(r.fma256_gflops_core)},
          {"roofline_bf16dot_GFLOPps_core", num(r.bf16dot_gflops_core)}};
}

/// For benchmarks that copy (block moves, kv_append, and their memcpy baselines): sets the bytes processed to
/// `bytes` (all iterations) and adds `of_memcpy`, those bytes per second over this run's one-thread memcpy bound
/// (measured_roofline().memcpy_gbs). A rate counter, so it is divided by the same seconds as bytes_per_second (real
/// time under UseRealTime, CPU time otherwise), repetitions and aggregates included. No of_memcpy where the roofline
/// was skipped.
inline void set_copied_bytes(benchmark::State& state, std::int64_t bytes) {
  state.SetBytesProcessed(bytes);
  const double bound = measured_roofline().memcpy_gbs * 1e9;
  if (bound > 0)
    state.counters["of_memcpy"] = benchmark::Counter(static_cast<double>(bytes) / bound, benchmark::Counter::kIsRate);
}

/// A benchmark program's main: parses the flags, measures the roofline, prints its line to stderr and adds it to the
/// benchmark context, then runs the benchmarks. KVPAGER_BENCH_NO_ROOFLINE=1 (set to anything) skips the
/// measurement, for quick runs; so does --benchmark_list_tests.
inline int roofline_main(int argc, char** argv) {
  bool measure = std::getenv("KVPAGER_BENCH_NO_ROOFLINE") == nullptr;
  for (int i = 1; i < argc; ++i) {  // (before Initialize, which takes its flags out of argv)
    const std::string a = argv[i];
    if (a == "--benchmark_list_tests" || a == "--benchmark_list_tests=true" || a == "--benchmark_list_tests=1")
      measure = false;  // listing the benchmarks measures nothing
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (measure) {
    const roofline& r = measured_roofline() = measure_roofline();
    for (const auto& [k, v] : roofline_context(r)) benchmark::AddCustomContext(k, v);
    std::fprintf(stderr, "%s\n", roofline_line(r).c_str());
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace kvbench
