// SPDX-License-Identifier: Apache-2.0
#pragma once
// kvpager-sim --layers: a model's attention kinds per layer, as a pattern ("full:12,swa128:12") or a built-in
// model, and the KV cache groups vLLM's hybrid manager forms from them (kv_cache_utils: layers bucketed by kind in
// order of first appearance, the group size the rarest kind's count unless every count is within 1.5x of the
// largest, each kind split into groups of that size, a short group padded). A block of the shared pool holds one
// group's layers, so at the same KV bytes the pool has layers / group_size times the blocks of one full group.

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kvpager/groups/group_kind_variant.hpp>
#include <kvpager/groups/layer_grouping.hpp>
#include <kvpager/groups/vllm_hit.hpp>

namespace kvsim {

struct layer_kind {
  kvpager::any_group_kind kind;
  std::string name;       ///< "full", "sliding_window 128", "chunked_local 8192"
  std::int32_t layers = 0;
};

/// The layers of a model and the groups vLLM forms.
struct layer_plan {
  std::string source;                        ///< the --layers value
  std::vector<layer_kind> kinds;             ///< in order of first appearance
  std::int32_t num_layers = 0;
  std::int32_t group_size = 0;               ///< layers per group (a block holds that many layers)
  std::vector<kvpager::any_group_kind> groups;  ///< in group order
  std::vector<std::string> group_names;
  /// Each group's layers of the model (group_size, or fewer in the last group of a kind: the rest is padding).
  std::vector<std::int32_t> group_layers;
  std::int32_t padding_layers = 0;           ///< groups x group_size - layers
};

/// The built-in models' layer patterns (config.json facts: docs/notes/hybrid_models.md).
inline const std::vector<std::pair<std::string_view, std::string_view>>& builtin_layer_patterns() {
  static const std::vector<std::pair<std::string_view, std::string_view>> m = {
      {"gpt-oss-20b", "swa128:12,full:12"},        // 24 layers, sliding 128 on even layers
      {"gpt-oss-120b", "swa128:18,full:18"},       // 36 layers
      {"gemma-2-9b", "swa4096:21,full:21"},        // 42 layers, sliding 4096 on even layers
      {"gemma-2-27b", "swa4096:23,full:23"},       // 46 layers
      {"gemma-3-12b", "swa1024:40,full:8"},        // 48 layers, 5 local to 1 global
      {"gemma-3-27b", "swa1024:52,full:10"},       // 62 layers
      {"mistral-7b-v0.1", "swa4096:32"},           // every layer sliding 4096
      {"llama-4-scout", "chunk8192:36,full:12"},   // 48 layers, chunked local 8192 on the RoPE layers
  };
  return m;
}

/// Parses `spec` (a pattern or a built-in model name) into `plan`; "" or an error naming the bad part.
inline std::string parse_layers(const std::string& spec, layer_plan& plan) {
  plan = layer_plan{};
  plan.source = spec;
  std::string pattern = spec;
  for (const auto& [name, p] : builtin_layer_patterns())
    if (spec == name) pattern = std::string(p);
  std::string models;
  for (const auto& [name, p] : builtin_layer_patterns()) models += (models.empty() ? "" : ", ") + std::string(name);
  const std::string usage = " (kind:count,... with kind full, swa<W> or chunk<C>; or a model: " + models + ")";
  for (std::size_t at = 0; at <= pattern.size();) {
    const std::size_t comma = std::min(pattern.find(',', at), pattern.size());
    const std::string item = pattern.substr(at, comma - at);
    at = comma + 1;
    const std::size_t colon = item.find(':');
    if (colon == std::string::npos) return "--layers: '" + item + "' is not kind:count" + usage;
    const std::string kind = item.substr(0, colon), count = item.substr(colon + 1);
    const auto number = [](const std::string& s, std::int64_t lo, std::int64_t hi, std::int64_t& v) {
      if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
      v = std::stoll(s);
      return v >= lo && v <= hi;
    };
    std::int64_t n = 0, size = 0;
    if (!number(count, 1, 1024, n)) return "--layers: the count of '" + item + "' must be 1 to 1024" + usage;
    layer_kind k;
    if (kind == "full") {
      k.kind = kvpager::full_attention{};
      k.name = "full";
    } else if (kind.rfind("swa", 0) == 0 && number(kind.substr(3), 1, 1 << 24, size)) {
      k.kind = kvpager::sliding_window{size};
      k.name = "sliding_window " + std::to_string(size);
    } else if (kind.rfind("chunk", 0) == 0 && number(kind.substr(5), 1, 1 << 24, size)) {
      k.kind = kvpager::chunked_local{size};
      k.name = "chunked_local " + std::to_string(size);
    } else {
      return "--layers: unknown kind '" + kind + "' (full, swa<W>, chunk<C>; W and C 1 to 2^24)" + usage;
    }
    k.layers = static_cast<std::int32_t>(n);
    plan.num_layers += k.layers;
    if (plan.num_layers > 4096) return "--layers: more than 4096 layers";
    const auto same = std::find_if(plan.kinds.begin(), plan.kinds.end(), [&](const layer_kind& x) { return x.name == k.name; });
    if (same != plan.kinds.end()) {
      same->layers += k.layers;
    } else {
      plan.kinds.push_back(std::move(k));
    }
  }
  // vLLM's grouping (groups/layer_grouping.hpp): the rarest kind's count, or the largest when every count is
  // within 1.5x of it.
  std::vector<kvpager::kind_layers<kvpager::any_group_kind>> counts;
  for (const layer_kind& k : plan.kinds) counts.push_back({k.kind, k.layers});
  const auto groups = kvpager::plan_groups<kvpager::any_group_kind>(counts, kvpager::grouping::vllm);
  if (!groups) return std::string("--layers: ") + groups.error().message() + " (" + std::to_string(groups.error().detail()) + ")";
  plan.group_size = groups->group_size;
  plan.groups = groups->groups;
  // A kind's layers fill its groups in order (its groups are consecutive): the last one is padded.
  std::vector<std::int32_t> left;
  for (const layer_kind& k : plan.kinds) left.push_back(k.layers);
  for (const std::int32_t k : groups->kind_of_group) {
    plan.group_names.push_back(plan.kinds[static_cast<std::size_t>(k)].name);
    std::int32_t& n = left[static_cast<std::size_t>(k)];
    plan.group_layers.push_back(std::min(n, plan.group_size));
    n -= plan.group_layers.back();
  }
  plan.padding_layers = groups->padding_layers;
  return "";
}

}  // namespace kvsim
