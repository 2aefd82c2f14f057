// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The tier_policy concept: which blocks a host tier (tier/host_tier.hpp) keeps and which it gives up when a store
/// needs room. A policy owns the tier's index (block key -> host slot) and its order; the tier owns the slots' states
/// (being written, ready, being read) and asks the policy through `tier_evictable` which slots may go.
///
/// | expression | type | semantics |
/// |---|---|---|
/// | `p.reset(c)` | void | empty, for slots [0, c); allocates (only here) what c slots need |
/// | `cp.find(k)` | int32 | the slot holding key k, or -1 |
/// | `cp.key_of(s)` | uint64 | the key slot s holds |
/// | `cp.size()` | int32 | keys held |
/// | `p.insert(k, s)` | void | k (not held) now lives in slot s, as the most recent entry |
/// | `p.remove(k)` | void | forgets k (held), as if never stored (a failed store): no history kept |
/// | `p.touch(k, ready)` | void | k was used (ready: its slot can be read); k may also be unknown (a policy with history adapts) |
/// | `p.evict(n, ok, out)` | bool | selects exactly n slots with ok(s), removes them and lists them in `out` (cleared first), in eviction order; false and nothing changed if fewer than n qualify |
/// | `p.clear()` | void | forgets every key and all history |
///
/// All but reset are noexcept and allocate nothing.

#include <concepts>
#include <cstdint>
#include <vector>

#include "kvpager/concepts/value_concepts.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Whether a host tier slot may be evicted now: ready with no reader (state 0) and not protected (a key of the store
/// being prepared).
struct tier_evictable {
  const std::int32_t* state = nullptr;       ///< per slot: -1 being written, 0 ready, > 0 readers
  const std::uint8_t* protect = nullptr;     ///< per slot: nonzero while protected
  [[nodiscard]] bool operator()(std::int32_t s) const noexcept {
    return state[s] == 0 && protect[s] == 0;
  }
};

template <class P>
concept tier_policy = detail::default_value<P> && detail::movable_value<P> &&
                      requires(P& p, const P& cp, std::uint64_t k, std::int32_t s, bool ready,
                               const tier_evictable& ok, std::vector<std::int32_t>& out) {
                        { p.reset(s) } -> std::same_as<void>;
                        { cp.find(k) } noexcept -> std::same_as<std::int32_t>;
                        { cp.key_of(s) } noexcept -> std::same_as<std::uint64_t>;
                        { cp.size() } noexcept -> std::same_as<std::int32_t>;
                        { p.insert(k, s) } noexcept -> std::same_as<void>;
                        { p.remove(k) } noexcept -> std::same_as<void>;
                        { p.touch(k, ready) } noexcept -> std::same_as<void>;
                        { p.evict(s, ok, out) } noexcept -> std::same_as<bool>;
                        { p.clear() } noexcept -> std::same_as<void>;
                      };

/// The smallest tier policy: declarations only, for concept tests and as a template to copy.
struct tier_policy_archetype {
  void reset(std::int32_t capacity);
  [[nodiscard]] std::int32_t find(std::uint64_t key) const noexcept;
  [[nodiscard]] std::uint64_t key_of(std::int32_t slot) const noexcept;
  [[nodiscard]] std::int32_t size() const noexcept;
  void insert(std::uint64_t key, std::int32_t slot) noexcept;
  void remove(std::uint64_t key) noexcept;
  void touch(std::uint64_t key, bool ready) noexcept;
  bool evict(std::int32_t n, const tier_evictable& ok, std::vector<std::int32_t>& out) noexcept;
  void clear() noexcept;
};
static_assert(tier_policy<tier_policy_archetype>);

/// The fifth policy of a paged_kv_cache without a host tier (the default).
struct no_tier {};

/// What a paged_kv_cache takes as its fifth policy: no_tier, or a tier policy (the cache then owns a
/// host_tier<T>, tier/host_tier.hpp).
template <class T>
concept cache_tier = std::same_as<T, no_tier> || tier_policy<T>;

KVPAGER_NAMESPACE_END
