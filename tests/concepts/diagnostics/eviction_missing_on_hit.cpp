// SPDX-License-Identifier: Apache-2.0
// Compiled (not built) by the concepts.diagnostic.* tests: an indexed eviction policy without `on_hit` must be
// rejected with a message naming `e.on_hit(b)`; with KVPAGER_DIAG_COMPLETE it has the member and compiles.
#include <kvpager/concepts/eviction_policy.hpp>

struct my_index_eviction {
  static constexpr kvpager::retention_mode retention = kvpager::retention_mode::indexed;
  void reset(const kvpager::pool_geometry& g);
  void insert(kvpager::block_id b, kvpager::retention_hint hint) noexcept;
  void erase(kvpager::block_id b) noexcept;
  kvpager::block_id pop_victim() noexcept;
#ifdef KVPAGER_DIAG_COMPLETE
  void on_hit(kvpager::block_id b) noexcept;
#endif
  [[nodiscard]] bool contains(kvpager::block_id b) const noexcept;
  [[nodiscard]] std::int32_t size() const noexcept;
};

template <kvpager::eviction_policy E>
struct uses_eviction {};
template struct uses_eviction<my_index_eviction>;
