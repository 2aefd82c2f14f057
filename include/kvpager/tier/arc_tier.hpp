// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// arc_tier: a host tier policy (concepts/tier_policy.hpp) with adaptive replacement, exactly as vLLM's offloading
/// ARC (`vllm/v1/kv_offload/cpu/policies/arc.py`, 0.22.0), which differs from textbook ARC:
///   - T1 holds keys seen once, T2 keys touched again; B1 and B2 remember keys evicted from each (ghosts), each
///     bounded by the capacity c (trimmed, oldest first, after every eviction);
///   - a new key goes to T1's most recent end and leaves the ghost lists;
///   - touch: a ready T1 key moves to T2's most recent end (a key still being written stays in T1, moved to its
///     most recent end: its store is not a second use); a T2 key moves to T2's most recent end; a B1 ghost raises
///     the target size of T1, p += max(1, |B2| / |B1|) up to c, a B2 ghost lowers it, p -= max(1, |B1| / |B2|) down
///     to 0 (real division; the ghost moves to its list's most recent end): adaptation happens on touch, and a ghost
///     touched is not brought back;
///   - evict(n): for each victim in turn, from T1's least recent evictable key while the simulated size of T1 (less
///     the victims taken from it so far) is at least int(p), else (or when T1 has none) from T2's; all n found
///     first, or none is taken; victims from T1 become B1 ghosts, from T2 B2 ghosts.
/// O(1) per insert, remove and touch; evict O(n + skipped). Allocates in reset only.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvpager/concepts/tier_policy.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/id_map.hpp"
#include "kvpager/core/index_list.hpp"

KVPAGER_NAMESPACE_BEGIN

/// arc_tier. A class template with one defaulted parameter, used as arc_tier: its member functions (and the
/// standard templates they use) are analysed only in a translation unit that uses them, not in every one that
/// includes <kvpager/cache.hpp> (a consumer build cost measured in bench/RESULTS.md).
template <class = void>
class basic_arc_tier {
 public:
  static constexpr const char* name = "arc";

  void reset(std::int32_t capacity) {
    cap_ = capacity;
    p_ = 0.0;
    index_ = id_map{};
    index_.reserve(capacity);
    keys_.assign(static_cast<std::size_t>(capacity), 0);
    in_t2_.assign(static_cast<std::size_t>(capacity), 0);
    selected_.assign(static_cast<std::size_t>(capacity), 0);
    from_t1_.assign(static_cast<std::size_t>(capacity), 0);
    t1_.reset(capacity);
    t2_.reset(capacity);
    // Ghosts: at most c in each list after an eviction, and at most n <= c more during one.
    const std::int32_t ghosts = 3 * capacity + 1;
    ghost_index_ = id_map{};
    ghost_index_.reserve(ghosts);
    ghost_keys_.assign(static_cast<std::size_t>(ghosts), 0);
    ghost_in_b2_.assign(static_cast<std::size_t>(ghosts), 0);
    b1_.reset(ghosts);
    b2_.reset(ghosts);
    ghost_free_.clear();
    ghost_free_.reserve(static_cast<std::size_t>(ghosts));
    for (std::int32_t g = ghosts - 1; g >= 0; --g) ghost_free_.push_back(g);
  }

  [[nodiscard]] std::int32_t find(std::uint64_t key) const noexcept { return index_.find(key); }
  [[nodiscard]] std::uint64_t key_of(std::int32_t slot) const noexcept { return keys_[static_cast<std::size_t>(slot)]; }
  [[nodiscard]] std::int32_t size() const noexcept { return t1_.size() + t2_.size(); }
  /// The adaptive target size of T1 (vLLM's target_t1_size).
  [[nodiscard]] double target_t1_size() const noexcept { return p_; }
  [[nodiscard]] std::int32_t t1_size() const noexcept { return t1_.size(); }
  [[nodiscard]] std::int32_t t2_size() const noexcept { return t2_.size(); }
  [[nodiscard]] std::int32_t b1_size() const noexcept { return b1_.size(); }
  [[nodiscard]] std::int32_t b2_size() const noexcept { return b2_.size(); }

  void insert(std::uint64_t key, std::int32_t slot) noexcept {
    index_.insert(key, slot);
    keys_[static_cast<std::size_t>(slot)] = key;
    in_t2_[static_cast<std::size_t>(slot)] = 0;
    t1_.push_back(slot);
    if (const std::int32_t g = ghost_index_.find(key); g >= 0) drop_ghost(g);
  }
  void remove(std::uint64_t key) noexcept {
    const std::int32_t s = index_.find(key);
    if (s < 0) return;
    list_of(s).erase(s);
    index_.erase(key);
  }
  void touch(std::uint64_t key, bool ready) noexcept {
    if (const std::int32_t s = index_.find(key); s >= 0) {
      if (in_t2_[static_cast<std::size_t>(s)] == 0) {
        t1_.erase(s);
        if (ready) {
          in_t2_[static_cast<std::size_t>(s)] = 1;
          t2_.push_back(s);
        } else {
          t1_.push_back(s);
        }
      } else {
        t2_.erase(s);
        t2_.push_back(s);
      }
      return;
    }
    const std::int32_t g = ghost_index_.find(key);
    if (g < 0) return;
    const auto n1 = static_cast<double>(b1_.size()), n2 = static_cast<double>(b2_.size());
    if (ghost_in_b2_[static_cast<std::size_t>(g)] == 0) {
      p_ = std::min(p_ + std::max(1.0, n2 / n1), static_cast<double>(cap_));
      b1_.erase(g);
      b1_.push_back(g);
    } else {
      p_ = std::max(p_ - std::max(1.0, n1 / n2), 0.0);
      b2_.erase(g);
      b2_.push_back(g);
    }
  }
  bool evict(std::int32_t n, const tier_evictable& ok, std::vector<std::int32_t>& out) noexcept {
    out.clear();
    if (n <= 0) return true;
    std::int32_t virtual_t1 = t1_.size();
    // Each list is scanned once: what a scan passed over is not evictable or already selected.
    std::int32_t c1 = t1_.empty() ? -1 : t1_.front();
    std::int32_t c2 = t2_.empty() ? -1 : t2_.front();
    bool found_all = true;
    for (std::int32_t i = 0; i < n; ++i) {
      std::int32_t cand = -1;
      if (static_cast<double>(virtual_t1) >= static_cast<double>(static_cast<std::int64_t>(p_))) {
        while (c1 >= 0 && !(ok(c1) && selected_[static_cast<std::size_t>(c1)] == 0)) c1 = t1_.next(c1);
        if (c1 >= 0) {
          cand = c1;
          from_t1_[static_cast<std::size_t>(cand)] = 1;
          --virtual_t1;
          c1 = t1_.next(c1);
        }
      }
      if (cand < 0) {
        while (c2 >= 0 && !(ok(c2) && selected_[static_cast<std::size_t>(c2)] == 0)) c2 = t2_.next(c2);
        if (c2 < 0) {
          found_all = false;
          break;
        }
        cand = c2;
        from_t1_[static_cast<std::size_t>(cand)] = 0;
        c2 = t2_.next(c2);
      }
      selected_[static_cast<std::size_t>(cand)] = 1;
      out.push_back(cand);
    }
    for (const std::int32_t s : out) selected_[static_cast<std::size_t>(s)] = 0;
    if (!found_all) {
      out.clear();
      return false;
    }
    for (const std::int32_t s : out) {
      const std::uint64_t key = keys_[static_cast<std::size_t>(s)];
      const bool t1 = from_t1_[static_cast<std::size_t>(s)] != 0;
      (t1 ? t1_ : t2_).erase(s);
      index_.erase(key);
      add_ghost(key, !t1);
    }
    while (b1_.size() > cap_) drop_ghost(b1_.front());
    while (b2_.size() > cap_) drop_ghost(b2_.front());
    return true;
  }
  void clear() noexcept {
    while (!t1_.empty()) index_.erase(keys_[static_cast<std::size_t>(t1_.pop_front())]);
    while (!t2_.empty()) index_.erase(keys_[static_cast<std::size_t>(t2_.pop_front())]);
    while (!b1_.empty()) drop_ghost(b1_.front());
    while (!b2_.empty()) drop_ghost(b2_.front());
    p_ = 0.0;
  }

 private:
  [[nodiscard]] index_list& list_of(std::int32_t s) noexcept { return in_t2_[static_cast<std::size_t>(s)] ? t2_ : t1_; }
  void add_ghost(std::uint64_t key, bool b2) noexcept {
    const std::int32_t g = ghost_free_.back();
    ghost_free_.pop_back();
    ghost_keys_[static_cast<std::size_t>(g)] = key;
    ghost_in_b2_[static_cast<std::size_t>(g)] = b2 ? 1 : 0;
    ghost_index_.insert(key, g);
    (b2 ? b2_ : b1_).push_back(g);
  }
  void drop_ghost(std::int32_t g) noexcept {
    (ghost_in_b2_[static_cast<std::size_t>(g)] ? b2_ : b1_).erase(g);
    ghost_index_.erase(ghost_keys_[static_cast<std::size_t>(g)]);
    ghost_free_.push_back(g);
  }

  std::int32_t cap_ = 0;
  double p_ = 0.0;  ///< target size of T1
  id_map index_;    ///< key -> slot, T1 and T2
  std::vector<std::uint64_t> keys_;
  std::vector<std::uint8_t> in_t2_;
  std::vector<std::uint8_t> selected_;  ///< evict's scratch: chosen in this call
  std::vector<std::uint8_t> from_t1_;   ///< evict's scratch: the list a victim came from
  index_list t1_, t2_;                  ///< least recently used first
  id_map ghost_index_;                  ///< key -> ghost node
  std::vector<std::uint64_t> ghost_keys_;
  std::vector<std::uint8_t> ghost_in_b2_;
  index_list b1_, b2_;
  std::vector<std::int32_t> ghost_free_;
};

using arc_tier = basic_arc_tier<>;

static_assert(tier_policy<arc_tier>);

KVPAGER_NAMESPACE_END
