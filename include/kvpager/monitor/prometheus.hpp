// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A metrics_snapshot in the Prometheus text exposition format, version 0.0.4 (what a /metrics endpoint serves
/// with `Content-Type: text/plain; version=0.0.4`). Every family has its HELP and TYPE lines; counters end in
/// `_total`; names are prefixed `kvpager:` and are vLLM's where vLLM has the metric (kv_cache_usage_perc,
/// num_requests_running, num_requests_waiting, num_preemptions_total, prefix_cache_queries_total,
/// prefix_cache_hits_total), so vLLM dashboards carry over by changing the prefix. As in vLLM,
/// kv_cache_usage_perc is a fraction in [0, 1], and the prefix hit rate is not a metric of its own: a dashboard
/// divides the counters, `rate(kvpager:prefix_cache_hits_total[5m]) / rate(kvpager:prefix_cache_queries_total[5m])`
/// (metrics_snapshot::prefix_hit_rate and the JSON carry the lifetime rate). The families, in order, are listed by
/// prometheus_family_name(i).
///
/// Dependency-free. The text is written into a caller-owned buffer: a std::string reused across calls (it grows
/// once, to prometheus_max_size(), on the first call; later calls allocate nothing), or a char span of at least
/// prometheus_max_size() bytes (never allocates).
///
/// \code
///   std::string body;  // kept by the HTTP handler
///   kvpager::write_prometheus(body, kvpager::take_snapshot(cache, sched, bytes_per_block));
/// \endcode

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "kvpager/core/config.hpp"
#include "kvpager/core/float_checks.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/monitor/metrics.hpp"

KVPAGER_NAMESPACE_BEGIN

namespace detail {

/// A sample's value: an integer, or a double when `is_double`.
struct prom_value {
  std::int64_t i = 0;
  double d = 0.0;
  bool is_double = false;
};
[[nodiscard]] constexpr prom_value prom_int(std::int64_t v) noexcept { return {v, 0.0, false}; }
[[nodiscard]] constexpr prom_value prom_double(double v) noexcept { return {0, v, true}; }

/// One sample line of a family: its label set ("" or `{name="value"}`) and how to read its value.
struct prom_sample {
  std::string_view labels;
  prom_value (*get)(const metrics_snapshot&) noexcept;
};

/// One metric family: name, type ("gauge", "counter"), HELP text (no backslash, no newline) and 1-3 samples.
struct prom_family {
  std::string_view name;
  std::string_view type;
  std::string_view help;
  std::array<prom_sample, 3> samples;
  std::size_t num_samples = 1;
};

using ms = metrics_snapshot;

// clang-format off
inline constexpr std::array<prom_family, 36> prom_families{{
  {"kvpager:kv_cache_usage_perc", "gauge",
   "KV-cache usage as a fraction in [0, 1] (1 means 100 percent): used blocks over usable blocks, cached unreferenced blocks counted as free (as vLLM).",
   {{{"", [](const ms& m) noexcept { return prom_double(m.kv_cache_usage); }}}}},
  {"kvpager:num_requests_running", "gauge", "Requests with their KV blocks on the device.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.running); }}}}},
  {"kvpager:num_requests_waiting", "gauge", "Requests waiting for admission (including recompute victims).",
   {{{"", [](const ms& m) noexcept { return prom_int(m.waiting); }}}}},
  {"kvpager:num_requests_swapped", "gauge", "Requests swapped out to the host pool.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.swapped); }}}}},
  {"kvpager:kv_cache_block_size", "gauge", "Tokens per KV block.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.block_size); }}}}},
  {"kvpager:kv_cache_block_bytes", "gauge", "Bytes per KV block over all layers (0: not configured).",
   {{{"", [](const ms& m) noexcept { return prom_int(m.bytes_per_block); }}}}},
  {"kvpager:kv_cache_usable_blocks", "gauge", "Blocks of the device pool that can be handed out.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.usable_blocks); }}}}},
  {"kvpager:kv_cache_used_blocks", "gauge", "Blocks an allocation cannot take now (usable minus free minus evictable).",
   {{{"", [](const ms& m) noexcept { return prom_int(m.used_blocks); }}}}},
  {"kvpager:kv_cache_free_blocks", "gauge", "Blocks in the allocator's free set.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.free_blocks); }}}}},
  {"kvpager:kv_cache_evictable_blocks", "gauge", "Cached, unreferenced blocks (reclaimable).",
   {{{"", [](const ms& m) noexcept { return prom_int(m.evictable_blocks); }}}}},
  {"kvpager:kv_cache_cached_blocks", "gauge", "Blocks whose content the prefix cache can find.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.cached_blocks); }}}}},
  {"kvpager:kv_cache_shared_blocks", "gauge", "Physical blocks referenced by more than one sequence.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.shared_blocks); }}}}},
  {"kvpager:kv_cache_logical_blocks", "gauge", "Block references of device block tables.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.logical_blocks); }}}}},
  {"kvpager:kv_cache_referenced_blocks", "gauge", "Physical blocks with at least one reference.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.referenced_blocks); }}}}},
  {"kvpager:kv_cache_shared_fraction", "gauge", "Shared blocks over usable blocks.",
   {{{"", [](const ms& m) noexcept { return prom_double(m.shared_fraction); }}}}},
  {"kvpager:kv_cache_sharing_ratio", "gauge", "Fraction of logical block references served by sharing.",
   {{{"", [](const ms& m) noexcept { return prom_double(m.sharing_ratio); }}}}},
  {"kvpager:internal_waste_tokens", "gauge", "Token slots allocated to live sequences minus the tokens they store.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.internal_waste_tokens); }}}}},
  {"kvpager:internal_waste_bytes", "gauge", "Internal waste in bytes (0: bytes per block not configured).",
   {{{"", [](const ms& m) noexcept { return prom_int(m.internal_waste_bytes); }}}}},
  {"kvpager:num_preemptions_total", "counter", "Preempted requests, either mode (as vLLM).",
   {{{"", [](const ms& m) noexcept { return prom_int(m.preemptions()); }}}}},
  {"kvpager:preemptions_total", "counter", "Preempted requests by mode.",
   {{{"{mode=\"recompute\"}", [](const ms& m) noexcept { return prom_int(m.preemptions_recompute); }},
     {"{mode=\"swap\"}", [](const ms& m) noexcept { return prom_int(m.preemptions_swap); }}}}, 2},
  {"kvpager:swap_fallback_recompute_total", "counter", "Preemptions by recompute because the host pool refused a swap.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.swap_fallback_recompute); }}}}},
  {"kvpager:swaps_total", "counter", "Sequences swapped, by direction.",
   {{{"{direction=\"out\"}", [](const ms& m) noexcept { return prom_int(m.swap_outs); }},
     {"{direction=\"in\"}", [](const ms& m) noexcept { return prom_int(m.swap_ins); }}}}, 2},
  {"kvpager:swapped_blocks_total", "counter", "Blocks copied between device and host, by direction.",
   {{{"{direction=\"out\"}", [](const ms& m) noexcept { return prom_int(m.swapped_out_blocks); }},
     {"{direction=\"in\"}", [](const ms& m) noexcept { return prom_int(m.swapped_in_blocks); }}}}, 2},
  {"kvpager:swapped_bytes_total", "counter", "Bytes copied between device and host, by direction.",
   {{{"{direction=\"out\"}", [](const ms& m) noexcept { return prom_int(m.swapped_out_bytes); }},
     {"{direction=\"in\"}", [](const ms& m) noexcept { return prom_int(m.swapped_in_bytes); }}}}, 2},
  {"kvpager:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache at first admission (as vLLM).",
   {{{"", [](const ms& m) noexcept { return prom_int(m.prefix_queries); }}}}},
  {"kvpager:prefix_cache_hits_total", "counter", "Of those, tokens served from the prefix cache (as vLLM).",
   {{{"", [](const ms& m) noexcept { return prom_int(m.prefix_hits); }}}}},
  {"kvpager:resumed_prefix_cache_queries_total", "counter", "Tokens looked up at re-admission of preempted requests.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.resumed_prefix_queries); }}}}},
  {"kvpager:resumed_prefix_cache_hits_total", "counter", "Of those, tokens served from the prefix cache.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.resumed_prefix_hits); }}}}},
  {"kvpager:evictions_total", "counter", "Cached blocks whose content was discarded to reuse the block.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.evictions); }}}}},
  {"kvpager:admission_answers_total", "counter", "Answers of add_request: ok (fits now), later (queued), never (rejected).",
   {{{"{answer=\"ok\"}", [](const ms& m) noexcept { return prom_int(m.admission_ok); }},
     {"{answer=\"later\"}", [](const ms& m) noexcept { return prom_int(m.admission_later); }},
     {"{answer=\"never\"}", [](const ms& m) noexcept { return prom_int(m.admission_never); }}}}, 3},
  {"kvpager:scheduler_steps_total", "counter", "Scheduler steps.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.steps); }}}}},
  {"kvpager:num_requests_loading", "gauge", "Requests waiting for host tier loads (asynchronous transfers).",
   {{{"", [](const ms& m) noexcept { return prom_int(m.loading); }}}}},
  {"kvpager:prefix_cache_host_hits_total", "counter", "Of prefix_cache_queries, tokens loaded from the host tier.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.prefix_host_hits); }}}}},
  {"kvpager:host_tier_transfers_in_flight", "gauge", "Host tier loads and stores planned and not complete.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.tier_in_flight); }}}}},
  {"kvpager:host_tier_transfer_failures_total", "counter", "Host tier transfers reported failed, by direction.",
   {{{"{direction=\"load\"}", [](const ms& m) noexcept { return prom_int(m.tier_failed_loads); }},
     {"{direction=\"store\"}", [](const ms& m) noexcept { return prom_int(m.tier_failed_stores); }}}}, 2},
  {"kvpager:host_tier_load_timeouts_total", "counter", "Requests whose host tier loads passed the load timeout.",
   {{{"", [](const ms& m) noexcept { return prom_int(m.tier_load_timeouts); }}}}},
}};
// clang-format on

/// The longest text of one value: an int64 (20 characters), or a shortest-round-trip double (at most 24).
inline constexpr std::size_t prom_value_chars = 32;

[[nodiscard]] constexpr std::size_t prom_max_size() noexcept {
  std::size_t n = 0;
  for (const prom_family& f : prom_families) {
    n += 7 + f.name.size() + 1 + f.help.size() + 1;  // "# HELP " name ' ' help '\n'
    n += 7 + f.name.size() + 1 + f.type.size() + 1;  // "# TYPE " name ' ' type '\n'
    for (std::size_t i = 0; i < f.num_samples; ++i)
      n += f.name.size() + f.samples[i].labels.size() + 1 + prom_value_chars + 1;
  }
  return n;
}

/// Appends to a buffer known to be large enough (prom_max_size()).
struct prom_sink {
  char* p;
  void put(std::string_view s) noexcept {
    std::memcpy(p, s.data(), s.size());
    p += s.size();
  }
  void put(char c) noexcept { *p++ = c; }
  void put(const prom_value& v) noexcept {
    char* end = p + prom_value_chars;
    if (!v.is_double) {
      p = std::to_chars(p, end, v.i).ptr;
    } else if (detail::is_nan(v.d)) {
      put(std::string_view("NaN"));
    } else if (!detail::is_finite(v.d)) {
      put(v.d > 0 ? std::string_view("+Inf") : std::string_view("-Inf"));
    } else {
      p = std::to_chars(p, end, v.d).ptr;
    }
  }
};

/// Writes the text into `out` (at least prom_max_size() bytes); returns its length.
inline std::size_t write_prometheus_unchecked(char* out, const metrics_snapshot& m) noexcept {
  prom_sink s{out};
  for (const prom_family& f : prom_families) {
    s.put(std::string_view("# HELP "));
    s.put(f.name);
    s.put(' ');
    s.put(f.help);
    s.put(std::string_view("\n# TYPE "));
    s.put(f.name);
    s.put(' ');
    s.put(f.type);
    s.put('\n');
    for (std::size_t i = 0; i < f.num_samples; ++i) {
      s.put(f.name);
      s.put(f.samples[i].labels);
      s.put(' ');
      s.put(f.samples[i].get(m));
      s.put('\n');
    }
  }
  return static_cast<std::size_t>(s.p - out);
}

}  // namespace detail

/// The most bytes the Prometheus text of a snapshot takes (whatever its values): the size a buffer for
/// write_prometheus needs.
[[nodiscard]] constexpr std::size_t prometheus_max_size() noexcept { return detail::prom_max_size(); }

/// The metric names written, one per family, in order (for documentation and dashboards).
[[nodiscard]] constexpr std::size_t prometheus_num_families() noexcept { return detail::prom_families.size(); }
[[nodiscard]] constexpr std::string_view prometheus_family_name(std::size_t i) noexcept {
  return i < detail::prom_families.size() ? detail::prom_families[i].name : std::string_view{};
}

/// Writes the Prometheus text of `m` into `out` and returns its length. errc::buffer_too_small (detail =
/// prometheus_max_size()) and nothing written when `out` is shorter than prometheus_max_size(). Never allocates.
[[nodiscard]] inline result<std::size_t> write_prometheus(std::span<char> out, const metrics_snapshot& m) noexcept {
  if (out.size() < prometheus_max_size())
    return status{errc::buffer_too_small, "write_prometheus: the buffer is shorter than prometheus_max_size()",
                  static_cast<std::int64_t>(prometheus_max_size())};
  return detail::write_prometheus_unchecked(out.data(), m);
}

/// Replaces the contents of `out` with the Prometheus text of `m`. `out` grows to prometheus_max_size() capacity
/// on the first call; reused, it allocates nothing again.
inline void write_prometheus(std::string& out, const metrics_snapshot& m) {
  out.resize(prometheus_max_size());
  out.resize(detail::write_prometheus_unchecked(out.data(), m));
}

KVPAGER_NAMESPACE_END
