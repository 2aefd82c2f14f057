// SPDX-License-Identifier: Apache-2.0
#pragma once
// kvpager-sim --compute cpu: real attention on the CPU kernels every step, for one random-weight attention layer,
// checked at the end against the same attention over contiguous K/V computed without any cache.
//
// The layer: a token t at position p has the input x = e(t) + pos(p) (d_model 32: a pseudo-random embedding and a
// sinusoidal position code), and q = Wq x, k = Wk x, v = Wv x with random weights: 2 query heads, 1 KV head (GQA),
// head_dim 64, K/V/Q/out in fp32 or bf16. Since k and v depend on the token and its position only, a prefix-cache
// hit (same tokens at the same positions) may serve them, as in a real model's first layer.
//
// The simulator is a plain driver of the scheduler's step_output and the cache's geometry(): every step, the plan's
// swap-outs, swap-ins and copies run through kvpager::step_executor (the shipped block-move kernels) over the pools
// of a kvpager::host_kv_pools of the cache's geometry; the K/V of the step's tokens (out.input_ids at out.positions)
// through its append (kvpager_cpu_kv_append) and out.slot_mapping; attention over the step's page tables: the
// decode group (out.decode) with kvpager_cpu_paged_attention_decode, the prefill group (out.prefill, qo_indptr) with
// kvpager_cpu_paged_attention_prefill. Each request keeps the output row of every position it computed (the last
// time: a recompute overwrites). When the request finishes, its rows are compared with causal attention over its
// tokens' K/V laid out contiguously (fp32, no cache, no kernel).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <kvpager/c/kernels.h>
#include <kvpager/core/step_plan.hpp>
#include <kvpager/kernels/float16.hpp>
#include <kvpager/kernels/step_executor.hpp>
#include <kvpager/sched/step_output.hpp>

#include "workload.hpp"

namespace kvsim {

/// Prefill attention over a paged KV pool: the prompt rows of each sequence (qo_indptr, CSR) over its whole paged KV
/// (cached prefix included), causal, through the library's kvpager_cpu_paged_attention_prefill (no window, no cap).
inline int32_t prefill_attention(void* out, const void* query, void* kv_cache, const int32_t* qo_indptr,
                                 const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                 int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                                 int32_t max_blocks_per_seq, int32_t num_blocks, float scale, int32_t dtype,
                                 int32_t num_threads) {
  return kvpager_cpu_paged_attention_prefill(out, query, kv_cache, qo_indptr, block_table, seq_lens, num_seqs,
                                             num_q_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq,
                                             num_blocks, scale, /*window_left=*/-1, /*logits_soft_cap=*/0.0F, dtype,
                                             num_threads);
}

/// The attention layer, its KV pools (host_kv_pools) and the outputs waiting to be checked.
class attention_compute {
 public:
  static constexpr std::int32_t d_model = 32, q_heads = 2, kv_heads = 1, head_dim = 64;

  struct stats {
    std::int64_t rows = 0;           ///< output rows computed (prompt and decode)
    std::int64_t prefill_rows = 0;   ///< of those, prompt rows
    std::int64_t rows_checked = 0;   ///< rows compared with the reference
    std::int64_t requests_checked = 0;
    std::int64_t mismatches = 0;     ///< rows outside the tolerance
    std::int64_t copies = 0, swap_outs = 0, swap_ins = 0;  ///< blocks moved by the executor
    double max_error = 0;            ///< largest |kernel - reference| over all rows
    double kernel_s = 0, reference_s = 0;
    std::string first_mismatch;      ///< which request and position, for the message
  };

  /// The layer over `pools` (the cache's geometry(): kv_heads and head_dim must be the layer's; its host pool the
  /// cache's swap pool).
  attention_compute(kvpager::host_kv_pools pools, std::uint64_t seed) : pools_(std::move(pools)), geom_(pools_.geometry()) {
    random_stream rng(seed);
    const double w = 1.0 / std::sqrt(double{d_model});
    for (auto* m : {&wq_, &wk_, &wv_}) {
      const std::size_t rows = m == &wq_ ? q_heads * head_dim : kv_heads * head_dim;
      m->resize(rows * d_model);
      for (float& x : *m) x = static_cast<float>(rng.normal() * w);
    }
  }

  [[nodiscard]] const stats& counters() const noexcept { return st_; }

  /// Test hook (--inject-corruption): at the step numbered `step`, one V element of a running request's first
  /// block is overwritten, so the check must fail.
  void corrupt_at(std::int64_t step) noexcept { corrupt_step_ = step; }
  /// Threads of the kernel calls (0: all cores).
  void set_threads(std::int32_t n) noexcept { threads_ = n; }

  /// One step, from the scheduler's output alone. Returns "" or an error message.
  std::string step(std::int64_t step_no, const kvpager::step_output& out) {
    const auto t0 = std::chrono::steady_clock::now();
    if (out.plan == nullptr) return "step_output without a plan";
    const kvpager::step_plan& plan = *out.plan;
    if (const kvpager::status st = pools_.executor().run_plan(plan); !st)
      return std::string("executor: ") + st.message();
    st_.copies += static_cast<std::int64_t>(plan.copies().size());
    st_.swap_outs += static_cast<std::int64_t>(plan.swap_outs().size());
    st_.swap_ins += static_cast<std::int64_t>(plan.swap_ins().size());
    const std::int64_t ntok = out.num_tokens();
    if (ntok != static_cast<std::int64_t>(out.slot_mapping.size()) ||
        ntok != static_cast<std::int64_t>(out.input_ids.size()))
      return "slot mapping has " + std::to_string(out.slot_mapping.size()) + " entries and input_ids " +
             std::to_string(out.input_ids.size()) + " for " + std::to_string(ntok) + " tokens";
    for (const kvpager::step_tables* g : {&out.decode, &out.prefill})
      for (std::size_t i = 0; i < g->rows(); ++i) {
        const kvpager::scheduled_sequence& e = out.scheduled[static_cast<std::size_t>(g->entries[i])];
        if (g->seq_lens[i] != e.start + e.num_tokens)
          return "request " + std::to_string(e.id) + ": exported length " + std::to_string(g->seq_lens[i]) +
                 ", scheduled up to " + std::to_string(e.start + e.num_tokens);
      }
    // K, V, Q of the step's tokens in slot-mapping order, from their ids and positions.
    const std::size_t es = elem();
    k_.resize(static_cast<std::size_t>(ntok) * kv_heads * head_dim * es);
    v_.resize(k_.size());
    q_.resize(static_cast<std::size_t>(ntok) * q_heads * head_dim * es);
    for (std::size_t t = 0; t < static_cast<std::size_t>(ntok); ++t) {
      project(out.input_ids[t], out.positions[t], proj_);
      store(proj_.data(), q_.data() + t * q_heads * head_dim * es, q_heads * head_dim);
      store(proj_.data() + q_heads * head_dim, k_.data() + t * kv_heads * head_dim * es, kv_heads * head_dim);
      store(proj_.data() + (q_heads + kv_heads) * head_dim, v_.data() + t * kv_heads * head_dim * es,
            kv_heads * head_dim);
    }
    if (const kvpager::status st = pools_.executor().append(0, out.slot_mapping, k_.data(), v_.data()); !st)
      return std::string("kv_append: ") + st.message();
    void* pool = pools_.device_bytes().data();
    const auto dtype = static_cast<std::int32_t>(geom_.dtype);
    const float scale = 1.0F / std::sqrt(float{head_dim});
    // Attention: one decode call over the decode group's table, one prefill call over the prefill group's.
    const kvpager::step_tables& dec = out.decode;
    const kvpager::step_tables& pre = out.prefill;
    gather(out, dec, dq_);
    dout_.resize(dq_.size());
    if (!dec.empty()) {
      if (const int32_t rc = kvpager_cpu_paged_attention_decode(
              dout_.data(), dq_.data(), pool, dec.block_table.data(), dec.seq_lens.data(),
              static_cast<std::int32_t>(dec.rows()), q_heads, kv_heads, head_dim, geom_.block_size, dec.row_stride,
              geom_.num_blocks, scale, dtype, threads_);
          rc != 0)
        return std::string("decode: ") + kvpager_status_string(rc);
    }
    gather(out, pre, pq_);
    pout_.resize(pq_.size());
    if (!pre.empty()) {
      if (const int32_t rc = prefill_attention(pout_.data(), pq_.data(), pool, pre.qo_indptr.data(),
                                               pre.block_table.data(), pre.seq_lens.data(),
                                               static_cast<std::int32_t>(pre.rows()), q_heads, kv_heads, head_dim,
                                               geom_.block_size, pre.row_stride, geom_.num_blocks, scale, dtype,
                                               threads_);
          rc != 0)
        return std::string("prefill: ") + kvpager_status_string(rc);
    }
    // Keep every row for the check.
    const std::size_t qrow = q_heads * head_dim * es;
    for (const kvpager::step_tables* g : {&dec, &pre}) {
      const std::vector<std::byte>& o = g == &dec ? dout_ : pout_;
      for (std::size_t i = 0; i < g->rows(); ++i) {
        const kvpager::scheduled_sequence& e = out.scheduled[static_cast<std::size_t>(g->entries[i])];
        for (std::int32_t j = 0; j < e.num_tokens; ++j) {
          keep(e.id, e.start + j, o.data() + static_cast<std::size_t>(g->qo_indptr[i] + j) * qrow);
          ++st_.rows;
          if (g == &pre) ++st_.prefill_rows;
        }
      }
    }
    if (step_no == corrupt_step_) corrupt(dec), corrupt(pre);
    st_.kernel_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return "";
  }

  /// Request `id` finished with `tokens` (every computed position): its rows are checked and dropped.
  void finish(std::uint64_t id, std::span<const kvpager::token_id> tokens) {
    const auto it = rows_.find(id);
    if (it == rows_.end()) return;
    check(id, it->second, tokens);
    rows_.erase(it);
  }
  /// Request `id` ended without its tokens (the scheduler finished it): its rows are dropped unchecked.
  void forget(std::uint64_t id) { rows_.erase(id); }

 private:
  struct request_rows {
    std::vector<float> out;       // [positions, q_heads, head_dim]
    std::vector<std::uint8_t> have;
  };

  [[nodiscard]] std::size_t elem() const noexcept { return geom_.dtype == kvpager::kv_dtype::f32 ? 4 : 2; }

  /// q (q_heads x head_dim), k, v (kv_heads x head_dim each) of token `tok` at `pos`, in fp32, rounded to the KV
  /// dtype (what the kernels store and read).
  void project(kvpager::token_id tok, std::int32_t pos, std::vector<float>& out) const {
    float x[d_model];
    for (std::int32_t i = 0; i < d_model; ++i) {
      const std::uint64_t h = splitmix64((static_cast<std::uint64_t>(tok) << 8) | static_cast<std::uint64_t>(i));
      const double e = static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0;
      const double freq = std::pow(10000.0, -static_cast<double>(i / 2 * 2) / d_model);
      x[i] = static_cast<float>(e + 0.5 * ((i & 1) != 0 ? std::cos(pos * freq) : std::sin(pos * freq)));
    }
    out.assign((q_heads + 2 * kv_heads) * head_dim, 0.0F);
    float* o = out.data();
    for (const auto* m : {&wq_, &wk_, &wv_}) {
      const std::size_t rows = m->size() / d_model;
      for (std::size_t r = 0; r < rows; ++r) {
        float acc = 0;
        for (std::int32_t i = 0; i < d_model; ++i) acc += (*m)[r * d_model + static_cast<std::size_t>(i)] * x[i];
        *o++ = round_dtype(acc);
      }
    }
  }
  [[nodiscard]] float round_dtype(float f) const noexcept {
    if (geom_.dtype == kvpager::kv_dtype::bf16) return kvpager::detail::bf16_to_float(kvpager::detail::float_to_bf16(f));
    return f;
  }
  void store(const float* src, std::byte* dst, std::int32_t n) const noexcept {
    if (geom_.dtype == kvpager::kv_dtype::f32) {
      std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
      return;
    }
    for (std::int32_t i = 0; i < n; ++i) {
      const std::uint16_t b = kvpager::detail::float_to_bf16(src[i]);
      std::memcpy(dst + static_cast<std::size_t>(i) * 2, &b, 2);
    }
  }
  [[nodiscard]] float load(const std::byte* src, std::size_t i) const noexcept {
    if (geom_.dtype == kvpager::kv_dtype::f32) {
      float f;
      std::memcpy(&f, src + i * 4, 4);
      return f;
    }
    std::uint16_t b;
    std::memcpy(&b, src + i * 2, 2);
    return kvpager::detail::bf16_to_float(b);
  }

  /// The query rows of group `g` (its entries' tokens, row after row as g.qo_indptr lays them out) into `out`.
  void gather(const kvpager::step_output& o, const kvpager::step_tables& g, std::vector<std::byte>& out) const {
    const std::size_t qrow = q_heads * head_dim * elem();
    out.clear();
    for (std::size_t i = 0; i < g.rows(); ++i) {
      const auto e = static_cast<std::size_t>(g.entries[i]);
      const auto* b = q_.data() + static_cast<std::size_t>(o.query_start_loc[e]) * qrow;
      out.insert(out.end(), b, b + static_cast<std::size_t>(g.qo_indptr[i + 1] - g.qo_indptr[i]) * qrow);
    }
  }

  void keep(std::uint64_t id, std::int32_t pos, const std::byte* src) {
    request_rows& r = rows_[id];
    const auto need = static_cast<std::size_t>(pos) + 1;
    if (r.have.size() < need) {
      r.have.resize(need, 0);
      r.out.resize(need * q_heads * head_dim, 0.0F);
    }
    r.have[static_cast<std::size_t>(pos)] = 1;
    for (std::size_t i = 0; i < q_heads * head_dim; ++i)
      r.out[static_cast<std::size_t>(pos) * q_heads * head_dim + i] = load(src, i);
  }

  /// Overwrites one V element in the first block of every request of group `g` (at least one of them computes again
  /// after it, in any workload the test uses).
  void corrupt(const kvpager::step_tables& g) {
    for (std::size_t i = 0; i < g.rows(); ++i) {
      const std::int32_t b = g.block_table[i * static_cast<std::size_t>(g.row_stride)];
      const auto off = static_cast<std::size_t>(kvpager::kv_layout::of(geom_).offset(b, 1, 0, 0));
      std::byte* p = pools_.device_bytes().data() + off;
      if (geom_.dtype == kvpager::kv_dtype::f32) {
        const float f = 1000.0F;
        std::memcpy(p, &f, 4);
      } else {
        const std::uint16_t h = kvpager::detail::float_to_bf16(1000.0F);
        std::memcpy(p, &h, 2);
      }
    }
  }

  /// Causal attention over the request's contiguous K/V (fp32, no cache), row by row, against the kept rows.
  void check(std::uint64_t id, const request_rows& r, std::span<const kvpager::token_id> tokens) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t n = std::min(r.have.size(), tokens.size());
    const std::size_t hd = head_dim;
    // K transposed ([dim][position]) and V ([position][dim]) of the single KV head; all query rows.
    kt_.assign(hd * n, 0.0F);
    vv_.assign(n * hd, 0.0F);
    qq_.assign(n * q_heads * hd, 0.0F);
    for (std::size_t p = 0; p < n; ++p) {
      project(tokens[p], static_cast<std::int32_t>(p), proj_);
      std::copy_n(proj_.data(), q_heads * hd, qq_.data() + p * q_heads * hd);
      for (std::size_t d = 0; d < hd; ++d) kt_[d * n + p] = proj_[q_heads * hd + d];
      std::copy_n(proj_.data() + (q_heads + 1) * hd, hd, vv_.data() + p * hd);
    }
    const float scale = 1.0F / std::sqrt(float{head_dim});
    const double tol = geom_.dtype == kvpager::kv_dtype::f32 ? 2e-4 : 3e-2;
    std::vector<float>& s = scores_;
    std::vector<float> o(hd);
    for (std::size_t p = 0; p < n; ++p) {
      if (r.have[p] == 0) continue;
      ++st_.rows_checked;
      double row_err = 0;
      for (std::size_t h = 0; h < q_heads; ++h) {
        const float* qv = qq_.data() + (p * q_heads + h) * hd;
        s.assign(p + 1, 0.0F);
        for (std::size_t d = 0; d < hd; ++d) {
          const float qd = qv[d];
          const float* kd = kt_.data() + d * n;
          for (std::size_t j = 0; j <= p; ++j) s[j] += qd * kd[j];
        }
        float m = -INFINITY;
        for (std::size_t j = 0; j <= p; ++j) m = std::max(m, s[j] * scale);
        float sum = 0;
        for (std::size_t j = 0; j <= p; ++j) {
          s[j] = std::exp(s[j] * scale - m);
          sum += s[j];
        }
        std::fill(o.begin(), o.end(), 0.0F);
        for (std::size_t j = 0; j <= p; ++j) {
          const float w = s[j];
          const float* vj = vv_.data() + j * hd;
          for (std::size_t d = 0; d < hd; ++d) o[d] += w * vj[d];
        }
        for (std::size_t d = 0; d < hd; ++d) {
          const double ref = o[d] / sum;
          const double got = r.out[(p * q_heads + h) * hd + d];
          row_err = std::max(row_err, std::abs(got - ref) / (1.0 + std::abs(ref)));
        }
      }
      st_.max_error = std::max(st_.max_error, row_err);
      if (!(row_err <= tol)) {
        if (st_.mismatches == 0)
          st_.first_mismatch = "request " + std::to_string(id) + " position " + std::to_string(p) + ": error " +
                               std::to_string(row_err) + " > " + std::to_string(tol);
        ++st_.mismatches;
      }
    }
    ++st_.requests_checked;
    st_.reference_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  kvpager::host_kv_pools pools_;
  kvpager::kv_geometry geom_;
  std::int64_t corrupt_step_ = -1;
  std::int32_t threads_ = 0;
  std::vector<float> wq_, wk_, wv_;
  std::unordered_map<std::uint64_t, request_rows> rows_;
  stats st_;
  // Per-step buffers, reused.
  std::vector<float> proj_;
  std::vector<std::byte> k_, v_, q_, dq_, dout_, pq_, pout_;
  std::vector<float> kt_, vv_, qq_, scores_;
};

}  // namespace kvsim
