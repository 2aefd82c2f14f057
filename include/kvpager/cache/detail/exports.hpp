// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Kernel-facing page tables written from a sequence_table into caller-provided buffers: the dense block table
/// (vLLM layout) and CSR (FlashInfer layout); engines that keep their own sequence_table can call these too. Each
/// validates everything before writing anything, and allocates nothing. cache_exports gives a cache (paged_kv_cache)
/// its export members over them and over its step ledger's slot mapping.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpager/cache/detail/sequence_table.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

/// Dense page table: row i of `table` (`row_stride` int32 entries) gets the block ids of `seqs[i]`, padded with
/// -1; `seq_lens[i]` its token count. Errors: errc::invalid_argument (row_stride <= 0), errc::unknown_sequence,
/// errc::sequence_swapped, errc::buffer_too_small (a buffer, or a sequence with more than row_stride blocks;
/// detail = entries needed). O(total entries).
template <class Cursor>
status export_block_table(const sequence_table<Cursor>& t, std::span<const seq_id> seqs, std::span<std::int32_t> table,
                          std::int32_t row_stride, std::span<std::int32_t> seq_lens) noexcept {
  if (row_stride <= 0)
    return status{errc::invalid_argument, "export_block_table: row_stride must be positive", row_stride};
  if (seq_lens.size() < seqs.size())
    return status{errc::buffer_too_small, "export_block_table: seq_lens is shorter than seqs",
                  static_cast<std::int64_t>(seqs.size())};
  const auto need = static_cast<std::int64_t>(seqs.size()) * row_stride;
  if (static_cast<std::int64_t>(table.size()) < need)
    return status{errc::buffer_too_small, "export_block_table: table is smaller than seqs x row_stride", need};
  for (const seq_id id : seqs) {
    const auto h = t.template checked<"export_block_table">(id);
    if (!h) return h.error();
    const auto n = static_cast<std::int64_t>(t[*h].blocks.size());
    if (n > row_stride)
      return status{errc::buffer_too_small, "export_block_table: a sequence has more blocks than row_stride", n};
  }
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const auto& s = t.at(seqs[i]);
    std::int32_t* row = table.data() + i * static_cast<std::size_t>(row_stride);
    std::copy(s.blocks.begin(), s.blocks.end(), row);
    std::fill(row + s.blocks.size(), row + row_stride, no_block);
    seq_lens[i] = s.num_tokens;
  }
  return ok_status();
}

/// Number of `indices` entries export_csr needs for `seqs`; errc::unknown_sequence, errc::sequence_swapped.
template <class Cursor>
[[nodiscard]] result<std::int64_t> csr_size(const sequence_table<Cursor>& t, std::span<const seq_id> seqs) noexcept {
  std::int64_t n = 0;
  for (const seq_id id : seqs) {
    const auto h = t.template checked<"csr_size">(id);
    if (!h) return h.error();
    n += static_cast<std::int64_t>(t[*h].blocks.size());
  }
  return n;
}

/// CSR page table: the blocks of seqs[i] are indices[indptr[i] .. indptr[i+1]); last_page_len[i] = tokens in its
/// last block (in [1, block_size]). Errors: those of csr_size, errc::buffer_too_small (indptr < seqs + 1,
/// last_page_len < seqs, indices < csr_size, or a total over 2^31-1 entries; detail = entries needed).
template <class Cursor>
status export_csr(const sequence_table<Cursor>& t, std::int32_t block_size, std::span<const seq_id> seqs,
                  std::span<std::int32_t> indptr, std::span<std::int32_t> indices,
                  std::span<std::int32_t> last_page_len) noexcept {
  const auto total = csr_size(t, seqs);
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
    const auto& s = t.at(seqs[i]);
    std::copy(s.blocks.begin(), s.blocks.end(), indices.begin() + pos);
    pos += static_cast<std::int32_t>(s.blocks.size());
    indptr[i + 1] = pos;
    last_page_len[i] = s.num_tokens - (static_cast<std::int32_t>(s.blocks.size()) - 1) * block_size;
  }
  return ok_status();
}

/// The read side of cache `Cache`'s sequence table (a base of the cache, which befriends it): token counts, block
/// tables, block hashes, and the kernel exports, forwarding to the functions above over its sequence table `seqs_`,
/// block size `cfg_.block_size`, step ledger `ledger_` (and `cursors_`, `blocks_` for the block hashes).
template <class Cache>
class cache_exports {
 public:
  /// Tokens of sequence `id`; errc::unknown_sequence.
  [[nodiscard]] result<std::int32_t> num_tokens(seq_id id) const noexcept {
    const Cache& c = self();
    const auto h = c.seqs_.template checked<"num_tokens">(id, residency::any);
    if (!h) return h.error();
    return c.seqs_[*h].num_tokens;
  }

  /// The block table of sequence `id` (valid until the next call that changes that sequence);
  /// errc::unknown_sequence, errc::sequence_swapped (see host_block_table).
  [[nodiscard]] result<std::span<const block_id>> block_table(seq_id id) const noexcept {
    const Cache& c = self();
    const auto h = c.seqs_.template checked<"block_table">(id);
    if (!h) return h.error();
    return std::span<const block_id>(c.seqs_[*h].blocks);
  }

  /// Every block table of sequence `id` into `out`, in table order: here its one table (hybrid_kv_cache answers one
  /// per table), so code written for both caches gathers a sequence's tables alike (a KV transfer's offer, say).
  /// errc::unknown_sequence, errc::sequence_swapped, and `out` unchanged.
  status block_tables(seq_id id, std::vector<std::span<const block_id>>& out) const {
    const Cache& c = self();
    const auto h = c.seqs_.template checked<"block_tables">(id);
    if (!h) return h.error();
    out.assign(1, std::span<const block_id>(c.seqs_[*h].blocks));
    return ok_status();
  }

  /// The host block table of swapped-out sequence `id`; errc::unknown_sequence, errc::sequence_swapped (it is
  /// not swapped out).
  [[nodiscard]] result<std::span<const block_id>> host_block_table(seq_id id) const noexcept {
    const Cache& c = self();
    const auto h = c.seqs_.template checked<"host_block_table">(id, residency::swapped);
    if (!h) return h.error();
    return std::span<const block_id>(c.seqs_[*h].blocks);
  }

  /// Device blocks swap_in(id) takes at most: the entries of its host block table (a block shared within the
  /// swapped group counts once per entry). errc::unknown_sequence, errc::sequence_swapped (it is on device).
  [[nodiscard]] result<std::int64_t> swap_in_blocks(seq_id id) const noexcept {
    const Cache& c = self();
    const auto h = c.seqs_.template checked<"swap_in_blocks">(id, residency::swapped);
    if (!h) return h.error();
    return static_cast<std::int64_t>(c.seqs_[*h].blocks.size());
  }

  /// Whether sequence `id` is live and swapped out.
  [[nodiscard]] bool is_swapped(seq_id id) const noexcept {
    const Cache& c = self();
    const std::int32_t h = c.seqs_.find(id);
    return h >= 0 && c.seqs_[h].swapped;
  }

  /// The chained hashes of sequence `id`'s leading cached full blocks into `out` (emptied first; empty unless the
  /// sharing policy is a prehashed_content_cache), read without hashing: keep them to re-admit its tokens after a
  /// preemption by recompute (add_sequence's and match_prefix's `known`). Errors: errc::unknown_sequence,
  /// errc::sequence_swapped (`out` unchanged).
  status block_hashes(seq_id id, std::vector<std::uint64_t>& out) const {
    const Cache& c = self();
    const auto h = c.seqs_.template checked<"block_hashes">(id);
    if (!h) return h.error();
    c.cursors_.hashes_of(c.blocks_.sharing(), c.seqs_[*h], out);
    return ok_status();
  }

  /// Dense page table (vLLM layout) of `seqs` into `table` (rows of `row_stride`) and `seq_lens`; see
  /// kvpager::export_block_table for the format and errors. Validates everything before writing.
  status export_block_table(std::span<const seq_id> seqs, std::span<std::int32_t> table, std::int32_t row_stride,
                            std::span<std::int32_t> seq_lens) const noexcept {
    return ::kvpager::detail::export_block_table(self().seqs_, seqs, table, row_stride, seq_lens);
  }

  /// Number of `indices` entries export_csr needs for `seqs`; errc::unknown_sequence, errc::sequence_swapped.
  [[nodiscard]] result<std::int64_t> csr_size(std::span<const seq_id> seqs) const noexcept {
    return ::kvpager::detail::csr_size(self().seqs_, seqs);
  }

  /// CSR page table (FlashInfer layout) of `seqs`; see kvpager::export_csr. Validates before writing.
  status export_csr(std::span<const seq_id> seqs, std::span<std::int32_t> indptr, std::span<std::int32_t> indices,
                    std::span<std::int32_t> last_page_len) const noexcept {
    return ::kvpager::detail::export_csr(self().seqs_, self().cfg_.block_size, seqs, indptr, indices, last_page_len);
  }

  /// Length of the slot mapping of this step (plan().num_append_tokens()).
  [[nodiscard]] std::int64_t slot_mapping_size() const noexcept { return self().ledger_.plan().num_append_tokens(); }

  /// Slot mapping of the tokens appended in this step, in plan().appends() order: slot = block * block_size +
  /// offset, computed in 64 bits; -1 (kernels skip it) for tokens of sequences freed since, except those kept
  /// because another sequence shares their block (see paged_kv_cache::free_sequence).
  /// Error: errc::buffer_too_small (detail = slot_mapping_size()); nothing written then.
  status export_slot_mapping(std::span<std::int64_t> out) const noexcept {
    const Cache& c = self();
    return c.ledger_.export_slot_mapping(out, c.cfg_.block_size,
                                         [&c](std::int32_t h) noexcept { return c.seqs_[h].blocks.data(); });
  }

 private:
  [[nodiscard]] const Cache& self() const noexcept { return static_cast<const Cache&>(*this); }
};

}  // namespace detail
KVPAGER_NAMESPACE_END
