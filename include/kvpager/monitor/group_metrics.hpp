// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Per-group figures of a cache with KV cache groups (hybrid_kv_cache), beside the pool-wide metrics_snapshot:
/// each group's blocks in use (and that share of the usable pool), its peak, its table entries (null ones
/// included: what one full-attention group would hold), the blocks its window released and the blocks prefix hits
/// brought back. vLLM reports only the pool's usage (kv_cache_usage_perc), so these are kvpager's own names, one
/// sample per group labelled `group` (its index) and `kind` ("full", "sliding_window 128", "chunked_local 8192"):
///
///   kvpager:kv_cache_group_usage_perc, kvpager:kv_cache_group_blocks, kvpager:kv_cache_group_peak_blocks,
///   kvpager:kv_cache_group_table_entries (gauges); kvpager:kv_cache_group_released_blocks_total,
///   kvpager:kv_cache_group_prefix_hit_blocks_total (counters).
///
/// \code
///   std::array<kvpager::group_metrics, 8> groups;
///   const std::size_t n = kvpager::take_group_snapshots(cache, groups);
///   kvpager::write_prometheus(body, snapshot);
///   kvpager::append_group_prometheus(body, std::span(groups).first(n));
/// \endcode

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>

#include "kvpager/core/config.hpp"
#include "kvpager/groups/vllm_hit.hpp"

KVPAGER_NAMESPACE_BEGIN

/// One KV cache group's figures (take_group_snapshots).
struct group_metrics {
  std::int32_t group = 0;
  char kind[40] = {};                ///< "full", "sliding_window 128", "chunked_local 8192", or the kind's kind_name
  std::int32_t blocks = 0;           ///< blocks with references that belong to the group
  std::int32_t peak_blocks = 0;      ///< the most `blocks` after any allocation
  std::int64_t table_entries = 0;    ///< entries of its live tables, null ones included
  std::int64_t released_blocks = 0;  ///< entries its window release replaced by the null block (counter)
  std::int64_t hit_blocks = 0;       ///< cached blocks admissions took into its tables (counter)
  double usage = 0.0;                ///< blocks / the pool's usable blocks
};

namespace detail {
inline void group_kind_label(char (&out)[40], const char* name, std::int64_t size) noexcept {
  std::size_t n = 0;
  for (const char* p = name; *p != '\0' && n + 1 < sizeof out; ++p) {  // a label value with nothing to escape
    const char c = *p;
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    out[n++] = plain ? c : '_';
  }
  if (size > 0 && n + 1 < sizeof out) {
    out[n++] = ' ';
    char digits[24];
    std::size_t d = 0;
    for (std::uint64_t v = static_cast<std::uint64_t>(size); v > 0 && d < sizeof digits; v /= 10)
      digits[d++] = static_cast<char>('0' + v % 10);
    while (d > 0 && n + 1 < sizeof out) out[n++] = digits[--d];
  }
  out[n] = '\0';
}
}  // namespace detail

/// Fills `out` with the figures of `cache`'s groups, in group order (at most out.size() of them); returns how many.
/// O(groups), allocates nothing.
template <class Cache>
  requires requires(const Cache& c) { c.num_groups(); }
std::size_t take_group_snapshots(const Cache& cache, std::span<group_metrics> out) noexcept {
  const auto usable = static_cast<double>(cache.config().num_blocks - cache.config().reserved_blocks);
  std::size_t n = 0;
  for (std::int32_t g = 0; g < cache.num_groups() && n < out.size(); ++g, ++n) {
    group_metrics& m = out[n];
    const auto& s = cache.stats(g);
    m.group = g;
    const vllm_kind vk = vllm_kind_of(cache.kind(g));
    switch (vk.tag) {
      case vllm_kind_tag::full: detail::group_kind_label(m.kind, "full", 0); break;
      case vllm_kind_tag::sliding_window: detail::group_kind_label(m.kind, "sliding_window", vk.size); break;
      case vllm_kind_tag::chunked_local: detail::group_kind_label(m.kind, "chunked_local", vk.size); break;
      default: {
        using K = typename Cache::kind_type;
        if constexpr (requires { cache.kind(g).name(); }) {
          detail::group_kind_label(m.kind, cache.kind(g).name(), 0);
        } else {
          detail::group_kind_label(m.kind, K::kind_name, 0);
        }
      }
    }
    m.blocks = s.blocks;
    m.peak_blocks = s.peak_blocks;
    m.table_entries = s.table_entries;
    m.released_blocks = s.skipped_blocks;
    m.hit_blocks = s.hit_blocks;
    m.usage = usable > 0 ? static_cast<double>(s.blocks) / usable : 0.0;
  }
  return n;
}

/// Appends the Prometheus text (format 0.0.4) of `groups` to `out`: six families, HELP and TYPE first, one sample
/// per group. Nothing is appended for no group.
inline void append_group_prometheus(std::string& out, std::span<const group_metrics> groups) {
  if (groups.empty()) return;
  struct family {
    const char* name;
    const char* type;
    const char* help;
  };
  static constexpr family families[] = {
      {"kvpager:kv_cache_group_usage_perc", "gauge", "Share of the usable blocks the KV cache group holds (0-1)."},
      {"kvpager:kv_cache_group_blocks", "gauge", "Blocks in use by the KV cache group."},
      {"kvpager:kv_cache_group_peak_blocks", "gauge", "The most blocks the KV cache group held after an allocation."},
      {"kvpager:kv_cache_group_table_entries", "gauge",
       "Entries of the group's block tables, null ones included (what one full-attention group would hold)."},
      {"kvpager:kv_cache_group_released_blocks_total", "counter",
       "Table entries the group's window released to the pool."},
      {"kvpager:kv_cache_group_prefix_hit_blocks_total", "counter",
       "Cached blocks prefix hits brought into the group's tables."},
  };
  for (std::size_t f = 0; f < std::size(families); ++f) {
    out += "# HELP ";
    out += families[f].name;
    out += ' ';
    out += families[f].help;
    out += "\n# TYPE ";
    out += families[f].name;
    out += ' ';
    out += families[f].type;
    out += '\n';
    for (const group_metrics& m : groups) {
      out += families[f].name;
      out += "{group=\"";
      out += std::to_string(m.group);
      out += "\",kind=\"";
      out += m.kind;  // letters, digits, '_' and one space: nothing to escape
      out += "\"} ";
      switch (f) {
        case 0: {
          char buf[32];
          const auto r = std::to_chars(buf, buf + sizeof buf, m.usage);
          out.append(buf, r.ptr);
          break;
        }
        case 1: out += std::to_string(m.blocks); break;
        case 2: out += std::to_string(m.peak_blocks); break;
        case 3: out += std::to_string(m.table_entries); break;
        case 4: out += std::to_string(m.released_blocks); break;
        default: out += std::to_string(m.hit_blocks); break;
      }
      out += '\n';
    }
  }
}

KVPAGER_NAMESPACE_END
