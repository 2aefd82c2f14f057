// SPDX-License-Identifier: Apache-2.0
#pragma once
// Everything observable about a paged_kv_cache (or a hybrid_kv_cache: every table), to check that a failed call
// changed nothing.

#include <kvpager/kvpager.hpp>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace kvtest {

struct cache_snapshot {
  kvpager::cache_stats stats;
  std::vector<std::int32_t> refcounts;           // per block id
  std::vector<kvpager::block_id> free_order;     // the order the allocator would hand blocks out
  std::vector<std::pair<bool, std::vector<kvpager::block_id>>> tables;  // per probed id: live?, table
  std::vector<std::int32_t> tokens;
  std::vector<kvpager::block_copy> copies;
  std::vector<kvpager::token_range> appends;
  std::vector<std::int64_t> slots;
  friend bool operator==(const cache_snapshot&, const cache_snapshot&) = default;
};

template <class Cache>
cache_snapshot take_snapshot(const Cache& c, std::span<const kvpager::seq_id> ids) {
  cache_snapshot s;
  s.stats = c.stats();
  const auto& pool = c.pool();
  for (kvpager::block_id b = 0; b < pool.num_blocks(); ++b) s.refcounts.push_back(c.refcount(b));
  auto drained = pool;  // a copy: drain it to read the allocation order without touching the cache
  s.free_order.resize(static_cast<std::size_t>(drained.num_free()));
  if (!drained.allocate(s.free_order)) s.free_order.clear();
  // A cache with KV cache groups (hybrid_kv_cache): every table of each probed id, one after the other.
  constexpr bool grouped = requires { c.num_tables(); };
  std::int32_t tables = 1;
  if constexpr (grouped) tables = c.num_tables();
  for (const kvpager::seq_id id : ids) {
    for (std::int32_t g = 0; g < tables; ++g) {
      const auto device = [&] {
        if constexpr (grouped) return c.block_table(g, id); else return c.block_table(id);
      }();
      const auto host = [&] {  // swapped-out sequences
        if constexpr (grouped) return c.host_block_table(g, id); else return c.host_block_table(id);
      }();
      const auto* t = device ? &device : host ? &host : nullptr;
      if (t != nullptr) {
        s.tables.emplace_back(device.ok(), std::vector<kvpager::block_id>((*t)->begin(), (*t)->end()));
      } else {
        s.tables.emplace_back(false, std::vector<kvpager::block_id>{});
      }
    }
    s.tokens.push_back(c.contains(id) ? *c.num_tokens(id) : -1);
  }
  s.copies.assign(c.plan().copies().begin(), c.plan().copies().end());
  s.appends.assign(c.plan().appends().begin(), c.plan().appends().end());
  s.slots.resize(static_cast<std::size_t>(c.slot_mapping_size()));
  if (!c.export_slot_mapping(s.slots)) s.slots.clear();
  return s;
}

}  // namespace kvtest
