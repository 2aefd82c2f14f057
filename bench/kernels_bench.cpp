// SPDX-License-Identifier: Apache-2.0
// CPU decode attention as KV bytes read per second, against a tuned streaming read of the same bytes in the same run
// (see bench/RESULTS.md): AVX-512 loads (AVX2 or scalar where the CPU lacks it, chosen at run time) into eight
// independent accumulators, on all cores through a team of threads kept across iterations (woken like the kernels'
// worker pool, so both pay the same wake-up cost). memcpy of the same bytes on all cores is reported beside it.
// Every decode benchmark reports `x_read`: its bandwidth over the tuned read's of the same pool on as many threads
// (all cores, or the calling thread for a one-thread call), the two measured in alternating rounds of the same run
// (BM_Decode); and `x_bound`: over the lower of that read and the FMA bound (the roofline's fp32 FMA peak). Pools under 128 MiB are repeated as layers that successive calls
// walk (no call finds its KV in the cache). The pools are 2 MiB aligned and advised to transparent huge pages, as an
// engine should allocate its KV pool (KVPAGER_BENCH_SMALL_PAGES=1 keeps them on 4 KiB pages, to compare).
// Shapes: batch 8, 32 query heads over 8 KV heads (GQA 4) or 32 (MHA), head_dim 128, block 16, fp16 and bf16 KV.
#include <kvpager/c/kernels.h>
#include <kvpager/kvpager.hpp>

#include <benchmark/benchmark.h>

#include "pool_buffer.hpp"
#include "roofline.hpp"

#if defined(__x86_64__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <chrono>
#include <ctime>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

namespace {

constexpr std::int32_t batch = 8, hq = 32, dim = 128, bs = 16;

// ------------------------------------------------------------------------------------------- the tuned read
/// Sums `bytes` bytes (a multiple of 8) as 64-bit integers, with the widest loads the CPU has: the roofline's
/// streaming read (bench/roofline.hpp), so x_read below and the kvpager-roofline line measure the same read.
using kvbench::roofline_detail::pick_read;
using kvbench::roofline_detail::read_fn;

/// All cores: the caller and (cores - 1) threads that live as long as the team, woken per job through a condition
/// variable (as the kernels' worker pool is).
class team {
 public:
  team() {
    const unsigned n = std::max(1U, std::thread::hardware_concurrency());
    for (unsigned t = 1; t < n; ++t) threads_.emplace_back([this, t] { loop(t); });
  }
  team(const team&) = delete;
  team& operator=(const team&) = delete;
  ~team() {
    {
      const std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  [[nodiscard]] unsigned size() const { return static_cast<unsigned>(threads_.size()) + 1; }
  /// Runs fn(t) for t in [0, size()) on the team; returns when all are done.
  void run(const std::function<void(unsigned)>& fn) {
    {
      const std::lock_guard<std::mutex> lk(m_);
      job_ = &fn;
      finished_ = 0;
      ++generation_;
    }
    cv_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lk(m_);
    done_.wait(lk, [&] { return finished_ == threads_.size(); });
  }

 private:
  void loop(unsigned t) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(unsigned)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      (*job)(t);
      {
        const std::lock_guard<std::mutex> lk(m_);
        ++finished_;
      }
      done_.notify_one();
    }
  }
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable cv_, done_;
  const std::function<void(unsigned)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  std::size_t finished_ = 0;
  bool stop_ = false;
};

team& the_team() {
  static team t;
  return t;
}

/// Thread t's part of [0, bytes): equal shares cut at 512-byte boundaries.
std::pair<std::size_t, std::size_t> share(std::size_t bytes, unsigned t, unsigned n) {
  const std::size_t lines = bytes / 512;
  const std::size_t b = lines * t / n * 512, e = t + 1 == n ? bytes : lines * (t + 1) / n * 512;
  return {b, e};
}

/// One tuned read of `bytes` bytes at `p` on all cores, or on the calling thread alone (`one_thread`).
std::uint64_t tuned_read(const unsigned char* p, std::size_t bytes, bool one_thread = false) {
  static const read_fn fn = pick_read().first;
  if (one_thread) return fn(p, bytes);
  team& tm = the_team();
  std::vector<std::uint64_t> sums(tm.size() * 8, 0);  // 64 bytes apart: no false sharing
  tm.run([&](unsigned t) {
    const auto [b, e] = share(bytes, t, tm.size());
    sums[t * 8] = fn(p + b, e - b);
  });
  return std::accumulate(sums.begin(), sums.end(), std::uint64_t{0});
}

// ------------------------------------------------------------------------------------------- the decode problem
/// Pools smaller than this are repeated as `layers` copies that the calls walk in turn, as an engine's decode step
/// walks its layers: a layer's KV is then not in the cache when its call starts (the L3 here is 32 MiB), for the
/// decode and the tuned read alike.
constexpr std::int64_t min_total_bytes = std::int64_t{128} << 20;

struct setup {
  std::int32_t context, hkv, dtype, layers = 1;
  std::int32_t max_blocks, num_blocks;
  kvbench::pool_buffer<std::uint16_t> kv;
  std::vector<std::uint16_t> q, out;
  std::vector<std::int32_t> table, lens;
  std::int32_t next = 0;  // the layer the next call reads
  /// hot: one layer however small (the compute-only benchmarks, whose pool stays in L2).
  setup(std::int32_t ctx, std::int32_t kv_heads, std::int32_t dt, bool hot) : context(ctx), hkv(kv_heads), dtype(dt) {
    max_blocks = (ctx + bs - 1) / bs;
    num_blocks = batch * max_blocks;
    layers = hot ? 1 : static_cast<std::int32_t>(std::max<std::int64_t>(1, (min_total_bytes + pool_bytes() - 1) / pool_bytes()));
    const std::uint16_t one = dt == KVPAGER_DTYPE_FP16 ? 0x3C00 : 0x3F80;
    kv.assign(static_cast<std::size_t>(pool_bytes() / 2) * static_cast<std::size_t>(layers), one,
              std::getenv("KVPAGER_BENCH_SMALL_PAGES") == nullptr);
    // Varied K values, so the scores and exponentials are not all equal.
    std::mt19937 rng(7);
    for (std::size_t i = 0; i < kv.size(); i += 61) kv[i] = static_cast<std::uint16_t>(one - (rng() & 0xFF));
    q.assign(static_cast<std::size_t>(batch) * hq * dim, one);
    out.resize(q.size());
    table.resize(static_cast<std::size_t>(batch) * static_cast<std::size_t>(max_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(1));
    lens.assign(batch, ctx);
  }
  /// Bytes of one layer's pool (every block is used).
  [[nodiscard]] std::int64_t pool_bytes() const { return std::int64_t{num_blocks} * 2 * hkv * bs * dim * 2; }
  /// KV bytes one decode call reads.
  [[nodiscard]] std::int64_t kv_bytes() const { return std::int64_t{batch} * context * 2 * hkv * dim * 2; }
  /// The pool of the next layer (round robin).
  const unsigned char* next_layer() {
    const auto* p = reinterpret_cast<const unsigned char*>(kv.data()) + pool_bytes() * next;
    next = (next + 1) % layers;
    return p;
  }
};

/// The pool of the shape asked for: the last one built is kept (a benchmark's repetitions, and the tuned read of the
/// same shape, reuse it: building a 512 MiB pool costs more than measuring it), any other is freed first, so the
/// process holds one pool at a time (all of them at once came to 2.5 GiB, and the read of the pools built last then
/// ran at 50-55 GB/s against 33-36 for the same pool alone).
setup& pool(std::int32_t ctx, std::int32_t kv_heads, std::int32_t dt, bool hot = false) {
  static std::tuple<std::int32_t, std::int32_t, std::int32_t, bool> key{};
  static std::unique_ptr<setup> p;
  const std::tuple<std::int32_t, std::int32_t, std::int32_t, bool> want{ctx, kv_heads, dt, hot};
  if (!p || key != want) {
    p.reset();
    p = std::make_unique<setup>(ctx, kv_heads, dt, hot);
    key = want;
  }
  return *p;
}

/// CPU time of the whole process (all threads), seconds: time the threads ran, stalls on memory included, but not
/// time spent waiting for a core. On a machine shared with other work, bytes per CPU-second of the decode against
/// those of the read (both on all cores) is the ratio the two would have alone, as long as both keep their threads
/// busy; the wall-clock ratio is reported beside it.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::int32_t decode(setup& s, std::int32_t threads) {
  return kvpager_cpu_paged_attention_decode(s.out.data(), s.q.data(), s.next_layer(), s.table.data(), s.lens.data(),
                                            batch, hq, s.hkv, dim, bs, s.max_blocks, s.num_blocks, 0.088F, s.dtype,
                                            threads);
}

/// Args: context, KV heads, dtype, threads (0 = all cores). Each iteration is a round: the tuned read of R layers'
/// KV bytes, then R decode calls over the next R layers back to back, as an engine's step calls the decode layer
/// after layer (R: at least 4, and at least 256 MiB of KV), each side timed on its own. The ratio x_read compares the
/// two over the same seconds of the run, so a change in what the rest of a shared machine takes from the memory
/// system (the read alone measured 26 to 61 GB/s in runs minutes apart here) moves both sides alike. The reported
/// time is the decode's alone per round (manual time); us_per_call is per call. busy_read and busy_decode: process
/// CPU time over wall time per thread while each side ran (1: every thread busy throughout).
void BM_Decode(benchmark::State& state) {
  setup& s = pool(static_cast<std::int32_t>(state.range(0)), static_cast<std::int32_t>(state.range(1)),
                  static_cast<std::int32_t>(state.range(2)));
  const auto threads = static_cast<std::int32_t>(state.range(3));
  const auto n = static_cast<std::size_t>(s.kv_bytes());
  const std::int64_t rounds = std::max<std::int64_t>(4, ((std::int64_t{256} << 20) + s.kv_bytes() - 1) / s.kv_bytes());
  // The decode's threads: the calls' own choice (one for calls under 8192 (token, query head) pairs, see decode.cpp).
  // The read it is measured against runs on as many.
  const bool one_thread = threads == 1 || (threads == 0 && std::int64_t{batch} * s.context * hq < 8192);
  benchmark::DoNotOptimize(tuned_read(s.next_layer(), n));  // warm-up: the team's threads, the pages
  if (decode(s, threads) != 0) state.SkipWithError("kernel failed");
  using clock = std::chrono::steady_clock;
  double read_wall = 0, read_cpu = 0, dec_wall = 0, dec_cpu = 0;
  for (auto _ : state) {
    const auto r0 = clock::now();
    const double rc0 = process_cpu_seconds();
    for (std::int64_t r = 0; r < rounds; ++r) benchmark::DoNotOptimize(tuned_read(s.next_layer(), n, one_thread));
    const double rc1 = process_cpu_seconds();
    const auto d0 = clock::now();
    for (std::int64_t r = 0; r < rounds; ++r)
      if (decode(s, threads) != 0) state.SkipWithError("kernel failed");
    benchmark::DoNotOptimize(s.out.data());
    const double dc1 = process_cpu_seconds();
    const auto d1 = clock::now();
    const double dt = std::chrono::duration<double>(d1 - d0).count();
    read_wall += std::chrono::duration<double>(d0 - r0).count();
    read_cpu += rc1 - rc0;
    dec_wall += dt;
    dec_cpu += dc1 - rc1;
    state.SetIterationTime(dt);
  }
  const double used = one_thread ? 1.0 : static_cast<double>(the_team().size());
  const double bytes = static_cast<double>(state.iterations()) * static_cast<double>(rounds) * static_cast<double>(n);
  state.SetBytesProcessed(state.iterations() * rounds * s.kv_bytes());
  state.counters["calls_per_round"] = static_cast<double>(rounds);
  state.counters["us_per_call"] = dec_wall / (static_cast<double>(state.iterations()) * static_cast<double>(rounds)) * 1e6;
  state.counters["read_GBps"] = bytes / read_wall / 1e9;
  state.counters["x_read"] = read_wall / dec_wall;
  state.counters["x_read_cpu"] = read_cpu / dec_cpu;
  state.counters["busy_read"] = read_cpu / used / read_wall;
  // The FMA bound: the decode's fp32 FMAs (QK^T and PV: 4 x group x head_dim FLOPs per token and KV head, which is
  // 2 x head_dim elements of KV) at the roofline's 512-bit FMA peak on the threads used, as KV bytes per second. At
  // GQA 8 with 2-byte KV one core's FMAs (about 31 GB/s of KV here) cannot keep up with its read (about 40): that
  // call is compute-bound, and x_bound says how near it is to whichever bound is lower.
  const double fma = kvbench::measured_roofline().fma512_gflops_core;
  if (fma > 0) {
    const double group = static_cast<double>(hq) / s.hkv, esz = s.dtype == KVPAGER_DTYPE_FP32 ? 4.0 : 2.0;
    const double fma_gbs = fma * used * esz / (2.0 * group), read_gbs = bytes / read_wall / 1e9;
    state.counters["fma_bound_GBps"] = fma_gbs;
    state.counters["x_bound"] = bytes / dec_wall / 1e9 / std::min(fma_gbs, read_gbs);
    state.SetLabel(fma_gbs < read_gbs ? "bound=fma" : "bound=read");
  }
  state.counters["busy_decode"] = dec_cpu / used / dec_wall;
}
constexpr std::int64_t fp16 = KVPAGER_DTYPE_FP16, bf16 = KVPAGER_DTYPE_BF16;
BENCHMARK(BM_Decode)->Name("decode_b8_d128/ctx/kv_heads/dtype/threads")
    ->Args({1024, 8, fp16, 0})->Args({4096, 8, fp16, 0})->Args({16384, 8, fp16, 0})
    ->Args({4096, 8, bf16, 0})->Args({16384, 8, bf16, 0})
    ->Args({1024, 32, fp16, 0})->Args({4096, 32, fp16, 0})->Args({4096, 32, bf16, 0})
    ->Args({4096, 8, fp16, 1})->Args({4096, 32, fp16, 1})
    ->Args({4096, 8, bf16, 1})->Args({16384, 8, fp16, 1})
    ->Args({4096, 4, fp16, 0})->Args({4096, 4, fp16, 1})->Args({4096, 4, bf16, 1})  // GQA 8
    ->UseManualTime();
/// Short calls (batch 8 x 128 tokens, and x 16 where the fixed cost shows): all cores, and one thread.
BENCHMARK(BM_Decode)->Name("decode_b8_d128_short/ctx/kv_heads/dtype/threads")
    ->Args({128, 8, fp16, 0})->Args({128, 8, bf16, 0})->Args({128, 32, fp16, 0})
    ->Args({16, 8, fp16, 0})->Args({16, 8, fp16, 1})->Args({128, 8, fp16, 1})->Args({128, 8, bf16, 1})
    ->Args({128, 32, fp16, 1})->Args({128, 32, bf16, 1})
    ->UseManualTime();

/// Compute alone: one thread over a pool that stays in L3 (batch 8 x 64 tokens, 2 MiB at GQA 4), CPU time per call;
/// what the kernel costs when memory is not the limit. Args: KV heads, dtype.
void BM_DecodeHot(benchmark::State& state) {
  setup& s = pool(64, static_cast<std::int32_t>(state.range(0)), static_cast<std::int32_t>(state.range(1)), true);
  for (auto _ : state) {
    if (decode(s, 1) != 0) state.SkipWithError("kernel failed");
    benchmark::DoNotOptimize(s.out.data());
  }
  state.SetBytesProcessed(state.iterations() * s.kv_bytes());
  state.counters["ns_per_token_kv_head"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * batch * 64 * s.hkv * 1e-9, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_DecodeHot)->Name("decode_b8_d128_hot_one_thread/kv_heads/dtype")
    ->Args({8, fp16})->Args({8, bf16})->Args({32, fp16})->Args({32, bf16})->Args({4, fp16});

/// The baselines themselves on the GQA-4 fp16 pools: the tuned read, and memcpy of the same bytes (each thread its
/// share, into a destination of the same size; bytes copied per second). Both walk the layers as the decode does.
void BM_TunedRead(benchmark::State& state) {
  setup& s = pool(static_cast<std::int32_t>(state.range(0)), 8, fp16);
  const auto n = static_cast<std::size_t>(s.kv_bytes());
  for (auto _ : state) benchmark::DoNotOptimize(tuned_read(s.next_layer(), n));
  state.SetBytesProcessed(state.iterations() * s.kv_bytes());
  state.SetLabel(pick_read().second);
}
BENCHMARK(BM_TunedRead)->Name("baseline/tuned_read")->Arg(128)->Arg(1024)->Arg(4096)->Arg(16384)->UseRealTime();

void BM_Memcpy(benchmark::State& state) {
  setup& s = pool(static_cast<std::int32_t>(state.range(0)), 8, fp16);
  const auto n = static_cast<std::size_t>(s.kv_bytes());
  std::vector<unsigned char> dst(n, 1);
  team& tm = the_team();
  for (auto _ : state) {
    const unsigned char* src = s.next_layer();
    tm.run([&](unsigned t) {
      const auto [b, e] = share(n, t, tm.size());
      std::memcpy(dst.data() + b, src + b, e - b);
    });
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(state.iterations() * s.kv_bytes());
}
BENCHMARK(BM_Memcpy)->Name("baseline/memcpy")->Arg(128)->Arg(4096)->Arg(16384)->UseRealTime();

/// kv_append (issue 22: the C function now forwards to kv_append_cpu, which writes through paged_kv_view::offset):
/// one step's K and V, 256 tokens x 8 KV heads x 128 dims in fp16 (1 MiB), into a 4096-block pool (256 MiB) through a
/// shuffled slot mapping, against the baseline of copying the same rows with memcpy to the same addresses. Both
/// state of_memcpy: bytes written per second over the one-thread memcpy bound of this run's roofline (a copy of
/// 256 MiB, from memory to memory). `sets` slot mappings of disjoint slots are used in turn, one per iteration: with
/// one (kv_append_256x8x128_fp16, the rows of issue 22) every iteration rewrites the same 1 MiB of the pool, which
/// stays in the caches, so it may run above that bound; with 64 (kv_append_256x8x128_fp16_cold) the iterations write
/// 64 MiB of rows, twice the L3 here, so each finds its destination out of the caches, as a step's append into a
/// real pool does, and the memcpy bound applies.
struct append_setup {
  static constexpr std::int32_t tokens = 256, heads = 8, dim = 128, bs = 16, blocks = 4096;
  std::int64_t sets;
  std::vector<std::uint16_t> pool, k, v;
  std::vector<std::int64_t> slots;  ///< sets x tokens
  explicit append_setup(std::int64_t n)
      : sets(n), pool(std::size_t{blocks} * 2 * heads * bs * dim), k(std::size_t{tokens} * heads * dim, 1),
        v(k.size(), 2) {
    std::vector<std::int64_t> all(std::size_t{blocks} * bs);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), std::mt19937(3));
    slots.assign(all.begin(), all.begin() + tokens * n);
  }
  /// The slot mapping of iteration i.
  [[nodiscard]] const std::int64_t* slots_of(std::int64_t i) const { return slots.data() + i % sets * tokens; }
  [[nodiscard]] std::int64_t bytes() const { return std::int64_t{2} * tokens * heads * dim * 2; }
};

void BM_KvAppend(benchmark::State& state, std::int64_t sets) {
  append_setup s(sets);
  std::int64_t i = 0;
  for (auto _ : state) {
    const auto rc = kvpager_cpu_kv_append(s.pool.data(), s.k.data(), s.v.data(), s.slots_of(i++), s.tokens, s.heads,
                                          s.dim, s.bs, s.blocks, KVPAGER_DTYPE_FP16);
    benchmark::DoNotOptimize(rc);
    benchmark::ClobberMemory();
  }
  kvbench::set_copied_bytes(state, state.iterations() * s.bytes());
}
BENCHMARK_CAPTURE(BM_KvAppend, hot, 1)->Name("kv_append_256x8x128_fp16/kvpager");
BENCHMARK_CAPTURE(BM_KvAppend, cold, 64)->Name("kv_append_256x8x128_fp16_cold/kvpager");

void BM_KvAppendMemcpy(benchmark::State& state, std::int64_t sets) {
  append_setup s(sets);
  const std::size_t row = append_setup::dim, head = std::size_t{append_setup::bs} * row;
  const std::size_t half = std::size_t{append_setup::heads} * head;
  std::int64_t i = 0;
  for (auto _ : state) {
    const std::int64_t* slots = s.slots_of(i++);
    for (std::size_t t = 0; t < append_setup::tokens; ++t) {
      const auto b = static_cast<std::size_t>(slots[t]) / append_setup::bs;
      const auto off = static_cast<std::size_t>(slots[t]) % append_setup::bs;
      for (std::size_t h = 0; h < append_setup::heads; ++h) {
        const std::size_t src = (t * append_setup::heads + h) * row, dst = b * 2 * half + h * head + off * row;
        std::memcpy(s.pool.data() + dst, s.k.data() + src, row * 2);
        std::memcpy(s.pool.data() + dst + half, s.v.data() + src, row * 2);
      }
    }
    benchmark::ClobberMemory();
  }
  kvbench::set_copied_bytes(state, state.iterations() * s.bytes());
}
BENCHMARK_CAPTURE(BM_KvAppendMemcpy, hot, 1)->Name("kv_append_256x8x128_fp16/baseline_memcpy");
BENCHMARK_CAPTURE(BM_KvAppendMemcpy, cold, 64)->Name("kv_append_256x8x128_fp16_cold/baseline_memcpy");

}  // namespace

// The host's roofline (bench/roofline.hpp) is measured first: its `kvpager-roofline:` line goes to stderr and its
// figures into the benchmark context (`roofline_*`), so every run carries the bounds it is a fraction of.
int main(int argc, char** argv) { return kvbench::roofline_main(argc, argv); }
