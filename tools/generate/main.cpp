// SPDX-License-Identifier: Apache-2.0
// kvpager-generate: offline batch generation for Hugging Face decoder-only checkpoints (llama, qwen2, mistral, gemma2) served
// on kvpager: its scheduler over a shipped cache composition, K/V in paged pools written by kv_append, attention by
// kvpager's prefill and decode kernels, the step's swaps and copies by the step executor. docs/generate.md.
//
//   kvpager-generate MODEL_DIR requests.jsonl [--output FILE] [--logprobs K] [--top-logits K] [--reference]
//       [--num-blocks N | --kv-bytes B] [--block-size B] [--kv-dtype fp32|fp16|bf16|fp8] [--max-num-batched-tokens T]
//       [--max-num-seqs S] [--preemption swap|recompute|hybrid] [--num-host-blocks H] [--composition NAME]
//       [--host-tier-blocks N]
//       [--threads N] [--json] [--report DIR]
//       [--role single|prefill|decode --kv-listen HOST:PORT | --kv-connect HOST:PORT [--kv-peers N]
//        [--kv-peer-index K] [--kv-timeout-ms MS]]
//
// Exit status: 0, 1 (--reference found an output that differs, or the run failed), 2 (bad input: the command line, a
// checkpoint file, tensor or field, a requests line), each with a message naming what was wrong.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <kvpager/cache/compositions.hpp>
#include <kvpager/cache/hybrid_kv_cache.hpp>
#include <kvpager/monitor/group_metrics.hpp>
#include <kvpager/kernels/can_implement.hpp>
#include <kvpager/kernels/step_executor.hpp>
#include <kvpager/monitor/prometheus.hpp>

#include "checkpoint.hpp"
#include "cli_options.hpp"
#include "engine.hpp"
#include "model.hpp"
#include "paged_attention.hpp"
#include "reference.hpp"
#include "requests.hpp"
#include "step_chart.hpp"

extern "C" void openblas_set_num_threads(int);  // OpenBLAS's own (cblas.h declares it; kept explicit here)

namespace {

using ordered_json = nlohmann::ordered_json;

struct settings {
  std::string model_dir, requests, output, report, composition = "auto", kv_dtype = "fp32",
                                                  preemption = "hybrid";
  std::int32_t logprobs = 0, top_logits = 0, block_size = 16, max_num_seqs = 64, threads = 0, max_model_len = 0;
  std::int64_t num_blocks = 0, kv_bytes = 0, num_host_blocks = -1, max_num_batched_tokens = 512;
  std::int32_t host_tier_blocks = 0;  // the prefix cache's host tier (lru_tier_cache, kv_groups_lru_tier_cache); 0: none
  double k_scale = 1.0, v_scale = 1.0, tolerance = -1;
  bool reference = false, json = false, quiet = false;
  // Disaggregated serving (disagg.hpp): the role, the address, the decode instances and this one's share.
  std::string role = "single", kv_listen, kv_connect;
  std::int32_t kv_peers = 1, kv_peer_index = 0, kv_timeout_ms = 30000;
};

#if KVPAGER_GENERATE_HAS_UCX
/// HOST:PORT of --kv-listen or --kv-connect: false for anything else.
bool split_address(const std::string& a, std::string& host, std::uint16_t& port) {
  const auto colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == a.size()) return false;
  host = a.substr(0, colon);
  std::int64_t p = 0;
  for (std::size_t i = colon + 1; i < a.size(); ++i) {
    if (a[i] < '0' || a[i] > '9') return false;
    p = p * 10 + (a[i] - '0');
    if (p > 65535) return false;
  }
  port = static_cast<std::uint16_t>(p);
  return true;
}
#endif

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1;
  return v[std::min(i, v.size() - 1)];
}

/// The default tolerance of --reference per KV dtype: logits of fp32 activations over K/V rounded alike differ by
/// summation order only; rounded queries and outputs (fp16, bf16) and fp8 K/V can land one step of rounding apart.
double default_tolerance(kvpager::kv_dtype d) {
  switch (d) {
    case kvpager::kv_dtype::f32: return 2e-3;
    case kvpager::kv_dtype::f16: return 2e-2;
    default: return 1e-1;
  }
}

/// The KV cache groups of a checkpoint's layers: one per distinct attention kind (full, or a sliding window of W
/// tokens), in order of first appearance (vLLM's order), and each layer's group.
struct layer_groups {
  std::vector<kvpager::any_group_kind> kinds;
  std::vector<std::string> names;            ///< "full", "sliding_window W"
  std::vector<std::int32_t> layers;          ///< layers per group
  std::vector<std::int32_t> layer_group;     ///< per layer
};

layer_groups groups_of(const kvgen::model_config& c) {
  layer_groups lg;
  std::vector<std::int32_t> windows;  // window_left per group
  for (const std::int32_t wl : c.window_left) {
    auto at = std::find(windows.begin(), windows.end(), wl);
    if (at == windows.end()) {
      windows.push_back(wl);
      if (wl < 0) {
        lg.kinds.emplace_back(kvpager::full_attention{});
        lg.names.emplace_back("full");
      } else {
        lg.kinds.emplace_back(kvpager::sliding_window{std::int64_t{wl} + 1});
        lg.names.push_back("sliding_window " + std::to_string(wl + 1));
      }
      lg.layers.push_back(0);
      at = windows.end() - 1;
    }
    const auto g = static_cast<std::int32_t>(at - windows.begin());
    lg.layer_group.push_back(g);
    ++lg.layers[static_cast<std::size_t>(g)];
  }
  return lg;
}

template <class Cache>
constexpr bool grouped_cache = requires(const Cache& k) { k.num_groups(); };

template <class Cache>
int serve(const settings& s, const kvgen::model_weights& w, const std::vector<kvgen::gen_request>& reqs,
          kvpager::kv_dtype dtype, std::int32_t max_model_len, std::int32_t threads) {
  const kvgen::model_config& c = w.config;
  const layer_groups lg = groups_of(c);
  // The pool: one geometry for every layer, the block count from --num-blocks or --kv-bytes.
  kvpager::kv_geometry g{1, s.block_size, c.num_kv_heads, c.head_dim, dtype};
  const std::int64_t per_block = kvpager::block_bytes(g) * c.num_layers;
  std::int64_t blocks = s.num_blocks;
  if (blocks == 0) blocks = (s.kv_bytes > 0 ? s.kv_bytes : std::int64_t{256} << 20) / per_block;
  if (blocks < 1 || blocks > INT32_MAX - 1) {
    std::fprintf(stderr, "kvpager-generate: --kv-bytes gives %lld blocks of %lld bytes (over %d layers); need 1 to 2^31-2\n",
                 static_cast<long long>(blocks), static_cast<long long>(per_block), c.num_layers);
    return kvtools::exit_bad_input;
  }
  const bool has_host = s.composition == "hybrid_swap" || s.composition == "kv_groups";
  // kv_groups: host block 0 is reserved (a table's null entry), so its host pool has at least 2 blocks.
  std::int64_t host = !has_host ? 0 : s.num_host_blocks >= 0 ? s.num_host_blocks : blocks / 4;
  if (grouped_cache<Cache> && host == 1) host = 2;
  if (!has_host && s.num_host_blocks > 0)
    std::fprintf(stderr, "kvpager-generate: --composition %s has no host pool; --num-host-blocks ignored\n",
                 s.composition.c_str());
  const kvpager::cache_config cc{.block_size = s.block_size,
                                 .num_blocks = static_cast<std::int32_t>(blocks + 1),
                                 .reserved_blocks = 1,
                                 .max_blocks_per_seq = (max_model_len + s.block_size - 1) / s.block_size,
                                 .num_host_blocks = static_cast<std::int32_t>(host),
                                 .num_kv_heads = c.num_kv_heads,
                                 .head_dim = c.head_dim,
                                 .dtype = dtype,
                                 .host_tier = {.num_blocks = s.host_tier_blocks}};
  auto cache = [&] {
    if constexpr (grouped_cache<Cache>) {  // the checkpoint's groups, vLLM's decisions
      if (const kvpager::status st = kvpager::can_implement(cc.geometry()); !st) return kvpager::result<Cache>(st);
      return Cache::create(cc, lg.kinds, {kvpager::hybrid_conventions::vllm});
    } else {
      return Cache::create(cc, kvpager::can_implement);
    }
  }();
  if (!cache) {
    std::fprintf(stderr, "kvpager-generate: the KV cache (block size %d, head_dim %d, %d KV heads, %s): %s\n",
                 s.block_size, c.head_dim, c.num_kv_heads, s.kv_dtype.c_str(), cache.error().message());
    return kvtools::exit_bad_input;
  }
  // Each layer's group, so that a swap or copy moves only the layers of the group it names.
  const std::vector<std::int32_t> layer_groups = grouped_cache<Cache> ? lg.layer_group : std::vector<std::int32_t>{};
  // The host pool: the swap pool's blocks, then the host tier's (cache_config::host_pool_blocks()).
  auto pools = kvpager::host_kv_pools::create(cache->geometry(), static_cast<std::int32_t>(cc.host_pool_blocks()),
                                              c.num_layers, layer_groups);
  if (!pools) {
    std::fprintf(stderr, "kvpager-generate: cannot create the KV pools: %s\n", pools.error().message());
    return 1;
  }
  kvpager::scheduler_config sc;
  sc.max_num_seqs = s.max_num_seqs;
  sc.max_num_batched_tokens = s.max_num_batched_tokens;
  sc.preemption = s.preemption == "swap"        ? kvpager::preemption_mode::swap
                  : s.preemption == "recompute" ? kvpager::preemption_mode::recompute
                                                : kvpager::preemption_mode::cache_policy;
  if (const kvpager::status st = sc.validate(); !st) {
    std::fprintf(stderr, "kvpager-generate: scheduler configuration: %s\n", st.message());
    return kvtools::exit_bad_input;
  }

  kvgen::transformer model(w);
  kvgen::paged_attention attn(pools->executor(), c, threads, static_cast<float>(s.k_scale), static_cast<float>(s.v_scale),
                              grouped_cache<Cache> ? lg.layer_group : std::vector<std::int32_t>{});
  // KV held per step: by every group (blocks x the group's layers) against one full-attention group (every layer
  // keeps every block of every table: the full group's blocks, or a table's entries where there is none).
  const std::int64_t layer_block_bytes = kvpager::block_bytes(g);
  std::int64_t peak_group_bytes = 0, peak_one_group_bytes = 0;
  const auto note_groups = [&] {
    if constexpr (grouped_cache<Cache>) {
      std::int64_t held = 0, one = 0;
      for (std::int32_t k = 0; k < cache->num_groups(); ++k) {
        held += std::int64_t{cache->stats(k).blocks} * lg.layers[static_cast<std::size_t>(k)] * layer_block_bytes;
        one = std::max(one, lg.names[static_cast<std::size_t>(k)] == "full" ? std::int64_t{cache->stats(k).blocks}
                                                                            : cache->stats(k).table_entries);
      }
      peak_group_bytes = std::max(peak_group_bytes, held);
      peak_one_group_bytes = std::max(peak_one_group_bytes, one * c.num_layers * layer_block_bytes);
    }
  };
  const std::int32_t keep = std::max({s.logprobs, s.top_logits, s.reference ? 8 : 0, 2});
  kvgen::engine_options eo;
  eo.max_model_len = max_model_len;
  eo.keep_top = keep;
  eo.eos = c.eos_ids;
  eo.bytes_per_block = per_block;
  std::ofstream steps_csv;
  if (!s.report.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(s.report, ec);
    steps_csv.open(s.report + "/steps.csv");
    if (!steps_csv) {
      std::fprintf(stderr, "kvpager-generate: --report %s: cannot write steps.csv\n", s.report.c_str());
      return kvtools::exit_bad_input;
    }
    steps_csv << "step,running,waiting,swapped,kv_cache_usage,preemptions,swap_events,prefix_hit_rate\n";
  }
  const bool tty = isatty(2) != 0 && !s.quiet;
  kvpager::metrics_snapshot last{};
  kvtools::chart_series chart{"kvpager-generate", "#1f77b4", {}};
  eo.on_step = [&](std::int64_t step, const kvpager::metrics_snapshot& m, std::int64_t done, std::int64_t total) {
    last = m;
    note_groups();
    if (!s.report.empty())
      chart.points.push_back({step, 1, m.kv_cache_usage, static_cast<double>(m.running), static_cast<double>(m.waiting),
                              static_cast<double>(m.swap_events())});
    if (steps_csv)
      steps_csv << step << ',' << m.running << ',' << m.waiting << ',' << m.swapped << ',' << m.kv_cache_usage << ','
                << m.preemptions() << ',' << m.swap_events() << ',' << m.prefix_hit_rate << '\n';
    if (tty && step % 8 == 0)
      std::fprintf(stderr, "\rkvpager-generate: step %lld, %lld/%lld samples done, KV %.0f%%   ",
                   static_cast<long long>(step), static_cast<long long>(done), static_cast<long long>(total),
                   100.0 * m.kv_cache_usage);
  };
  kvgen::engine<Cache> eng(model, *cache, pools->executor(), attn, sc, eo);
#if KVPAGER_GENERATE_HAS_UCX
  // Disaggregated: this instance's pools registered with UCX, then the connection to the other role.
  kvgen::disagg_link link;
  if (s.role != "single") {
    kvgen::disagg_options o;
    o.role = s.role == "prefill" ? kvgen::kv_role::prefill : kvgen::kv_role::decode;
    const std::string& addr = o.role == kvgen::kv_role::prefill ? s.kv_listen : s.kv_connect;
    if (!split_address(addr, o.host, o.port)) {
      std::fprintf(stderr, "kvpager-generate: --%s: '%s' is not HOST:PORT\n",
                   o.role == kvgen::kv_role::prefill ? "kv-listen" : "kv-connect", addr.c_str());
      return kvtools::exit_bad_input;
    }
    o.peers = s.kv_peers;
    o.index = s.kv_peer_index;
    o.timeout = std::chrono::milliseconds(s.kv_timeout_ms);
    const auto rl = kvpager::rank_layout(cache->geometry(), c.num_heads, 1, 0);
    if (!rl) {
      std::fprintf(stderr, "kvpager-generate: the KV layout: %s\n", rl.error().message());
      return kvtools::exit_bad_input;
    }
    std::vector<std::span<std::byte>> layer_pools;
    for (std::int32_t l = 0; l < c.num_layers; ++l) layer_pools.push_back(pools->device_bytes(l));
    // With KV cache groups each layer's pool is indexed by its group's table (block 0, the null block, unread).
    kvpager::kv_groups groups{};
    if constexpr (grouped_cache<Cache>) groups = kvpager::kv_groups{lg.layer_group, Cache::null_block};
    if (std::string e = link.open(o, kvpager::kv_side{*rl, c.num_layers, kvpager::kv_pool_layout::per_layer},
                                  layer_pools, groups);
        !e.empty()) {
      std::fprintf(stderr, "kvpager-generate: %s\n", e.c_str());
      return 1;
    }
    eng.set_link(&link);
  }
  const auto ours = [&](std::size_t r) { return s.role != "decode" || link.ours(r); };
#else
  const auto ours = [](std::size_t) { return true; };
#endif
  std::vector<kvgen::request_result> results;
  if (std::string e = eng.run(reqs, results); !e.empty()) {
    if (tty) std::fputc('\n', stderr);
    std::fprintf(stderr, "kvpager-generate: %s\n", e.c_str());
    return 1;
  }
  if (tty) std::fprintf(stderr, "\r%80s\r", "");

  if (!s.output.empty()) {
    std::ofstream out(s.output);
    if (!out) {
      std::fprintf(stderr, "kvpager-generate: --output %s: cannot write\n", s.output.c_str());
      return kvtools::exit_bad_input;
    }
    for (std::size_t r = 0; r < reqs.size(); ++r)
      if (ours(r)) out << kvgen::result_json(reqs[r], results[r], s.logprobs, s.top_logits).dump() << '\n';
  }

  // --reference: every sample again, alone, over contiguous K/V.
  kvgen::reference_check chk;
  chk.tolerance = s.tolerance >= 0 ? s.tolerance : default_tolerance(dtype);
  double ref_s = 0;
  if (s.reference) {
    const auto t0 = std::chrono::steady_clock::now();
    kvgen::transformer ref_model(w);
    kvgen::io_dtype dt;
    dt.pool = dtype;
    kvgen::contiguous_attention ref_attn(c, dt, static_cast<float>(s.k_scale), static_cast<float>(s.v_scale));
    std::vector<float> scratch;
    for (std::size_t r = 0; r < reqs.size(); ++r)
      for (std::size_t k = 0; k < results[r].samples.size() && ours(r); ++k) {
        const kvgen::sample_result& got = results[r].samples[k];
        if (got.finish_reason != "stop" && got.finish_reason != "length") continue;  // refused: nothing to compare
        kvgen::sample_result want;
        if (std::string e = kvgen::reference_sample(ref_model, ref_attn, reqs[r], static_cast<std::uint32_t>(k), c.eos_ids,
                                                    max_model_len, keep, want, scratch);
            !e.empty()) {
          std::fprintf(stderr, "kvpager-generate: reference: %s\n", e.c_str());
          return 1;
        }
        kvgen::compare_sample(got, want, "request " + reqs[r].id.dump() + " sample " + std::to_string(k), chk);
      }
    ref_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // The summary.
  const kvgen::engine_stats& st = eng.stats();
  const kvpager::scheduler_stats ss = eng.scheduler().stats();
  std::int64_t samples = 0, finished = 0, refused = 0;
  std::vector<double> ttft;
  for (std::size_t r = 0; r < results.size(); ++r)
    for (const auto& x : results[r].samples) {
      if (!ours(r)) continue;
      ++samples;
      (x.finish_reason == "stop" || x.finish_reason == "length" ? finished : refused) += 1;
      if (x.first_token_s >= 0) ttft.push_back(x.first_token_s);
    }
  std::int64_t prompt_tokens = 0;
  for (const auto& r : reqs) prompt_tokens += static_cast<std::int64_t>(r.prompt.size());
  const kvgen::forward_times& ft = model.times();
  const double wall = std::max(st.wall_s, 1e-9);
  ordered_json j;
  j["model"] = {{"model_type", c.model_type}, {"layers", c.num_layers}, {"hidden_size", c.hidden_size},
                {"heads", c.num_heads}, {"kv_heads", c.num_kv_heads}, {"head_dim", c.head_dim},
                {"vocab_size", c.vocab_size}, {"parameters", w.parameters}, {"weights_mapped_bytes", w.mapped_bytes},
                {"weights_converted_bytes", w.converted_bytes}};
  j["kv"] = {{"dtype", s.kv_dtype}, {"blocks", blocks}, {"block_size", s.block_size}, {"host_blocks", host},
             {"bytes_per_block", per_block}, {"composition", s.composition}};
  j["requests"] = reqs.size();
  j["samples"] = samples;
  j["finished"] = finished;
  j["refused"] = refused;
  j["prompt_tokens"] = prompt_tokens;
  j["generated_tokens"] = st.generated;
  j["computed_tokens"] = st.computed_tokens;
  j["prefill_tokens"] = st.prefill_tokens;
  j["decode_tokens"] = st.decode_tokens;
  j["steps"] = st.steps;
  j["wall_s"] = st.wall_s;
  const double prefill_rate = st.prefill_s > 0 ? static_cast<double>(st.prefill_tokens) / st.prefill_s : 0.0;
  const double decode_rate = st.decode_s > 0 ? static_cast<double>(st.decode_tokens) / st.decode_s : 0.0;
  j["prefill_tokens_per_s"] = prefill_rate;
  j["decode_tokens_per_s"] = decode_rate;
  j["generated_tokens_per_s"] = static_cast<double>(st.generated) / wall;
  j["ttft_p50_s"] = percentile(ttft, 0.5);
  j["ttft_p99_s"] = percentile(ttft, 0.99);
  j["prefix_hit_rate"] = ss.prefix.query_tokens > 0 ? static_cast<double>(ss.prefix.hit_tokens) / ss.prefix.query_tokens : 0.0;
  j["prefix_hit_tokens"] = ss.prefix.hit_tokens;
  j["prefix_hit_tokens_host"] = ss.prefix.host_hit_tokens;  // of those, loaded from the host tier
  {
    const kvpager::cache_stats cs = cache->stats();
    j["host_tier"] = {{"blocks", s.host_tier_blocks},
                      {"loaded_blocks", cs.tier_loaded_blocks},
                      {"stored_blocks", cs.tier_stored_blocks}};
  }
  j["preemptions_swap"] = ss.preempted_swap;
  j["preemptions_recompute"] = ss.preempted_recompute;
  j["swapped_out_blocks"] = st.swap_outs;
  j["swapped_in_blocks"] = st.swap_ins;
  j["block_copies"] = st.block_copies;
  j["forks"] = st.forks;
  j["fork_fallbacks"] = st.fork_fallbacks;
  j["peak_kv_usage"] = st.peak_kv_usage;
  j["kv_slack_tokens_per_seq_max"] = st.max_slack_tokens_per_seq;
  j["time_share"] = {{"scheduler_cache_exports", st.schedule_s / wall}, {"plan", st.plan_s / wall},
                     {"gemm", ft.gemm_s / wall}, {"attention", ft.attention_s / wall},
                     {"other_forward", ft.other_s / wall}, {"sampling", st.sample_s / wall}};
  if constexpr (grouped_cache<Cache>) {
    ordered_json groups = ordered_json::array();
    for (std::int32_t k = 0; k < cache->num_groups(); ++k) {
      const kvpager::group_stats& gs = cache->stats(k);
      const std::int32_t layers = lg.layers[static_cast<std::size_t>(k)];
      groups.push_back({{"kind", lg.names[static_cast<std::size_t>(k)]}, {"layers", layers},
                        {"peak_blocks", gs.peak_blocks}, {"final_blocks", gs.blocks},
                        {"released_blocks", gs.skipped_blocks}, {"hit_blocks", gs.hit_blocks},
                        {"peak_kv_bytes", std::int64_t{gs.peak_blocks} * layers * layer_block_bytes}});
    }
    j["kv_groups"] = std::move(groups);
    j["kv_held_peak_bytes"] = peak_group_bytes;
    j["kv_one_full_group_peak_bytes"] = peak_one_group_bytes;
  }
#if KVPAGER_GENERATE_HAS_UCX
  if (s.role != "single") {
    kvgen::disagg_stats& ds = link.stats();
    double share = 0;
    std::int64_t shared = 0;
    for (const auto& [r, secs] : ds.per_request) {
      const double first = results[static_cast<std::size_t>(r)].samples.empty()
                               ? -1
                               : results[static_cast<std::size_t>(r)].samples[0].first_token_s;
      if (first > 0) {
        share += secs / first;
        ++shared;
      }
    }
    j["kv_role"] = s.role;
    j["kv_transfer_bytes"] = ds.bytes;
    j["kv_transfer_s"] = ds.transfer_s;
    j["kv_transfer"] = {{"offered", ds.offered},
                        {"released", ds.released},
                        {"received", ds.received},
                        {"failed", ds.failed},
                        {"recomputed_locally", ds.recomputed_locally},
                        {"refused_messages", ds.refused_messages},
                        {"mean_s_per_request", ds.received > 0 ? ds.transfer_s / static_cast<double>(ds.received) : 0.0},
                        {"mean_share_of_ttft", shared > 0 ? share / static_cast<double>(shared) : 0.0}};
  }
#endif
  j["threads"] = threads;
  if (s.reference)
    j["reference"] = {{"samples", chk.samples}, {"identical", chk.identical}, {"near_tie", chk.near_tie},
                      {"mismatched", chk.mismatched}, {"positions", chk.positions},
                      {"max_logit_diff", chk.max_logit_diff}, {"tolerance", chk.tolerance},
                      {"matched", chk.mismatched == 0 && chk.max_logit_diff <= chk.tolerance}, {"seconds", ref_s}};
  if (!s.report.empty()) {
    std::ofstream(s.report + "/summary.json") << j.dump(2) << '\n';
    std::string prom;
    kvpager::write_prometheus(prom, last);
    if constexpr (grouped_cache<Cache>) {  // and each KV cache group's figures
      std::vector<kvpager::group_metrics> gm(static_cast<std::size_t>(cache->num_groups()));
      gm.resize(kvpager::take_group_snapshots(*cache, gm));
      kvpager::append_group_prometheus(prom, gm);
    }
    std::ofstream(s.report + "/metrics.prom") << prom;
    const std::string title = "kvpager-generate: " + s.model_dir + ", " + c.model_type + " " + std::to_string(c.num_layers) +
                              " layers, " + std::to_string(reqs.size()) + " requests, " + std::to_string(blocks) +
                              " blocks x " + std::to_string(s.block_size) + " tokens, KV " + s.kv_dtype + ", " +
                              s.composition;
    if (!kvtools::write_step_chart(s.report + "/chart.svg", title, {chart})) {
      std::fprintf(stderr, "kvpager-generate: --report %s: cannot write chart.svg\n", s.report.c_str());
      return kvtools::exit_bad_input;
    }
  }
  if (s.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    const auto row = [](const char* k, const std::string& v) { std::printf("  %-40s %s\n", k, v.c_str()); };
    const auto f = [](const char* fmt, double x) {
      char b[64];
      std::snprintf(b, sizeof b, fmt, x);
      return std::string(b);
    };
    std::printf("kvpager-generate: %s, %d layers, hidden %d, %d/%d heads x %d, vocab %d; KV %s, %lld blocks x %d "
                "tokens (%s), %d threads\n\n",
                c.model_type.c_str(), c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size,
                s.kv_dtype.c_str(), static_cast<long long>(blocks), s.block_size, s.composition.c_str(), threads);
    row("requests (samples)", std::to_string(reqs.size()) + " (" + std::to_string(samples) + ", " +
                                  std::to_string(refused) + " refused)");
    row("prompt tokens / generated tokens", std::to_string(prompt_tokens) + " / " + std::to_string(st.generated));
    row("steps", std::to_string(st.steps));
    row("prefill tokens/s", f("%.1f", prefill_rate) + " (" + std::to_string(st.prefill_tokens) + " computed)");
    row("decode tokens/s", f("%.1f", decode_rate));
    row("time to first token p50 / p99", f("%.3f s", percentile(ttft, 0.5)) + " / " + f("%.3f s", percentile(ttft, 0.99)));
    row("prefix hit rate (tokens)", f("%.1f%%", 100.0 * j["prefix_hit_rate"].get<double>()));
    row("preemptions (swap + recompute)", std::to_string(ss.preempted_swap) + " + " + std::to_string(ss.preempted_recompute));
    row("blocks swapped out / in", std::to_string(st.swap_outs) + " / " + std::to_string(st.swap_ins));
    row("forks (copy-on-write block copies)", std::to_string(st.forks) + " (" + std::to_string(st.block_copies) + ")");
    row("peak KV usage", f("%.1f%%", 100.0 * st.peak_kv_usage));
    if constexpr (grouped_cache<Cache>) {
      for (std::int32_t k = 0; k < cache->num_groups(); ++k) {
        const kvpager::group_stats& gs = cache->stats(k);
        const std::string name = "KV group " + std::to_string(k) + " (" + lg.names[static_cast<std::size_t>(k)] + ", " +
                                 std::to_string(lg.layers[static_cast<std::size_t>(k)]) + " layers)";
        row(name.c_str(), "peak " + std::to_string(gs.peak_blocks) + " blocks, " + std::to_string(gs.skipped_blocks) +
                              " released by its window");
      }
      row("peak KV held: groups / one full group",
          f("%.2f MiB", static_cast<double>(peak_group_bytes) / 1048576.0) + " / " +
              f("%.2f MiB", static_cast<double>(peak_one_group_bytes) / 1048576.0));
    }
    row("time: scheduler+cache / GEMM / attention",
        f("%.2f%%", 100.0 * st.schedule_s / wall) + " / " + f("%.1f%%", 100.0 * ft.gemm_s / wall) + " / " +
            f("%.1f%%", 100.0 * ft.attention_s / wall));
    row("wall time", f("%.2f s", st.wall_s));
    if (j.contains("kv_role")) {
      const auto& kt = j["kv_transfer"];
      if (s.role == "prefill")
        row("KV offered / released", std::to_string(kt["offered"].get<std::int64_t>()) + " / " +
                                         std::to_string(kt["released"].get<std::int64_t>()));
      else
        row("KV received (failed, computed here)",
            std::to_string(kt["received"].get<std::int64_t>()) + " (" + std::to_string(kt["failed"].get<std::int64_t>()) +
                ", " + std::to_string(kt["recomputed_locally"].get<std::int64_t>()) + "), " +
                f("%.2f MiB", static_cast<double>(j["kv_transfer_bytes"].get<std::int64_t>()) / 1048576.0) + " in " +
                f("%.3f s", j["kv_transfer_s"].get<double>()) + ", " +
                f("%.1f%% of time to first token", 100.0 * kt["mean_share_of_ttft"].get<double>()));
    }
    if (s.reference)
      std::printf("\nreference (one sample at a time, contiguous K/V, no cache): %lld/%lld samples identical%s, "
                  "max logit difference %.2g (tolerance %.2g): %s\n",
                  static_cast<long long>(chk.identical), static_cast<long long>(chk.samples),
                  chk.near_tie > 0 ? (", " + std::to_string(chk.near_tie) + " diverge at a near tie").c_str() : "",
                  chk.max_logit_diff, chk.tolerance,
                  chk.mismatched == 0 && chk.max_logit_diff <= chk.tolerance ? "every output matched" : "MISMATCH");
  }
  if (s.reference && !(chk.mismatched == 0 && chk.max_logit_diff <= chk.tolerance)) {
    if (!chk.first_problem.empty()) std::fprintf(stderr, "kvpager-generate: reference: %s\n", chk.first_problem.c_str());
    return 1;
  }
  return 0;
}

int run_main(int argc, char** argv) {
  CLI::App app{"kvpager-generate: offline batch generation for Hugging Face checkpoints (llama, qwen2, mistral, gemma2) served "
               "on kvpager's scheduler, paged KV cache and kernels"};
  settings s;
  using kvtools::finite_range;
  using kvtools::int_range;
  app.add_option("model_dir", s.model_dir, "checkpoint directory (config.json, model.safetensors or shards)")->required();
  app.add_option("requests", s.requests, "requests, JSON Lines (id, prompt_ids, max_tokens, n, temperature, top_k, "
                                         "top_p, seed, ignore_eos)")->required();
  app.add_option("--output", s.output, "write the outputs as JSON Lines here");
  app.add_option("--logprobs", s.logprobs, "top-K log-probabilities of every generated position")->check(int_range(0, 1024));
  app.add_option("--top-logits", s.top_logits, "top-K raw logits (top_ids, top_logits, lse) of every generated position")
      ->check(int_range(0, 1024));
  app.add_flag("--reference", s.reference, "also run every sample alone over contiguous K/V without kvpager and "
                                            "compare (exit 1 on a difference)");
  app.add_option("--tolerance", s.tolerance, "--reference's logit tolerance (default by --kv-dtype)")
      ->check(finite_range(0, 1e6));
  app.add_option("--num-blocks", s.num_blocks, "KV blocks in the device pool")->check(int_range(1, INT32_MAX - 1));
  app.add_option("--kv-bytes", s.kv_bytes, "KV pool size in bytes over all layers (default 256 MiB)")
      ->check(int_range(1, std::int64_t{1} << 50));
  app.add_option("--block-size", s.block_size, "tokens per block")->check(int_range(1, 1 << 16));
  app.add_option("--kv-dtype", s.kv_dtype, "fp32, fp16, bf16 or fp8 (E4M3 with --k-scale, --v-scale)");
  app.add_option("--k-scale", s.k_scale, "fp8 K scale")->check(finite_range(0, 1e30, true));
  app.add_option("--v-scale", s.v_scale, "fp8 V scale")->check(finite_range(0, 1e30, true));
  app.add_option("--max-num-batched-tokens", s.max_num_batched_tokens, "token budget of a step")
      ->check(int_range(1, 1 << 24));
  app.add_option("--max-num-seqs", s.max_num_seqs, "running sequences at most")->check(int_range(1, 1 << 20));
  app.add_option("--max-model-len", s.max_model_len, "context length (default: max_position_embeddings)")
      ->check(int_range(1, 1 << 24));
  app.add_option("--preemption", s.preemption, "swap, recompute or hybrid (the cache decides: swap while the host pool has room)");
  app.add_option("--num-host-blocks", s.num_host_blocks, "host (swap) pool blocks (default a quarter of the device pool)")
      ->check(int_range(0, INT32_MAX));
  app.add_option("--composition", s.composition,
                 "cache composition: auto (kv_groups for checkpoints with sliding-window layers, else hybrid_swap), "
                 "hybrid_swap, vllm_v1, or kv_groups (one KV cache group per attention kind, vLLM's hybrid manager)");
  app.add_option("--host-tier-blocks", s.host_tier_blocks,
                 "a host tier of the prefix cache below the device pool, in blocks (LRU; composition hybrid_swap or "
                 "kv_groups; "
                 "default 0: none)")
      ->check(int_range(0, 1 << 24));
  app.add_option("--threads", s.threads, "threads of the GEMMs and the kernels (0: every core)")->check(int_range(0, 1024));
  app.add_flag("--json", s.json, "print the summary as JSON");
  app.add_flag("--quiet", s.quiet, "no progress line");
  app.add_option("--report", s.report, "write steps.csv, metrics.prom, chart.svg and summary.json into this directory");
  app.add_option("--role", s.role, "single (default), or one instance of disaggregated serving over UCX: prefill "
                                   "(computes prompts, offers their KV) or decode (reads it, generates)");
  app.add_option("--kv-listen", s.kv_listen, "prefill: HOST:PORT to listen on for decode instances");
  app.add_option("--kv-connect", s.kv_connect, "decode: HOST:PORT of the prefill instance");
  app.add_option("--kv-peers", s.kv_peers, "decode instances (prefill: how many to accept; decode: how many share "
                                           "the requests)")->check(int_range(1, 64));
  app.add_option("--kv-peer-index", s.kv_peer_index, "decode: this instance's share, requests r with r % kv-peers == K")
      ->check(int_range(0, 63));
  app.add_option("--kv-timeout-ms", s.kv_timeout_ms, "a KV read, a connection, a silent peer")->check(int_range(1, 3600000));
  if (const int rc = kvtools::parse(app, argc, argv); rc >= 0) return rc;

  const auto bad = [](const std::string& m) {
    std::fprintf(stderr, "kvpager-generate: %s\n", m.c_str());
    return kvtools::exit_bad_input;
  };
  kvpager::kv_dtype dtype{};
  if (s.kv_dtype == "fp32") dtype = kvpager::kv_dtype::f32;
  else if (s.kv_dtype == "fp16") dtype = kvpager::kv_dtype::f16;
  else if (s.kv_dtype == "bf16") dtype = kvpager::kv_dtype::bf16;
  else if (s.kv_dtype == "fp8") dtype = kvpager::kv_dtype::fp8_e4m3;
  else return bad("--kv-dtype: '" + s.kv_dtype + "' is not one of fp32, fp16, bf16, fp8");
  if (s.preemption != "swap" && s.preemption != "recompute" && s.preemption != "hybrid")
    return bad("--preemption: '" + s.preemption + "' is not one of swap, recompute, hybrid");
  if (s.composition != "auto" && s.composition != "hybrid_swap" && s.composition != "vllm_v1" &&
      s.composition != "kv_groups")
    return bad("--composition: '" + s.composition + "' is not one of auto, hybrid_swap, vllm_v1, kv_groups");
  if (s.num_blocks > 0 && s.kv_bytes > 0) return bad("--num-blocks and --kv-bytes: give one of them");
  if (s.role != "single" && s.role != "prefill" && s.role != "decode")
    return bad("--role: '" + s.role + "' is not one of single, prefill, decode");
#if !KVPAGER_GENERATE_HAS_UCX
  if (s.role != "single") return bad("--role " + s.role + ": this kvpager-generate was built without UCX (libucx-dev)");
#endif
  if (s.role == "prefill" && s.kv_listen.empty()) return bad("--role prefill needs --kv-listen HOST:PORT");
  if (s.role == "decode" && s.kv_connect.empty()) return bad("--role decode needs --kv-connect HOST:PORT");
  if (s.role != "decode" && s.kv_peer_index != 0) return bad("--kv-peer-index: only with --role decode");
  if (s.kv_peer_index >= s.kv_peers) return bad("--kv-peer-index: must be below --kv-peers");
  if (s.role != "single" && s.host_tier_blocks > 0) return bad("--host-tier-blocks: not with --role " + s.role);

  kvgen::model_weights w;
  if (std::string e = kvgen::load_checkpoint(s.model_dir, w); !e.empty()) return bad(e);
  const std::int32_t max_model_len = s.max_model_len > 0 ? s.max_model_len : w.config.max_position_embeddings;
  std::vector<kvgen::gen_request> reqs;
  if (std::string e = kvgen::read_requests(s.requests, w.config.vocab_size, max_model_len, reqs); !e.empty()) return bad(e);
  if (s.role == "prefill")  // the prompt, one sample, its first token: the decode instance generates the rest
    for (kvgen::gen_request& r : reqs) {
      r.n = 1;
      r.max_tokens = std::min(r.max_tokens, 1);
    }
  const std::int32_t threads =
      s.threads > 0 ? s.threads : static_cast<std::int32_t>(std::max(1U, std::thread::hardware_concurrency()));
  // One pool of threads at a time: OpenBLAS's for the GEMMs, the kernels' for attention, never both at once (the
  // forward pass runs them one after the other), each sized to --threads.
  openblas_set_num_threads(threads);
  if (s.composition == "auto") {
    const auto& wl = w.config.window_left;
    s.composition = std::any_of(wl.begin(), wl.end(), [](std::int32_t x) { return x >= 0; }) ? "kv_groups" : "hybrid_swap";
  }
  if (s.host_tier_blocks > 0 && s.composition != "hybrid_swap" && s.composition != "kv_groups")
    return bad("--host-tier-blocks: the host tier runs with --composition hybrid_swap or kv_groups, not " +
               s.composition);
  if (s.composition == "kv_groups")
    return s.host_tier_blocks > 0
               ? serve<kvpager::kv_groups_lru_tier_cache>(s, w, reqs, dtype, max_model_len, threads)
               : serve<kvpager::kv_groups_swap_cache>(s, w, reqs, dtype, max_model_len, threads);
  if (s.host_tier_blocks > 0) return serve<kvpager::lru_tier_cache>(s, w, reqs, dtype, max_model_len, threads);
  return s.composition == "vllm_v1" ? serve<kvpager::vllm_v1_cache>(s, w, reqs, dtype, max_model_len, threads)
                                    : serve<kvpager::hybrid_swap_cache>(s, w, reqs, dtype, max_model_len, threads);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) {  // nothing above is meant to throw; a message rather than an abort if it does
    std::fprintf(stderr, "kvpager-generate: %s\n", e.what());
    return 1;
  }
}
