// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// A metrics_snapshot as JSON, through nlohmann-json. The one header of kvpager that needs a third-party library:
/// include it only where nlohmann-json (3.x, `find_package(nlohmann_json 3)`, Debian's nlohmann-json3-dev) is on
/// the include path; kvpager.hpp does not include it.
///
/// metrics_json_writer builds the JSON document once, keeps a reference to each number in it and, per call,
/// overwrites the numbers and serializes the document into a string reserved at construction: writing allocates
/// nothing (nlohmann's own dump() would allocate its serializer and output adapter on every call, so the writer
/// keeps one of each; the serializer is nlohmann's `detail::serializer`, the class dump() itself uses).
///
/// \code
///   kvpager::metrics_json_writer json;  // once (allocates)
///   const std::string& text = json.write(kvpager::take_snapshot(cache, sched, bytes_per_block));  // every scrape
/// \endcode
/// The document (keys in alphabetical order, as nlohmann's default object keeps them):
/// \code
///   {"admission":{"admitted":..,"later":..,"never":..,"ok":..},
///    "host_tier":{"failed_loads":..,"failed_stores":..,"in_flight":..,"load_timeouts":..},
///    "internal_waste":{"bytes":..,"tokens":..},
///    "kv_cache":{"block_bytes":..,"block_size":..,"cached_blocks":..,"evictable_blocks":..,"free_blocks":..,
///                "usable_blocks":..,"usage":<fraction>,"used_blocks":..},
///    "preemptions":{"recompute":..,"swap":..,"swap_fallback_recompute":..,"total":..},
///    "prefix_cache":{"evictions":..,"hit_rate":..,"hits":..,"host_hits":..,"queries":..,"resumed_hits":..,
///                    "resumed_queries":..},
///    "requests":{"loading":..,"running":..,"swapped":..,"waiting":..},
///    "sharing":{"logical_blocks":..,"referenced_blocks":..,"shared_blocks":..,"shared_fraction":..,
///               "sharing_ratio":..},
///    "steps":..,
///    "swaps":{"in_blocks":..,"in_bytes":..,"ins":..,"out_blocks":..,"out_bytes":..,"outs":..}}
/// \endcode

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kvpager/core/config.hpp"
#include "kvpager/monitor/metrics.hpp"

static_assert(NLOHMANN_JSON_VERSION_MAJOR == 3,
              "kvpager/monitor/json.hpp uses nlohmann-json 3.x's serializer (nlohmann::detail::serializer)");

KVPAGER_NAMESPACE_BEGIN

namespace detail {

/// One number of the document: its object ("" = top level), key, and value (integer, or double when is_double).
struct json_field {
  std::string_view group;
  std::string_view key;
  bool is_double;
  std::int64_t (*get_int)(const metrics_snapshot&) noexcept;
  double (*get_double)(const metrics_snapshot&) noexcept;
};

using jm = metrics_snapshot;
#define KVPAGER_JSON_INT(group, key, expr) \
  json_field { group, key, false, [](const jm& m) noexcept -> std::int64_t { return expr; }, nullptr }
#define KVPAGER_JSON_DOUBLE(group, key, expr) \
  json_field { group, key, true, nullptr, [](const jm& m) noexcept -> double { return expr; } }

// clang-format off
inline constexpr std::array<json_field, 45> json_fields{{
  KVPAGER_JSON_INT("kv_cache", "block_size", m.block_size),
  KVPAGER_JSON_INT("kv_cache", "block_bytes", m.bytes_per_block),
  KVPAGER_JSON_INT("kv_cache", "usable_blocks", m.usable_blocks),
  KVPAGER_JSON_INT("kv_cache", "used_blocks", m.used_blocks),
  KVPAGER_JSON_INT("kv_cache", "free_blocks", m.free_blocks),
  KVPAGER_JSON_INT("kv_cache", "evictable_blocks", m.evictable_blocks),
  KVPAGER_JSON_INT("kv_cache", "cached_blocks", m.cached_blocks),
  KVPAGER_JSON_DOUBLE("kv_cache", "usage", m.kv_cache_usage),
  KVPAGER_JSON_INT("requests", "running", m.running),
  KVPAGER_JSON_INT("requests", "waiting", m.waiting),
  KVPAGER_JSON_INT("requests", "swapped", m.swapped),
  KVPAGER_JSON_INT("swaps", "outs", m.swap_outs),
  KVPAGER_JSON_INT("swaps", "ins", m.swap_ins),
  KVPAGER_JSON_INT("swaps", "out_blocks", m.swapped_out_blocks),
  KVPAGER_JSON_INT("swaps", "in_blocks", m.swapped_in_blocks),
  KVPAGER_JSON_INT("swaps", "out_bytes", m.swapped_out_bytes),
  KVPAGER_JSON_INT("swaps", "in_bytes", m.swapped_in_bytes),
  KVPAGER_JSON_INT("preemptions", "recompute", m.preemptions_recompute),
  KVPAGER_JSON_INT("preemptions", "swap", m.preemptions_swap),
  KVPAGER_JSON_INT("preemptions", "swap_fallback_recompute", m.swap_fallback_recompute),
  KVPAGER_JSON_INT("preemptions", "total", m.preemptions()),
  KVPAGER_JSON_INT("sharing", "shared_blocks", m.shared_blocks),
  KVPAGER_JSON_INT("sharing", "logical_blocks", m.logical_blocks),
  KVPAGER_JSON_INT("sharing", "referenced_blocks", m.referenced_blocks),
  KVPAGER_JSON_DOUBLE("sharing", "shared_fraction", m.shared_fraction),
  KVPAGER_JSON_DOUBLE("sharing", "sharing_ratio", m.sharing_ratio),
  KVPAGER_JSON_INT("prefix_cache", "queries", m.prefix_queries),
  KVPAGER_JSON_INT("prefix_cache", "hits", m.prefix_hits),
  KVPAGER_JSON_DOUBLE("prefix_cache", "hit_rate", m.prefix_hit_rate),
  KVPAGER_JSON_INT("prefix_cache", "resumed_queries", m.resumed_prefix_queries),
  KVPAGER_JSON_INT("prefix_cache", "resumed_hits", m.resumed_prefix_hits),
  KVPAGER_JSON_INT("prefix_cache", "evictions", m.evictions),
  KVPAGER_JSON_INT("internal_waste", "tokens", m.internal_waste_tokens),
  KVPAGER_JSON_INT("internal_waste", "bytes", m.internal_waste_bytes),
  KVPAGER_JSON_INT("admission", "ok", m.admission_ok),
  KVPAGER_JSON_INT("admission", "later", m.admission_later),
  KVPAGER_JSON_INT("admission", "never", m.admission_never),
  KVPAGER_JSON_INT("admission", "admitted", m.admitted),
  KVPAGER_JSON_INT("", "steps", m.steps),
  KVPAGER_JSON_INT("requests", "loading", m.loading),
  KVPAGER_JSON_INT("prefix_cache", "host_hits", m.prefix_host_hits),
  KVPAGER_JSON_INT("host_tier", "in_flight", m.tier_in_flight),
  KVPAGER_JSON_INT("host_tier", "failed_loads", m.tier_failed_loads),
  KVPAGER_JSON_INT("host_tier", "failed_stores", m.tier_failed_stores),
  KVPAGER_JSON_INT("host_tier", "load_timeouts", m.tier_load_timeouts),
}};
// clang-format on
#undef KVPAGER_JSON_INT
#undef KVPAGER_JSON_DOUBLE

/// The node of field `f` in `doc`, created (as 0 of the field's kind) if missing.
inline nlohmann::json& json_node(nlohmann::json& doc, const json_field& f) {
  nlohmann::json& parent = f.group.empty() ? doc : doc[std::string(f.group)];
  return parent[std::string(f.key)];
}

/// Appends to a std::string whose capacity the writer reserved (no reallocation while it lasts).
class json_string_output final : public nlohmann::detail::output_adapter_protocol<char> {
 public:
  explicit json_string_output(std::string& s) noexcept : s_(s) {}
  void write_character(char c) override { s_.push_back(c); }
  void write_characters(const char* p, std::size_t n) override { s_.append(p, n); }

 private:
  std::string& s_;
};

}  // namespace detail

/// Sets every field of `j` from `m` (nlohmann's to_json customization point: `nlohmann::json j = snapshot;`).
/// Allocates; for a writer that does not, see metrics_json_writer.
inline void to_json(nlohmann::json& j, const metrics_snapshot& m) {
  j = nlohmann::json::object();
  for (const detail::json_field& f : detail::json_fields) {
    if (f.is_double) {
      detail::json_node(j, f) = f.get_double(m);
    } else {
      detail::json_node(j, f) = f.get_int(m);
    }
  }
}

/// Writes snapshots as JSON text, reusing one document, one serializer and one string: write() allocates nothing.
class metrics_json_writer {
 public:
  /// Builds the document and reserves the text for any values. `indent` < 0: compact; otherwise pretty-printed
  /// with that many spaces per level (at most 64).
  explicit metrics_json_writer(int indent = -1)
      : out_(std::make_shared<detail::json_string_output>(text_)), indent_(indent < 0 ? -1 : std::min(indent, 64)) {
    to_json(doc_, metrics_snapshot{});
    for (std::size_t i = 0; i < detail::json_fields.size(); ++i)
      nodes_[i] = &detail::json_node(doc_, detail::json_fields[i]);
    serializer_ = std::make_unique<serializer_type>(out_, ' ');
    // The longest text: the all-zero document, each number grown to its longest (32 characters bound both an
    // int64 and a shortest-round-trip double).
    serialize();
    text_.reserve(text_.size() + 32 * detail::json_fields.size());
  }
  metrics_json_writer(const metrics_json_writer&) = delete;
  metrics_json_writer& operator=(const metrics_json_writer&) = delete;

  /// The JSON text of `m`, valid until the next write(). Allocates nothing.
  const std::string& write(const metrics_snapshot& m) {
    for (std::size_t i = 0; i < detail::json_fields.size(); ++i) {
      const detail::json_field& f = detail::json_fields[i];
      if (f.is_double) {
        nodes_[i]->get_ref<nlohmann::json::number_float_t&>() = f.get_double(m);
      } else {
        nodes_[i]->get_ref<nlohmann::json::number_integer_t&>() = f.get_int(m);
      }
    }
    serialize();
    return text_;
  }

  /// The text of the last write() (of a zero snapshot before the first).
  [[nodiscard]] const std::string& text() const noexcept { return text_; }
  /// The document of the last write().
  [[nodiscard]] const nlohmann::json& document() const noexcept { return doc_; }

 private:
  using serializer_type = nlohmann::detail::serializer<nlohmann::json>;

  void serialize() {
    text_.clear();
    serializer_->dump(doc_, indent_ >= 0, false, indent_ >= 0 ? static_cast<unsigned>(indent_) : 0U);
  }

  nlohmann::json doc_;
  std::array<nlohmann::json*, detail::json_fields.size()> nodes_{};
  std::string text_;
  std::shared_ptr<detail::json_string_output> out_;
  std::unique_ptr<serializer_type> serializer_;
  int indent_;
};

KVPAGER_NAMESPACE_END
