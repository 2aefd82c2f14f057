// SPDX-License-Identifier: Apache-2.0
// kvpager-sim: a serving simulator that shows what paged KV management buys. It runs a workload through
// kvpager::scheduler over a paged_kv_cache composition (measured with the library's monitor) and the same workload
// over contiguous allocation (each request reserves max_model_len tokens, first fit), and prints both side by side.
// With --compute cpu it also runs one attention layer on the CPU kernels every step and checks every output against
// attention computed without a cache. docs/sim.md describes the workload, the measures and the options.
//
//   kvpager-sim [TRACE.kvtrace] [--composition NAME] [--blocks N] [--block-size B] [--max-model-len L]
//               [--host-blocks N] [--preemption MODE] [--admission RULE] [--tuning on|off] [--requests N]
//               [--rate R] [--seed S] [--max-steps N] [--compute none|cpu] [--dtype fp32|bf16] [--json]
//               [--report DIR] [--quiet] [--layers SPEC]
//               [--disaggregated [--kv-transport inproc|ucx] [--disagg-layers N] [--prefill-token-budget N]]
//
// Exit status: 0 on success; 2 on bad input (an option outside its range, which the message states; an unknown
// composition, which lists the choices; an unreadable or unusable trace, named with its line) and when --compute cpu
// finds an output that differs from the reference (or a kernel refuses a call), or --disaggregated finds received KV
// that differs from what the prefill instance computed, a request that did not end or a pool not empty at the end; 1
// when the run itself cannot be made (the cache cannot be created, the report cannot be written, out of memory, a
// transport that cannot be set up).
//
// CLI11 reports command-line errors by exception; this tool is therefore built with exceptions even in the
// -fno-exceptions preset (the library headers it uses never throw).
// GCC 12 at -O3 reports a false -Wrestrict inside CLI11's string concatenations once they are inlined (GCC bug
// 105329); the pragma covers CLI11's own lines only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
#include <CLI/CLI.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#include <nlohmann/json.hpp>

#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <kvpager/allocator/free_list_allocator.hpp>
#include <kvpager/cache/compositions.hpp>
#include <kvpager/cache/paged_kv_cache.hpp>
#include <kvpager/eviction/lru_eviction.hpp>
#include <kvpager/kernels/can_implement.hpp>
#include <kvpager/monitor/json.hpp>
#include <kvpager/cache/hybrid_kv_cache.hpp>
#include <kvpager/monitor/group_metrics.hpp>
#include <kvpager/monitor/prometheus.hpp>
#include <kvpager/sharing/prefix_caching.hpp>
#include <kvpager/swap/hybrid_swap.hpp>

#include "cli_options.hpp"
#include "compute.hpp"
#include "contiguous.hpp"
#include "disaggregated.hpp"
#include "events.hpp"
#include "kvtrace.hpp"
#include "paged.hpp"
#include "report.hpp"
#include "layers.hpp"
#include "workload.hpp"

namespace {

/// The compositions compiled in (each is one instantiation of the scheduler and the cache: keep the list short),
/// both named in kvpager/cache/compositions.hpp. vllm_v1: vLLM v1's KV-cache manager (kvpager::vllm_v1_cache).
/// hybrid_swap: the same with a host pool (kvpager::hybrid_swap_cache): a victim is swapped out while the host pool
/// has room, else recomputed.
constexpr const char* compositions = "hybrid_swap, vllm_v1";

struct settings {
  std::string trace;
  std::string composition = "hybrid_swap";
  std::int32_t blocks = 0;  // 0: the workload's
  std::int32_t block_size = 0;
  std::int32_t max_model_len = 0;
  std::int32_t host_blocks = -1;  // -1: a quarter of the device pool (hybrid_swap)
  std::int32_t host_tier_blocks = 0;  // --host-tier-blocks: the prefix cache's host tier (0: none)
  std::string host_tier_policy = "lru";
  std::string host_tier_write = "through";
  std::int32_t host_tier_store_threshold = 1;
  std::string preemption = "cache_policy";
  std::string admission = "watermark";
  std::string tuning = "on";
  std::int32_t requests = 400;
  double rate = -1;  // < 0: the workload's
  std::uint64_t seed = 2023;
  std::int64_t max_steps = 0;
  std::string compute = "none";
  std::string dtype = "fp32";
  std::int32_t threads = 0;
  double link_gbps = 25.0;       // --preemption adaptive: host link bandwidth, GB/s each way (PCIe 4.0 x16)
  double prefill_tflops = 100.0;  // --preemption adaptive: prefill throughput the recompute cost assumes
  bool json = false;
  std::string report;
  bool quiet = false;
  std::int64_t corrupt_step = -1;  // hidden test hook
  std::string layers;  // --layers: a layer pattern or a built-in model ("": one full-attention group)
  std::string workload = "default";  // --workload: the built-in workload (default, multiturn)
  std::string kv_events;         // --kv-events: the PUB endpoint ("": no events)
  std::string kv_events_replay;  // --kv-events-replay: the replay (ROUTER) endpoint
  std::string kv_events_topic;
  double kv_events_linger = 0;   // seconds the replay socket stays open after the run
  std::string kv_events_check;   // hidden test hook: the cache's cached blocks after each batch
  bool disaggregated = false;    // --disaggregated: also over a prefill and a decode instance
  std::string kv_transport = kvsim::sim_has_ucx ? "ucx" : "inproc";
  std::int32_t disagg_layers = 2;
  std::int32_t prefill_token_budget = 0;  // --prefill-token-budget: the prefill instance's (0: the workload's)
  std::int64_t inject_read_failures = 0;     // hidden test hook: every n-th read fails (inproc)
  std::int64_t inject_offer_corruption = 0;  // hidden test hook: the n-th offer's KV has a byte changed
  std::int64_t inject_reregister = 0;        // hidden test hook: the prefill pools registered again after offer n
  std::string inject_disconnect;             // hidden test hook: prefill:N or decode:N, the connection closed
};

/// KV bytes of one token over all layers for the byte figures: Llama-2-7B in fp16 (32 layers x 2 x 4096 x 2 bytes
/// = 512 KiB, the seed's "16 KB per token" per layer).
constexpr std::int64_t bytes_per_token = 32LL * 2 * 4096 * 2;
/// Floating-point operations of one token of the simulated model's prefill: 2 x parameters (Llama-2-7B: 6.74 B).
constexpr double prefill_flops_per_token = 2.0 * 6.74e9;
/// Requests of the built-in workload at most: it is generated before the run (~1.5 KB a request with its prompt).
constexpr std::int64_t max_requests = 100000;
/// Poisson arrival rates per step accepted besides 0 (all at step 0): a run of max_requests at the lowest rate
/// spans ~1e11 steps, which idle skipping crosses in a moment.
constexpr double min_rate = 1e-6, max_rate = 1e6;

/// Progress on stderr: one line updated in place on a terminal, plain lines (every 10%) otherwise.
struct progress_line {
  bool tty = isatty(2) != 0;
  bool quiet = false;
  std::int64_t last_decile = -1;
  void operator()(const char* what, std::int64_t step, std::int64_t done, std::int64_t total) {
    if (quiet || total <= 0) return;
    if (tty) {
      std::fprintf(stderr, "\r%-10s step %7lld  %6lld/%lld requests done", what, static_cast<long long>(step),
                   static_cast<long long>(done), static_cast<long long>(total));
      std::fflush(stderr);
      return;
    }
    const std::int64_t decile = done * 10 / total;
    if (decile == last_decile) return;
    last_decile = decile;
    std::fprintf(stderr, "%s: step %lld, %lld/%lld requests done\n", what, static_cast<long long>(step),
                 static_cast<long long>(done), static_cast<long long>(total));
  }
  void end() {
    if (!quiet && tty) std::fprintf(stderr, "\r%60s\r", "");
    last_decile = -1;
  }
};

struct outcome {
  kvsim::run_summary summary;
  kvsim::paged_extras extras;
  kvsim::step_history samples;
};

/// Creates the cache of `cc` (with --compute cpu, one the kernels run: create(cc, can_implement)) and runs the
/// workload over it; --compute cpu's layer gets a pool of the cache's geometry() and swap pool. 0, 1 (the cache
/// cannot be created) or 2 (a geometry the kernels refuse, a compute error).
/// The paged run over KV cache groups (--layers): kv_groups_swap_cache (Cache; with --host-tier-blocks one of
/// groups_tiered_cache_with) in vLLM's conventions over the plan's groups, swapping as hybrid_swap_cache does (every
/// group's table of a victim, while the host pool has room).
template <class Cache>
int run_groups(const kvpager::cache_config& cc, const kvsim::layer_plan& plan, const kvsim::workload& w,
               const kvsim::paged_options& po, outcome& out, std::vector<kvpager::group_metrics>& groups) {
  auto cache = Cache::create(cc, plan.groups, {kvpager::hybrid_conventions::vllm});
  if (!cache) {
    std::fprintf(stderr, "kvpager-sim: cannot create the cache of KV cache groups: %s\n", cache.error().message());
    return 1;
  }
  out.summary = kvsim::run_paged(w, *cache, po, out.samples, out.extras);
  groups.resize(static_cast<std::size_t>(cache->num_groups()));
  groups.resize(kvpager::take_group_snapshots(*cache, groups));
  return 0;
}

template <class Cache>
int run_composition(const kvpager::cache_config& cc, const settings& s, const kvsim::workload& w,
                    kvsim::paged_options po, outcome& out, std::unique_ptr<kvsim::attention_compute>& attn) {
  const bool compute = s.compute == "cpu";
  auto cache = compute ? Cache::create(cc, kvpager::can_implement) : Cache::create(cc);
  if (!cache) {
    if (compute && cache.error().code() == kvpager::errc::unsupported) {
      std::fprintf(stderr, "kvpager-sim: --compute cpu: the kernels do not run this pool (block size %d): %s\n",
                   cc.block_size, cache.error().message());
      return kvtools::exit_bad_input;
    }
    std::fprintf(stderr, "kvpager-sim: cannot create the cache: %s\n", cache.error().message());
    return 1;
  }
  if (compute) {
    // The host pool: the swap pool's blocks, then the host tier's (cache_config::host_pool_blocks).
    auto pools = kvpager::host_kv_pools::create(cache->geometry(), static_cast<std::int32_t>(cc.host_pool_blocks()));
    if (!pools) {
      std::fprintf(stderr, "kvpager-sim: --compute cpu: cannot create the KV pools (%lld host blocks with "
                           "--host-blocks and --host-tier-blocks): %s\n",
                   static_cast<long long>(cc.host_pool_blocks()), pools.error().message());
      return pools.error().code() == kvpager::errc::out_of_memory ? kvtools::exit_bad_input : 1;
    }
    attn = std::make_unique<kvsim::attention_compute>(std::move(*pools), s.seed);
    attn->corrupt_at(s.corrupt_step);
    attn->set_threads(s.threads);
    po.compute = attn.get();
  }
  if (po.events != nullptr) {
    if (const kvpager::status st = cache->set_kv_event_buffer(&po.events->buffer); !st) {
      std::fprintf(stderr, "kvpager-sim: --kv-events: %s\n", st.message());
      return 1;
    }
  }
  out.summary = kvsim::run_paged(w, *cache, po, out.samples, out.extras);
  return out.extras.error.empty() ? 0 : 2;  // the caller reports the compute error
}

}  // namespace

namespace {

int run_main(int argc, char** argv) {
  CLI::App app{"kvpager-sim: a serving workload through kvpager's scheduler and paged cache, against contiguous "
               "allocation"};
  settings s;
  using kvtools::finite_range;
  using kvtools::int_range;
  app.add_option("trace", s.trace, "a manager-level kvtrace file (docs/KVTRACE.md); default: the built-in workload");
  app.add_option("--composition", s.composition, std::string("cache composition: ") + compositions +
                                                      " (default hybrid_swap)");
  app.add_option("--blocks", s.blocks, "usable device blocks of the paged pool (default 1030; a trace's num_blocks - 1)")
      ->check(int_range(2, 1 << 24));
  app.add_option("--block-size", s.block_size, "tokens per block, a power of two (default 16; --compute cpu: 8, 16 or 32)")
      ->check(int_range(1, 4096));
  app.add_option("--max-model-len", s.max_model_len, "longest sequence; the contiguous reservation (default 2048)")
      ->check(int_range(1, kvsim::max_model_len_limit));
  app.add_option("--host-blocks", s.host_blocks, "host (swap) pool blocks of hybrid_swap (default: blocks / 4)")
      ->check(int_range(0, 1 << 24));
  app.add_option("--host-tier-blocks", s.host_tier_blocks,
                 "host tier of the prefix cache below the device pool, in blocks (default 0: none; hybrid_swap)")
      ->check(int_range(0, 1 << 24));
  app.add_option("--host-tier-policy", s.host_tier_policy, "the host tier's eviction: lru or arc (default lru)")
      ->check(CLI::IsMember({"lru", "arc"}));
  app.add_option("--host-tier-write", s.host_tier_write,
                 "when blocks go to the host tier: through (when cached) or back (when the device evicts them); "
                 "default through")
      ->check(CLI::IsMember({"through", "back"}));
  app.add_option("--host-tier-store-threshold", s.host_tier_store_threshold,
                 "store only blocks looked up in the host tier at least this often (default 1: every block)")
      ->check(int_range(1, 1 << 20));
  app.add_option("--preemption", s.preemption, "cache_policy, recompute, swap or adaptive (default cache_policy)")
      ->check(CLI::IsMember({"cache_policy", "recompute", "swap", "adaptive"}));
  app.add_option("--admission", s.admission, "watermark (1% kept free) or headroom (the seed's free >= 1.1 x needed)")
      ->check(CLI::IsMember({"watermark", "headroom"}));
  app.add_option("--tuning", s.tuning, "dynamic batch size and block size advice: on or off (default on)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--workload", s.workload,
                 "the built-in workload: default (ShareGPT-like requests) or multiturn (conversations that come back; "
                 "--requests counts turns, --rate starts conversations)")
      ->check(CLI::IsMember({"default", "multiturn"}));
  app.add_option("--requests", s.requests,
                 "requests of the built-in workload (default 400; at most " + std::to_string(max_requests) +
                     ": the workload is generated before the run)")
      ->check(int_range(1, max_requests));
  app.add_option("--rate", s.rate, "Poisson arrivals per step, 0: all at step 0, else in [1e-06, 1e+06] (default 0.3; a trace: 0)")
      ->check(finite_range(0, max_rate));
  app.add_option("--seed", s.seed, "seed of the built-in workload and of the arrivals (default 2023)");
  app.add_option("--max-steps", s.max_steps, "stop each system after this many steps (default 0: until done)")
      ->check(int_range(0, std::int64_t{1} << 50));
  app.add_option("--compute", s.compute, "none, or cpu: attention on the CPU kernels every step, checked at the end")
      ->check(CLI::IsMember({"none", "cpu"}));
  app.add_option("--dtype", s.dtype, "KV dtype of --compute cpu: fp32 or bf16 (default fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--threads", s.threads, "threads of the kernel calls of --compute cpu (default 0: all cores)")
      ->check(int_range(0, 1024));
  app.add_option("--link-gbps", s.link_gbps,
                 "--preemption adaptive: host link bandwidth in GB/s each way (default 25, PCIe 4.0 x16)")
      ->check(finite_range(0, 1e5, true));
  app.add_option("--prefill-tflops", s.prefill_tflops,
                 "prefill throughput in TFLOP/s: --preemption adaptive's recompute cost, --disaggregated's step time "
                 "(default 100)")
      ->check(finite_range(0, 1e5, true));
  app.add_flag("--json", s.json, "print one JSON document instead of the table");
  app.add_option("--report", s.report, "write steps.csv, chart.svg and metrics.prom into this directory");
  app.add_flag("--quiet", s.quiet, "no progress on stderr");
  app.add_option("--layers", s.layers,
                 "the model's attention per layer, kind:count,... (full, swa<W>, chunk<C>) or a model (gpt-oss-20b, "
                 "gpt-oss-120b, gemma-2-9b, gemma-2-27b, gemma-3-12b, gemma-3-27b, mistral-7b-v0.1, llama-4-scout): "
                 "also run the paged cache with KV cache groups at the same KV bytes");
  app.add_option("--inject-corruption", s.corrupt_step, "")->group("");  // test hook: corrupt KV at this step
  app.add_option("--kv-events", s.kv_events,
                 "publish KV cache events in vLLM's wire format on this ZeroMQ endpoint (tcp://*:5557 binds, "
                 "tcp://HOST:PORT connects, as vLLM)");
  app.add_option("--kv-events-replay", s.kv_events_replay, "serve vLLM's replay socket for missed batches here (bound)");
  app.add_option("--kv-events-topic", s.kv_events_topic, "the topic frame of every batch (default empty)");
  app.add_option("--kv-events-linger", s.kv_events_linger,
                 "seconds the replay socket stays open after the run (default 0)")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--kv-events-check", s.kv_events_check, "")->group("");  // test hook: cached blocks per batch
  app.add_flag("--disaggregated", s.disaggregated,
               "also run the workload over a prefill and a decode instance (simulated compute, real KV transfers "
               "between real pools, every received block checked; docs/sim.md)");
  app.add_option("--kv-transport", s.kv_transport,
                 std::string("--disaggregated: the KV transfers' transport, inproc or ucx (UCX on 127.0.0.1); "
                             "default ") +
                     (kvsim::sim_has_ucx ? "ucx" : "inproc (this build has no UCX)"))
      ->check(CLI::IsMember({"inproc", "ucx"}));
  app.add_option("--disagg-layers", s.disagg_layers,
                 "--disaggregated: layers of Llama-2-7B's KV (16 KiB a token each) in each instance's pools (default 2 "
                 "of 32; with --layers, the layers of each group's block, default 1, at most the group size)")
      ->check(int_range(1, kvsim::disagg_shape::model_layers));
  app.add_option("--prefill-token-budget", s.prefill_token_budget,
                 "--disaggregated: the prefill instance's tokens per step (max_num_batched_tokens; default the "
                 "workload's): a smaller budget computes prompts in more chunks")
      ->check(int_range(1, 1 << 24));
  app.add_option("--inject-read-failures", s.inject_read_failures, "")->group("");  // test hook: every n-th read fails
  app.add_option("--inject-offer-corruption", s.inject_offer_corruption, "")->group("");  // test hook
  app.add_option("--inject-reregister", s.inject_reregister, "")->group("");  // test hook: new remote keys
  // Test hook: one side's transport closes the connection (prefill:N after the N-th offer, decode:N with the N-th
  // read in flight).
  app.add_option("--inject-disconnect", s.inject_disconnect, "")->group("");
  if (const int rc = kvtools::parse(app, argc, argv); rc >= 0) return rc;
  if (s.rate > 0 && s.rate < min_rate) {
    std::fprintf(stderr, "--rate: must be 0 or a finite number in [1e-06, 1e+06], not %g\n", s.rate);
    return kvtools::exit_bad_input;
  }
  if (s.composition != "hybrid_swap" && s.composition != "vllm_v1") {
    std::fprintf(stderr, "kvpager-sim: unknown composition '%s'; choose one of: %s\n", s.composition.c_str(),
                 compositions);
    return kvtools::exit_bad_input;
  }

  if (s.host_tier_blocks > 0 && s.composition != "hybrid_swap") {
    std::fprintf(stderr, "kvpager-sim: --host-tier-blocks runs with --composition hybrid_swap (for vllm_v1's "
                         "behaviour add --host-blocks 0)\n");
    return kvtools::exit_bad_input;
  }

  // --disaggregated runs a built-in workload over two schedulers of the composition, every request to its end.
  kvsim::disagg_disconnect disconnect;
  for (const char* o : {"--kv-transport", "--disagg-layers", "--prefill-token-budget", "--inject-read-failures",
                        "--inject-offer-corruption", "--inject-disconnect", "--inject-reregister"})
    if (!s.disaggregated && app.get_option(o)->count() > 0) {
      std::fprintf(stderr, "kvpager-sim: %s needs --disaggregated\n", o);
      return kvtools::exit_bad_input;
    }
  if (s.disaggregated) {
    const char* conflict = !s.trace.empty()         ? "a trace (it runs a built-in workload: --workload)"
                           : s.compute == "cpu"     ? "--compute cpu (it checks the KV it moves instead)"
                           : s.host_tier_blocks > 0 ? "--host-tier-blocks"
                           : !s.kv_events.empty()   ? "--kv-events"
                           : s.max_steps > 0        ? "--max-steps (it runs every request to its end)"
                                                    : nullptr;
    if (conflict != nullptr) {
      std::fprintf(stderr, "kvpager-sim: --disaggregated does not run with %s\n", conflict);
      return kvtools::exit_bad_input;
    }
    if (s.kv_transport == "ucx" && !kvsim::sim_has_ucx) {
      std::fprintf(stderr, "kvpager-sim: --kv-transport ucx: this build has no UCX (install libucx-dev and "
                           "reconfigure); use --kv-transport inproc\n");
      return kvtools::exit_bad_input;
    }
    if (s.inject_read_failures > 0 && s.kv_transport != "inproc") {
      std::fprintf(stderr, "kvpager-sim: --inject-read-failures needs --kv-transport inproc\n");
      return kvtools::exit_bad_input;
    }
    if (!s.inject_disconnect.empty()) {
      const std::size_t colon = s.inject_disconnect.find(':');
      const std::string side = s.inject_disconnect.substr(0, colon == std::string::npos ? 0 : colon);
      const std::string n = colon == std::string::npos ? "" : s.inject_disconnect.substr(colon + 1);
      if ((side != "prefill" && side != "decode") || n.empty() || n.size() > 9 ||
          n.find_first_not_of("0123456789") != std::string::npos || std::stoll(n) < 1) {
        std::fprintf(stderr, "kvpager-sim: --inject-disconnect: prefill:N or decode:N (N >= 1), not '%s'\n",
                     s.inject_disconnect.c_str());
        return kvtools::exit_bad_input;
      }
      disconnect = {side == "decode", std::stoll(n)};
    }
  }

  kvsim::layer_plan plan;
  if (!s.layers.empty()) {
    if (const std::string e = kvsim::parse_layers(s.layers, plan); !e.empty()) {
      std::fprintf(stderr, "kvpager-sim: %s\n", e.c_str());
      return kvtools::exit_bad_input;
    }
    if (s.compute == "cpu") {
      std::fprintf(stderr, "kvpager-sim: --layers with --compute cpu is not supported (the computed layer is one full "
                           "layer)\n");
      return kvtools::exit_bad_input;
    }
  }

  // The workload.
  if (!s.trace.empty() && s.workload != "default") {
    std::fprintf(stderr, "kvpager-sim: --workload %s is a built-in workload: not with a trace\n", s.workload.c_str());
    return kvtools::exit_bad_input;
  }
  kvsim::workload w;
  if (s.trace.empty() && s.workload == "multiturn") {
    kvsim::multiturn_options m;
    m.seed = s.seed;
    m.num_requests = s.requests;
    if (s.rate >= 0) m.conversations_per_step = s.rate;
    if (s.max_model_len > 0) m.max_model_len = s.max_model_len;
    w = kvsim::multiturn_workload(m);
    if (w.requests.empty()) {
      std::fprintf(stderr, "kvpager-sim: --workload multiturn: no turn fits --max-model-len %d\n", m.max_model_len);
      return kvtools::exit_bad_input;
    }
  } else if (s.trace.empty()) {
    kvsim::default_workload_options d;
    d.seed = s.seed;
    d.num_requests = s.requests;
    if (s.rate >= 0) d.arrivals_per_step = s.rate;
    w = kvsim::default_workload(d);
  } else {
    const kvreplay::read_result text = kvreplay::read_trace_file(s.trace);
    if (!text.text) {
      std::fprintf(stderr, "kvpager-sim: %s\n", text.error.c_str());
      return kvtools::exit_bad_input;
    }
    const kvreplay::parse_result t = kvreplay::parse_kvtrace(*text.text, s.trace);
    if (!t.value) {
      std::fprintf(stderr, "kvpager-sim: %s\n", t.error.c_str());
      return kvtools::exit_bad_input;
    }
    if (const std::string err = kvsim::workload_from_trace(*t.value, std::max(s.rate, 0.0), s.seed, w); !err.empty()) {
      std::fprintf(stderr, "kvpager-sim: %s: %s\n", s.trace.c_str(), err.c_str());
      return kvtools::exit_bad_input;
    }
  }
  if (s.blocks > 0) w.num_blocks = s.blocks;
  if (s.block_size > 0) w.block_size = s.block_size;
  if (s.max_model_len > 0) w.max_model_len = s.max_model_len;
  if (!std::has_single_bit(static_cast<std::uint32_t>(w.block_size))) {
    std::fprintf(stderr, "kvpager-sim: the block size must be a power of two, not %d\n", w.block_size);
    return kvtools::exit_bad_input;
  }
  const bool compute = s.compute == "cpu";
  // In 64 bits: max_model_len is at most max_model_len_limit (2^24) and the block size at least 1, so the quotient
  // fits the cache's int32 field.
  const auto max_blocks_per_seq =
      static_cast<std::int32_t>((std::int64_t{w.max_model_len} + w.block_size - 1) / w.block_size);
  const std::int32_t host_blocks =
      s.composition == "vllm_v1" ? 0 : (s.host_blocks >= 0 ? s.host_blocks : w.num_blocks / 4);

  // The scheduler's configuration.
  kvsim::paged_options po;
  po.sched.max_num_seqs = w.max_num_seqs;
  po.sched.max_num_batched_tokens = w.max_num_batched_tokens;
  po.sched.preemption = s.preemption == "recompute" ? kvpager::preemption_mode::recompute
                        : s.preemption == "swap"    ? kvpager::preemption_mode::swap
                        : s.preemption == "adaptive" ? kvpager::preemption_mode::adaptive
                                                     : kvpager::preemption_mode::cache_policy;
  po.sched.admit_rule =
      s.admission == "headroom" ? kvpager::admission_rule::request_headroom : kvpager::admission_rule::watermark;
  // --preemption adaptive: the cost model of the simulated model (Llama-2-7B, fp16): a block's bytes over the host
  // link against the prefill compute of its tokens.
  po.sched.swap_cost.block_bytes = bytes_per_token * w.block_size;
  po.sched.swap_cost.link_bytes_per_second = s.link_gbps * 1e9;
  po.sched.swap_cost.prefill_seconds_per_token = prefill_flops_per_token / (s.prefill_tflops * 1e12);
  if (s.tuning == "on") {
    po.sched.batch_tuning.enabled = true;
    po.sched.batch_tuning.max_seqs = w.max_num_seqs;
    po.sched.advise_block_size = true;
  }
  if (const kvpager::status st = po.sched.validate(); !st) {
    std::fprintf(stderr, "kvpager-sim: scheduler configuration: %s\n", st.message());
    return kvtools::exit_bad_input;
  }
  const std::int64_t bytes_per_block = bytes_per_token * w.block_size;
  po.bytes_per_block = bytes_per_block;
  po.max_steps = s.max_steps;
  progress_line progress;
  progress.quiet = s.quiet;
  po.progress_every = 50;
  po.progress = [&](std::int64_t step, std::int64_t done, std::int64_t total) {
    progress("paged", step, done, total);
  };

  // --kv-events: the paged run's cache reports its events; they are published once per step.
  kvsim::kv_event_sink events;
  if (!s.kv_events_replay.empty() && s.kv_events.empty()) {
    std::fprintf(stderr, "kvpager-sim: --kv-events-replay needs --kv-events\n");
    return kvtools::exit_bad_input;
  }
  if (!s.kv_events.empty()) {
#if KVPAGER_SIM_HAS_ZMQ
    kvpager::kv_event_publisher_config pc;
    pc.endpoint = s.kv_events;
    pc.replay_endpoint = s.kv_events_replay;
    pc.topic = s.kv_events_topic;
    pc.close_linger_ms = 2000;  // the last batches leave before the tool exits
    kvpager::status st;
    events.publisher = kvpager::kv_event_publisher::create(pc, st);
    if (!events.publisher) {
      std::fprintf(stderr, "kvpager-sim: --kv-events %s%s%s: %s (%s)\n", s.kv_events.c_str(),
                   s.kv_events_replay.empty() ? "" : " --kv-events-replay ", s.kv_events_replay.c_str(), st.message(),
                   zmq_strerror(static_cast<int>(st.detail())));
      return kvtools::exit_bad_input;
    }
#else
    std::fprintf(stderr, "kvpager-sim: --kv-events: this build has no ZeroMQ (install libzmq3-dev and reconfigure)\n");
    return kvtools::exit_bad_input;
#endif
    if (!s.kv_events_check.empty()) {
      events.check = std::fopen(s.kv_events_check.c_str(), "w");
      if (events.check == nullptr) {
        std::fprintf(stderr, "kvpager-sim: cannot write %s\n", s.kv_events_check.c_str());
        return 1;
      }
    }
    po.events = &events;
  }

  // The model runner consumes the step's tables only with --compute cpu.
  po.sched.export_slot_mapping = po.sched.export_tables = compute;

  // The paged run, over the chosen composition (one reserved null block, as vLLM); the pool's geometry is the
  // --compute cpu layer's (kvsim::attention_compute), stated once here.
  const kvpager::kv_dtype dtype = s.dtype == "bf16" ? kvpager::kv_dtype::bf16 : kvpager::kv_dtype::f32;
  const kvpager::cache_config cc{
      .block_size = w.block_size,
      .num_blocks = w.num_blocks + 1,
      .reserved_blocks = 1,
      .max_blocks_per_seq = max_blocks_per_seq,
      .num_host_blocks = host_blocks,
      .num_kv_heads = kvsim::attention_compute::kv_heads,
      .head_dim = kvsim::attention_compute::head_dim,
      .dtype = dtype,
      .host_tier = {.num_blocks = s.host_tier_blocks,
                    .write = s.host_tier_write == "back" ? kvpager::tier_write::back : kvpager::tier_write::through,
                    .store_threshold = s.host_tier_store_threshold}};
  // --layers: the cache of KV cache groups at the same KV bytes: a block holds group_size layers, so the pool has
  // num_layers / group_size times the blocks, and so has the host pool (plus its reserved block 0).
  kvpager::cache_config gc = cc;
  std::int64_t group_blocks = 0;
  const std::int64_t group_bytes_per_block =
      s.layers.empty() ? bytes_per_block : bytes_per_block * plan.group_size / plan.num_layers;
  if (!s.layers.empty()) {
    group_blocks = std::int64_t{w.num_blocks} * plan.num_layers / plan.group_size;
    if (group_blocks > INT32_MAX - 1) {
      std::fprintf(stderr, "kvpager-sim: --layers: %lld blocks of KV cache groups is too many\n",
                   static_cast<long long>(group_blocks));
      return kvtools::exit_bad_input;
    }
    gc.num_blocks = static_cast<std::int32_t>(group_blocks + 1);
    const std::int64_t group_host = std::int64_t{host_blocks} * plan.num_layers / plan.group_size;
    if (group_host > INT32_MAX - 1) {
      std::fprintf(stderr, "kvpager-sim: --layers: %lld host blocks of KV cache groups is too many\n",
                   static_cast<long long>(group_host));
      return kvtools::exit_bad_input;
    }
    gc.num_host_blocks = group_host > 0 ? static_cast<std::int32_t>(group_host + 1) : 0;
    // The host tier holds the same bytes as the main run's: num_layers / group_size blocks of groups per block.
    const std::int64_t group_tier = std::int64_t{s.host_tier_blocks} * plan.num_layers / plan.group_size;
    if (group_tier > INT32_MAX - 1 - gc.num_host_blocks) {
      std::fprintf(stderr, "kvpager-sim: --layers: %lld host tier blocks of KV cache groups is too many\n",
                   static_cast<long long>(group_tier));
      return kvtools::exit_bad_input;
    }
    gc.host_tier.num_blocks = static_cast<std::int32_t>(group_tier);
  }

  // --disaggregated: both instances' pools of the shape, within the limit; blocks the block-move kernels take. With
  // --layers, both instances run the --layers run's cache (its groups, pool and scheduler) and the pools hold the
  // first --disagg-layers layers of every group's block (default 1; at most the group size).
  kvsim::disagg_options dopt;
  if (s.disaggregated) {
    dopt.transport = s.kv_transport == "ucx" ? kvsim::kv_transport_kind::ucx : kvsim::kv_transport_kind::inproc;
    dopt.shape.layers = s.disagg_layers;
    dopt.composition = s.composition;
    dopt.cache = cc;
    dopt.sched = po.sched;
    if (!s.layers.empty()) {
      if (app.get_option("--disagg-layers")->count() == 0) dopt.shape.layers = 1;
      if (dopt.shape.layers > plan.group_size) {
        std::fprintf(stderr, "kvpager-sim: --disaggregated --layers %s: --disagg-layers must be at most the group "
                             "size, %d (the layers a block of one group holds), not %d\n",
                     plan.source.c_str(), plan.group_size, dopt.shape.layers);
        return kvtools::exit_bad_input;
      }
      dopt.groups = plan.groups;
      dopt.group_layers = plan.group_layers;
      dopt.cache = gc;
      dopt.sched.swap_cost.block_bytes = group_bytes_per_block;
    }
    dopt.step_s = std::chrono::duration<double>(po.step_time).count();
    dopt.prefill_s_per_token = prefill_flops_per_token / (s.prefill_tflops * 1e12);
    dopt.fail_every = s.inject_read_failures;
    dopt.corrupt_offer = s.inject_offer_corruption;
    dopt.reregister_after = s.inject_reregister;
    dopt.disconnect = disconnect;
    dopt.prefill_token_budget = s.prefill_token_budget;
    if (w.block_size != 8 && w.block_size != 16 && w.block_size != 32) {
      std::fprintf(stderr, "kvpager-sim: --disaggregated: --block-size must be 8, 16 or 32 (the block-move kernels' "
                           "sizes), not %d\n", w.block_size);
      return kvtools::exit_bad_input;
    }
    if (const std::int64_t bytes = kvsim::disagg_pool_bytes(dopt.cache, dopt.shape); bytes > kvsim::disagg_pool_limit) {
      std::fprintf(stderr, "kvpager-sim: --disaggregated: the two instances' KV pools would take %.2f GiB (%d blocks "
                           "and %lld host blocks of %d tokens, %d layers x 16 KiB a token, each), more than %lld GiB: "
                           "lower --blocks, --host-blocks or --disagg-layers\n",
                   static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0), dopt.cache.num_blocks,
                   static_cast<long long>(dopt.cache.host_pool_blocks()), dopt.cache.block_size, dopt.shape.layers,
                   static_cast<long long>(kvsim::disagg_pool_limit >> 30));
      return kvtools::exit_bad_input;
    }
  }

  std::unique_ptr<kvsim::attention_compute> attn;
  outcome paged;
  int rc = 0;
  if (s.composition == "vllm_v1")
    rc = run_composition<kvpager::vllm_v1_cache>(cc, s, w, po, paged, attn);
  else if (s.host_tier_blocks == 0)
    rc = run_composition<kvpager::hybrid_swap_cache>(cc, s, w, po, paged, attn);
  else if (s.host_tier_policy == "arc")
    rc = run_composition<kvpager::arc_tier_cache>(cc, s, w, po, paged, attn);
  else
    rc = run_composition<kvpager::lru_tier_cache>(cc, s, w, po, paged, attn);
  progress.end();
  if (rc != 0 && !paged.extras.error.empty())
    std::fprintf(stderr, "kvpager-sim: --compute cpu: %s\n", paged.extras.error.c_str());
  if (rc != 0) return rc;

  // --layers: the same workload over KV cache groups, at the same KV bytes: a block holds group_size layers, so the
  // pool has num_layers / group_size times the blocks, and so has the host pool (plus its reserved block 0).
  outcome grouped;
  std::vector<kvpager::group_metrics> group_figures;
  if (!s.layers.empty()) {
    kvsim::paged_options gpo = po;
    gpo.events = nullptr;  // the events are the main run's (one stream, one cache)
    gpo.bytes_per_block = group_bytes_per_block;
    gpo.sched.swap_cost.block_bytes = gpo.bytes_per_block;
    gpo.progress = [&](std::int64_t step, std::int64_t done, std::int64_t total) {
      progress("groups", step, done, total);
    };
    int grc = 0;
    if (s.host_tier_blocks == 0)
      grc = run_groups<kvpager::kv_groups_swap_cache>(gc, plan, w, gpo, grouped, group_figures);
    else if (s.host_tier_policy == "arc")
      grc = run_groups<kvpager::kv_groups_arc_tier_cache>(gc, plan, w, gpo, grouped, group_figures);
    else
      grc = run_groups<kvpager::kv_groups_lru_tier_cache>(gc, plan, w, gpo, grouped, group_figures);
    if (grc != 0) return grc;
    progress.end();
  }

  // The contiguous baseline over a pool of the same bytes.
  kvsim::contiguous_options co;
  co.pool_tokens = std::int64_t{w.num_blocks} * w.block_size;
  co.bytes_per_token = bytes_per_token;
  co.max_model_len = w.max_model_len;
  co.max_num_seqs = w.max_num_seqs;
  co.max_num_batched_tokens = w.max_num_batched_tokens;
  co.max_steps = s.max_steps;
  kvsim::step_history contiguous_samples;
  const kvsim::run_summary contiguous = kvsim::run_contiguous(w, co, contiguous_samples);

  // --disaggregated: the same workload over a prefill and a decode instance.
  kvsim::disagg_summary dis;
  if (s.disaggregated) {
    dopt.progress = [&](std::int64_t step, std::int64_t done, std::int64_t total) {
      progress("disagg", step, done, total);
    };
    dis = kvsim::run_disaggregated(w, dopt);
    progress.end();
    if (!dis.error.empty()) {
      std::fprintf(stderr, "kvpager-sim: --disaggregated: %s\n", dis.error.c_str());
      return 1;
    }
  }

  const kvsim::workload_summary ws = kvsim::summarize(w);
  const double pool_gib = static_cast<double>(co.pool_tokens * bytes_per_token) / (1024.0 * 1024.0 * 1024.0);
  char title[512];
  std::snprintf(title, sizeof title,
                "kvpager-sim: workload %s (%lld requests, %lld samples), %d blocks x %d tokens (%.1f GiB of KV at "
                "512 KiB/token), max_model_len %d, %s",
                w.name.c_str(), static_cast<long long>(ws.requests), static_cast<long long>(ws.samples),
                w.num_blocks, w.block_size, pool_gib, w.max_model_len, s.composition.c_str());

  // Verdict of the compute check.
  int exit_status = 0;
  if (attn) {
    const auto& c = attn->counters();
    if (c.mismatches > 0) exit_status = 2;
  }
  if (s.disaggregated && !dis.ok()) exit_status = 2;

  if (s.json) {
    kvsim::ordered_json doc;
    doc["workload"] = {{"name", w.name},
                       {"requests", ws.requests},
                       {"samples", ws.samples},
                       {"prompt_tokens", ws.prompt_tokens},
                       {"output_tokens", ws.output_tokens},
                       {"last_arrival_step", ws.last_arrival}};
    doc["settings"] = {{"workload", s.trace.empty() ? s.workload : std::string("trace")},
                       {"composition", s.composition},
                       {"blocks", w.num_blocks},
                       {"block_size", w.block_size},
                       {"host_blocks", host_blocks},
                       {"host_tier_blocks", s.host_tier_blocks},
                       {"host_tier_policy", s.host_tier_blocks > 0 ? s.host_tier_policy : std::string("none")},
                       {"host_tier_write", s.host_tier_write},
                       {"host_tier_store_threshold", s.host_tier_store_threshold},
                       {"max_model_len", w.max_model_len},
                       {"max_num_seqs", w.max_num_seqs},
                       {"max_num_batched_tokens", w.max_num_batched_tokens},
                       {"preemption", s.preemption},
                       {"admission", s.admission},
                       {"tuning", s.tuning},
                       {"bytes_per_token", bytes_per_token},
                       {"link_gbps", s.link_gbps},
                       {"prefill_tflops", s.prefill_tflops},
                       // 1: steps.csv has every sample; k: every k-th (a run longer than the history)
                       {"history_stride", std::max(paged.samples.stride(), contiguous_samples.stride())}};
    doc["paged"] = kvsim::to_json(paged.summary);
    doc["paged"]["dropped_forks"] = paged.extras.dropped_forks;
    if (paged.extras.advised_block_size) doc["paged"]["advised_block_size"] = *paged.extras.advised_block_size;
    nlohmann::json last;
    kvpager::to_json(last, paged.extras.last);
    doc["paged"]["last_snapshot"] = last;
    doc["contiguous"] = kvsim::to_json(contiguous);
    if (!s.layers.empty()) {
      kvsim::ordered_json kinds = kvsim::ordered_json::array(), gl = kvsim::ordered_json::array();
      for (const kvsim::layer_kind& k : plan.kinds) kinds.push_back({{"kind", k.name}, {"layers", k.layers}});
      for (const kvpager::group_metrics& g : group_figures)
        gl.push_back({{"group", g.group}, {"kind", g.kind}, {"peak_blocks", g.peak_blocks},
                      {"released_blocks", g.released_blocks}, {"hit_blocks", g.hit_blocks}});
      doc["layers"] = {{"source", plan.source},     {"num_layers", plan.num_layers},
                       {"kinds", kinds},            {"group_size", plan.group_size},
                       {"groups", plan.group_names}, {"padding_layers", plan.padding_layers},
                       {"blocks", group_blocks}};
      doc["paged_groups"] = kvsim::to_json(grouped.summary);
      doc["paged_groups"]["groups"] = gl;
    }
    if (po.events != nullptr) {
      doc["kv_events"] = {{"endpoint", s.kv_events},
                          {"replay_endpoint", s.kv_events_replay},
                          {"batches", events.batches},
                          {"events", events.events},
                          {"send_errors", events.send_errors},
                          {"final_stored_blocks", {{"GPU", events.stored[0]}, {"CPU", events.stored[1]}}},
                          {"cached_blocks_at_end", paged.extras.cached_at_end}};
    }
    if (attn) {
      const auto& c = attn->counters();
      doc["compute"] = {{"dtype", s.dtype},
                        {"rows", c.rows},
                        {"prefill_rows", c.prefill_rows},
                        {"rows_checked", c.rows_checked},
                        {"requests_checked", c.requests_checked},
                        {"mismatches", c.mismatches},
                        {"max_error", c.max_error},
                        {"block_copies", c.copies},
                        {"blocks_swapped_out", c.swap_outs},
                        {"blocks_swapped_in", c.swap_ins},
                        {"kernel_s", c.kernel_s},
                        {"reference_s", c.reference_s},
                        {"ok", c.mismatches == 0}};
    }
    if (s.disaggregated) doc["disaggregated"] = kvsim::to_json(dis, dopt);
    std::cout << doc.dump(2) << '\n';
  } else {
    std::printf("%s\npreemption %s, admission %s, tuning %s\n\n", title, s.preemption.c_str(), s.admission.c_str(),
                s.tuning.c_str());
    if (s.layers.empty()) {
      kvsim::print_table(paged.summary, contiguous);
    } else {
      std::printf("layers %s: %d layers (", plan.source.c_str(), plan.num_layers);
      for (std::size_t k = 0; k < plan.kinds.size(); ++k)
        std::printf("%s%s x %d", k > 0 ? ", " : "", plan.kinds[k].name.c_str(), plan.kinds[k].layers);
      std::printf("); %zu KV cache groups of %d layers (vLLM's grouping, %d padding layers), %lld blocks at the same "
                  "KV bytes\n\n",
                  plan.groups.size(), plan.group_size, plan.padding_layers, static_cast<long long>(group_blocks));
      kvsim::print_table({{"paged, KV groups", &grouped.summary}, {"paged, one group", &paged.summary},
                          {"contiguous", &contiguous}});
      std::printf("\n");
      for (const kvpager::group_metrics& g : group_figures)
        std::printf("  group %d (%s): peak %d blocks, %lld released by its window, %lld prefix-hit blocks\n", g.group,
                    g.kind, g.peak_blocks, static_cast<long long>(g.released_blocks),
                    static_cast<long long>(g.hit_blocks));
    }
    if (po.events != nullptr)
      std::printf("\nKV cache events: %lld batches, %lld events published to %s; %lld blocks stored and not removed "
                  "at the end (the cache holds %lld)\n",
                  static_cast<long long>(events.batches), static_cast<long long>(events.events), s.kv_events.c_str(),
                  static_cast<long long>(events.stored[0]), static_cast<long long>(paged.extras.cached_at_end));
    if (paged.extras.advised_block_size)
      std::printf("\nblock size advice (tuning): %d tokens for these lengths\n", *paged.extras.advised_block_size);
    if (attn) {
      const auto& c = attn->counters();
      std::printf("\n--compute cpu (%s, 2 query heads, 1 KV head, head_dim 64): %lld rows (%lld prompt), %lld block "
                  "copies, %lld/%lld blocks swapped out/in; kernels %.2f s, reference %.2f s\n",
                  s.dtype.c_str(), static_cast<long long>(c.rows), static_cast<long long>(c.prefill_rows),
                  static_cast<long long>(c.copies), static_cast<long long>(c.swap_outs),
                  static_cast<long long>(c.swap_ins), c.kernel_s, c.reference_s);
      std::printf("check against attention over contiguous K/V: %lld rows of %lld requests, max error %.3g: %s\n",
                  static_cast<long long>(c.rows_checked), static_cast<long long>(c.requests_checked), c.max_error,
                  c.mismatches == 0 ? "all match" : "MISMATCH");
    }
    if (s.disaggregated) kvsim::print_disaggregated(dis, dopt);
  }
  if (attn && attn->counters().mismatches > 0)
    std::fprintf(stderr, "kvpager-sim: --compute cpu: %lld rows differ from the reference; first: %s\n",
                 static_cast<long long>(attn->counters().mismatches), attn->counters().first_mismatch.c_str());
  if (s.disaggregated) {
    if (dis.mismatches > 0)
      std::fprintf(stderr, "kvpager-sim: --disaggregated: received KV differs from what the prefill instance "
                           "computed (%lld reads); first: %s\n",
                   static_cast<long long>(dis.mismatches), dis.first_mismatch.c_str());
    if (dis.finished + dis.rejected != dis.samples)
      std::fprintf(stderr, "kvpager-sim: --disaggregated: %lld of %lld samples neither finished nor rejected\n",
                   static_cast<long long>(dis.samples - dis.finished - dis.rejected),
                   static_cast<long long>(dis.samples));
    if (!dis.prefill.pools_empty || !dis.decode.pools_empty)
      std::fprintf(stderr, "kvpager-sim: --disaggregated: the %s instance's pools are not empty at the end\n",
                   !dis.prefill.pools_empty ? "prefill" : "decode");
  }

  if (!s.report.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(s.report, ec);
    const std::string dir = s.report + "/";
    std::string prom;
    kvpager::write_prometheus(prom, s.layers.empty() ? paged.extras.last : grouped.extras.last);
    kvpager::append_group_prometheus(prom, group_figures);
    std::ofstream pf(dir + "metrics.prom");
    pf << prom;
    const std::vector<kvsim::step_sample> ps = paged.samples.samples(), cs = contiguous_samples.samples();
    if (ec || !pf || !kvsim::write_csv(dir + "steps.csv", ps, cs) || !kvsim::write_svg(dir + "chart.svg", title, ps, cs)) {
      std::fprintf(stderr, "kvpager-sim: cannot write the report into %s\n", s.report.c_str());
      return 1;
    }
  }
  if (events.check != nullptr) std::fclose(events.check);
  if (po.events != nullptr && !s.kv_events_replay.empty() && s.kv_events_linger > 0) {
    std::cout.flush();
    std::fflush(stdout);  // the report is out: a consumer may now ask for the batches it missed
    std::this_thread::sleep_for(std::chrono::duration<double>(s.kv_events_linger));
  }
  return exit_status;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::bad_alloc&) {  // a pool (--blocks, --compute cpu) or a trace too large for this machine
    std::fprintf(stderr, "kvpager-sim: out of memory\n");
    return 1;
  }
}
