// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// tp_cpu_executors: the executor set-up of a tensor-parallel engine on the CPU backend. One cache decides (block
/// ids, block tables, slot mapping, step plan); every rank has its own KV pool holding its KV heads
/// (tp_rank_layout, tensor_parallel.hpp) in its own host_kv_pools (and step_executor), and every rank runs the same plan and slot
/// mapping on its own pool, with its own heads' K and V. Attention then runs per rank over the same exported block
/// table (view(r) is rank r's pool for paged_attention_decode_cpu), each rank on its query heads; concatenating the
/// ranks' outputs over heads gives the unsplit model's output.
///
/// Needs libkvpager_kernels (the ranks' executors run the shipped CPU block-move kernels, as decode does).

#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/step_plan.hpp"
#include "kvpager/kernels/attention.hpp"
#include "kvpager/kernels/step_executor.hpp"
#include "kvpager/sizing/tensor_parallel.hpp"

KVPAGER_NAMESPACE_BEGIN

class tp_cpu_executors {
 public:
  /// `tp` ranks for a cache of geometry `g` (the model's KV heads in g.num_kv_heads; g.num_blocks and g.block_size
  /// are the cache's) and a model with `num_q_heads` query heads; rank r's device pool has rank_layout(g,
  /// num_q_heads, tp, r).geometry, its host pool `num_host_blocks` blocks of that shape, all zero-filled. Errors:
  /// those of rank_layout, errc::invalid_argument (g.num_blocks <= 0, num_host_blocks < 0), host_kv_pools::create's
  /// (a rank geometry the kernels do not run: errc::unsupported), errc::out_of_memory
  /// (the pools could not be allocated; built without exceptions, a failed allocation ends the program instead).
  [[nodiscard]] static result<tp_cpu_executors> create(const kv_geometry& g, std::int32_t num_q_heads, std::int32_t tp,
                                                       std::int32_t num_host_blocks) {
    if (g.num_blocks <= 0)
      return status{errc::invalid_argument, "tp_cpu_executors::create: num_blocks must be positive", g.num_blocks};
    if (num_host_blocks < 0)
      return status{errc::invalid_argument, "tp_cpu_executors::create: num_host_blocks must not be negative",
                    num_host_blocks};
    if (const result<tp_head_split> s = split_heads(num_q_heads, g.num_kv_heads, tp); !s.ok()) return s.error();
#if KVPAGER_HAS_EXCEPTIONS
    try {
#endif
      tp_cpu_executors out;
      out.layouts_.reserve(static_cast<std::size_t>(tp));
      out.ranks_.reserve(static_cast<std::size_t>(tp));
      for (std::int32_t r = 0; r < tp; ++r) {
        out.layouts_.push_back(*rank_layout(g, num_q_heads, tp, r));
        result<host_kv_pools> pools = host_kv_pools::create(out.layouts_.back().geometry, num_host_blocks);
        if (!pools) return pools.error();
        out.ranks_.push_back(std::move(*pools));
      }
      return out;
#if KVPAGER_HAS_EXCEPTIONS
    } catch (const std::bad_alloc&) {
      return status{errc::out_of_memory, "tp_cpu_executors::create: not enough host memory for the ranks' pools", tp};
    } catch (const std::length_error&) {
      return status{errc::out_of_memory, "tp_cpu_executors::create: the ranks' pools exceed max_size", tp};
    }
#endif
  }

  /// The tensor-parallel degree (number of ranks).
  [[nodiscard]] std::int32_t tp() const noexcept { return static_cast<std::int32_t>(ranks_.size()); }
  /// Rank r's heads and pool geometry. r in [0, tp()).
  [[nodiscard]] const tp_rank_layout& layout(std::int32_t r) const noexcept { return layouts_[static_cast<std::size_t>(r)]; }
  /// Rank r's executor (its device and host pools). r in [0, tp()).
  [[nodiscard]] host_kv_pools& rank(std::int32_t r) noexcept { return ranks_[static_cast<std::size_t>(r)]; }
  [[nodiscard]] const host_kv_pools& rank(std::int32_t r) const noexcept { return ranks_[static_cast<std::size_t>(r)]; }
  /// Rank r's device pool as the decode kernels read it (the default HND layout).
  [[nodiscard]] paged_kv_view view(std::int32_t r) noexcept {
    return rank(r).view();
  }

  /// Runs `plan` with slot mapping `slots` on every rank; k[r] and v[r] are rank r's heads of the appended tokens'
  /// K and V in slot order ([num_tokens, layout(r).geometry.num_kv_heads, head_dim], e.g. from copy_rank_kv_heads).
  /// Everything is checked before any rank moves a byte: errc::invalid_argument (k or v not one span per rank),
  /// errc::buffer_too_small (a rank's k or v shorter than the mapping needs; detail = the rank), errc::invalid_block
  /// (a block id or slot outside the pools, the same on every rank). Allocates nothing once warm (the executors' scratch
  /// lists have grown to the largest plan).
  status execute(const step_plan& plan, std::span<const std::int64_t> slots,
                 std::span<const std::span<const std::byte>> k, std::span<const std::span<const std::byte>> v) {
    if (k.size() != ranks_.size() || v.size() != ranks_.size())
      return status{errc::invalid_argument, "tp_cpu_executors::execute: k and v need one span per rank",
                    static_cast<std::int64_t>(ranks_.size())};
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      const kv_layout l = ranks_[r].layout();
      const std::int64_t need = static_cast<std::int64_t>(slots.size()) * l.num_kv_heads * l.row_bytes();
      if (static_cast<std::int64_t>(k[r].size()) < need || static_cast<std::int64_t>(v[r].size()) < need)
        return status{errc::buffer_too_small, "tp_cpu_executors::execute: a rank's k/v is shorter than the slot mapping",
                      static_cast<std::int64_t>(r)};
    }
    // Block ids and slots are validated by rank 0 before it writes; every rank has the same block count and block
    // size, so once rank 0 accepted them the others do too.
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      const status st = ranks_[r].execute(plan, slots, k[r], v[r]);
      KVPAGER_ASSERT(st.ok() || r == 0, "tp_cpu_executors: ranks disagree on a plan rank 0 accepted");
      if (!st.ok()) return st;
    }
    return ok_status();
  }

 private:
  tp_cpu_executors() = default;
  std::vector<tp_rank_layout> layouts_;
  std::vector<host_kv_pools> ranks_;
};

KVPAGER_NAMESPACE_END
