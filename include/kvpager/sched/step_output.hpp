// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// What the scheduler reports: the output of one step (step_output) and its counters (scheduler_stats).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvpager/core/step_plan.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Why the scheduler finished a request itself (step_output::finished). Its blocks are back in the cache.
enum class finish_reason {
  length_cap,   ///< its tokens need more than cache_config::max_blocks_per_seq blocks (vLLM's max_model_len)
  too_long,     ///< its tokens can no longer be computed: more blocks than the cache's usable blocks, more than
                ///< 2^31-1 tokens, or (chunked prefill off) more tokens to recompute than max_num_batched_tokens
  cache_error,  ///< the cache refused a call it cannot refuse for a sequence the scheduler owns (the sequence was
                ///< changed behind the scheduler's back); step_output::error holds the cache's status
};

/// Stable name of a finish reason.
[[nodiscard]] constexpr const char* to_string(finish_reason r) noexcept {
  switch (r) {
    case finish_reason::length_cap: return "length_cap";
    case finish_reason::too_long: return "too_long";
    case finish_reason::cache_error: return "cache_error";
  }
  return "unknown_reason";
}

/// Where a request is (scheduler::state).
enum class request_state : std::uint8_t {
  unknown,  ///< not a request of this scheduler (never added, or finished)
  waiting,  ///< queued; holds nothing in the cache
  running,  ///< its blocks are on the device
  swapped,  ///< its blocks are in the host pool
  /// admitted with host tier blocks to load (async transfers): it holds its hit and is not scheduled until the
  /// loads are in (then running), or one fails or times out (then waiting again, to be recomputed)
  loading,
};

/// A sequence scheduled in a step: it computes tokens [start, start + num_tokens) of scheduler::tokens(id).
struct scheduled_sequence {
  seq_id id = 0;
  std::int32_t num_tokens = 0;  ///< 1 for a decode; a chunk of the uncached prompt for a (re-)admission
  bool prefill = false;         ///< the tokens are (part of) a prompt, or of a recompute victim's tokens
  /// The request's last pending token is computed: the engine samples its next token and calls complete().
  /// False for a prefill chunk that is not the prompt's last one: no token is sampled for it.
  bool last_chunk = true;
  std::int32_t start = 0;  ///< position of the first token computed
};

/// A request the scheduler finished itself, and why.
struct finished_request {
  seq_id id = 0;
  finish_reason reason = finish_reason::length_cap;
  friend bool operator==(const finished_request&, const finished_request&) = default;
};

/// The page tables of one group of a step's scheduled sequences (step_output::decode: the entries that compute one
/// token; step_output::prefill: those that compute more), for the attention kernels (kvpager/kernels: a
/// page_table_view over `block_table` or over the CSR arrays, `qo_indptr` for the prefill). Row i is
/// step_output::scheduled[entries[i]]; its query rows are [qo_indptr[i], qo_indptr[i+1]) of the group's queries laid
/// out row after row (gather them from the step's tokens at step_output::query_start_loc[entries[i]]). The buffers
/// are the step_output's own and are reused every step.
struct step_tables {
  std::vector<std::int32_t> entries;    ///< index in step_output::scheduled of each row, in scheduled order
  std::vector<std::int32_t> qo_indptr;  ///< [rows + 1] query rows per row (0, 1, 2, ... for the decode group)
  std::vector<std::int32_t> seq_lens;   ///< KV length of each row once this step's tokens are written
  std::int32_t row_stride = 0;          ///< entries per block_table row: the most blocks a row has (at least 1)
  std::vector<std::int32_t> block_table;  ///< dense (vLLM): [rows, row_stride] block ids, padded with -1
  std::vector<std::int32_t> kv_indptr;    ///< CSR (FlashInfer): [rows + 1] offsets into kv_indices
  std::vector<std::int32_t> kv_indices;   ///< the rows' block ids, row after row
  std::vector<std::int32_t> kv_last_page_len;  ///< [rows] tokens in each row's last block, in [1, block_size]

  /// Rows in the group.
  [[nodiscard]] std::size_t rows() const noexcept { return entries.size(); }
  [[nodiscard]] bool empty() const noexcept { return entries.empty(); }
  /// Query rows over the group (qo_indptr's last entry).
  [[nodiscard]] std::int32_t num_query_rows() const noexcept { return qo_indptr.empty() ? 0 : qo_indptr.back(); }
  void clear() noexcept {
    entries.clear();
    qo_indptr.clear();
    seq_lens.clear();
    row_stride = 0;
    block_table.clear();
    kv_indptr.clear();
    kv_indices.clear();
    kv_last_page_len.clear();
  }
};

/// What one schedule() call decided. Byte movement is in the cache's plan(); its slot mapping is copied here. A step
/// is always complete: a cache error the scheduler cannot absorb ends only the request it concerns (in `finished`,
/// reason cache_error) and is reported in `error`. The scheduler reuses this object (and its buffers) every step.
struct step_output {
  std::vector<scheduled_sequence> scheduled;  ///< in slot-mapping order
  std::vector<seq_id> preempted_recompute;    ///< freed; back at the front of the waiting queue
  std::vector<seq_id> swapped_out;            ///< now in the swapped queue
  std::vector<seq_id> swapped_in;             ///< back to running (and scheduled when the budget and blocks allow)
  /// Always empty: a request that can never run is answered admission::never by add_request and never queued.
  /// (Kept for source compatibility; a queued request that can no longer run is in `finished`.)
  std::vector<seq_id> rejected;
  std::vector<finished_request> finished;     ///< finished by the scheduler in this step, with the reason; freed
  std::vector<seq_id> forked;                 ///< fork children created at the start of this step (running)
  std::vector<seq_id> dropped_forks;          ///< fork children not created: the parent stopped running (or the
                                              ///< cache refused the fork, e.g. out of blocks to copy into)
  /// Requests admitted in this step whose KV arrives from outside (sequence_options::external_tokens): each holds
  /// its blocks and waits (cache.external_blocks(id) says where) until the engine has received them and reported
  /// cache.complete_external(id, ok); the next schedule() then runs it, or queues it again to compute them itself.
  std::vector<seq_id> external;
  status error;                               ///< ok, or the first cache error that ended a request in this step
  std::vector<std::int64_t> slot_mapping;     ///< cache.export_slot_mapping() of this step
  /// The cache's plan: swap-outs, swap-ins, copies, appends. Execute it before the step's first complete(): that call
  /// takes the step as executed and the cache clears its plan.
  const step_plan* plan = nullptr;
  // What the model runner consumes besides the plan (scheduler_config::export_tables; empty without it). The step's
  // tokens are those of `scheduled`, entry after entry, in slot-mapping order.
  std::vector<token_id> input_ids;            ///< the step's token ids
  std::vector<std::int32_t> positions;        ///< each token's position in its sequence
  /// [scheduled.size() + 1]: scheduled[i]'s tokens are [query_start_loc[i], query_start_loc[i+1]) (vLLM's name).
  std::vector<std::int32_t> query_start_loc;
  step_tables decode;                         ///< page tables of the entries computing one token
  step_tables prefill;                        ///< page tables of the entries computing a chunk of several
  /// A cache with KV cache groups (hybrid_kv_cache): the same two sets of tables per table of the cache, in table
  /// order (its groups, then the companion tables of groups of several units: hybrid_kv_cache::unit_table; decode
  /// and prefill above then stay empty; the rows, entries and query rows are the same in every table, the block
  /// ids differ, and a window group's rows hold the null block before its window). Empty otherwise.
  std::vector<step_tables> group_decode;
  std::vector<step_tables> group_prefill;

  /// Tokens computed in this step.
  [[nodiscard]] std::int64_t num_tokens() const noexcept {
    std::int64_t n = 0;
    for (const scheduled_sequence& e : scheduled) n += e.num_tokens;
    return n;
  }

  /// Empties every list (keeping their capacity, so a step allocates nothing once they have grown).
  void clear() noexcept {
    scheduled.clear();
    preempted_recompute.clear();
    swapped_out.clear();
    swapped_in.clear();
    rejected.clear();
    finished.clear();
    forked.clear();
    dropped_forks.clear();
    external.clear();
    error = ok_status();
    slot_mapping.clear();
    plan = nullptr;
    input_ids.clear();
    positions.clear();
    query_start_loc.clear();
    decode.clear();
    prefill.clear();
    for (step_tables& t : group_decode) t.clear();
    for (step_tables& t : group_prefill) t.clear();
  }
};

/// Prefix-cache lookups of successful admissions (vLLM's prefix_cache_queries / hits, per admission). A lookup
/// that ends in a failed admission or a budget stop is not counted.
struct prefix_counters {
  std::int64_t admissions = 0;    ///< successful admissions (one lookup each)
  std::int64_t query_tokens = 0;  ///< their tokens at admission (prompt, plus outputs for a resumed request)
  std::int64_t hit_tokens = 0;    ///< of those, tokens served from the prefix cache (device and host tier)
  std::int64_t hit_blocks = 0;    ///< the device's hits in blocks
  std::int64_t host_hit_tokens = 0;  ///< of hit_tokens, those loaded from the host tier (a cache with one)
  friend bool operator==(const prefix_counters&, const prefix_counters&) = default;
};

/// Counters over the scheduler's life.
struct scheduler_stats {
  std::int64_t steps = 0;
  std::int64_t admitted = 0;
  std::int64_t finished = 0;              ///< by the engine (finish, complete) or by the scheduler
  std::int64_t finished_with_reason = 0;  ///< of those, by the scheduler (step_output::finished)
  std::int64_t rejected = 0;        ///< add_request answered admission::never (not queued)
  std::int64_t answered_ok = 0;     ///< add_request answered admission::ok (queued, fits now)
  std::int64_t answered_later = 0;  ///< add_request answered admission::later (queued, does not fit now)
  std::int64_t preempted_recompute = 0;
  std::int64_t preempted_swap = 0;
  /// Of preempted_recompute: victims the configured mode would swap that the cache refused to (host pool full),
  /// freed for recompute instead. Caches without a host pool (errc::unsupported) are not counted.
  std::int64_t swap_fallback_recompute = 0;
  std::int64_t swapped_in = 0;
  /// Of preempted_recompute + preempted_swap: victims preempted for a higher-priority waiting request
  /// (scheduler_config::priority_preemption).
  std::int64_t preempted_for_priority = 0;
  std::int64_t dropped_forks = 0;
  /// Admission passes that stopped at a request whose blocks do not fit (with the watermark) now: vLLM's failed
  /// allocate_slots in the admission loop. A request stuck at the head of the queue counts once per step.
  std::int64_t admit_fail = 0;
  /// Admission passes that stopped at a request whose uncached tokens exceed the step's remaining token budget
  /// (chunked prefill off).
  std::int64_t admit_budget_stop = 0;
  /// Slot allocations for a running request's pending tokens refused for lack of blocks (each answered by a
  /// preemption while running requests are scanned; left pending for a request just swapped in).
  std::int64_t decode_alloc_fail = 0;
  /// Admissions that waited for host tier loads (async transfers), and of those, requests whose loads failed or
  /// timed out: freed and queued again at the front, their tokens after the blocks that arrived recomputed.
  std::int64_t load_waits = 0;
  std::int64_t load_failures = 0;
  /// Admissions that waited for external KV (sequence_options::external_tokens), and of those, requests whose
  /// transfer failed: freed and queued again at the front without external tokens (computed here).
  std::int64_t external_waits = 0;
  std::int64_t external_failures = 0;
  /// Finished requests whose blocks are held for a KV transfer (scheduler::hold), and of those, released.
  std::int64_t held = 0;
  std::int64_t released = 0;
  prefix_counters prefix;          ///< first admissions
  prefix_counters resumed_prefix;  ///< re-admissions of requests preempted before
  /// The most device blocks in use (usable blocks minus cache.available_blocks()) right after an allocation the
  /// scheduler made (admission, slots of running requests, swap-in).
  std::int64_t peak_used_blocks = 0;
  std::int32_t waiting = 0;
  std::int32_t running = 0;
  std::int32_t swapped = 0;
  std::int32_t loading = 0;  ///< requests waiting for host tier loads
};

KVPAGER_NAMESPACE_END
