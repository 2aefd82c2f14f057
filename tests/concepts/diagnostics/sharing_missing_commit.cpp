// SPDX-License-Identifier: Apache-2.0
// Compiled (not built) by the concepts.diagnostic.* tests: a sharing policy that declares itself a content cache
// but has no `commit` must be rejected with a message naming `s.commit(b, c, t)`; with KVPAGER_DIAG_COMPLETE it has
// the member and compiles.
#include <kvpager/concepts/sharing_policy.hpp>

#include <cstdint>
#include <span>

struct my_prefix_cache {
  static constexpr kvpager::fork_mode fork = kvpager::fork_mode::share;
  static constexpr bool caches_content = true;
  struct cursor {
    friend bool operator==(const cursor&, const cursor&) = default;
  };
  void reset(const kvpager::pool_geometry& g);
  [[nodiscard]] bool is_cached(kvpager::block_id b) const noexcept;
  void uncache(kvpager::block_id b) noexcept;
  [[nodiscard]] cursor first_cursor(std::uint64_t extra_key) const noexcept;
  kvpager::block_id lookup(cursor& c, std::span<const kvpager::token_id> tokens) const noexcept;
#ifdef KVPAGER_DIAG_COMPLETE
  void commit(kvpager::block_id b, cursor& c, std::span<const kvpager::token_id> tokens) noexcept;
#endif
  [[nodiscard]] cursor cursor_after(kvpager::block_id b) const noexcept;
  [[nodiscard]] bool valid(const cursor& c) const noexcept;
  [[nodiscard]] std::int32_t num_cached() const noexcept;
};

template <kvpager::sharing_policy S>
struct uses_sharing {};
template struct uses_sharing<my_prefix_cache>;
