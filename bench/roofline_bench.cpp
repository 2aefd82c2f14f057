// SPDX-License-Identifier: Apache-2.0
// The host's roofline (issue 27, point 1; bench/roofline.hpp says how each bound is measured): prints the
// `kvpager-roofline:` line to stderr, then runs each bound as a benchmark of its own, one pass per iteration timed
// manually, so that --benchmark_format=json carries them as counters:
//   GBps / GFLOPps = the best pass (what the line reports), bytes_per_second / items_per_second (FLOP/s) = the mean.
// Run: build/default/bench/bench_roofline (see bench/RESULTS.md).
#include "roofline.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace {

namespace d = kvbench::roofline_detail;

d::stream_buffers& buffers() {
  static d::stream_buffers b;
  return b;
}

/// A memory bound: pass() returns the seconds of one pass over `bytes` bytes.
template <class Pass>
void run_bytes(benchmark::State& state, double bytes, Pass pass) {
  double best = 0;
  for (auto _ : state) {
    const double s = pass();
    state.SetIterationTime(s);
    best = std::max(best, bytes / s / 1e9);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(static_cast<double>(state.iterations()) * bytes));
  state.counters["GBps"] = best;
}

void BM_ReadAll(benchmark::State& state) {
  auto& b = buffers();
  state.SetLabel(std::string(d::pick_read().second) + " loads, " + std::to_string(d::hardware_threads()) + " threads");
  run_bytes(state, static_cast<double>(d::stream_bytes),
            [&] { return d::read_pass(b.in(), d::stream_bytes, d::hardware_threads()); });
}
BENCHMARK(BM_ReadAll)->Name("roofline/read_256MiB/all_threads")->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_ReadOne(benchmark::State& state) {
  auto& b = buffers();
  state.SetLabel(std::string(d::pick_read().second) + " loads");
  run_bytes(state, static_cast<double>(d::stream_bytes), [&] { return d::read_pass(b.in(), d::stream_bytes, 1); });
}
BENCHMARK(BM_ReadOne)->Name("roofline/read_256MiB/one_thread")->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_ReadL2(benchmark::State& state) {
  kvbench::pool_buffer<std::uint64_t> small;
  small.assign(d::l2_bytes / 8, 1, false);
  const auto* p = reinterpret_cast<const unsigned char*>(small.data());
  constexpr int repeats = 64;
  state.SetLabel(std::string(d::pick_read().second) + " loads, 64 reads of the buffer per iteration");
  run_bytes(state, static_cast<double>(d::l2_bytes) * repeats,
            [&] { return d::cached_read_pass(p, d::l2_bytes, repeats); });
}
BENCHMARK(BM_ReadL2)->Name("roofline/read_512KiB_in_L2/one_thread")->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_Memcpy(benchmark::State& state) {
  auto& b = buffers();
  state.SetLabel("one std::memcpy, copied bytes");
  run_bytes(state, static_cast<double>(d::stream_bytes),
            [&] { return d::memcpy_pass(b.out(), b.in(), d::stream_bytes); });
}
BENCHMARK(BM_Memcpy)->Name("roofline/memcpy_256MiB/one_thread")->UseManualTime()->Unit(benchmark::kMillisecond);

/// A compute bound: kind as in roofline_detail::peak_pass. A unit the CPU lacks reports 0.
void run_peak(benchmark::State& state, int kind, bool have) {
  double best = 0, flops = 0;
  for (auto _ : state) {
    const auto [f, s] = d::peak_pass(kind);
    state.SetIterationTime(s);
    flops += f;
    best = std::max(best, f / s / 1e9);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(flops));
  state.counters["GFLOPps"] = best;
  state.SetLabel(have ? (kind == 16 ? "vdpbf16ps, 64 FLOP each, CPU clock" : "fp32 FMA, CPU clock")
                      : "not on this CPU: 0");
}
void BM_Fma512(benchmark::State& state) { run_peak(state, 512, d::has_fma512()); }
void BM_Fma256(benchmark::State& state) { run_peak(state, 256, d::has_fma256()); }
void BM_Bf16Dot(benchmark::State& state) { run_peak(state, 16, d::has_bf16dot()); }
BENCHMARK(BM_Fma512)->Name("roofline/fma512/one_core")->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Fma256)->Name("roofline/fma256/one_core")->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Bf16Dot)->Name("roofline/bf16dot/one_core")->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) { return kvbench::roofline_main(argc, argv); }
