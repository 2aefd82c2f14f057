// SPDX-License-Identifier: Apache-2.0
#pragma once
// The page tables of a prefill test batch, shared by the plain and fp8 CPU prefill tests: shuffled block ids, a dense
// block table, the same pages in CSR form, and qo_indptr.
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/prefill.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace kvpager_prefill_test {

/// Calls fn(j) for every KV position j < len that a query row at position `pos` may not attend to: after it, or,
/// with window >= 0, before pos - window (issue 21: what the masked-position tests poison).
template <class Fn>
void for_each_masked_position(std::int32_t len, std::int64_t pos, std::int32_t window, Fn fn) {
  for (std::int32_t j = 0; j < len; ++j)
    if (j > pos || (window >= 0 && j < pos - window)) fn(j);
}

/// Sequences of lens[s] tokens with q_lens[s] query rows each, over num_blocks = the blocks they use + `spare` (which
/// no sequence uses), in shuffled order.
struct paged_tables {
  std::int32_t num_blocks = 0, max_blocks = 1;
  std::vector<std::int32_t> table, indptr, indices, last, qo;
  paged_tables() = default;
  paged_tables(const std::vector<std::int32_t>& lens, const std::vector<std::int32_t>& q_lens, std::int32_t bs,
               std::int32_t spare, std::mt19937& rng) {
    for (const std::int32_t len : lens) {
      max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
      num_blocks += (len + bs - 1) / bs;
    }
    num_blocks += spare;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(lens.size() * static_cast<std::size_t>(max_blocks), -1);
    indptr.push_back(0);
    qo.push_back(0);
    std::size_t next = 0;
    for (std::size_t sq = 0; sq < lens.size(); ++sq) {
      const std::int32_t len = lens[sq];
      for (std::int32_t b = 0; b < (len + bs - 1) / bs; ++b) {
        table[sq * static_cast<std::size_t>(max_blocks) + static_cast<std::size_t>(b)] = ids[next];
        indices.push_back(ids[next++]);
      }
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
      last.push_back(len == 0 ? 0 : (len - 1) % bs + 1);
      qo.push_back(qo.back() + q_lens[sq]);
    }
  }
  /// The block holding token t of sequence sq.
  [[nodiscard]] std::int64_t block(std::int32_t sq, std::int32_t t, std::int32_t bs) const {
    return table[static_cast<std::size_t>(sq) * static_cast<std::size_t>(max_blocks) + static_cast<std::size_t>(t / bs)];
  }
  /// p.pages (the dense table over seq_lens, or CSR), p.qo_indptr and p.num_seqs.
  void set_pages(kvpager::prefill_params& p, bool csr, const std::vector<std::int32_t>& seq_lens) const {
    if (csr) {
      p.pages.indptr = indptr.data();
      p.pages.indices = indices.data();
      p.pages.last_page_len = last.data();
    } else {
      p.pages.block_table = table.data();
      p.pages.row_stride = max_blocks;
      p.pages.seq_lens = seq_lens.data();
    }
    p.qo_indptr = qo.data();
    p.num_seqs = static_cast<std::int32_t>(seq_lens.size());
  }
};

}  // namespace kvpager_prefill_test
