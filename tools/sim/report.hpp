// SPDX-License-Identifier: Apache-2.0
#pragma once
// kvpager-sim's outputs: the side-by-side table, the JSON document, and the report directory (per-step CSV, an SVG
// chart written by hand, the Prometheus text of the last step).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "disaggregated.hpp"
#include "metrics.hpp"
#include "step_chart.hpp"

namespace kvsim {

using ordered_json = nlohmann::ordered_json;

[[nodiscard]] inline ordered_json to_json(const run_summary& s) {
  ordered_json j;
  j["steps"] = s.steps;
  j["completed"] = s.completed;
  j["aborted"] = s.aborted;
  j["output_tokens"] = s.output_tokens;
  j["completed_per_step"] = s.completed_per_step;
  j["peak_batch"] = s.peak_batch;
  j["mean_batch"] = s.mean_batch;
  j["mean_kv_usage"] = s.mean_kv_usage;
  j["mean_token_share"] = s.mean_token_share;
  j["internal_waste"] = s.internal_waste;
  j["mean_external_fragmentation"] = s.mean_external_fragmentation;
  j["peak_external_fragmentation"] = s.peak_external_fragmentation;
  j["preemptions"] = s.preemptions;
  j["preemptions_swap"] = s.preemptions_swap;
  j["preemptions_recompute"] = s.preemptions_recompute;
  j["swap_outs"] = s.swap_outs;
  j["swap_ins"] = s.swap_ins;
  j["prefix_hit_rate"] = s.prefix_hit_rate;
  j["prefix_hit_tokens"] = s.prefix_hit_tokens;
  j["prefix_query_tokens"] = s.prefix_query_tokens;
  j["prefix_hit_tokens_device"] = s.prefix_hit_tokens_device;
  j["prefix_hit_tokens_host"] = s.prefix_hit_tokens_host;
  // Prompt tokens computed: neither tier served them (recomputed where an earlier turn had computed them).
  j["prompt_tokens_computed"] = s.prefix_query_tokens - s.prefix_hit_tokens;
  j["tier_loads"] = s.tier_loads;
  j["tier_stores"] = s.tier_stores;
  // Device-to-host copies per block loaded back (a store that is never reused is the tier's cost), and all bytes
  // moved by the tier (stores and loads) per reused block.
  j["tier_stores_per_reused_block"] = s.tier_loads > 0 ? double(s.tier_stores) / double(s.tier_loads) : 0.0;
  j["tier_bytes_per_reused_block"] =
      s.tier_loads > 0 ? double(s.tier_stores + s.tier_loads) * double(s.bytes_per_block) / double(s.tier_loads) : 0.0;
  ordered_json h;
  for (std::size_t i = 0; i < s.health_steps.size(); ++i)
    h[kvpager::to_string(static_cast<kvpager::health_level>(i))] = s.health_steps[i];
  j["health_steps"] = h;
  j["wall_s"] = s.wall_s;
  return j;
}

/// The side-by-side table on stdout: the summaries one column each (title, summary), in the order given (24
/// characters a column for two, 20 for more).
inline void print_table(std::initializer_list<std::pair<const char*, const run_summary*>> columns) {
  const int width = columns.size() <= 2 ? 24 : 20;
  auto num = [](double v, const char* fmt) {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v);
    return std::string(buf);
  };
  auto pct = [&](double v) { return num(100.0 * v, "%.1f%%"); };
  auto i64 = [](std::int64_t v) { return std::to_string(v); };
  auto row = [&](const char* name, auto value) {
    std::printf("  %-36s", name);
    for (const auto& [title, p] : columns) std::printf(" %*s", width, value(*p).c_str());
    std::printf("\n");
  };
  std::printf("  %-36s", "");
  for (const auto& [title, p] : columns) std::printf(" %*s", width, title);
  std::printf("\n");
  using S = const run_summary&;
  row("steps", [&](S p) { return i64(p.steps); });
  row("requests completed", [&](S p) { return i64(p.completed); });
  row("requests completed per step", [&](S p) { return num(p.completed_per_step, "%.4f"); });
  row("batch size, peak", [&](S p) { return i64(p.peak_batch); });
  row("batch size, mean", [&](S p) { return num(p.mean_batch, "%.1f"); });
  row("KV allocated, mean (share of pool)", [&](S p) { return pct(p.mean_kv_usage); });
  row("KV holding tokens, mean (share)", [&](S p) { return pct(p.mean_token_share); });
  row("internal waste (allocated, empty)", [&](S p) { return pct(p.internal_waste); });
  row("external fragmentation, mean", [&](S p) { return pct(p.mean_external_fragmentation); });
  row("external fragmentation, peak", [&](S p) { return pct(p.peak_external_fragmentation); });
  row("preemptions (swap + recompute)", [&](S p) {
    return p.system == "contiguous" ? i64(p.preemptions) : i64(p.preemptions_swap) + " + " + i64(p.preemptions_recompute);
  });
  row("swaps (out / in)", [&](S p) { return i64(p.swap_outs) + " / " + i64(p.swap_ins); });
  row("prefix hit rate (tokens)", [&](S p) { return pct(p.prefix_hit_rate); });
  row("prefix hit tokens, device / host", [&](S p) {
    return i64(p.prefix_hit_tokens_device) + " / " + i64(p.prefix_hit_tokens_host);
  });
  row("host tier blocks, stored / loaded", [&](S p) { return i64(p.tier_stores) + " / " + i64(p.tier_loads); });
  row("health levels seen", [&](S p) { return levels_seen(p); });
  row("aborted or rejected", [&](S p) { return i64(p.aborted); });
  row("wall time", [&](S p) { return num(p.wall_s, "%.2f s"); });
}

/// Paged against contiguous.
inline void print_table(const run_summary& p, const run_summary& c) { print_table({{"paged", &p}, {"contiguous", &c}}); }

/// --disaggregated's section of --json: the shape and pools, how every request ended, the transfers (bytes, tokens,
/// wall-clock time, share of the time to first token), the check of the received KV, both instances, and each
/// request's figures.
[[nodiscard]] inline ordered_json to_json(const disagg_summary& d, const disagg_options& o) {
  ordered_json j;
  j["transport"] = d.transport;
  j["layers"] = o.shape.layers;
  j["model_layers"] = disagg_shape::model_layers;
  j["kv_heads"] = disagg_shape::kv_heads;
  j["head_dim"] = disagg_shape::head_dim;
  j["dtype"] = "fp16";
  j["bytes_per_token"] = o.shape.bytes_per_token();
  // KV cache groups (--layers): one table per group; each transfer layer reads through its group's table.
  j["tables"] = o.groups.empty() ? 1 : static_cast<std::int64_t>(o.groups.size());
  j["transfer_layers"] = disagg_transfer_layers(o);
  j["layer_block_bytes"] = std::int64_t{o.cache.block_size} * (o.shape.bytes_per_token() / o.shape.layers);
  j["pool_bytes"] = disagg_pool_bytes(o.cache, o.shape);
  j["step_s"] = o.step_s;
  j["prefill_s_per_token"] = o.prefill_s_per_token;
  j["requests"] = d.requests;
  j["samples"] = d.samples;
  j["finished"] = d.finished;
  j["rejected"] = d.rejected;
  ordered_json why = ordered_json::object();
  for (const auto& [reason, n] : d.rejected_reasons) why[reason] = n;
  j["rejected_reasons"] = why;
  j["output_tokens"] = d.output_tokens;
  j["offered"] = d.offered;
  j["declined"] = d.declined;
  j["reads"] = d.reads;
  j["reads_failed"] = d.reads_failed;
  j["declined_released"] = d.declined_released;
  j["declined_stale"] = d.declined_stale;
  j["kv_offered_tokens"] = d.kv_offered_tokens;
  j["kv_read_tokens"] = d.kv_read_tokens;
  j["kv_transfer_bytes"] = d.kv_transfer_bytes;
  j["kv_read_entries"] = d.kv_read_entries;
  j["kv_read_layer_blocks"] = d.kv_read_layer_blocks;
  j["kv_transfer_s"] = d.kv_transfer_s;
  j["mean_transfer_s"] = d.mean_transfer_s;
  j["mean_ttft_s"] = d.mean_ttft_s;
  j["mean_transfer_share_of_ttft"] = d.mean_transfer_share;
  j["external_waits"] = d.external_waits;
  j["external_failures"] = d.external_failures;
  j["recomputed_locally"] = d.recomputed_locally;
  j["link_lost"] = d.link_lost;
  j["released_on_loss"] = d.released_on_loss;
  j["check"] = {{"reads_checked", d.reads_checked},
                {"blocks_checked", d.blocks_checked},
                {"mismatches", d.mismatches},
                {"first_mismatch", d.first_mismatch},
                {"ok", d.mismatches == 0}};
  j["pools_empty"] = {{"prefill", d.prefill.pools_empty}, {"decode", d.decode.pools_empty}};
  for (const auto& [name, f] : {std::pair{"prefill", &d.prefill}, std::pair{"decode", &d.decode}})
    j[name] = {{"steps", f->steps},           {"simulated_s", f->simulated_s}, {"prefix_hit_rate", f->prefix_hit_rate},
               {"preemptions", f->preemptions}, {"swap_outs", f->swap_outs}};
  ordered_json per = ordered_json::array();
  for (const disagg_request& q : d.per_request)
    per.push_back({{"id", q.id},
                   {"read_tokens", q.read_tokens},
                   {"transfer_s", q.transfer_s},
                   {"ttft_s", q.ttft_s},
                   {"transfer_share_of_ttft", q.ttft_s > 0 ? q.transfer_s / q.ttft_s : 0.0}});
  j["per_request"] = per;
  j["ok"] = d.ok();
  j["wall_s"] = d.wall_s;
  return j;
}

/// --disaggregated's section of the table.
inline void print_disaggregated(const disagg_summary& d, const disagg_options& o) {
  const auto mib = [](double b) { return b / (1024.0 * 1024.0); };
  std::printf("\ndisaggregated: a prefill and a decode instance (%s), %s transport, pools of %d of Llama-2-7B's %d "
              "layers (%lld KiB of KV a token, %.0f MiB of pools in all)\n",
              o.groups.empty() ? o.composition.c_str() : "kv_groups_swap", d.transport.c_str(), o.shape.layers,
              disagg_shape::model_layers,
              static_cast<long long>(o.shape.bytes_per_token() / 1024),
              mib(static_cast<double>(disagg_pool_bytes(o.cache, o.shape))));
  if (!o.groups.empty())
    std::printf("  %zu KV cache groups (vLLM's grouping), the pools holding %d layer%s of each group's block: %d "
                "layers read, each through its group's table\n",
                o.groups.size(), o.shape.layers, o.shape.layers == 1 ? "" : "s", disagg_transfer_layers(o));
  std::printf("  %-44s %lld of %lld samples (%lld rejected)\n", "finished on the decode instance",
              static_cast<long long>(d.finished), static_cast<long long>(d.samples), static_cast<long long>(d.rejected));
  for (const auto& [reason, n] : d.rejected_reasons)
    std::printf("  %-44s %lld samples: %s\n", "  rejected", static_cast<long long>(n), reason.c_str());
  std::printf("  %-44s %lld\n", "output tokens", static_cast<long long>(d.output_tokens));
  std::printf("  %-44s %lld / %lld / %lld\n", "offers / reads / declined (nothing to read)",
              static_cast<long long>(d.offered), static_cast<long long>(d.reads), static_cast<long long>(d.declined));
  std::printf("  %-44s %lld of %lld offered tokens, %.1f MiB in %.4f s\n", "KV transferred",
              static_cast<long long>(d.kv_read_tokens), static_cast<long long>(d.kv_offered_tokens),
              mib(static_cast<double>(d.kv_transfer_bytes)), d.kv_transfer_s);
  std::printf("  %-44s %.3f ms\n", "transfer time per request read, mean", 1e3 * d.mean_transfer_s);
  std::printf("  %-44s %.2f%% (time to first token, mean %.3f s)\n", "transfer share of time to first token, mean",
              100.0 * d.mean_transfer_share, d.mean_ttft_s);
  if (!o.groups.empty())
    std::printf("  %-44s %lld of %lld table entries (the rest a window's null block)\n", "table entries read",
                static_cast<long long>(d.kv_read_entries),
                static_cast<long long>(d.kv_read_tokens / o.cache.block_size *
                                       static_cast<std::int64_t>(o.groups.size())));
  std::printf("  %-44s %lld / %lld\n", "external failures / recomputed locally",
              static_cast<long long>(d.external_failures), static_cast<long long>(d.recomputed_locally));
  if (d.declined_released > 0)
    std::printf("  %-44s %lld (computed on the decode instance)\n", "declined: a window block already released",
                static_cast<long long>(d.declined_released));
  if (d.declined_stale > 0)
    std::printf("  %-44s %lld (computed on the decode instance)\n", "declined: remote keys that no longer match",
                static_cast<long long>(d.declined_stale));
  if (d.link_lost)
    std::printf("  %-44s %lld held requests released by the prefill instance\n", "the connection was lost",
                static_cast<long long>(d.released_on_loss));
  std::printf("  %-44s %lld reads, %lld blocks: %s\n", "received KV checked", static_cast<long long>(d.reads_checked),
              static_cast<long long>(d.blocks_checked), d.mismatches == 0 ? "all match" : "MISMATCH");
  std::printf("  %-44s prefill %s, decode %s\n", "pools empty at the end", d.prefill.pools_empty ? "yes" : "NO",
              d.decode.pools_empty ? "yes" : "NO");
  std::printf("  %-44s prefill %lld (%.1f s), decode %lld (%.1f s)\n", "steps (simulated time)",
              static_cast<long long>(d.prefill.steps), d.prefill.simulated_s, static_cast<long long>(d.decode.steps),
              d.decode.simulated_s);
  std::printf("  %-44s %.2f s\n", "wall time", d.wall_s);
}

/// One CSV row per sample and system: per step, except that a row of span k stands for k identical idle steps, and a
/// run longer than the history keeps only every stride-th sample (step_history; --json says the stride).
inline bool write_csv(const std::string& path, const std::vector<step_sample>& paged,
                      const std::vector<step_sample>& contiguous) {
  std::ofstream f(path);
  if (!f) return false;
  f << "system,step,running,waiting,swapped,batched_tokens,allocated_slots,stored_tokens,pool_slots,kv_usage,"
       "external_fragmentation,completed,preemptions,swaps,health,span\n";
  for (const auto* v : {&paged, &contiguous})
    for (const step_sample& x : *v) {
      char buf[512];
      std::snprintf(buf, sizeof buf, "%s,%lld,%d,%d,%d,%lld,%lld,%lld,%lld,%.6f,%.6f,%lld,%lld,%lld,%s,%lld\n",
                    v == &paged ? "paged" : "contiguous", static_cast<long long>(x.step), x.running, x.waiting,
                    x.swapped, static_cast<long long>(x.batched_tokens), static_cast<long long>(x.allocated_slots),
                    static_cast<long long>(x.stored_tokens), static_cast<long long>(x.pool_slots), x.kv_usage,
                    x.external_fragmentation, static_cast<long long>(x.completed),
                    static_cast<long long>(x.preemptions), static_cast<long long>(x.swaps),
                    kvpager::to_string(x.health), static_cast<long long>(x.span));
      f << buf;
    }
  return static_cast<bool>(f);
}

/// The chart (tools/common/step_chart.hpp): paged against contiguous.
inline bool write_svg(const std::string& path, const std::string& title, const std::vector<step_sample>& paged,
                      const std::vector<step_sample>& contiguous) {
  const auto points = [](const std::vector<step_sample>& v) {
    std::vector<kvtools::chart_point> p;
    p.reserve(v.size());
    for (const step_sample& x : v)
      p.push_back({x.step, x.span, x.kv_usage, static_cast<double>(x.running), static_cast<double>(x.waiting),
                   static_cast<double>(x.swaps)});
    return p;
  };
  return kvtools::write_step_chart(path, title,
                                   {{"paged (kvpager)", "#1f77b4", points(paged)},
                                    {"contiguous (max_model_len reserved per request)", "#ff7f0e", points(contiguous)}});
}

}  // namespace kvsim
