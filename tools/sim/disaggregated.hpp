// SPDX-License-Identifier: Apache-2.0
#pragma once
// kvpager-sim --disaggregated: the workload over two instances in one process, a prefill instance and a decode
// instance, each its own scheduler over its own cache of the chosen composition, with simulated compute and real KV
// transfers between real byte pools (docs/sim.md, "--disaggregated"; the sequence of calls is
// docs/disaggregated.md's).
//
// Every request first runs on the prefill instance (its prompt computed, one token, its sequence held with
// scheduler::hold), which writes into its pools what computing each token writes (a pattern of the token, its
// position, the layer, K or V and the head). It is offered through kvpager::kv_sender; the decode instance admits it
// with external_tokens = the offer's computed tokens, reads the KV with kvpager::kv_receiver into the blocks its own
// cache gave it (kv_transport: inproc_transport, or ucx_transport over the loopback), checks that every received
// block holds exactly the pattern, reports it (complete_external), computes the rest of the prompt (at least its last
// token) and decodes the request's outputs, forking its other samples as the paged run does. The prefill instance
// releases the request when the decode instance's done message arrives.
//
// Time: each instance has a simulated clock. A step takes the simulator's step (20 ms, a decode step) plus the
// prefill compute of the prompt tokens it computes (2 x 6.74 GFLOP a token at --prefill-tflops). A request arrives at
// its arrival step x 20 ms. The instance whose next event comes first runs next, so an offer reaches the decode
// instance at the simulated time its prefill step ended, and a done message the prefill instance at the time the
// decode instance sent it. A read starts at the decode step that admitted the request and takes the wall-clock time
// the real read took (measured around kv_receiver::start and the progress that saw it end; the reads of one step are
// in flight together): the request runs at the first decode step from then on.
//
// KV cache groups (--layers): both instances run kv_groups_swap_cache over the --layers run's groups. A block of the
// shared pool holds one group's layers (the layers at the same place of every group share the memory, as in vLLM),
// so the pools hold the first `shape.layers` layer places of every block: each group's first layers (a padded group
// has fewer) are the transfer's layers, each read through its group's table in its place's pool
// (kv_groups::layer_groups). A window group's entries that are the null block on the receiver are not read; where the
// receiver needs a window block the sender already released, the offer is declined and computed here.
//
// The connection can go away (UCX: a peer error, a read past its timeout; the test hook closes it from one side):
// nothing more is offered, the prefill instance releases everything it held, and the decode instance computes from
// the prompt what it was offered and had not read.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <kvpager/cache/cache_types.hpp>
#include <kvpager/core/dtype.hpp>
#include <kvpager/groups/group_kind_variant.hpp>
#include <kvpager/sched/scheduler_config.hpp>

#include "workload.hpp"

namespace kvsim {

/// Whether this build has UCX (--kv-transport ucx): CMake defines KVPAGER_SIM_HAS_UCX where it found libucx.
#if KVPAGER_SIM_HAS_UCX
inline constexpr bool sim_has_ucx = true;
#else
inline constexpr bool sim_has_ucx = false;
#endif

enum class kv_transport_kind : std::uint8_t { inproc, ucx };

/// The KV shape of the disaggregated run's pools: Llama-2-7B's attention layer (32 KV heads of 128 in fp16, 16 KiB a
/// token and layer, K and V), `layers` of its 32 layers, so that both instances' pools fit in memory. A transfer moves
/// that share of a request's KV.
struct disagg_shape {
  static constexpr std::int32_t kv_heads = 32, q_heads = 32, head_dim = 128, model_layers = 32;
  static constexpr kvpager::kv_dtype dtype = kvpager::kv_dtype::f16;
  std::int32_t layers = 2;
  /// KV bytes of one token over the pools' layers.
  [[nodiscard]] constexpr std::int64_t bytes_per_token() const noexcept {
    return std::int64_t{layers} * 2 * kv_heads * head_dim * kvpager::elem_bytes(dtype);
  }
};

/// The most bytes both instances' pools (device and host pools) may take together.
inline constexpr std::int64_t disagg_pool_limit = std::int64_t{2} << 30;

/// Bytes of both instances' pools for cache configuration `cc` (its blocks and host pool) and `shape`.
[[nodiscard]] constexpr std::int64_t disagg_pool_bytes(const kvpager::cache_config& cc,
                                                       const disagg_shape& shape) noexcept {
  const std::int64_t blocks = std::int64_t{cc.num_blocks} + cc.host_pool_blocks();
  return 2 * blocks * cc.block_size * shape.bytes_per_token();
}

/// The test hook that closes the connection mid-run from one side's transport (`after` 0: never).
struct disagg_disconnect {
  bool decode = false;     ///< false: the prefill side, right after its after-th offer; true: the decode side, right
                           ///< after starting its after-th read (the read in flight)
  std::int64_t after = 0;
};

struct disagg_options {
  kv_transport_kind transport = kv_transport_kind::inproc;
  /// shape.layers: the layers a pool block holds here (with groups: the first layer places of a group's block).
  disagg_shape shape{};
  std::string composition = "hybrid_swap";  ///< hybrid_swap or vllm_v1: both instances' (without groups)
  /// KV cache groups (--layers; empty: one group, the composition's paged cache): each group's kind, in group order,
  /// and its layers of the model (group_layers, the same size; fewer than the group size in a padded group). Both
  /// instances then run kv_groups_swap_cache in vLLM's conventions, with a host pool when `cache` has one.
  std::vector<kvpager::any_group_kind> groups;
  std::vector<std::int32_t> group_layers;
  kvpager::cache_config cache{};            ///< each instance's pool (its geometry becomes the shape's)
  kvpager::scheduler_config sched{};        ///< each instance's scheduler
  /// The prefill instance's max_num_batched_tokens (0: sched's): a small budget chunks its prompts.
  std::int32_t prefill_token_budget = 0;
  double step_s = 0.020;                    ///< the simulator's step: a decode step's time, and the arrivals' unit
  double prefill_s_per_token = 0;           ///< simulated prefill compute of one prompt token
  /// A read, an offer or a done message not through within this fails (the receiver closes the connection).
  std::chrono::milliseconds timeout{10000};
  std::int64_t fail_every = 0;     ///< test hook (inproc): every n-th read fails (0: none)
  std::int64_t corrupt_offer = 0;  ///< test hook: the n-th offer with a full block has one byte changed (0: none)
  disagg_disconnect disconnect{};  ///< test hook: the connection closed mid-run
  /// Test hook: right after its n-th offer the prefill instance registers its pools again (new remote keys; the old
  /// registration kept, as kv_sender::replace_regions asks) and tells its sender (0: never).
  std::int64_t reregister_after = 0;
  std::function<void(std::int64_t step, std::int64_t done, std::int64_t total)> progress;  ///< every 50 decode steps
};

/// The layers a transfer moves: shape.layers, or with groups each group's first shape.layers layers (a padded group
/// may have fewer); each is read through its group's table.
[[nodiscard]] inline std::int32_t disagg_transfer_layers(const disagg_options& o) noexcept {
  if (o.groups.empty()) return o.shape.layers;
  std::int32_t n = 0;
  for (const std::int32_t l : o.group_layers) n += l < o.shape.layers ? l : o.shape.layers;
  return n;
}

/// One request's figures on the decode instance.
struct disagg_request {
  std::uint64_t id = 0;
  std::int64_t read_tokens = 0;  ///< tokens read from the prefill instance (0: none, computed here)
  double transfer_s = 0;         ///< the read's wall-clock time
  double ttft_s = -1;            ///< arrival to its first output token (simulated; -1: none)
};

/// One instance's figures.
struct disagg_instance {
  std::int64_t steps = 0;
  double simulated_s = 0;  ///< its clock at the end
  double prefix_hit_rate = 0;
  std::int64_t preemptions = 0, swap_outs = 0;
  bool pools_empty = false;  ///< no sequence, block, swapped sequence or open transfer left at the end
};

struct disagg_summary {
  std::string transport;
  std::int64_t requests = 0, samples = 0;
  std::int64_t finished = 0;  ///< samples finished on the decode instance
  std::int64_t rejected = 0;  ///< samples rejected or ended by a scheduler, by reason below
  std::map<std::string, std::int64_t> rejected_reasons;
  std::int64_t output_tokens = 0;  ///< the finished samples' output tokens
  std::int64_t offered = 0, declined = 0;  ///< offers sent; of those, declined (the decode instance read nothing)
  /// Reads started; reads that failed, or could not start (the connection gone): computed on the decode instance.
  /// external_failures (the decode scheduler's) is reads_failed + declined_released + declined_stale.
  std::int64_t reads = 0, reads_failed = 0;
  /// Offers whose read the decode instance could not plan because the prefill instance had already released a
  /// window block it needs (a chunked prompt): declined, computed on the decode instance (KV cache groups only).
  std::int64_t declined_released = 0;
  /// Offers made under a layout the prefill instance has replaced since (its pools registered again: the remote
  /// keys no longer match): refused by kv_receiver::start, declined, computed on the decode instance.
  std::int64_t declined_stale = 0;
  std::int64_t kv_offered_tokens = 0, kv_read_tokens = 0, kv_transfer_bytes = 0;
  /// Of the reads that arrived: the receiving tables' non-null entries in the tokens read (summed over tables; one
  /// table: kv_read_tokens / block size), and those entries times the transfer's layers reading each (each moves a
  /// block of one layer): kv_transfer_bytes is kv_read_layer_blocks x block size x one layer's KV of a token.
  std::int64_t kv_read_entries = 0, kv_read_layer_blocks = 0;
  double kv_transfer_s = 0;  ///< wall-clock time of the reads that arrived, summed
  std::int64_t external_waits = 0, external_failures = 0;  ///< the decode scheduler's
  std::int64_t recomputed_locally = 0;  ///< requests computed without an offer: the link gone, or refused offers
  bool link_lost = false;               ///< the connection went away during the run
  std::int64_t released_on_loss = 0;    ///< held requests the prefill instance released when it went
  /// Reads checked, their non-null receiving entries checked (each entry every layer of its table), and the
  /// mismatches: a row that is not what computing its token writes, or a read whose bytes differ from what those
  /// entries hold.
  std::int64_t reads_checked = 0, blocks_checked = 0, mismatches = 0;
  std::string first_mismatch;
  double mean_transfer_s = 0, mean_ttft_s = 0, mean_transfer_share = 0;  ///< over the requests read
  disagg_instance prefill, decode;
  std::vector<disagg_request> per_request;  ///< in arrival order
  double wall_s = 0;
  std::string error;  ///< the run could not be made or went wrong ("" when it ran)

  /// Every sample ended (finished or rejected), every received block checked equal, both instances empty.
  [[nodiscard]] bool ok() const noexcept {
    return error.empty() && mismatches == 0 && finished + rejected == samples && prefill.pools_empty &&
           decode.pools_empty;
  }
};

/// Runs `w` disaggregated (see the file comment). summary.error says what went wrong: a transport or pool that
/// could not be set up, a cache or kernel error, a run that stopped making progress.
[[nodiscard]] disagg_summary run_disaggregated(const workload& w, const disagg_options& o);

}  // namespace kvsim
