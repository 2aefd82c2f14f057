// SPDX-License-Identifier: Apache-2.0
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
/// tracked by *entries*: one per distinct (parent entry, extra key, tokens); duplicate blocks share an entry.
/// `prefix_caching_config{.verify_tokens = false}` trusts the 64-bit hash alone (no token copy is kept, no compare
/// per hit, and an entry lives exactly as long as a block holds it).
///
/// Orphans and the entry bound. An entry is *held* while a cached block has its content, and an *orphan* while no
/// block has it but entries name it as parent. Orphans keep vLLM's behaviour when a chain's head is evicted before
/// its tail: once the head is computed again it rejoins its old, still cached children. Eviction orders that drop
/// heads first (priorities rising along a chain, LFU with a rarely hit head) leave such orphan chains, and a
/// chain of any length hangs off one cached tail, so orphans are not bounded by the cached blocks. Instead:
///   - each cached block holds one entry, so held entries <= cached blocks <= num_blocks;
///   - live entries (held + orphans) never exceed max_entries() = 2 x num_blocks + 1: a new entry that finds
///     none free reclaims the orphan that lost its last holder longest ago (its descendants can then no longer be
///     reached from the root; they stay cached until evicted). When all max_entries() are live, at least
///     max_entries() - (num_blocks - 1) >= 1 of them are orphans (the block being committed is not cached yet), so
///     a commit always finds an entry.
/// Reclaiming changes nothing else: hits stay exact (entry serials keep a reused slot from matching the children of
/// its previous occupant), and until max_entries() entries are live the behaviour is exactly vLLM's.
/// Invariant, checked by the tests after every call: num_entries() - num_orphan_entries() <= num_cached() and
/// num_entries() <= max_entries().
///
/// Cost: hashing and lookup are O(block_size) per block (plus the length of a hash's duplicate list, 1 without
/// collisions), independent of how long the prefix already hashed is. Index: an open-addressing map from hash to
/// the first entry with it; blocks with equal content (duplicates: block tables are append-only, identical content
/// is not merged) form an insertion-ordered list, and lookup returns the earliest still present (vLLM's order).
/// Memory, allocated as it is used: 12 bytes per block from reset(); per live entry sizeof(entry) (64 bytes) plus,
/// when verifying, its block_size token ids (4 x block_size bytes), in chunks of entries_per_chunk() entries that are
/// allocated when the number of entries ever live at once grows (never more than max_entries() entries); and the
/// hash index (16-byte slots, at most half full: up to 64 bytes per entry ever live at once). A chunk that cannot
/// be allocated leaves the block uncached (commit's cursor becomes invalid). (The hash index grows as a std::vector
/// does; a failure there, inside these noexcept calls, ends the program.)

#include <algorithm>
#include <bit>
#include <cstdint>
#include <new>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/core/assert.hpp"
#include "kvpager/core/chunk_array.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/id_map.hpp"
#include "kvpager/core/splitmix.hpp"
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
  /// A content cache (concepts/sharing_policy.hpp): the compiler checks every member of the refinement.
  static constexpr bool caches_content = true;

  /// A position in a hash chain: the hash and content entry of the last block, and the chain's extra key.
  struct cursor {
    std::uint64_t hash = 0;
    std::int32_t entry = -1;   ///< content entry of the last block; -1 = chain root
    std::uint64_t serial = 0;  ///< that entry's serial (0 at the root): a reused entry slot never matches
    std::uint64_t extra = 0;
    bool valid = false;
    friend bool operator==(const cursor&, const cursor&) = default;
  };

  basic_prefix_caching() = default;
  explicit basic_prefix_caching(prefix_caching_config cfg, Hasher hasher = Hasher{})
      : cfg_(cfg), hasher_(std::move(hasher)) {}

  /// Empty cache for pool geometry `g`. Allocates the per-block links and the chunk tables only; entries and
  /// their token ids are allocated as they are first needed.
  void reset(const pool_geometry& g) {
    block_size_ = g.block_size;
    const auto n = static_cast<std::size_t>(g.num_blocks);
    blocks_.assign(n, block_link{});
    // 2n + 1, capped at the int32 entry ids (still >= n: see the bound in the file comment).
    capacity_ = static_cast<std::int32_t>(std::min<std::int64_t>(2 * std::int64_t{g.num_blocks} + 1, INT32_MAX));
    const std::size_t per_chunk = chunk_entries(g.block_size, capacity_);
    chunk_shift_ = std::countr_zero(per_chunk);
    const std::size_t max_chunks = (static_cast<std::size_t>(capacity_) + per_chunk - 1) / per_chunk;
    entries_.reset(per_chunk, max_chunks);
    tokens_.reset(cfg_.verify_tokens ? per_chunk * static_cast<std::size_t>(g.block_size) : 0,
                  cfg_.verify_tokens ? max_chunks : 0);
    fresh_ = 0;
    free_head_ = -1;
    live_ = 0;
    orphan_head_ = orphan_tail_ = -1;
    num_orphans_ = 0;
    // serial_ and commits_ go on counting: a stamp or a commit count read before the reset never matches after it.
    reclaimed_ = 0;
    index_ = id_map{};
    num_cached_ = 0;
    ++generation_;
  }

  [[nodiscard]] const prefix_caching_config& config() const noexcept { return cfg_; }

  [[nodiscard]] cursor first_cursor(std::uint64_t extra_key) const noexcept {
    return cursor{root_seed(extra_key), -1, 0, extra_key, true};
  }
  [[nodiscard]] bool valid(const cursor& c) const noexcept { return c.valid; }

  [[nodiscard]] block_id lookup(cursor& c, std::span<const token_id> tokens) const noexcept {
    if (!c.valid) return no_block;
    return lookup(c, hash(c, tokens), tokens);
  }

  /// The chained hash of a block holding `tokens` after `c` (what lookup and commit compute): a request can keep
  /// it and pass it to the overloads below, so that no block of it is hashed twice.
  [[nodiscard]] std::uint64_t hash(const cursor& c, std::span<const token_id> tokens) const noexcept {
    return hasher_(c.hash, tokens);
  }
  /// The chained hash of a block holding `tokens` after a block whose chained hash is `parent` (cached or not: a
  /// host tier is looked up past the device's last hit this way).
  [[nodiscard]] std::uint64_t chained_hash(std::uint64_t parent, std::span<const token_id> tokens) const noexcept {
    return hasher_(parent, tokens);
  }

  /// lookup(c, tokens) with the block's hash `h` = hash(c, tokens) already known. Tokens are still compared when
  /// verifying, so a wrong `h` can only miss.
  [[nodiscard]] block_id lookup(cursor& c, std::uint64_t h, std::span<const token_id> tokens) const noexcept {
    if (!c.valid) return no_block;
    const std::int32_t e = find_entry(h, c, tokens);
    if (e < 0 || at(e).first_block < 0) return no_block;  // unknown, or no holder left
    const block_id b = at(e).first_block;
    c = cursor_after(b);
    return b;
  }

  /// Caches block `b` (full, not cached) as holding `tokens` after `c`, and advances `c` past it. If no entry can
  /// be had (memory for a new chunk is short), `b` stays uncached and `c` becomes invalid: the rest of that chain
  /// is not cached, nothing else changes.
  void commit(block_id b, cursor& c, std::span<const token_id> tokens) noexcept {
    if (!c.valid) return;
    commit(b, c, hash(c, tokens), tokens);
  }

  /// commit(b, c, tokens) with the block's hash `h` = hash(c, tokens) already known (see lookup).
  void commit(block_id b, cursor& c, std::uint64_t h, std::span<const token_id> tokens) noexcept {
    KVPAGER_ASSERT(!is_cached(b), "prefix_caching::commit of a block that is already cached");
    KVPAGER_ASSERT(static_cast<std::int32_t>(tokens.size()) == block_size_, "prefix_caching::commit of a partial block");
    if (!c.valid) return;
    // A valid cursor names a held entry (the chain's last block is cached and referenced by its sequence). Were it
    // not so, the parent could be reclaimed under the new entry: stop caching this chain instead.
    const bool parent_held = c.entry < 0 || (live(c.entry, c.serial) && at(c.entry).holders > 0);
    KVPAGER_ASSERT(parent_held, "prefix_caching::commit after a cursor whose block is no longer cached");
    if (!parent_held) {
      c = cursor{};
      return;
    }
    std::int32_t e = find_entry(h, c, tokens);
    if (e < 0) e = new_entry(h, c, tokens);
    if (e < 0) {
      c = cursor{};
      return;
    }
    entry& en = at(e);
    if (en.orphan) unlink_orphan(e);  // an orphan gets its content back
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
    ++generation_;
    ++commits_;
    c = cursor_after(b);
  }

  [[nodiscard]] cursor cursor_after(block_id b) const noexcept {
    const std::int32_t e = blocks_[static_cast<std::size_t>(b)].entry;
    if (e < 0) return cursor{};
    const entry& en = at(e);
    return cursor{en.hash, e, en.serial, en.extra, true};
  }

  [[nodiscard]] bool is_cached(block_id b) const noexcept {
    return b >= 0 && static_cast<std::size_t>(b) < blocks_.size() && blocks_[static_cast<std::size_t>(b)].entry >= 0;
  }

  void uncache(block_id b) noexcept {
    KVPAGER_ASSERT(is_cached(b), "prefix_caching::uncache of a block that is not cached");
    block_link& link = blocks_[static_cast<std::size_t>(b)];
    const std::int32_t e = link.entry;
    entry& en = at(e);
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
    ++generation_;
    release_entry(e);
  }

  [[nodiscard]] std::int32_t num_cached() const noexcept { return num_cached_; }
  /// Changes whenever a block is cached or uncached (every change that can alter a lookup's answer): a lookup made
  /// at one generation is still exact at the same generation (paged_kv_cache's prefix_hit relies on it).
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }
  /// A stamp of what a lookup from a root cursor (first_cursor) answers with `b`: nonzero while `b` is cached and the
  /// earliest holder of its content (the block lookup returns for that content), and the same value for exactly as
  /// long as that stays so (the content entry's serial, never reused, not even across reset); 0 otherwise. A caller
  /// that keeps a lookup's answer `b` with this stamp knows the same lookup still answers `b` while the stamp is
  /// unchanged, without hashing or comparing tokens (hybrid_kv_cache's lookup memo).
  [[nodiscard]] std::uint64_t first_holder_stamp(block_id b) const noexcept {
    if (!is_cached(b)) return 0;
    const entry& en = at(blocks_[static_cast<std::size_t>(b)].entry);
    return en.first_block == b ? en.serial : 0;
  }
  /// Blocks cached so far (every commit that cached one; never reset). A lookup that missed can only find a block
  /// after a commit: while this is unchanged, it still misses.
  [[nodiscard]] std::uint64_t commits() const noexcept { return commits_; }
  /// The chained hash of cached block `b` (0 if it is not cached): a request's hash list is rebuilt from its
  /// blocks' without hashing (paged_kv_cache::block_hashes).
  [[nodiscard]] std::uint64_t block_hash(block_id b) const noexcept {
    return is_cached(b) ? at(blocks_[static_cast<std::size_t>(b)].entry).hash : 0;
  }

  /// Live content entries: held ones (<= num_cached()) plus orphans. Never above max_entries().
  [[nodiscard]] std::int32_t num_entries() const noexcept { return live_; }
  /// Live entries no cached block holds, kept because entries name them as parent (verifying only).
  [[nodiscard]] std::int32_t num_orphan_entries() const noexcept { return num_orphans_; }
  /// The most entries ever live at once: 2 x num_blocks + 1 (capped at 2^31 - 1).
  [[nodiscard]] std::int32_t max_entries() const noexcept { return capacity_; }
  /// Orphans reclaimed so far to make room for new entries (each cut its cached descendants off the root).
  [[nodiscard]] std::int64_t reclaimed_orphans() const noexcept { return reclaimed_; }
  /// Entries allocated per chunk (a power of two).
  [[nodiscard]] std::size_t entries_per_chunk() const noexcept { return std::size_t{1} << chunk_shift_; }
  /// Bytes this policy holds now, excluding the hash index.
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return blocks_.capacity() * sizeof(block_link) + entries_.bytes() + tokens_.bytes();
  }

 private:
  /// One distinct content: tokens after a given parent content, under an extra key. Its holders are the cached
  /// blocks with that content (duplicates); without holders it lives on as an orphan while entries name it as
  /// parent (verifying only), so a recomputed parent rejoins its old children exactly as vLLM's hash chain does.
  struct entry {
    std::uint64_t hash = 0;
    std::uint64_t extra = 0;
    std::uint64_t serial = 0;         ///< unique per entry created (from 1); 0 while the slot is free
    std::uint64_t parent_serial = 0;  ///< the parent's serial when this entry was created; 0 = root
    std::int32_t parent = -1;         ///< parent entry, -1 = root (stale once that slot's serial changed)
    std::int32_t next_same_hash = -1; ///< next entry with this hash; while free, the next free slot
    std::int32_t first_block = -1;    ///< earliest cached holder
    std::int32_t holders = 0;
    std::int32_t children = 0;        ///< live entries naming this one as parent
    std::int32_t orphan_prev = -1;    ///< orphan list links (orphan == true)
    std::int32_t orphan_next = -1;
    bool orphan = false;
  };
  struct block_link {
    std::int32_t entry = -1;
    block_id next = no_block;  ///< next holder of the same entry
    block_id prev = no_block;  ///< previous holder; for the first, the last
  };

  /// Entries per chunk: about 2^16 token ids (at least 64 entries), no more than the capacity needs.
  [[nodiscard]] static std::size_t chunk_entries(std::int32_t block_size, std::int32_t capacity) noexcept {
    const std::size_t by_tokens = std::max<std::size_t>(64, (std::size_t{1} << 16) / static_cast<std::size_t>(block_size));
    return std::min(std::bit_ceil(by_tokens), std::bit_ceil(static_cast<std::size_t>(capacity)));
  }

  [[nodiscard]] static std::uint64_t root_seed(std::uint64_t extra) noexcept {
    return splitmix64(extra);  // distinct extra keys give unrelated root seeds
  }

  [[nodiscard]] entry& at(std::int32_t e) noexcept {
    const auto u = static_cast<std::size_t>(e);
    return entries_.chunk(u >> chunk_shift_)[u & (entries_per_chunk() - 1)];
  }
  [[nodiscard]] const entry& at(std::int32_t e) const noexcept {
    const auto u = static_cast<std::size_t>(e);
    return entries_.chunk(u >> chunk_shift_)[u & (entries_per_chunk() - 1)];
  }
  [[nodiscard]] token_id* tokens_of(std::int32_t e) const noexcept {
    const auto u = static_cast<std::size_t>(e);
    return tokens_.chunk(u >> chunk_shift_) + (u & (entries_per_chunk() - 1)) * static_cast<std::size_t>(block_size_);
  }
  /// Whether slot `e` still holds the entry created with `serial`.
  [[nodiscard]] bool live(std::int32_t e, std::uint64_t serial) const noexcept {
    return e >= 0 && e < fresh_ && serial != 0 && at(e).serial == serial;
  }

  /// The entry for `tokens` after cursor `c` under hash h, or -1. Without verification the hash alone decides.
  [[nodiscard]] std::int32_t find_entry(std::uint64_t h, const cursor& c, std::span<const token_id> tokens) const noexcept {
    for (std::int32_t e = index_.find(h); e >= 0; e = at(e).next_same_hash) {
      if (!cfg_.verify_tokens) return e;
      const entry& en = at(e);
      if (en.parent == c.entry && en.parent_serial == c.serial && en.extra == c.extra &&
          std::equal(tokens.begin(), tokens.end(), tokens_of(e)))
        return e;
    }
    return -1;
  }

  /// A free entry slot: a released one, a never used one (allocating its chunk if needed), or the oldest orphan's.
  /// -1 only if memory for a chunk is short and there is no orphan, or if the bound were broken.
  std::int32_t acquire_entry() noexcept {
    if (free_head_ < 0 && fresh_ < capacity_ && storage_for(fresh_)) return fresh_++;
    if (free_head_ < 0 && orphan_head_ >= 0) {
      ++reclaimed_;
      release_entry(free_entry(orphan_head_));
    }
    if (free_head_ < 0) {
      KVPAGER_ASSERT(fresh_ < capacity_, "prefix_caching: content entries exhausted (live entries above the bound)");
      return -1;
    }
    const std::int32_t e = free_head_;
    free_head_ = at(e).next_same_hash;
    return e;
  }
  /// Whether slot `e` (at most one chunk past the allocated ones) has storage, allocating its chunks if needed.
  bool storage_for(std::int32_t e) noexcept {
    const std::size_t need = (static_cast<std::size_t>(e) >> chunk_shift_) + 1;
    if (entries_.num_chunks() < need && !entries_.grow()) return false;
    return !cfg_.verify_tokens || tokens_.num_chunks() >= need || tokens_.grow();
  }

  std::int32_t new_entry(std::uint64_t h, const cursor& c, std::span<const token_id> tokens) noexcept {
    const std::int32_t e = acquire_entry();
    if (e < 0) return -1;
    entry& en = at(e);
    en = entry{};
    en.hash = h;
    en.extra = c.extra;
    en.serial = ++serial_;
    en.parent = c.entry;
    en.parent_serial = c.serial;
    if (cfg_.verify_tokens) std::copy(tokens.begin(), tokens.end(), tokens_of(e));
    if (c.entry >= 0) ++at(c.entry).children;
    ++live_;
    // Append to the hash's entry list (collisions only; a later entry never precedes an earlier one).
    const std::int32_t head = index_.find(h);
    if (head < 0) {
      index_.insert(h, e);
    } else {
      std::int32_t t = head;
      while (at(t).next_same_hash >= 0) t = at(t).next_same_hash;
      at(t).next_same_hash = e;
    }
    return e;
  }

  /// Frees entry `e` and then its ancestors while nothing holds them and (verifying) no entry names them; an
  /// entry still named becomes an orphan.
  void release_entry(std::int32_t e) noexcept {
    while (e >= 0) {
      const entry& en = at(e);
      if (en.holders > 0) return;
      if (cfg_.verify_tokens && en.children > 0) {
        if (!en.orphan) link_orphan(e);
        return;
      }
      e = free_entry(e);
    }
  }

  /// Frees entry `e` whatever names it (entries naming it go stale: their parent's serial no longer matches);
  /// returns its parent if that is still live (its child count dropped), else -1.
  std::int32_t free_entry(std::int32_t e) noexcept {
    entry& en = at(e);
    if (en.orphan) unlink_orphan(e);
    const std::int32_t head = index_.find(en.hash);
    if (head == e) {
      index_.erase(en.hash);
      if (en.next_same_hash >= 0) index_.insert(en.hash, en.next_same_hash);
    } else {
      std::int32_t p = head;
      while (at(p).next_same_hash != e) p = at(p).next_same_hash;
      at(p).next_same_hash = en.next_same_hash;
    }
    std::int32_t parent = live(en.parent, en.parent_serial) ? en.parent : -1;
    en = entry{};
    en.next_same_hash = free_head_;
    free_head_ = e;
    --live_;
    if (parent >= 0) --at(parent).children;
    return parent;
  }

  void link_orphan(std::int32_t e) noexcept {
    entry& en = at(e);
    en.orphan = true;
    en.orphan_prev = orphan_tail_;
    en.orphan_next = -1;
    if (orphan_tail_ >= 0) {
      at(orphan_tail_).orphan_next = e;
    } else {
      orphan_head_ = e;
    }
    orphan_tail_ = e;
    ++num_orphans_;
  }
  void unlink_orphan(std::int32_t e) noexcept {
    entry& en = at(e);
    if (en.orphan_prev >= 0) {
      at(en.orphan_prev).orphan_next = en.orphan_next;
    } else {
      orphan_head_ = en.orphan_next;
    }
    if (en.orphan_next >= 0) {
      at(en.orphan_next).orphan_prev = en.orphan_prev;
    } else {
      orphan_tail_ = en.orphan_prev;
    }
    en.orphan = false;
    en.orphan_prev = en.orphan_next = -1;
    --num_orphans_;
  }

  prefix_caching_config cfg_{};
  [[no_unique_address]] Hasher hasher_{};
  std::int32_t block_size_ = 0;
  std::vector<block_link> blocks_;
  detail::chunk_array<entry> entries_;
  detail::chunk_array<token_id> tokens_;  ///< block_size token ids per entry, when verifying
  int chunk_shift_ = 0;                   ///< log2 of entries per chunk
  std::int32_t capacity_ = 0;             ///< max_entries()
  std::int32_t fresh_ = 0;                ///< slots [0, fresh_) have been used; the rest never
  std::int32_t free_head_ = -1;           ///< released slots, linked through next_same_hash
  std::int32_t live_ = 0;
  std::int32_t orphan_head_ = -1;         ///< orphans, oldest (lost its last holder longest ago) first
  std::int32_t orphan_tail_ = -1;
  std::int32_t num_orphans_ = 0;
  std::uint64_t serial_ = 0;
  std::int64_t reclaimed_ = 0;
  id_map index_;                          ///< hash -> first entry with that hash
  std::int32_t num_cached_ = 0;
  std::uint64_t generation_ = 0;  ///< see generation()
  std::uint64_t commits_ = 0;     ///< see commits()
};

/// Prefix caching with XXH3-64 block hashes and token verification.
using prefix_caching = basic_prefix_caching<xxh3_hasher>;

KVPAGER_NAMESPACE_END
