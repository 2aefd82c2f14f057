// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// KV cache events: what the prefix cache holds, reported as it changes, with the meaning of vLLM's
/// `vllm/distributed/kv_events.py` (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`), so a KV-aware router can
/// keep a view of every instance's cache. The cache appends them to a caller's `kv_event_buffer` (attached with
/// `set_kv_event_buffer`); the caller takes them once per step (a publisher encodes them: monitor/kv_events.hpp) and
/// clears the buffer, which keeps its capacity: once the buffer has grown to a step's events, recording allocates
/// nothing.
///
/// Semantics (as vLLM's block pool): one `block_stored` lists blocks newly cached, consecutive in one hash chain
/// (the parent of each is the one before it; the first one's parent is `parent_hash`, absent for a chain's first
/// block), with their token ids concatenated; one `block_removed` lists blocks whose cached content was discarded
/// (eviction, a cancelled append, ...). Events are per block, not per content: two blocks holding the same content
/// are stored twice and removed twice, so a consumer that counts each (medium, group, hash) rebuilds the cache's
/// cached blocks exactly. `all_blocks_cleared` empties every medium (a prefix-cache reset).

#include <cstdint>
#include <span>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

enum class kv_event_type : std::uint8_t { block_stored, block_removed, all_blocks_cleared };

/// Where the blocks of an event live. vLLM's names: "GPU" for the device pool, "CPU" for a host tier.
enum class kv_medium : std::uint8_t { device, host };

/// vLLM's medium string of `m`.
[[nodiscard]] constexpr const char* medium_name(kv_medium m) noexcept { return m == kv_medium::device ? "GPU" : "CPU"; }

/// One event; its hashes and token ids live in the buffer (kv_event_buffer::hashes_of, tokens_of).
struct kv_event {
  kv_event_type type = kv_event_type::block_stored;
  kv_medium medium = kv_medium::device;
  bool has_parent = false;       ///< block_stored: whether parent_hash is set (absent for a chain's first block)
  std::int32_t group = 0;        ///< the KV cache group (0 for a cache with one group)
  std::int32_t block_size = 0;   ///< block_stored: tokens per block
  std::uint64_t parent_hash = 0; ///< block_stored: the hash of the block before the first one listed
  std::uint32_t first_hash = 0;  ///< into kv_event_buffer::hashes
  std::uint32_t num_hashes = 0;
  std::uint32_t first_token = 0; ///< into kv_event_buffer::tokens (block_stored)
  std::uint32_t num_tokens = 0;
  friend bool operator==(const kv_event&, const kv_event&) = default;
};

/// The events of one step (or any span of time the caller chooses), in the order they happened. A plain value type.
struct kv_event_buffer {
  std::vector<kv_event> events;
  std::vector<std::uint64_t> hashes;  ///< every event's block hashes, in event order
  std::vector<token_id> tokens;       ///< every block_stored's token ids, in event order

  [[nodiscard]] bool empty() const noexcept { return events.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return events.size(); }
  /// Forgets the events, keeping the capacity (nothing is allocated again until a step records more than ever).
  void clear() noexcept {
    events.clear();
    hashes.clear();
    tokens.clear();
  }
  [[nodiscard]] std::span<const std::uint64_t> hashes_of(const kv_event& e) const noexcept {
    return {hashes.data() + e.first_hash, e.num_hashes};
  }
  [[nodiscard]] std::span<const token_id> tokens_of(const kv_event& e) const noexcept {
    return {tokens.data() + e.first_token, e.num_tokens};
  }

  /// Appends that block `hash` (holding `block_tokens`, after `parent` if `has_parent`) was stored in `group` on
  /// `medium`: to the last event when it is a block_stored of the same medium, group and block size whose last
  /// block is this one's parent (one chain, one event, as vLLM lists a request's new blocks), else as a new event.
  void block_stored(kv_medium medium, std::int32_t group, std::uint64_t hash, bool has_parent, std::uint64_t parent,
                    std::span<const token_id> block_tokens) {
    const auto bs = static_cast<std::int32_t>(block_tokens.size());
    if (!events.empty()) {
      kv_event& last = events.back();
      if (last.type == kv_event_type::block_stored && last.medium == medium && last.group == group &&
          last.block_size == bs && has_parent && hashes.back() == parent) {
        hashes.push_back(hash);
        tokens.insert(tokens.end(), block_tokens.begin(), block_tokens.end());
        ++last.num_hashes;
        last.num_tokens += static_cast<std::uint32_t>(bs);
        return;
      }
    }
    kv_event e;
    e.type = kv_event_type::block_stored;
    e.medium = medium;
    e.group = group;
    e.block_size = bs;
    e.has_parent = has_parent;
    e.parent_hash = has_parent ? parent : 0;
    e.first_hash = static_cast<std::uint32_t>(hashes.size());
    e.num_hashes = 1;
    e.first_token = static_cast<std::uint32_t>(tokens.size());
    e.num_tokens = static_cast<std::uint32_t>(bs);
    events.push_back(e);
    hashes.push_back(hash);
    tokens.insert(tokens.end(), block_tokens.begin(), block_tokens.end());
  }

  /// Appends that block `hash` was stored in `group` on `medium`, known by its hash alone (no parent, no token ids,
  /// block size 0: vLLM's offloading connector reports its host tier so): to the last event when it is such an
  /// event of the same medium and group, else as a new event.
  void block_stored_unchained(kv_medium medium, std::int32_t group, std::uint64_t hash) {
    hash_only(kv_event_type::block_stored, medium, group, hash);
  }

  /// Appends that block `hash` of `group` on `medium` was removed: to the last event when it is a block_removed of
  /// the same medium and group, else as a new event.
  void block_removed(kv_medium medium, std::int32_t group, std::uint64_t hash) {
    hash_only(kv_event_type::block_removed, medium, group, hash);
  }

  /// Appends that every medium was emptied.
  void all_blocks_cleared() {
    kv_event e;
    e.type = kv_event_type::all_blocks_cleared;
    e.first_hash = static_cast<std::uint32_t>(hashes.size());
    e.first_token = static_cast<std::uint32_t>(tokens.size());
    events.push_back(e);
  }

 private:
  /// An event of `type` that lists hashes only (a removal, a host tier's store): `hash` joins the last event when it
  /// is one of the same type, medium and group, else starts a new one.
  void hash_only(kv_event_type type, kv_medium medium, std::int32_t group, std::uint64_t hash) {
    if (!events.empty()) {
      kv_event& last = events.back();
      if (last.type == type && last.medium == medium && last.group == group && last.block_size == 0 &&
          !last.has_parent) {
        hashes.push_back(hash);
        ++last.num_hashes;
        return;
      }
    }
    kv_event e;
    e.type = type;
    e.medium = medium;
    e.group = group;
    e.first_hash = static_cast<std::uint32_t>(hashes.size());
    e.num_hashes = 1;
    e.first_token = static_cast<std::uint32_t>(tokens.size());
    events.push_back(e);
    hashes.push_back(hash);
  }
};

KVPAGER_NAMESPACE_END
