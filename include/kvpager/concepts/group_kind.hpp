// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The group_kind concept: which of a sequence's tokens the layers of one KV cache group can still read. A hybrid
/// model's layers fall into groups by attention kind (full attention, a sliding window of W tokens, chunked local
/// attention of C tokens, ...); each group keeps its own block table over the one shared pool, and a group's kind
/// says which leading tokens no future token of the sequence reads, so their blocks can go back to the pool (they
/// keep their hashes and stay hit-able) and a prefix-cache hit need not find them.
///
/// | expression               | result         | noexcept | complexity | semantics                                   |
/// |--------------------------|----------------|----------|------------|---------------------------------------------|
/// | `K{}`                    | `K`            | -        | O(1)       | (kinds with a size take it in a constructor as well) |
/// | `ck.skipped_tokens(t)`   | `std::int64_t` | yes      | O(1)       | with `t >= 0` tokens computed, how many leading tokens no later token reads: in [0, t], non-decreasing in `t`, 0 at `t = 0` |
/// | `ck.validate()`          | `status`       | yes      | O(1)       | `errc::invalid_argument` for a size the kind cannot have (a window below 1) |
/// | `K::kind_name`           | `const char*`  | -        | -          | the kind's name in traces and metrics ("full", "sliding_window", "chunked_local") |
///
/// The next token after `t` computed ones, at position `t`, reads tokens `[skipped_tokens(t), t]`. So a sequence
/// with a cached prefix of `L` tokens can resume in a group (compute token `L` next) when the group has every block
/// that holds a token of `[skipped_tokens(L), L)`: full attention needs all of them, a window only its last ones
/// (groups/agreed_hit.hpp). The shipped kinds are in groups/group_kinds.hpp; group_kind_archetype below is the
/// smallest one to copy.

#include <concepts>
#include <cstdint>

#include "kvpager/concepts/value_concepts.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"

KVPAGER_NAMESPACE_BEGIN

template <class K>
concept group_kind = detail::copyable_value<K> && requires(const K& ck, std::int64_t t) {
  { ck.skipped_tokens(t) } noexcept -> std::same_as<std::int64_t>;
  { ck.validate() } noexcept -> std::same_as<status>;
  { K::kind_name } -> std::convertible_to<const char*>;
};

/// The smallest group kind: declarations only, for concept tests and as a template to copy.
struct group_kind_archetype {
  static constexpr const char* kind_name = "archetype";
  [[nodiscard]] std::int64_t skipped_tokens(std::int64_t computed) const noexcept;
  [[nodiscard]] status validate() const noexcept;
};

KVPAGER_NAMESPACE_END
