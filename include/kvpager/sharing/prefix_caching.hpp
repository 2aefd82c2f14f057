#pragma once
/// \file
/// prefix_caching: automatic prefix caching (vLLM's APC). Every full block gets a chained hash
/// H(parent hash, the block's token ids), seeded at the root with an extra key (tenant salt, adapter id); a new
/// sequence reuses the longest run of cached blocks matching its prompt from the start. Forks share blocks by
/// reference count (copy-on-write for partial blocks, done by the cache). Blocks whose last reference is dropped stay
/// cached and hit-able until the eviction policy reclaims them.
///
/// Collision safety (default): a hit is accepted only if the cached block's token ids, extra key and parent content
/// equal the request's, so two different prompts never share a block even if their hashes collide. Content is
/// tracked by *entries*: one per distinct (parent entry, extra key, tokens); duplicate blocks share an entry, and an
/// entry outlives its blocks while a cached child names it as parent. `prefix_caching_config{.verify_tokens =
/// false}` trusts the 64-bit hash alone (no token copy is kept, no compare per hit).
///
/// Cost: hashing and lookup are O(block_size) per block (plus the length of a hash's duplicate list, 1 without
/// collisions), independent of how long the prefix already hashed is. Index: an open-addressing map from hash to
/// the first block cached under it; blocks with equal hashes (duplicates: block tables are append-only, identical
/// content is not merged) form an insertion-ordered list, and lookup returns the earliest still present (vLLM's
/// order). Memory: at most 2 entries per block, about 2 x (40 + 4 x block_size) + 12 bytes per block.

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/core/assert.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/id_map.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/sharing/xxh3_hasher.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Options of prefix_caching.
struct prefix_caching_config {
  /// Accept a hit only when the cached block's tokens, extra key and parent content equal the request's.
  bool verify_tokens = true;
};

template <class Hasher = xxh3_hasher>
class basic_prefix_caching {
 public:
  static constexpr fork_mode fork = fork_mode::share;

  /// A position in a hash chain: the hash and content entry of the last block, and the chain's extra key.
  struct cursor {
    std::uint64_t hash = 0;
    std::int32_t entry = -1;  ///< content entry of the last block; -1 = chain root
    std::uint64_t extra = 0;
    bool valid = false;
    friend bool operator==(const cursor&, const cursor&) = default;
  };

  basic_prefix_caching() = default;
  explicit basic_prefix_caching(prefix_caching_config cfg, Hasher hasher = Hasher{})
      : cfg_(cfg), hasher_(std::move(hasher)) {}

  void reset(const pool_geometry& g) {
    block_size_ = g.block_size;
    const auto n = static_cast<std::size_t>(g.num_blocks);
    blocks_.assign(n, block_link{});
    // Live entries <= 2 x cached blocks: each has a holder, or a cached child that names it as parent.
    entries_.assign(2 * n + 1, entry{});
    tokens_.assign(cfg_.verify_tokens ? entries_.size() * static_cast<std::size_t>(g.block_size) : 0, 0);
    free_entries_.clear();
    for (std::size_t e = entries_.size(); e-- > 0;) free_entries_.push_back(static_cast<std::int32_t>(e));
    index_ = id_map{};
    num_cached_ = 0;
  }

  [[nodiscard]] const prefix_caching_config& config() const noexcept { return cfg_; }

  [[nodiscard]] cursor first_cursor(std::uint64_t extra_key) const noexcept {
    return cursor{root_seed(extra_key), -1, extra_key, true};
  }
  [[nodiscard]] bool valid(const cursor& c) const noexcept { return c.valid; }

  [[nodiscard]] block_id lookup(cursor& c, std::span<const token_id> tokens) const noexcept {
    if (!c.valid) return no_block;
    const std::uint64_t h = hasher_(c.hash, tokens);
    const std::int32_t e = find_entry(h, c, tokens);
    if (e < 0 || entries_[static_cast<std::size_t>(e)].first_block < 0) return no_block;  // unknown, or no holder left
    const block_id b = entries_[static_cast<std::size_t>(e)].first_block;
    c = cursor_after(b);
    return b;
  }

  void commit(block_id b, cursor& c, std::span<const token_id> tokens) noexcept {
    KVPAGER_ASSERT(!is_cached(b), "prefix_caching::commit of a block that is already cached");
    KVPAGER_ASSERT(static_cast<std::int32_t>(tokens.size()) == block_size_, "prefix_caching::commit of a partial block");
    if (!c.valid) return;
    const std::uint64_t h = hasher_(c.hash, tokens);
    std::int32_t e = find_entry(h, c, tokens);
    if (e < 0) e = new_entry(h, c, tokens);
    entry& en = entries_[static_cast<std::size_t>(e)];
    // Append b to the entry's holders, in insertion order (circular prev: first.prev is the last).
    block_link& link = blocks_[static_cast<std::size_t>(b)];
    link.entry = e;
    link.next = no_block;
    if (en.first_block < 0) {
      en.first_block = b;
      link.prev = b;
    } else {
      block_link& first = blocks_[static_cast<std::size_t>(en.first_block)];
      blocks_[static_cast<std::size_t>(first.prev)].next = b;
      link.prev = first.prev;
      first.prev = b;
    }
    ++en.holders;
    ++num_cached_;
    c = cursor_after(b);
  }

  [[nodiscard]] cursor cursor_after(block_id b) const noexcept {
    const std::int32_t e = blocks_[static_cast<std::size_t>(b)].entry;
    if (e < 0) return cursor{};
    const entry& en = entries_[static_cast<std::size_t>(e)];
    return cursor{en.hash, e, en.extra, true};
  }

  [[nodiscard]] bool is_cached(block_id b) const noexcept {
    return b >= 0 && static_cast<std::size_t>(b) < blocks_.size() && blocks_[static_cast<std::size_t>(b)].entry >= 0;
  }

  void uncache(block_id b) noexcept {
    KVPAGER_ASSERT(is_cached(b), "prefix_caching::uncache of a block that is not cached");
    block_link& link = blocks_[static_cast<std::size_t>(b)];
    const std::int32_t e = link.entry;
    entry& en = entries_[static_cast<std::size_t>(e)];
    if (en.first_block == b) {
      en.first_block = link.next;
      if (link.next >= 0) blocks_[static_cast<std::size_t>(link.next)].prev = link.prev;
    } else {
      blocks_[static_cast<std::size_t>(link.prev)].next = link.next;
      const block_id fix = link.next >= 0 ? link.next : en.first_block;  // whose prev pointed at b
      blocks_[static_cast<std::size_t>(fix)].prev = link.prev;
    }
    link = block_link{};
    --en.holders;
    --num_cached_;
    release_entry(e);
  }

  [[nodiscard]] std::int32_t num_cached() const noexcept { return num_cached_; }
  /// The chained hash of cached block `b` (for inspection and tests).
  [[nodiscard]] std::uint64_t block_hash(block_id b) const noexcept {
    const std::int32_t e = blocks_[static_cast<std::size_t>(b)].entry;
    return e < 0 ? 0 : entries_[static_cast<std::size_t>(e)].hash;
  }

 private:
  /// One distinct content: tokens after a given parent content, under an extra key. Its holders are the cached
  /// blocks with that content (duplicates); it outlives them while a cached block names it as parent, so a
  /// recomputed parent rejoins its old children exactly as vLLM's hash chain does.
  struct entry {
    std::uint64_t hash = 0;
    std::uint64_t extra = 0;
    std::int32_t parent = -1;        ///< parent entry, -1 = root
    std::int32_t next_same_hash = -1;
    std::int32_t first_block = -1;   ///< earliest cached holder
    std::int32_t holders = 0;
    std::int32_t children = 0;       ///< entries naming this one as parent
  };
  struct block_link {
    std::int32_t entry = -1;
    block_id next = no_block;  ///< next holder of the same entry
    block_id prev = no_block;  ///< previous holder; for the first, the last
  };

  [[nodiscard]] static std::uint64_t root_seed(std::uint64_t extra) noexcept {
    // splitmix64 finalizer: distinct extra keys give unrelated root seeds.
    std::uint64_t z = extra + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  [[nodiscard]] std::ptrdiff_t offset(std::int32_t e) const noexcept {
    return static_cast<std::ptrdiff_t>(e) * block_size_;
  }

  /// The entry for `tokens` after cursor `c` under hash h, or -1. Without verification the hash alone decides.
  [[nodiscard]] std::int32_t find_entry(std::uint64_t h, const cursor& c, std::span<const token_id> tokens) const noexcept {
    for (std::int32_t e = index_.find(h); e >= 0; e = entries_[static_cast<std::size_t>(e)].next_same_hash) {
      if (!cfg_.verify_tokens) return e;
      const entry& en = entries_[static_cast<std::size_t>(e)];
      if (en.parent == c.entry && en.extra == c.extra &&
          std::equal(tokens.begin(), tokens.end(), tokens_.begin() + offset(e)))
        return e;
    }
    return -1;
  }

  std::int32_t new_entry(std::uint64_t h, const cursor& c, std::span<const token_id> tokens) noexcept {
    KVPAGER_ASSERT(!free_entries_.empty(), "prefix_caching: content entries exhausted");
    const std::int32_t e = free_entries_.back();
    free_entries_.pop_back();
    entry& en = entries_[static_cast<std::size_t>(e)];
    en = entry{h, c.extra, c.entry, -1, -1, 0, 0};
    if (cfg_.verify_tokens) std::copy(tokens.begin(), tokens.end(), tokens_.begin() + offset(e));
    if (c.entry >= 0) ++entries_[static_cast<std::size_t>(c.entry)].children;
    // Append to the hash's entry list (collisions only; a later entry never precedes an earlier one).
    const std::int32_t head = index_.find(h);
    if (head < 0) {
      index_.insert(h, e);
    } else {
      std::int32_t t = head;
      while (entries_[static_cast<std::size_t>(t)].next_same_hash >= 0) t = entries_[static_cast<std::size_t>(t)].next_same_hash;
      entries_[static_cast<std::size_t>(t)].next_same_hash = e;
    }
    return e;
  }

  /// Frees entry `e` and then its ancestors while nothing holds or names them.
  void release_entry(std::int32_t e) noexcept {
    while (e >= 0) {
      entry& en = entries_[static_cast<std::size_t>(e)];
      if (en.holders > 0 || en.children > 0) return;
      const std::int32_t head = index_.find(en.hash);
      if (head == e) {
        index_.erase(en.hash);
        if (en.next_same_hash >= 0) index_.insert(en.hash, en.next_same_hash);
      } else {
        std::int32_t p = head;
        while (entries_[static_cast<std::size_t>(p)].next_same_hash != e) p = entries_[static_cast<std::size_t>(p)].next_same_hash;
        entries_[static_cast<std::size_t>(p)].next_same_hash = en.next_same_hash;
      }
      const std::int32_t parent = en.parent;
      en = entry{};
      free_entries_.push_back(e);
      if (parent >= 0) --entries_[static_cast<std::size_t>(parent)].children;
      e = parent;
    }
  }

  prefix_caching_config cfg_{};
  [[no_unique_address]] Hasher hasher_{};
  std::int32_t block_size_ = 0;
  std::vector<block_link> blocks_;
  std::vector<entry> entries_;
  std::vector<std::int32_t> free_entries_;
  std::vector<token_id> tokens_;  ///< block_size token ids per entry, when verifying
  id_map index_;                  ///< hash -> first entry with that hash
  std::int32_t num_cached_ = 0;
};

/// Prefix caching with XXH3-64 block hashes and token verification.
using prefix_caching = basic_prefix_caching<xxh3_hasher>;

KVPAGER_NAMESPACE_END
