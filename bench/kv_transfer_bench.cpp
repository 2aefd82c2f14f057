// SPDX-License-Identifier: Apache-2.0
// KV transfer over UCX between two processes on this machine (issue 26): a request's KV of a Llama-3-8B-shaped
// model (32 layers, 8 KV heads, head dim 128, fp16, 16-token blocks: 64 KiB per block and layer), per-layer pools,
// the request's blocks shuffled on both sides (one run per block and layer), read by ucx_transport from a sender
// process (this binary started again) into this one; against memcpy of the same runs inside this process, and the
// per-transfer overhead (one 64-byte run: post, flush, completion). bench/kv_transfer_vs_perftest.sh runs it beside
// ucx_perftest on the same transports.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvpager/transfer/kv_runs.hpp"
#include "kvpager/transfer/ucx_transport.hpp"
#include "kvpager_testing/ucx_peer_process.hpp"

namespace {

using namespace kvpager;
using namespace std::chrono_literals;

constexpr std::int32_t layers = 32;
constexpr std::int32_t max_tokens = 2048;
constexpr std::int32_t block = 16;
constexpr std::int32_t blocks = max_tokens / block + 8;  // per layer pool

/// KVPAGER_KV_BENCH_ALL_TRANSPORTS=1: ucx_options::detect_peer_failure = false on both sides (shared memory and cma
/// allowed; the default is the transports that detect a dead peer).
ucx_options options() {
  ucx_options o;
  const char* all = std::getenv("KVPAGER_KV_BENCH_ALL_TRANSPORTS");
  o.detect_peer_failure = all == nullptr || std::string(all) != "1";
  return o;
}

kv_side side() {
  const kv_geometry g{blocks, block, 8, 128, kv_dtype::f16};
  return kv_side{*rank_layout(g, 32, 1, 0), layers, kv_pool_layout::per_layer};
}

// The sender process's role (KVPAGER_KV_BENCH_SENDER=<fd>): per-layer pools, described to the one peer that
// connects; waits until the peer goes away (at most 30 minutes).
struct sender_role {
  sender_role() {
    const char* env = std::getenv("KVPAGER_KV_BENCH_SENDER");
    if (env == nullptr) return;
    _exit(run(std::atoi(env)));
  }
  static int run(int fd) {
    result<ucx_transport> t = ucx_transport::create(options());
    if (!t.ok()) return 4;
    const result<peer_handle> p = testing::listen_report_accept(*t, fd, 60000ms);
    if (!p.ok()) return 7;
    // The pools: allocated by UCX (KVPAGER_KV_BENCH_UCX_POOLS=1: shared memory a reader on this machine maps), or
    // ordinary memory registered with UCX (what an engine that allocates its own pools does).
    const char* alloc = std::getenv("KVPAGER_KV_BENCH_UCX_POOLS");
    const bool by_ucx = alloc != nullptr && std::string(alloc) == "1";
    const auto bytes = static_cast<std::size_t>(side().region_bytes());
    std::vector<std::vector<std::uint8_t>> pools;
    std::vector<std::byte> desc;
    for (std::int32_t l = 0; l < layers; ++l) {
      result<mem_handle> m = status{errc::unsupported, ""};
      if (by_ucx) {
        const auto a = t->allocate_memory(bytes);
        if (a.ok()) m = a->first;
      } else {
        pools.emplace_back(bytes, 1);
        m = t->register_memory(pools.back().data(), bytes);
      }
      if (!m.ok() || !t->describe(*m, desc).ok() || !t->send(*p, desc).ok()) return 8;
    }
    std::vector<std::byte> got;
    const auto until = std::chrono::steady_clock::now() + 1800s;
    while (std::chrono::steady_clock::now() < until) {
      const result<bool> r = t->receive(*p, got);
      if (!r.ok() || *r) break;
      std::this_thread::yield();
    }
    return 0;
  }
};
const sender_role the_sender_role;

struct receiver {
  testing::peer_process sender{"KVPAGER_KV_BENCH_SENDER", ""};
  std::vector<std::vector<std::uint8_t>> pools;
  std::vector<std::vector<std::uint8_t>> local_src;  // memcpy baseline's source, same layout
  result<ucx_transport> t = status{errc::unsupported, "not started"};
  peer_handle peer = -1;
  std::vector<remote_handle> remotes;
  std::vector<mem_handle> mine;
  std::vector<block_id> src_table, dst_table;
  std::string error;

  receiver() {
    if (sender.port == 0) {
      error = "the sender process did not start";
      return;
    }
    t = ucx_transport::create(options());
    if (!t.ok()) {
      error = t.error().message();
      return;
    }
    const result<peer_handle> p = t->connect("127.0.0.1", sender.port);
    if (!p.ok()) {
      error = p.error().message();
      return;
    }
    peer = *p;
    std::vector<std::byte> desc;
    for (std::int32_t l = 0; l < layers; ++l) {
      const auto until = std::chrono::steady_clock::now() + 30s;
      bool got = false;
      while (!got && std::chrono::steady_clock::now() < until) {
        const result<bool> r = t->receive(peer, desc);
        if (!r.ok()) break;
        got = *r;
      }
      const result<remote_handle> rh = got ? t->import_remote(peer, desc) : result<remote_handle>(status{errc::timed_out, "no description"});
      if (!rh.ok()) {
        error = rh.error().message();
        return;
      }
      remotes.push_back(*rh);
    }
    const auto bytes = static_cast<std::size_t>(side().region_bytes());
    pools.assign(layers, std::vector<std::uint8_t>(bytes, 0));
    local_src.assign(layers, std::vector<std::uint8_t>(bytes, 2));
    for (auto& pool : pools) mine.push_back(*t->register_memory(pool.data(), pool.size()));
    std::mt19937_64 rng(1);
    src_table.resize(blocks);
    std::iota(src_table.begin(), src_table.end(), 0);
    dst_table = src_table;
    std::shuffle(src_table.begin(), src_table.end(), rng);
    std::shuffle(dst_table.begin(), dst_table.end(), rng);
  }
  ~receiver() {
    if (t.ok() && peer >= 0) {
      const std::byte bye[1] = {std::byte{1}};
      (void)t->send(peer, bye);
    }
    (void)sender.reap(std::chrono::milliseconds(5000));
  }
  std::vector<kv_run> runs(std::int64_t tokens) const {
    std::vector<kv_run> out;
    (void)plan_kv_runs(side(), src_table, side(), dst_table, tokens, out);
    return out;
  }
};

receiver& the_receiver() {
  static receiver r;
  return r;
}

void bm_ucx_read(benchmark::State& state) {
  receiver& r = the_receiver();
  if (!r.error.empty()) {
    state.SkipWithError(r.error.c_str());
    return;
  }
  const std::vector<kv_run> runs = r.runs(state.range(0));
  for (auto _ : state) {
    const result<transfer_handle> x = r.t->read(r.peer, runs, r.remotes, r.mine);
    if (!x.ok()) {
      state.SkipWithError(x.error().message());
      return;
    }
    result<transfer_state> s = r.t->poll(*x);
    while (s.ok() && *s == transfer_state::in_flight) s = r.t->poll(*x);
    if (!s.ok() || *s != transfer_state::done) {
      state.SkipWithError("the read failed");
      return;
    }
  }
  state.SetBytesProcessed(state.iterations() * run_bytes(runs));
  state.counters["runs"] = static_cast<double>(runs.size());
}
BENCHMARK(bm_ucx_read)->Arg(128)->Arg(2048)->UseRealTime()->Unit(benchmark::kMicrosecond);

void bm_memcpy_runs(benchmark::State& state) {
  receiver& r = the_receiver();
  const std::vector<kv_run> runs = r.runs(state.range(0));
  for (auto _ : state) {
    for (const kv_run& run : runs)
      std::memcpy(r.pools[static_cast<std::size_t>(run.dst_region)].data() + run.dst_offset,
                  r.local_src[static_cast<std::size_t>(run.src_region)].data() + run.src_offset,
                  static_cast<std::size_t>(run.bytes));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * run_bytes(runs));
}
BENCHMARK(bm_memcpy_runs)->Arg(128)->Arg(2048)->UseRealTime()->Unit(benchmark::kMicrosecond);

// One 64-byte run: what a transfer costs beyond its bytes (plan excluded; registration done once, before).
void bm_ucx_overhead(benchmark::State& state) {
  receiver& r = the_receiver();
  if (!r.error.empty()) {
    state.SkipWithError(r.error.c_str());
    return;
  }
  const kv_run one[1] = {kv_run{0, 0, 0, 0, 64}};
  for (auto _ : state) {
    const result<transfer_handle> x = r.t->read(r.peer, one, r.remotes, r.mine);
    result<transfer_state> s = r.t->poll(*x);
    while (s.ok() && *s == transfer_state::in_flight) s = r.t->poll(*x);
  }
}
BENCHMARK(bm_ucx_overhead)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Planning a 2k-token request's runs (shuffled blocks: 4096 runs).
void bm_plan_runs(benchmark::State& state) {
  receiver& r = the_receiver();
  std::vector<kv_run> out;
  for (auto _ : state) {
    out.clear();
    benchmark::DoNotOptimize(plan_kv_runs(side(), r.src_table, side(), r.dst_table, state.range(0), out));
  }
  state.counters["runs"] = static_cast<double>(out.size());
}
BENCHMARK(bm_plan_runs)->Arg(128)->Arg(2048)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
