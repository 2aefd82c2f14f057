// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// From a model's layers to KV cache groups: every group's block holds the same number of layers (group_size), so
/// one pool of equal blocks serves all groups and a block's bytes are group_size x one layer's block.
///
///   - grouping::vllm is vLLM's rule (kv_cache_utils, uniform page size): kinds in order of first appearance, the
///     group size the rarest kind's layer count unless every count is within 1.5x of the largest (then the
///     largest), each kind's layers split into groups of that size in layer order, a short last group padded
///     (on Gemma-3-27b, 52 sliding + 10 full layers: 6 + 1 groups of 10, 8 padding layers).
///   - grouping::native pads nothing: the group size is the greatest common divisor of the kinds' counts, so
///     every group is full (Gemma-3-27b: 26 + 5 groups of 2). Every layout vLLM forms without padding is formed
///     the same way (then the gcd is vLLM's group size); where the gcd is small the price is more tables per
///     request, never bytes.
///   - grouping::units pads nothing with the fewest groups: one group per kind, of layers / gcd units, each unit a
///     page of gcd layers (hybrid_options::units; Gemma-3-27b: groups of 26 and 5 units of 2 layers). The bytes and
///     the tables per request are grouping::native's; the decisions (hits, window release, eviction) are made once
///     per kind instead of once per group.
///
/// plan_groups answers the groups in group order (the order a hybrid_kv_cache allocates and frees in), the group
/// of each kind's layers, the group size and the padding layers.

#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "kvpager/concepts/group_kind.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"

KVPAGER_NAMESPACE_BEGIN

/// A model's layers of one attention kind.
template <group_kind K>
struct kind_layers {
  K kind{};
  std::int32_t layers = 0;
};

/// Which rule turns layers into groups (see the file comment).
enum class grouping : std::uint8_t { vllm, native, units };

/// The groups of a model's layers.
template <group_kind K>
struct group_plan {
  std::vector<K> groups;                   ///< each group's kind, in group order
  std::vector<std::int32_t> kind_of_group;  ///< each group's index into the kinds given
  std::int32_t group_size = 0;             ///< layers per unit: a pool block holds group_size layers' blocks
  std::int32_t padding_layers = 0;         ///< tables x group_size - layers (0 with grouping::native and ::units)
  std::vector<std::int32_t> units;         ///< each group's units (hybrid_options::units; 1 but with ::units)
  [[nodiscard]] std::int32_t num_groups() const noexcept { return static_cast<std::int32_t>(groups.size()); }
};

/// The groups of `kinds` (distinct kinds, each with at least one layer) under `how`. Errors (errc::invalid_argument):
/// no kind, a kind without layers, a kind its own validate() refuses (a window or chunk below 1), more than
/// `max_groups` tables (native or units grouping of counts whose gcd is small: a group of u units has u tables).
template <group_kind K>
[[nodiscard]] result<group_plan<K>> plan_groups(std::span<const kind_layers<K>> kinds, grouping how,
                                                std::int32_t max_groups = 64) {
  if (kinds.empty()) return status{errc::invalid_argument, "plan_groups: no layer kind"};
  std::int32_t lo = 0, hi = 0, g = 0;
  for (const kind_layers<K>& k : kinds) {
    if (k.layers < 1) return status{errc::invalid_argument, "plan_groups: a kind without layers", k.layers};
    if (const status st = k.kind.validate(); !st.ok()) return st;
    lo = lo == 0 ? k.layers : std::min(lo, k.layers);
    hi = std::max(hi, k.layers);
    g = std::gcd(g, k.layers);
  }
  group_plan<K> plan;
  plan.group_size = how != grouping::vllm ? g : (2 * std::int64_t{hi} < 3 * std::int64_t{lo} ? hi : lo);
  std::int64_t groups = 0;
  for (const kind_layers<K>& k : kinds) groups += (k.layers + plan.group_size - 1) / plan.group_size;
  if (groups > max_groups)
    return status{errc::invalid_argument, "plan_groups: more KV cache groups than max_groups", groups};
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    const std::int32_t n = (kinds[i].layers + plan.group_size - 1) / plan.group_size;
    if (how == grouping::units) {  // one group of n units
      plan.groups.push_back(kinds[i].kind);
      plan.kind_of_group.push_back(static_cast<std::int32_t>(i));
      plan.units.push_back(n);
      continue;
    }
    for (std::int32_t j = 0; j < n; ++j) {
      plan.units.push_back(1);
      plan.groups.push_back(kinds[i].kind);
      plan.kind_of_group.push_back(static_cast<std::int32_t>(i));
    }
    plan.padding_layers += n * plan.group_size - kinds[i].layers;
  }
  return plan;
}

KVPAGER_NAMESPACE_END
