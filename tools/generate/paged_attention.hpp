// SPDX-License-Identifier: Apache-2.0
#pragma once
// One layer's attention of a step on kvpager: the step's K/V are written into the layer's paged pool only by
// kv_append through the step's slot mapping (step_executor::append), and attention runs only through kvpager's
// kernels over the step's page tables: the decode group (out.decode: one query row per sequence) with
// paged_attention_decode_cpu, the prefill group (out.prefill: prompt chunks over their cached prefix, CSR qo_indptr)
// with paged_attention_prefill_cpu, both causal and with the layer's sliding window. With KV cache groups
// (hybrid_kv_cache) each layer uses its group's tables and its group's part of the slot mapping. fp16 and bf16 pools take their
// queries and give their outputs in the pool's dtype (converted here); fp32 and fp8 E4M3 pools take fp32 queries.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/float16.hpp>
#include <kvpager/kernels/float8.hpp>
#include <kvpager/kernels/prefill.hpp>
#include <kvpager/kernels/step_executor.hpp>
#include <kvpager/sched/step_output.hpp>

#include "model.hpp"

namespace kvgen {

/// fp32 to the pool's element type and back (fp16, bf16); fp32 and fp8 pools run on fp32 rows.
struct io_dtype {
  kvpager::kv_dtype pool = kvpager::kv_dtype::f32;
  [[nodiscard]] bool half() const noexcept { return pool == kvpager::kv_dtype::f16 || pool == kvpager::kv_dtype::bf16; }
  [[nodiscard]] std::int32_t code() const noexcept {
    return half() ? static_cast<std::int32_t>(pool) : KVPAGER_DTYPE_FP32;
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return half() ? 2 : 4; }
  void store(const float* src, std::size_t n, std::byte* dst) const noexcept {
    if (!half()) {
      std::memcpy(dst, src, n * 4);
      return;
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t b = pool == kvpager::kv_dtype::f16 ? kvpager::detail::float_to_half(src[i])
                                                             : kvpager::detail::float_to_bf16(src[i]);
      std::memcpy(dst + i * 2, &b, 2);
    }
  }
  void load(const std::byte* src, std::size_t n, float* dst) const noexcept {
    if (!half()) {
      std::memcpy(dst, src, n * 4);
      return;
    }
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t b;
      std::memcpy(&b, src + i * 2, 2);
      dst[i] = pool == kvpager::kv_dtype::f16 ? kvpager::detail::half_to_float(b) : kvpager::detail::bf16_to_float(b);
    }
  }
  /// x rounded as the pool stores it (what the kernels read back); fp8 with its scale.
  [[nodiscard]] float round(float x, float fp8_scale) const noexcept {
    switch (pool) {
      case kvpager::kv_dtype::f16: return kvpager::detail::half_to_float(kvpager::detail::float_to_half(x));
      case kvpager::kv_dtype::bf16: return kvpager::detail::bf16_to_float(kvpager::detail::float_to_bf16(x));
      case kvpager::kv_dtype::fp8_e4m3:
        return kvpager::detail::e4m3_to_float(kvpager::detail::float_to_e4m3(x / fp8_scale)) * fp8_scale;
      default: return x;
    }
  }
};

/// The attention of a step's layers over a step_executor's pools; reused every step.
class paged_attention {
 public:
  /// `layer_group`: with KV cache groups, each layer's group (its block tables and slot mapping); empty: one group.
  paged_attention(kvpager::step_executor& exec, const model_config& c, std::int32_t threads, float k_scale, float v_scale,
                  std::vector<std::int32_t> layer_group = {})
      : exec_(exec), c_(c), threads_(threads), k_scale_(k_scale), v_scale_(v_scale), layer_group_(std::move(layer_group)) {
    dt_.pool = exec.geometry().dtype;
    for (const std::int32_t g : layer_group_) num_groups_ = std::max(num_groups_, g + 1);
  }

  /// The step whose tables the next layers read.
  void begin(const kvpager::step_output& out) noexcept { out_ = &out; }

  std::string operator()(const attention_io& io) {
    const kvpager::step_output& out = *out_;
    const std::size_t nkv = static_cast<std::size_t>(c_.num_kv_heads) * c_.head_dim;
    const std::size_t nq = static_cast<std::size_t>(c_.num_heads) * c_.head_dim;
    const auto n = static_cast<std::size_t>(io.num_tokens);
    // K/V into the pool: fp32 rows for fp32 and fp8 pools (quantized by the append with the layer's scales).
    const void* k = io.k;
    const void* v = io.v;
    if (dt_.half()) {
      kb_.resize(n * nkv * 2);
      vb_.resize(n * nkv * 2);
      dt_.store(io.k, n * nkv, kb_.data());
      dt_.store(io.v, n * nkv, vb_.data());
      k = kb_.data();
      v = vb_.data();
    }
    // With KV cache groups the layer reads and writes its group's tables: its slots are the group's part of the
    // group-major slot mapping.
    const std::int32_t group = layer_group_.empty() ? 0 : layer_group_[static_cast<std::size_t>(io.layer)];
    std::span<const std::int64_t> slots = out.slot_mapping;
    const kvpager::step_tables* dec = &out.decode;
    const kvpager::step_tables* pre = &out.prefill;
    if (!layer_group_.empty()) {
      const std::size_t per_group = slots.size() / static_cast<std::size_t>(num_groups_);
      slots = slots.subspan(static_cast<std::size_t>(group) * per_group, per_group);
      if (!out.group_decode.empty()) {
        dec = &out.group_decode[static_cast<std::size_t>(group)];
        pre = &out.group_prefill[static_cast<std::size_t>(group)];
      }
    }
    const kvpager::fp8_append fp8{KVPAGER_DTYPE_FP32, k_scale_, v_scale_};
    if (const kvpager::status st = exec_.append(io.layer, slots, k, v, fp8); !st)
      return std::string("kv_append: ") + st.message();
    const auto scale = static_cast<float>(c_.attn_scale);  // 1/sqrt(head_dim), or Gemma's query_pre_attn_scalar
    const auto soft_cap = static_cast<float>(c_.attn_softcap);
    for (const kvpager::step_tables* g : {dec, pre}) {
      if (g->empty()) continue;
      // The group's query rows, row after row as qo_indptr lays them out.
      const auto rows = static_cast<std::size_t>(g->num_query_rows());
      qb_.resize(rows * nq * dt_.bytes());
      ob_.resize(qb_.size());
      for (std::size_t i = 0; i < g->rows(); ++i) {
        const auto e = static_cast<std::size_t>(g->entries[i]);
        const auto first = static_cast<std::size_t>(out.query_start_loc[e]);
        const auto len = static_cast<std::size_t>(g->qo_indptr[i + 1] - g->qo_indptr[i]);
        dt_.store(io.q + first * nq, len * nq, qb_.data() + static_cast<std::size_t>(g->qo_indptr[i]) * nq * dt_.bytes());
      }
      kvpager::page_table_view pages;
      pages.block_table = g->block_table.data();
      pages.row_stride = g->row_stride;
      pages.seq_lens = g->seq_lens.data();
      kvpager::status st;
      if (g == dec) {
        kvpager::decode_params p;
        p.out = ob_.data();
        p.query = qb_.data();
        p.kv = exec_.view(io.layer);
        p.pages = pages;
        p.num_seqs = static_cast<std::int32_t>(g->rows());
        p.num_q_heads = c_.num_heads;
        p.scale = scale;
        p.num_threads = decode_threads(*g, io.window_left);
        p.window_left = io.window_left;
        p.logits_soft_cap = soft_cap;
        p.q_dtype = dt_.code();
        p.k_scale = k_scale_;
        p.v_scale = v_scale_;
        const std::int64_t ws = kvpager::decode_workspace_size(p);
        if (ws > 0) {
          workspace_.resize(static_cast<std::size_t>((ws + 3) / 4));
          p.workspace = workspace_.data();
          p.workspace_bytes = ws;
        }
        st = kvpager::paged_attention_decode_cpu(p);
      } else {
        kvpager::prefill_params p;
        p.out = ob_.data();
        p.query = qb_.data();
        p.kv = exec_.view(io.layer);
        p.pages = pages;
        p.qo_indptr = g->qo_indptr.data();
        p.num_seqs = static_cast<std::int32_t>(g->rows());
        p.num_q_heads = c_.num_heads;
        p.scale = scale;
        p.num_threads = threads_;
        p.window_left = io.window_left;
        p.logits_soft_cap = soft_cap;
        p.q_dtype = dt_.code();
        p.k_scale = k_scale_;
        p.v_scale = v_scale_;
        st = kvpager::paged_attention_prefill_cpu(p);
      }
      if (!st) return std::string(g == dec ? "decode attention: " : "prefill attention: ") + st.message();
      for (std::size_t i = 0; i < g->rows(); ++i) {
        const auto e = static_cast<std::size_t>(g->entries[i]);
        const auto first = static_cast<std::size_t>(out.query_start_loc[e]);
        const auto len = static_cast<std::size_t>(g->qo_indptr[i + 1] - g->qo_indptr[i]);
        dt_.load(ob_.data() + static_cast<std::size_t>(g->qo_indptr[i]) * nq * dt_.bytes(), len * nq, io.out + first * nq);
      }
    }
    return "";
  }

 private:
  /// A decode group that reads little K/V runs on the calling thread: waking the kernels' workers costs more than it
  /// saves there, the more so while OpenBLAS's threads still spin after the last GEMM (bench/RESULTS.md, issue 23).
  [[nodiscard]] std::int32_t decode_threads(const kvpager::step_tables& g, std::int32_t window_left) const noexcept {
    constexpr std::int64_t one_thread_below = std::int64_t{4} << 20;  // bytes of K and V the group reads
    std::int64_t tokens = 0;
    for (std::size_t i = 0; i < g.rows(); ++i)
      tokens += window_left >= 0 ? std::min<std::int64_t>(g.seq_lens[i], window_left + 1) : g.seq_lens[i];
    const std::int64_t bytes =
        tokens * c_.num_kv_heads * c_.head_dim * 2 * kvpager::elem_bytes(exec_.geometry().dtype);
    return bytes < one_thread_below ? 1 : threads_;
  }

  kvpager::step_executor& exec_;
  const model_config& c_;
  std::int32_t threads_;
  float k_scale_, v_scale_;
  io_dtype dt_;
  const kvpager::step_output* out_ = nullptr;
  std::vector<std::int32_t> layer_group_;
  std::int32_t num_groups_ = 1;
  std::vector<std::byte> kb_, vb_, qb_, ob_;
  std::vector<float> workspace_;
};

}  // namespace kvgen
