// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// tier_link: a paged_kv_cache's host tier (cache_config::host_tier) and what the cache does with it. It owns the
/// host_tier<P>, turns its decisions into step-plan entries (a load is a swap-in from the tier's host block, a store
/// a swap-out to it; tier block i is host block num_host_blocks + i), keeps every transfer in flight until it is
/// complete, and completes them: all at the next begin_step (synchronous, the default), or one by one as the engine
/// reports them (host_tier_options::async, complete_tier_transfers), ok or failed. Write-through stores a block at the
/// begin_step after it was cached; write-back stores the blocks the device pool evicts, in the step it evicts them
/// (the swap-outs run before anything of the step writes). With async transfers a sequence admitted with blocks to
/// load is recorded here (a pending_load) until they are all in, one fails or the timeout passes.
/// tier_link<no_tier> is empty and does nothing.

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/cache/cache_types.hpp"
#include "kvpager/cache/detail/step_ledger.hpp"
#include "kvpager/concepts/tier_policy.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/kv_events.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/tier/host_tier.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

/// No host tier: nothing to do (the cache compiles its tier code out).
template <class T>
class tier_link {
 public:
  static constexpr bool enabled = false;
  /// errc::invalid_argument when cfg asks for host tier blocks without a tier policy.
  static result<tier_link> create(const cache_config& cfg, const T& /*policy*/) {
    if (cfg.host_tier.num_blocks != 0)
      return status{errc::invalid_argument,
                    "paged_kv_cache::create: host_tier.num_blocks is set but the cache has no tier policy (no_tier)",
                    cfg.host_tier.num_blocks};
    return tier_link{};
  }
};

/// A sequence admitted with host blocks to load, under async transfers: blocks [first, first + count) of its table
/// are being loaded; the tokens and chained hashes of its first first + count blocks commit them once they are in.
struct pending_load {
  seq_id id = 0;
  std::int32_t first = 0;        ///< device hits before the loaded blocks
  std::int32_t count = 0;        ///< blocks loaded
  std::int32_t outstanding = 0;  ///< loads not reported yet
  tier_load_state state = tier_load_state::none;  ///< none: the record is free
  std::uint64_t deadline = 0;    ///< the step from which its loads count as timed out
  std::uint64_t extra_key = 0;
  std::vector<std::uint8_t> done;       ///< per loaded block: 0 in flight, 1 in, 2 failed
  std::vector<block_id> tier_blocks;    ///< per loaded block: its tier block
  std::vector<token_id> tokens;         ///< the prompt's first (first + count) x block_size tokens
  std::vector<std::uint64_t> hashes;    ///< the chained hashes of those blocks
  /// hybrid_kv_cache: per loaded block, its table entry (position x max groups + group); empty for paged_kv_cache,
  /// whose loaded blocks are entries [first, first + count) of its one table.
  std::vector<std::int32_t> cells;

  /// Loaded blocks reported in, before the first that is not.
  [[nodiscard]] std::int32_t good() const noexcept {
    std::int32_t g = 0;
    while (g < count && done[static_cast<std::size_t>(g)] == 1) ++g;
    return g;
  }
};

template <tier_policy P>
class tier_link<P> {
 public:
  static constexpr bool enabled = true;
  using tier_type = host_tier<P>;

  /// The tier of cfg.host_tier. Errors: errc::invalid_pool_size (no tier blocks), host_tier::create's.
  static result<tier_link> create(const cache_config& cfg, P policy) {
    const host_tier_options& o = cfg.host_tier;
    if (o.num_blocks <= 0)
      return status{errc::invalid_pool_size,
                    "paged_kv_cache::create: a cache with a tier policy needs host_tier.num_blocks > 0", o.num_blocks};
    auto t = tier_type::create({o.num_blocks, o.store_threshold, o.max_tracker_size, o.min_priority, o.inclusive},
                               std::move(policy));
    if (!t) return t.error();
    tier_link l(std::move(*t));
    l.base_ = cfg.num_host_blocks;
    l.opts_ = o;
    const auto n = static_cast<std::size_t>(cfg.num_blocks);
    l.priority_.assign(n, 0);
    l.queued_.assign(n, 0);
    l.committed_.reserve(n);
    l.keys_.reserve(n);
    l.host_.reserve(n);
    l.flight_.assign(static_cast<std::size_t>(o.num_blocks), flight{});
    l.flying_.reserve(static_cast<std::size_t>(o.num_blocks));
    return l;
  }

  [[nodiscard]] const tier_type& tier() const noexcept { return tier_; }
  [[nodiscard]] bool async() const noexcept { return opts_.async; }
  /// Changes whenever a lookup's answer may have changed (a store completed, a block left the tier or was pinned).
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }
  /// Loads and stores planned and not yet complete.
  [[nodiscard]] bool in_flight() const noexcept { return !flying_.empty(); }
  [[nodiscard]] std::int32_t num_in_flight() const noexcept { return static_cast<std::int32_t>(flying_.size()); }
  void set_events(kv_event_buffer* out) noexcept { tier_.set_kv_event_buffer(out); }

  /// Whether a load of `key` could be planned now: held, its store complete, and no load of it in flight (nothing
  /// is loaded twice for the same content).
  [[nodiscard]] bool ready(std::uint64_t key) const noexcept {
    const block_id hb = tier_.host_block(key);
    return hb != no_block && tier_.state(hb) == 0;
  }

  /// Scratch for an admission's keys: the blocks after the device hits, up to and including the first the tier
  /// cannot serve.
  std::vector<std::uint64_t>& keys() noexcept { return keys_; }

  /// An admission took device blocks `dst` for the first dst.size() keys (all ready): counts the lookups of keys()
  /// for selective storing, pins the host blocks and plans their loads (of KV cache group `group`'s layers), marks
  /// them used. loaded() then lists their tier blocks; `slot` is the first one's index in a later wait record.
  void load(std::span<const block_id> dst, step_ledger& ledger, cache_stats& counts, std::int32_t group = 0,
            std::int32_t slot = 0) {
    (void)tier_.lookup_prefix(keys_);
    const std::span<const std::uint64_t> loaded = std::span<const std::uint64_t>(keys_).first(dst.size());
    host_.clear();
    if (loaded.empty()) return;
    host_.resize(loaded.size());
    [[maybe_unused]] const status st = tier_.prepare_load(loaded, host_);
    KVPAGER_ASSERT(st.ok(), "tier_link::load: a key that was ready is not loadable");
    tier_.touch(loaded);
    for (std::size_t i = 0; i < dst.size(); ++i) {
      ledger.plan_swap_in(block_swap{dst[i], base_ + host_[i], group});
      fly(host_[i], flight{loaded[i], dst[i], -1, slot + static_cast<std::int32_t>(i), -1, group, kind::load, false});
    }
    counts.tier_loaded_blocks += static_cast<std::int64_t>(dst.size());
    if (opts_.async) ++generation_;  // pinned: no longer ready for another lookup until it is in
  }

  /// The tier blocks of the last load(), in its order. (Made from data() and size(): a span's range constructor
  /// here costs every unit that includes the cache 2% more to compile, its concepts checked where it is parsed.)
  [[nodiscard]] std::span<const block_id> loaded() const noexcept { return {host_.data(), host_.size()}; }

  /// With async transfers, after the loads of a hybrid_kv_cache admission: sequence `id` waits for the blocks of
  /// tier blocks `tier_blocks` loaded into table entries `cells` (pending_load::cells; in the loads' slot order);
  /// `tokens` and `hashes` are those of the prompt's blocks up to the last entry of its hit.
  void wait_for_cells(seq_id id, std::span<const block_id> tier_blocks, std::span<const std::int32_t> cells,
                      std::span<const token_id> tokens, std::span<const std::uint64_t> hashes, std::uint64_t extra_key,
                      std::uint64_t now) {
    pending_load& p = record(id, static_cast<std::int32_t>(tier_blocks.size()), 0, extra_key, now, tier_blocks);
    p.tokens.assign(tokens.begin(), tokens.end());
    p.hashes.assign(hashes.begin(), hashes.end());
    p.cells.assign(cells.begin(), cells.end());
  }

  /// With async transfers, after load(dst, ...): sequence `id` waits for them. `first` device hits precede them
  /// (`hit_hash(i)`: the chained hash of hit i); `tokens` are (at least) the prompt's first first + dst.size()
  /// blocks (the loaded ones' hashes are keys()); the loads time out from step `now` + load_timeout_steps.
  template <class HitHash>
  void wait_for_loads(seq_id id, std::int32_t first, std::span<const block_id> dst, std::span<const token_id> tokens,
                      HitHash&& hit_hash, std::int32_t block_size, std::uint64_t extra_key, std::uint64_t now) {
    const auto n = static_cast<std::int32_t>(dst.size());
    pending_load& p = record(id, n, first, extra_key, now, host_);
    p.tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(first + n) * block_size);
    p.hashes.clear();
    for (std::int32_t i = 0; i < first; ++i) p.hashes.push_back(hit_hash(i));
    p.hashes.insert(p.hashes.end(), keys_.begin(), keys_.begin() + n);
    p.cells.clear();
  }

  /// Where sequence `id` stands with its loads.
  [[nodiscard]] tier_load_state load_state(seq_id id) const noexcept {
    const pending_load* p = find(id);
    return p == nullptr ? tier_load_state::none : p->state;
  }
  /// Whether sequence `id` has a load record (loading or failed): it must not be computed, appended to, forked,
  /// swapped or preempted. O(1) while no sequence waits.
  [[nodiscard]] bool waits(seq_id id) const noexcept { return waiting_ > 0 && find(id) != nullptr; }

  /// Sequence `id` (its block table `blocks`) is being freed: the blocks of its loads still in flight are left to
  /// the transfers (set to no_block in `blocks`: not released now; released when the engine reports them) and its
  /// record goes.
  void drop_sequence(seq_id id, std::span<block_id> blocks) noexcept {
    drop_sequence_with(id, [blocks](const pending_load& p, std::int32_t j) noexcept {
      blocks[static_cast<std::size_t>(p.first + j)] = no_block;
    });
  }
  /// drop_sequence with the table entry of each load in flight left out by `leave(record, j)` (the j-th loaded
  /// block).
  template <class Leave>
  void drop_sequence_with(seq_id id, Leave&& leave) noexcept {
    if (waiting_ == 0) return;
    pending_load* p = find(id);
    if (p == nullptr) return;
    for (std::int32_t j = 0; j < p->count; ++j) {
      if (p->done[static_cast<std::size_t>(j)] != 0) continue;
      flight_[static_cast<std::size_t>(p->tier_blocks[static_cast<std::size_t>(j)])].owner = -1;
      leave(*p, j);
    }
    p->state = tier_load_state::none;
    --waiting_;
  }

  /// A hybrid_kv_cache's tier: its keys are cached_key(hash, group); `unmix(key, group)` gives the name KV cache
  /// events report (the hash and group), and each device block's group (committed) names the layers a store moves.
  void name_blocks(kv_block_name (*unmix)(std::uint64_t, std::int32_t)) {
    unmix_ = unmix;
    group_.assign(priority_.size(), 0);
  }

  /// Block `b` (of KV cache group `group`) was just cached by a sequence of retention priority `priority`:
  /// write-through stores it at the next begin_step (its bytes are in place then).
  void committed(block_id b, std::int32_t priority, std::int32_t group = 0) {
    priority_[static_cast<std::size_t>(b)] = priority;
    if (!group_.empty()) group_[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(group);
    if (opts_.write != tier_write::through) return;
    std::uint8_t& q = queued_[static_cast<std::size_t>(b)];
    if (q != 0) return;
    q = 1;
    committed_.push_back(b);  // at most one entry per block: within the reserved room
  }

  /// After an operation that took device blocks: write-back stores what the device evicted for them, in this step.
  template <class Store>
  void evicted(Store& blocks, step_ledger& ledger, cache_stats& counts) {
    if (opts_.write == tier_write::back)
      for (const auto& e : blocks.evicted()) store(e.block, e.hash, false, ledger, counts);
    blocks.clear_evicted();
  }

  /// The previous plan has run. Synchronous transfers: its loads and stores are complete. Async: loads waited for
  /// past their timeout fail (`resolve(p)` for each such record). Then write-through plans the stores of the blocks
  /// cached in the previous step that are still cached (`hash_of(b, key)`: false when `b` no longer is, else true
  /// with its content's key in `key`); with async transfers `pin(b)` keeps each store's source until it completes.
  template <class HashOf, class Pin, class Resolve>
  void begin_step(HashOf&& hash_of, Pin&& pin, Resolve&& resolve, std::uint64_t now, step_ledger& ledger,
                  cache_stats& counts) {
    if (!opts_.async) {
      while (!flying_.empty()) {
        const std::int32_t h = flying_.back();
        finish(h, true, true);
      }
    } else if (waiting_ > 0) {
      for (pending_load& p : pending_)
        if (p.state == tier_load_state::loading && now >= p.deadline) {
          p.state = tier_load_state::failed;
          ++counts.tier_load_timeouts;
          resolve(p);
        }
    }
    for (const block_id b : committed_) {
      queued_[static_cast<std::size_t>(b)] = 0;
      std::uint64_t key = 0;
      if (!hash_of(b, key)) continue;
      if (store(b, key, opts_.async, ledger, counts) && opts_.async) pin(b);
    }
    committed_.clear();
  }

  /// errc::invalid_argument unless each of `done` names a transfer in flight as it was planned (its device and
  /// host blocks and its group), once; errc::unsupported with synchronous transfers. Changes nothing.
  [[nodiscard]] status check(std::span<const tier_done> done) const noexcept {
    if (!opts_.async)
      return status{errc::unsupported,
                    "complete_tier_transfers: the host tier's transfers are synchronous (they complete at begin_step)"};
    for (std::size_t i = 0; i < done.size(); ++i) {
      const std::int64_t h = std::int64_t{done[i].swap.host} - base_;
      if (h < 0 || h >= static_cast<std::int64_t>(flight_.size()) ||
          flight_[static_cast<std::size_t>(h)].what == kind::none ||
          flight_[static_cast<std::size_t>(h)].device != done[i].swap.device ||
          flight_[static_cast<std::size_t>(h)].group != done[i].swap.group)
        return status{errc::invalid_argument,
                      "complete_tier_transfers: no host tier transfer in flight between these blocks",
                      static_cast<std::int64_t>(i)};
      for (std::size_t j = 0; j < i; ++j)
        if (done[j].swap.host == done[i].swap.host)
          return status{errc::invalid_argument, "complete_tier_transfers: a transfer is listed twice",
                        static_cast<std::int64_t>(i)};
    }
    return ok_status();
  }

  /// Applies `done` (check() passed). A store: its host copy ready (or forgotten, failed), its pinned source
  /// released (`release(b, priority)`). A load: its host block unpinned (a failed one's copy forgotten); the
  /// device block of a freed sequence's load released; a waiting sequence whose loads are all in, or one of which
  /// failed, is resolved (`resolve(p)`: the cache commits what arrived).
  template <class Release, class Resolve>
  void apply(std::span<const tier_done> done, cache_stats& counts, Release&& release, Resolve&& resolve) {
    for (const tier_done& d : done) {
      const block_id h = d.swap.host - base_;
      const flight f = flight_[static_cast<std::size_t>(h)];
      // A load whose sequence gave up (freed, failed or timed out) is not used: an exclusive tier keeps its copy.
      const bool used = f.what == kind::load && f.owner >= 0 &&
                        pending_[static_cast<std::size_t>(f.owner)].state == tier_load_state::loading;
      finish(h, d.ok, used);
      if (f.what == kind::store) {
        if (!d.ok) ++counts.tier_failed_stores;
        if (f.pinned) release(f.device, priority_[static_cast<std::size_t>(f.device)]);
        continue;
      }
      if (!d.ok) ++counts.tier_failed_loads;
      if (f.owner < 0) {  // its sequence is gone: the block was left to the transfer
        release(f.device, 0);
        continue;
      }
      pending_load& p = pending_[static_cast<std::size_t>(f.owner)];
      p.done[static_cast<std::size_t>(f.slot)] = d.ok ? 1 : 2;
      --p.outstanding;
      if (p.state != tier_load_state::loading) continue;  // failed already (timed out, or another load failed)
      if (!d.ok || p.outstanding == 0) {
        p.state = d.ok ? tier_load_state::none : tier_load_state::failed;
        resolve(p);
        if (d.ok) --waiting_;  // all in: the sequence runs as any other
      }
    }
  }

  /// complete_tier_transfers of either cache: check(done), then apply it. Nothing changed on an error.
  template <class Release, class Resolve>
  status complete(std::span<const tier_done> done, cache_stats& counts, Release&& release, Resolve&& resolve) {
    if (status st = check(done); !st) return st;
    apply(done, counts, release, resolve);
    return ok_status();
  }

  /// Forgets every host block (reset_prefix_cache); the caller has checked that nothing is in flight.
  void reset() noexcept {
    tier_.reset();
    for (const block_id b : committed_) queued_[static_cast<std::size_t>(b)] = 0;
    committed_.clear();
    ++generation_;
  }

 private:
  enum class kind : std::uint8_t { none, load, store };
  /// A transfer in flight, per tier block (one at a time: a block being written is not read, one being read is
  /// not evicted, and nothing is loaded twice).
  struct flight {
    std::uint64_t key = 0;
    block_id device = no_block;
    std::int32_t owner = -1;  ///< a load's pending_load (async), -1 when none waits for it
    std::int32_t slot = 0;    ///< its block in that record
    std::int32_t pos = -1;    ///< its index in flying_
    std::int32_t group = 0;   ///< the KV cache group whose layers it moves (block_swap::group)
    kind what = kind::none;
    bool pinned = false;      ///< a store holding its source block (async write-through)
  };

  explicit tier_link(tier_type t) : tier_(std::move(t)) {}

  [[nodiscard]] const pending_load* find(seq_id id) const noexcept {
    for (const pending_load& p : pending_)
      if (p.state != tier_load_state::none && p.id == id) return &p;
    return nullptr;
  }
  [[nodiscard]] pending_load* find(seq_id id) noexcept {
    return const_cast<pending_load*>(static_cast<const tier_link*>(this)->find(id));
  }

  /// A free wait record for sequence `id`: `n` loads of tier blocks `tier_blocks` after `first` device hits.
  pending_load& record(seq_id id, std::int32_t n, std::int32_t first, std::uint64_t extra_key, std::uint64_t now,
                       std::span<const block_id> tier_blocks) {
    std::int32_t r = 0;
    while (r < static_cast<std::int32_t>(pending_.size()) && pending_[static_cast<std::size_t>(r)].state !=
                                                                 tier_load_state::none)
      ++r;
    if (r == static_cast<std::int32_t>(pending_.size())) pending_.emplace_back();
    pending_load& p = pending_[static_cast<std::size_t>(r)];
    p.id = id;
    p.first = first;
    p.count = n;
    p.outstanding = n;
    p.state = tier_load_state::loading;
    p.deadline = now + static_cast<std::uint64_t>(opts_.load_timeout_steps);
    p.extra_key = extra_key;
    p.done.assign(static_cast<std::size_t>(n), 0);
    p.tier_blocks.assign(tier_blocks.begin(), tier_blocks.begin() + n);
    for (const block_id h : p.tier_blocks) flight_[static_cast<std::size_t>(h)].owner = r;
    ++waiting_;
    return p;
  }

  void fly(block_id h, flight f) {
    f.pos = static_cast<std::int32_t>(flying_.size());
    flying_.push_back(h);
    flight_[static_cast<std::size_t>(h)] = f;
  }

  /// Tier block `h`'s transfer is complete (`ok`) or failed: the tier learns it, it leaves the flights. A load
  /// completes as loaded only if its device copy is `used` (an exclusive tier lets the block go then).
  void finish(block_id h, bool ok, bool used) noexcept {
    flight& f = flight_[static_cast<std::size_t>(h)];
    if (f.what == kind::store) {
      tier_.complete_store(std::span<const std::uint64_t>(&f.key, 1), ok);
      ++generation_;
    } else {
      const std::span<const std::uint64_t> key(&f.key, 1);
      // A failed copy is not offered again (fail_load forgets it).
      [[maybe_unused]] const status st = ok ? tier_.complete_load(key, used) : tier_.fail_load(key);
      KVPAGER_ASSERT(st.ok(), "tier_link: a load the tier does not know");
      if (!ok || !tier_.config().inclusive || opts_.async) ++generation_;
    }
    const block_id last = flying_.back();
    flying_[static_cast<std::size_t>(f.pos)] = last;
    flight_[static_cast<std::size_t>(last)].pos = f.pos;
    flying_.pop_back();
    f = flight{};
  }

  /// Stores device block `b` holding content `key` unless the tier holds it already (or refuses it: full of blocks
  /// being read or written, below min_priority, under store_threshold; counted by the tier). Returns whether it did.
  bool store(block_id b, std::uint64_t key, bool pinned, step_ledger& ledger, cache_stats& counts) {
    const std::int32_t group = group_.empty() ? 0 : group_[static_cast<std::size_t>(b)];
    const kv_block_name name = unmix_ != nullptr ? unmix_(key, group) : kv_block_name{key, 0};
    if (!tier_.prepare_store(std::span<const std::uint64_t>(&key, 1), plan_, std::span<const kv_block_name>(&name, 1),
                             priority_[static_cast<std::size_t>(b)]))
      return false;
    if (!plan_.evicted.empty()) ++generation_;
    if (plan_.host_blocks.empty()) return false;
    const block_id h = plan_.host_blocks.front();
    ledger.plan_swap_out(block_swap{b, base_ + h, group});
    ++counts.tier_stored_blocks;
    fly(h, flight{key, b, -1, 0, -1, group, kind::store, pinned});
    return true;
  }

  tier_type tier_;
  block_id base_ = 0;  ///< host block of tier block 0 (after the swap pool's)
  host_tier_options opts_{};
  std::uint64_t generation_ = 0;
  std::vector<std::int32_t> priority_;  ///< per device block: the retention priority of the sequence that cached it
  std::vector<std::uint8_t> group_;     ///< per device block: its KV cache group (name_blocks; empty: group 0)
  kv_block_name (*unmix_)(std::uint64_t, std::int32_t) = nullptr;  ///< name_blocks' (nullptr: a key is its hash)
  std::vector<std::uint8_t> queued_;    ///< per device block: listed in committed_
  std::vector<block_id> committed_;     ///< blocks cached in this step (write-through)
  std::vector<std::uint64_t> keys_;     ///< scratch (keys())
  std::vector<block_id> host_;          ///< scratch: the host blocks of a load
  std::vector<flight> flight_;          ///< per tier block: its transfer in flight
  std::vector<block_id> flying_;        ///< tier blocks with a transfer in flight
  std::vector<pending_load> pending_;   ///< async: sequences waiting for loads (free records have state none)
  std::int32_t waiting_ = 0;            ///< records not free
  tier_store_plan plan_;
};

}  // namespace detail
KVPAGER_NAMESPACE_END
