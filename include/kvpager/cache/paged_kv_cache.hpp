#pragma once
/// \file
/// paged_kv_cache: block tables for sequences over one block_pool, composed from four policies. It plans byte
/// movement (copy-on-write copies, slots of appended tokens) in a step_plan and exports kernel-facing tables into
/// caller-provided buffers; it never touches KV bytes and never throws. Every failed call leaves the cache exactly
/// as it was.
///
/// Typical engine step:
/// \code
///   cache.begin_step();                          // the previous plan has been executed
///   cache.add_sequence(id, prompt_len);          // prefill: ceil(prompt_len / block_size) blocks in one batch
///   cache.append_tokens(other_id, 1);            // decode: a new block exactly when the last one is full
///   run copies in cache.plan().copies();         // copy_blocks
///   cache.export_slot_mapping(slots);            // kv_append
///   cache.export_block_table(ids, table, stride, seq_lens);   // paged attention
/// \endcode

#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/allocator/free_list_allocator.hpp"
#include "kvpager/cache/step_plan.hpp"
#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/concepts/swap_policy.hpp"
#include "kvpager/core/assert.hpp"
#include "kvpager/core/block_pool.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/id_map.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/eviction/no_eviction.hpp"
#include "kvpager/sharing/refcount_sharing.hpp"
#include "kvpager/swap/no_swap.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Run-time configuration of a paged_kv_cache.
struct cache_config {
  std::int32_t block_size = 16;       ///< tokens per block; a power of two
  std::int32_t num_blocks = 0;        ///< blocks in the pool, including reserved ones
  std::int32_t reserved_blocks = 0;   ///< blocks [0, reserved) never handed out (1 = vLLM's null block)
  std::int32_t max_blocks_per_seq = 0;  ///< longest block table allowed; 0 = no limit
};

/// A snapshot of the cache's counts. Gauges are O(1) to read; counters are cumulative since creation.
struct cache_stats {
  std::int32_t block_size = 0;
  std::int32_t total = 0;         ///< usable blocks (num_blocks - reserved_blocks)
  std::int32_t free = 0;          ///< blocks in the allocator's free set
  std::int32_t used = 0;          ///< physical blocks in use (refcount > 0)
  std::int64_t logical = 0;       ///< logical block references = sum of block-table lengths
  std::int32_t shared = 0;        ///< physical blocks referenced by more than one sequence
  std::int32_t evictable = 0;     ///< cached, unreferenced blocks held by an indexed eviction policy
  std::int32_t pending_free = 0;  ///< unreferenced blocks a planned copy still uses; free at the next step
  std::int32_t sequences = 0;     ///< live sequences
  std::int64_t tokens = 0;        ///< tokens over all live sequences
  std::int64_t cow_copies = 0;    ///< copy-on-write block copies planned
  std::int64_t fork_copies = 0;   ///< block copies planned by copying forks (fork_mode::copy)
  std::int64_t evictions = 0;     ///< cached blocks whose content was discarded to reuse the block

  friend bool operator==(const cache_stats&, const cache_stats&) = default;

  /// Blocks an allocation can use now: free + evictable.
  [[nodiscard]] std::int32_t available() const noexcept { return free + evictable; }
  /// used / total.
  [[nodiscard]] double utilization() const noexcept { return total > 0 ? double(used) / double(total) : 0.0; }
  /// Fraction of logical references served by sharing: 1 - used / logical (0 when nothing is shared).
  [[nodiscard]] double sharing_ratio() const noexcept {
    return logical > 0 ? 1.0 - double(used) / double(logical) : 0.0;
  }
};

template <block_allocator A = free_list_allocator, eviction_policy E = no_eviction,
          sharing_policy S = refcount_sharing, swap_policy W = no_swap>
class paged_kv_cache {
 public:
  using allocator_policy = A;
  using eviction_policy_type = E;
  using sharing_policy_type = S;
  using swap_policy_type = W;

  /// Validates `cfg` and builds an empty cache. Errors: errc::invalid_block_size (not a positive power of two),
  /// errc::invalid_pool_size (no usable block), errc::invalid_argument (negative max_blocks_per_seq).
  [[nodiscard]] static result<paged_kv_cache> create(cache_config cfg, A allocator = A{}, E eviction = E{},
                                                     S sharing = S{}, W swap = W{}) {
    if (cfg.block_size <= 0 || !std::has_single_bit(static_cast<std::uint32_t>(cfg.block_size)))
      return status{errc::invalid_block_size, "paged_kv_cache::create: block_size must be a positive power of two",
                    cfg.block_size};
    if (cfg.max_blocks_per_seq < 0)
      return status{errc::invalid_argument, "paged_kv_cache::create: max_blocks_per_seq must be >= 0",
                    cfg.max_blocks_per_seq};
    auto pool = block_pool<A>::create({cfg.num_blocks, cfg.reserved_blocks}, std::move(allocator));
    if (!pool) return pool.error();
    return paged_kv_cache(cfg, std::move(*pool), std::move(eviction), std::move(sharing), std::move(swap));
  }

  // ------------------------------------------------------------------------------------------------ sequences

  /// Prefill: adds sequence `id` with a `num_tokens`-token prompt, taking ceil(num_tokens / block_size) blocks in
  /// one all-or-nothing batch, and plans the prompt's slots. Errors: errc::invalid_argument (num_tokens <= 0 or
  /// over max_blocks_per_seq), errc::duplicate_sequence, errc::out_of_blocks (detail = blocks needed).
  status add_sequence(seq_id id, std::int32_t num_tokens) {
    if (num_tokens <= 0)
      return status{errc::invalid_argument, "add_sequence: num_tokens must be positive", num_tokens};
    if (index_.find(id) >= 0) return status{errc::duplicate_sequence, "add_sequence: sequence id is already live"};
    const std::int64_t needed = blocks_for_tokens(num_tokens, cfg_.block_size);
    if (exceeds_table_limit(needed))
      return status{errc::invalid_argument, "add_sequence: prompt needs more than max_blocks_per_seq blocks", needed};
    if (needed > available_blocks())
      return status{errc::out_of_blocks, "add_sequence: not enough free blocks for the prompt", needed};

    const std::int32_t h = new_handle(id);
    seq_state& s = seqs_[static_cast<std::size_t>(h)];
    s.blocks.resize(static_cast<std::size_t>(needed));
    take_blocks(s.blocks);
    s.num_tokens = num_tokens;
    tokens_ += num_tokens;
    record_append(h, s, 0, num_tokens);
    return ok_status();
  }

  /// Decode: appends `n` tokens (default 1) to sequence `id`. Takes a new block exactly when the token count
  /// exceeds blocks x block_size; writing into a shared, partly filled last block first copies it
  /// (copy-on-write: a fresh block and a (src, dst) pair in the plan). All or nothing. Errors:
  /// errc::invalid_argument (n <= 0, or over max_blocks_per_seq), errc::unknown_sequence, errc::out_of_blocks.
  status append_tokens(seq_id id, std::int32_t n = 1) {
    if (n <= 0) return status{errc::invalid_argument, "append_tokens: token count must be positive", n};
    const std::int32_t h = index_.find(id);
    if (h < 0) return status{errc::unknown_sequence, "append_tokens: unknown sequence id"};
    seq_state& s = seqs_[static_cast<std::size_t>(h)];
    const std::int64_t new_total = std::int64_t{s.num_tokens} + n;
    if (new_total > INT32_MAX)
      return status{errc::invalid_argument, "append_tokens: sequence would exceed 2^31-1 tokens", new_total};
    const std::int64_t total_blocks = blocks_for_tokens(new_total, cfg_.block_size);
    if (exceeds_table_limit(total_blocks))
      return status{errc::invalid_argument, "append_tokens: sequence would need more than max_blocks_per_seq blocks",
                    total_blocks};
    const std::int64_t grow = total_blocks - static_cast<std::int64_t>(s.blocks.size());
    const bool cow = s.num_tokens % cfg_.block_size != 0 && pool_.refcount(s.blocks.back()) > 1;
    if (grow + (cow ? 1 : 0) > available_blocks())
      return status{errc::out_of_blocks, "append_tokens: not enough free blocks", grow + (cow ? 1 : 0)};

    if (cow) {
      const block_id src = s.blocks.back();
      block_id dst = no_block;
      take_blocks(std::span<block_id>(&dst, 1));
      plan_copy(src, dst);
      ++cow_copies_;
      s.blocks.back() = dst;
      release_block(src);  // still referenced by the other sharers
    }
    if (grow > 0) {
      const std::size_t old = s.blocks.size();
      s.blocks.resize(old + static_cast<std::size_t>(grow));
      take_blocks(std::span<block_id>(s.blocks).subspan(old));
    }
    record_append(h, s, s.num_tokens, n);
    s.num_tokens = static_cast<std::int32_t>(new_total);
    tokens_ += n;
    return ok_status();
  }

  /// Forks `child` from `parent`: the child starts with the parent's first `num_tokens` tokens (all of them when
  /// num_tokens is 0; a shared system prompt when fewer). With fork_mode::share the child references the
  /// parent's blocks; with fork_mode::copy it gets fresh blocks and the plan copies them (all or nothing).
  /// Errors: errc::unknown_sequence (parent), errc::duplicate_sequence (child is live or equals parent),
  /// errc::invalid_argument (num_tokens < 0 or over the parent's length), errc::pending_append (the parent's
  /// tokens appended in this step are not written yet: fork after begin_step), errc::out_of_blocks (copy mode).
  status fork(seq_id parent, seq_id child, std::int32_t num_tokens = 0) {
    const std::int32_t ph = index_.find(parent);
    if (ph < 0) return status{errc::unknown_sequence, "fork: unknown parent sequence id"};
    if (child == parent || index_.find(child) >= 0)
      return status{errc::duplicate_sequence, "fork: child sequence id is already live"};
    const seq_state& p = seqs_[static_cast<std::size_t>(ph)];
    if (num_tokens < 0 || num_tokens > p.num_tokens)
      return status{errc::invalid_argument, "fork: num_tokens must be in [0, parent length]", num_tokens};
    if (p.append_step == step_)
      return status{errc::pending_append, "fork: the parent has tokens appended in this step; fork after begin_step"};
    const std::int32_t tokens = num_tokens == 0 ? p.num_tokens : num_tokens;
    const auto k = static_cast<std::size_t>(blocks_for_tokens(tokens, cfg_.block_size));
    if constexpr (S::fork == fork_mode::copy) {
      if (static_cast<std::int64_t>(k) > available_blocks())
        return status{errc::out_of_blocks, "fork: not enough free blocks to copy the parent",
                      static_cast<std::int64_t>(k)};
    }

    const std::int32_t h = new_handle(child);  // may reallocate seqs_: index by handle from here on
    seq_state& c = seqs_[static_cast<std::size_t>(h)];
    const std::vector<block_id>& pblocks = seqs_[static_cast<std::size_t>(ph)].blocks;
    c.blocks.resize(k);
    if constexpr (S::fork == fork_mode::share) {
      for (std::size_t i = 0; i < k; ++i) {
        c.blocks[i] = pblocks[i];
        pool_.add_ref(pblocks[i]);
      }
    } else {
      take_blocks(c.blocks);
      for (std::size_t i = 0; i < k; ++i) plan_copy(pblocks[i], c.blocks[i]);
      fork_copies_ += static_cast<std::int64_t>(k);
      c.append_step = step_;  // its bytes arrive with this step's copies
    }
    c.num_tokens = tokens;
    tokens_ += tokens;
    return ok_status();
  }

  /// Frees sequence `id`: references are dropped last block first (so with LRU the tail of a chain is reclaimed
  /// before its head); a block whose count reaches zero returns to the pool (or stays cached, per the eviction
  /// policy). Slots it appended in this step export as -1. Error: errc::unknown_sequence (never added or already
  /// freed).
  status free_sequence(seq_id id) {
    const std::int32_t h = index_.find(id);
    if (h < 0) return status{errc::unknown_sequence, "free_sequence: unknown sequence id (never added or already freed)"};
    seq_state& s = seqs_[static_cast<std::size_t>(h)];
    for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) release_block(*it);
    if (s.append_step == step_)
      for (std::int32_t& owner : append_owner_)
        if (owner == h) owner = -1;
    tokens_ -= s.num_tokens;
    s.blocks.clear();  // keeps capacity for the next sequence in this handle
    s.num_tokens = 0;
    s.append_step = no_step;
    index_.erase(id);
    free_handles_.push_back(h);
    return ok_status();
  }

  /// Starts a new step: the previous plan is taken as executed, it is cleared, and blocks that planned copies
  /// kept busy become reusable. O(blocks touched by the previous plan).
  void begin_step() {
    for (const block_id b : busy_list_) busy_[static_cast<std::size_t>(b)] = 0;
    busy_list_.clear();
    for (const block_id b : deferred_) settle(b);
    deferred_.clear();
    plan_.clear();
    append_owner_.clear();
    ++step_;
  }

  /// The byte movement planned since the last begin_step().
  [[nodiscard]] const step_plan& plan() const noexcept { return plan_; }

  // ------------------------------------------------------------------------------------------------ queries

  [[nodiscard]] bool contains(seq_id id) const noexcept { return index_.find(id) >= 0; }
  [[nodiscard]] std::int32_t num_sequences() const noexcept { return index_.size(); }
  [[nodiscard]] std::int32_t block_size() const noexcept { return cfg_.block_size; }
  [[nodiscard]] const cache_config& config() const noexcept { return cfg_; }

  /// Tokens of sequence `id`; errc::unknown_sequence.
  [[nodiscard]] result<std::int32_t> num_tokens(seq_id id) const noexcept {
    const std::int32_t h = index_.find(id);
    if (h < 0) return status{errc::unknown_sequence, "num_tokens: unknown sequence id"};
    return seqs_[static_cast<std::size_t>(h)].num_tokens;
  }

  /// The block table of sequence `id` (valid until the next call that changes that sequence);
  /// errc::unknown_sequence.
  [[nodiscard]] result<std::span<const block_id>> block_table(seq_id id) const noexcept {
    const std::int32_t h = index_.find(id);
    if (h < 0) return status{errc::unknown_sequence, "block_table: unknown sequence id"};
    return std::span<const block_id>(seqs_[static_cast<std::size_t>(h)].blocks);
  }

  /// Reference count of block `b` (0 when free, parked, reserved or out of range).
  [[nodiscard]] std::int32_t refcount(block_id b) const noexcept { return pool_.refcount(b); }
  /// Whether `b` is in the allocator's free set.
  [[nodiscard]] bool is_free(block_id b) const noexcept { return pool_.is_free(b); }

  /// Blocks an allocation can use now (free + evictable).
  [[nodiscard]] std::int64_t available_blocks() const noexcept {
    std::int64_t n = pool_.num_free();
    if constexpr (E::retention == retention_mode::indexed) n += evict_.size();
    return n;
  }
  /// Blocks a prompt of `num_tokens` tokens needs.
  [[nodiscard]] std::int64_t blocks_needed(std::int64_t num_tokens) const noexcept {
    return blocks_for_tokens(num_tokens, cfg_.block_size);
  }

  [[nodiscard]] cache_stats stats() const noexcept {
    const pool_stats p = pool_.stats();
    cache_stats s;
    s.block_size = cfg_.block_size;
    s.total = p.total;
    s.free = p.free;
    s.used = p.used;
    s.logical = p.references;
    s.shared = p.shared;
    if constexpr (E::retention == retention_mode::indexed) s.evictable = evict_.size();
    s.pending_free = static_cast<std::int32_t>(deferred_.size());
    s.sequences = index_.size();
    s.tokens = tokens_;
    s.cow_copies = cow_copies_;
    s.fork_copies = fork_copies_;
    s.evictions = evictions_;
    return s;
  }

  [[nodiscard]] const block_pool<A>& pool() const noexcept { return pool_; }
  [[nodiscard]] const E& eviction() const noexcept { return evict_; }
  [[nodiscard]] const S& sharing() const noexcept { return share_; }
  [[nodiscard]] const W& swap() const noexcept { return swap_; }

  // ------------------------------------------------------------------------------------------------ exports

  /// Dense page table (vLLM layout): row i of `table` (`row_stride` int32 entries) gets the block ids of
  /// `seqs[i]`, padded with -1; `seq_lens[i]` its token count. Validates everything before writing anything.
  /// Errors: errc::invalid_argument (row_stride <= 0), errc::unknown_sequence, errc::buffer_too_small (a
  /// buffer, or a sequence with more than row_stride blocks; detail = entries needed).
  status export_block_table(std::span<const seq_id> seqs, std::span<std::int32_t> table, std::int32_t row_stride,
                            std::span<std::int32_t> seq_lens) const noexcept {
    if (row_stride <= 0)
      return status{errc::invalid_argument, "export_block_table: row_stride must be positive", row_stride};
    if (seq_lens.size() < seqs.size())
      return status{errc::buffer_too_small, "export_block_table: seq_lens is shorter than seqs",
                    static_cast<std::int64_t>(seqs.size())};
    const auto need = static_cast<std::int64_t>(seqs.size()) * row_stride;
    if (static_cast<std::int64_t>(table.size()) < need)
      return status{errc::buffer_too_small, "export_block_table: table is smaller than seqs x row_stride", need};
    for (const seq_id id : seqs) {
      const std::int32_t h = index_.find(id);
      if (h < 0) return status{errc::unknown_sequence, "export_block_table: unknown sequence id"};
      const auto n = static_cast<std::int64_t>(seqs_[static_cast<std::size_t>(h)].blocks.size());
      if (n > row_stride)
        return status{errc::buffer_too_small, "export_block_table: a sequence has more blocks than row_stride", n};
    }
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      const seq_state& s = seqs_[static_cast<std::size_t>(index_.find(seqs[i]))];
      std::int32_t* row = table.data() + i * static_cast<std::size_t>(row_stride);
      std::copy(s.blocks.begin(), s.blocks.end(), row);
      std::fill(row + s.blocks.size(), row + row_stride, no_block);
      seq_lens[i] = s.num_tokens;
    }
    return ok_status();
  }

  /// Number of `indices` entries export_csr needs for `seqs`; errc::unknown_sequence.
  [[nodiscard]] result<std::int64_t> csr_size(std::span<const seq_id> seqs) const noexcept {
    std::int64_t n = 0;
    for (const seq_id id : seqs) {
      const std::int32_t h = index_.find(id);
      if (h < 0) return status{errc::unknown_sequence, "csr_size: unknown sequence id"};
      n += static_cast<std::int64_t>(seqs_[static_cast<std::size_t>(h)].blocks.size());
    }
    return n;
  }

  /// CSR page table (FlashInfer layout): the blocks of seqs[i] are indices[indptr[i] .. indptr[i+1]);
  /// last_page_len[i] = tokens in its last block (in [1, block_size]). Validates before writing.
  /// Errors: errc::unknown_sequence, errc::buffer_too_small (indptr < seqs + 1, last_page_len < seqs,
  /// indices < csr_size, or a total over 2^31-1 entries; detail = entries needed).
  status export_csr(std::span<const seq_id> seqs, std::span<std::int32_t> indptr, std::span<std::int32_t> indices,
                    std::span<std::int32_t> last_page_len) const noexcept {
    const auto total = csr_size(seqs);
    if (!total) return total.error();
    if (indptr.size() < seqs.size() + 1)
      return status{errc::buffer_too_small, "export_csr: indptr needs seqs + 1 entries",
                    static_cast<std::int64_t>(seqs.size() + 1)};
    if (last_page_len.size() < seqs.size())
      return status{errc::buffer_too_small, "export_csr: last_page_len is shorter than seqs",
                    static_cast<std::int64_t>(seqs.size())};
    if (static_cast<std::int64_t>(indices.size()) < *total || *total > INT32_MAX)
      return status{errc::buffer_too_small, "export_csr: indices cannot hold every block", *total};
    std::int32_t pos = 0;
    indptr[0] = 0;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      const seq_state& s = seqs_[static_cast<std::size_t>(index_.find(seqs[i]))];
      std::copy(s.blocks.begin(), s.blocks.end(), indices.begin() + pos);
      pos += static_cast<std::int32_t>(s.blocks.size());
      indptr[i + 1] = pos;
      last_page_len[i] = s.num_tokens - (static_cast<std::int32_t>(s.blocks.size()) - 1) * cfg_.block_size;
    }
    return ok_status();
  }

  /// Length of the slot mapping of this step (plan().num_append_tokens()).
  [[nodiscard]] std::int64_t slot_mapping_size() const noexcept { return plan_.num_append_tokens(); }

  /// Slot mapping of the tokens appended in this step, in plan().appends() order: slot = block * block_size +
  /// offset, computed in 64 bits; -1 for tokens of sequences freed since they were appended (kernels skip them).
  /// Error: errc::buffer_too_small (detail = slot_mapping_size()); nothing written then.
  status export_slot_mapping(std::span<std::int64_t> out) const noexcept {
    if (static_cast<std::int64_t>(out.size()) < plan_.num_append_tokens())
      return status{errc::buffer_too_small, "export_slot_mapping: buffer is shorter than slot_mapping_size()",
                    plan_.num_append_tokens()};
    const std::span<const token_range> ranges = plan_.appends();
    const std::int64_t bs = cfg_.block_size;
    std::int64_t* o = out.data();
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      const token_range& tr = ranges[r];
      const std::int32_t owner = append_owner_[r];
      if (owner < 0) {
        o = std::fill_n(o, tr.count, std::int64_t{-1});
        continue;
      }
      const block_id* blocks = seqs_[static_cast<std::size_t>(owner)].blocks.data();
      for (std::int64_t p = tr.first_pos; p < std::int64_t{tr.first_pos} + tr.count; ++p)
        *o++ = std::int64_t{blocks[p / bs]} * bs + p % bs;
    }
    return ok_status();
  }

 private:
  static constexpr std::uint64_t no_step = ~std::uint64_t{0};

  struct seq_state {
    std::vector<block_id> blocks;
    seq_id id = 0;
    std::int32_t num_tokens = 0;
    std::uint64_t append_step = no_step;  ///< step of the last append whose bytes are not written yet
  };

  paged_kv_cache(cache_config cfg, block_pool<A> pool, E e, S s, W w)
      : cfg_(cfg), pool_(std::move(pool)), evict_(std::move(e)), share_(std::move(s)), swap_(std::move(w)) {
    evict_.reset(cfg.num_blocks);
    share_.reset(cfg.num_blocks);
    swap_.reset(cfg.num_blocks);
    busy_.assign(static_cast<std::size_t>(cfg.num_blocks), 0);
  }

  [[nodiscard]] bool exceeds_table_limit(std::int64_t blocks) const noexcept {
    return cfg_.max_blocks_per_seq > 0 && blocks > cfg_.max_blocks_per_seq;
  }

  std::int32_t new_handle(seq_id id) {
    std::int32_t h;
    if (!free_handles_.empty()) {
      h = free_handles_.back();
      free_handles_.pop_back();
    } else {
      h = static_cast<std::int32_t>(seqs_.size());
      seqs_.emplace_back();
    }
    seqs_[static_cast<std::size_t>(h)].id = id;
    index_.insert(id, h);
    return h;
  }

  /// Fills `out` with blocks; the caller has checked out.size() <= available_blocks(). Clean free blocks first,
  /// then (indexed retention) victims of the eviction policy. A reused block that still holds cached content is
  /// evicted here, lazily (vLLM's order with retention_mode::in_free_list).
  void take_blocks(std::span<block_id> out) noexcept {
    KVPAGER_ASSERT(static_cast<std::int64_t>(out.size()) <= available_blocks(), "take_blocks: capacity not checked");
    for (block_id& b : out) {
      if (pool_.num_free() > 0) {
        b = pool_.pop_free();
        if constexpr (E::retention == retention_mode::in_free_list) {
          if (share_.is_cached(b)) evict(b);
        }
      } else {
        if constexpr (E::retention == retention_mode::indexed) {
          b = evict_.pop_victim();
          evict(b);
          pool_.adopt(b);
        }
      }
      KVPAGER_ASSERT(!share_.is_cached(b), "take_blocks: a handed-out block still carries cached content");
    }
  }

  void evict(block_id b) noexcept {
    share_.uncache(b);
    ++evictions_;
  }

  /// Drops one reference; at zero the block is parked while a planned copy uses it, else settled.
  void release_block(block_id b) {
    if (pool_.drop_ref(b) > 0) return;
    if (busy_[static_cast<std::size_t>(b)] != 0) {
      deferred_.push_back(b);
      return;
    }
    settle(b);
  }

  /// Where an unreferenced block goes: back to the allocator, or kept cached per the eviction policy.
  void settle(block_id b) noexcept {
    KVPAGER_ASSERT(pool_.refcount(b) == 0, "settle: block is still referenced");
    if (share_.is_cached(b)) {
      if constexpr (E::retention == retention_mode::indexed) {
        evict_.insert(b, retention_hint{});
        return;
      } else if constexpr (E::retention == retention_mode::none) {
        share_.uncache(b);
      }
    }
    pool_.recycle(b);
  }

  void plan_copy(block_id src, block_id dst) {
    plan_.add_copy(block_copy{src, dst});
    mark_busy(src);
    mark_busy(dst);
  }

  void mark_busy(block_id b) {
    std::uint8_t& f = busy_[static_cast<std::size_t>(b)];
    if (f == 0) {
      f = 1;
      busy_list_.push_back(b);
    }
  }

  void record_append(std::int32_t h, seq_state& s, std::int32_t first_pos, std::int32_t count) {
    plan_.add_append(token_range{s.id, first_pos, count});
    append_owner_.push_back(h);
    s.append_step = step_;
  }

  cache_config cfg_;
  block_pool<A> pool_;
  [[no_unique_address]] E evict_;
  [[no_unique_address]] S share_;
  [[no_unique_address]] W swap_;
  std::vector<seq_state> seqs_;
  std::vector<std::int32_t> free_handles_;
  id_map index_;
  step_plan plan_;
  std::vector<std::int32_t> append_owner_;  ///< handle per plan_.appends() entry; -1 once that sequence is freed
  std::vector<std::uint8_t> busy_;          ///< per block: source or destination of a copy planned this step
  std::vector<block_id> busy_list_;
  std::vector<block_id> deferred_;          ///< unreferenced busy blocks, settled at the next begin_step
  std::uint64_t step_ = 0;
  std::int64_t tokens_ = 0;
  std::int64_t cow_copies_ = 0;
  std::int64_t fork_copies_ = 0;
  std::int64_t evictions_ = 0;
};

KVPAGER_NAMESPACE_END
