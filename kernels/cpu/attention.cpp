// CPU kernels of the C ABI: paged decode attention (GQA/MQA, fp32/fp16/bf16 with fp32 accumulation), kv_append and
// copy_blocks. Every argument is validated before any KV memory is touched. Work is split over (sequence, KV head)
// across std::threads; each work item loads a KV head's block once for its whole query-head group.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "kvpager/c/kernels.h"
#include "kvpager/kernels/float16.hpp"

namespace {

using kvpager::detail::bf16_to_float;
using kvpager::detail::float_to_bf16;
using kvpager::detail::float_to_half;
using kvpager::detail::half_to_float;

struct fp32_t {
  using storage = float;
  static float load(storage x) noexcept { return x; }
  static storage store(float x) noexcept { return x; }
};
struct fp16_t {
  using storage = std::uint16_t;
  static float load(storage x) noexcept { return half_to_float(x); }
  static storage store(float x) noexcept { return float_to_half(x); }
};
struct bf16_t {
  using storage = std::uint16_t;
  static float load(storage x) noexcept { return bf16_to_float(x); }
  static storage store(float x) noexcept { return float_to_bf16(x); }
};

bool supported_head_dim(std::int32_t d) { return d == 64 || d == 80 || d == 96 || d == 112 || d == 128 || d == 256; }
bool supported_block_size(std::int32_t b) { return b == 8 || b == 16 || b == 32; }

/// Runs fn(i) for i in [0, n) on up to `threads` threads (0 = all cores), in contiguous chunks.
template <class Fn>
void parallel_for(std::int64_t n, std::int32_t threads, Fn fn) {
  std::int64_t t = threads > 0 ? threads : static_cast<std::int64_t>(std::max(1U, std::thread::hardware_concurrency()));
  t = std::min(t, n);
  if (t <= 1) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(t));
  for (std::int64_t w = 0; w < t; ++w)
    pool.emplace_back([&, w] {
      for (std::int64_t i = n * w / t; i < n * (w + 1) / t; ++i) fn(i);
    });
  for (auto& th : pool) th.join();
}

struct decode_args {
  void* out;
  const void* query;
  const void* kv_cache;
  const std::int32_t* block_table;
  const std::int32_t* seq_lens;
  std::int32_t num_seqs, num_q_heads, num_kv_heads, head_dim, block_size, max_blocks_per_seq;
  float scale;
  std::int32_t num_threads;
};

template <class T>
void decode(const decode_args& a) {
  using S = typename T::storage;
  const auto* q = static_cast<const S*>(a.query);
  const auto* kv = static_cast<const S*>(a.kv_cache);
  auto* out = static_cast<S*>(a.out);
  const std::int64_t D = a.head_dim, bs = a.block_size, hkv = a.num_kv_heads;
  const std::int32_t group = a.num_q_heads / a.num_kv_heads;
  const std::int64_t head_stride = bs * D;          // elements between heads within a K (or V) half-block
  const std::int64_t half_stride = hkv * head_stride;  // between K and V of a block
  parallel_for(std::int64_t{a.num_seqs} * hkv, a.num_threads, [&](std::int64_t item) {
    const std::int64_t seq = item / hkv, h = item % hkv;
    const std::int32_t len = a.seq_lens[seq];
    std::vector<float> qf(static_cast<std::size_t>(group * D)), acc(static_cast<std::size_t>(group * D), 0.0F);
    std::vector<float> m(static_cast<std::size_t>(group), -std::numeric_limits<float>::infinity());
    std::vector<float> l(static_cast<std::size_t>(group), 0.0F);
    std::vector<float> scores(static_cast<std::size_t>(group * bs));
    for (std::int32_t g = 0; g < group; ++g) {
      const S* qrow = q + (seq * a.num_q_heads + h * group + g) * D;
      for (std::int64_t d = 0; d < D; ++d) qf[static_cast<std::size_t>(g * D + d)] = T::load(qrow[d]) * a.scale;
    }
    const std::int32_t* table = a.block_table + seq * a.max_blocks_per_seq;
    for (std::int64_t start = 0; start < len; start += bs) {
      const std::int64_t n = std::min<std::int64_t>(bs, len - start);
      const S* kblock = kv + (std::int64_t{table[start / bs]} * 2 * half_stride) + h * head_stride;
      const S* vblock = kblock + half_stride;
      for (std::int32_t g = 0; g < group; ++g) {
        const float* qg = qf.data() + g * D;
        float* sg = scores.data() + g * bs;
        float block_max = -std::numeric_limits<float>::infinity();
        for (std::int64_t t = 0; t < n; ++t) {
          const S* krow = kblock + t * D;
          float s = 0.0F;
          for (std::int64_t d = 0; d < D; ++d) s += qg[d] * T::load(krow[d]);
          sg[t] = s;
          block_max = std::max(block_max, s);
        }
        const float m_new = std::max(m[static_cast<std::size_t>(g)], block_max);
        const float alpha = std::exp(m[static_cast<std::size_t>(g)] - m_new);  // 0 on the first block
        float* ag = acc.data() + g * D;
        for (std::int64_t d = 0; d < D; ++d) ag[d] *= alpha;
        float lsum = l[static_cast<std::size_t>(g)] * alpha;
        for (std::int64_t t = 0; t < n; ++t) {
          const float p = std::exp(sg[t] - m_new);
          lsum += p;
          const S* vrow = vblock + t * D;
          for (std::int64_t d = 0; d < D; ++d) ag[d] += p * T::load(vrow[d]);
        }
        l[static_cast<std::size_t>(g)] = lsum;
        m[static_cast<std::size_t>(g)] = m_new;
      }
    }
    for (std::int32_t g = 0; g < group; ++g) {
      S* orow = out + (seq * a.num_q_heads + h * group + g) * D;
      const float inv = l[static_cast<std::size_t>(g)] > 0.0F ? 1.0F / l[static_cast<std::size_t>(g)] : 0.0F;
      for (std::int64_t d = 0; d < D; ++d) orow[d] = T::store(acc[static_cast<std::size_t>(g * D + d)] * inv);
    }
  });
}

std::int64_t dtype_bytes(std::int32_t dtype) { return dtype == KVPAGER_DTYPE_FP32 ? 4 : 2; }

}  // namespace

extern "C" {

int32_t kvpager_cpu_paged_attention_decode(void* out, const void* query, const void* kv_cache,
                                           const int32_t* block_table, const int32_t* seq_lens, int32_t num_seqs,
                                           int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                           int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks,
                                           float scale, int32_t dtype, int32_t num_threads) {
  if (num_seqs < 0 || max_blocks_per_seq <= 0 || num_blocks <= 0 || num_threads < 0 || !std::isfinite(scale))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_seqs > 0 && (out == nullptr || query == nullptr || kv_cache == nullptr || block_table == nullptr ||
                       seq_lens == nullptr))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_kv_heads <= 0 || num_q_heads <= 0 || num_q_heads % num_kv_heads != 0) return KVPAGER_STATUS_BAD_HEADS;
  if (!supported_head_dim(head_dim)) return KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM;
  if (dtype != KVPAGER_DTYPE_FP32 && dtype != KVPAGER_DTYPE_FP16 && dtype != KVPAGER_DTYPE_BF16)
    return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
  if (!supported_block_size(block_size)) return KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE;
  // Every block a sequence reads, checked before anything is read.
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t len = seq_lens[s];
    if (len < 0 || std::int64_t{len} > std::int64_t{max_blocks_per_seq} * block_size) return KVPAGER_STATUS_SEQ_TOO_LONG;
    const int32_t* row = block_table + std::int64_t{s} * max_blocks_per_seq;
    for (int32_t b = 0; b < (len + block_size - 1) / block_size; ++b)
      if (row[b] < 0 || row[b] >= num_blocks) return KVPAGER_STATUS_INVALID_BLOCK;
  }
  const decode_args a{out, query, kv_cache, block_table, seq_lens, num_seqs, num_q_heads, num_kv_heads,
                      head_dim, block_size, max_blocks_per_seq, scale, num_threads};
  switch (dtype) {
    case KVPAGER_DTYPE_FP32: decode<fp32_t>(a); break;
    case KVPAGER_DTYPE_FP16: decode<fp16_t>(a); break;
    default: decode<bf16_t>(a); break;
  }
  return KVPAGER_STATUS_OK;
}

int32_t kvpager_cpu_kv_append(void* kv_cache, const void* key, const void* value, const int64_t* slot_mapping,
                              int32_t num_tokens, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                              int32_t num_blocks, int32_t dtype) {
  if (num_tokens < 0 || num_kv_heads <= 0 || head_dim <= 0 || block_size <= 0 || num_blocks <= 0)
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (dtype != KVPAGER_DTYPE_FP32 && dtype != KVPAGER_DTYPE_FP16 && dtype != KVPAGER_DTYPE_BF16)
    return KVPAGER_STATUS_UNSUPPORTED_DTYPE;
  if (num_tokens > 0 && (kv_cache == nullptr || key == nullptr || value == nullptr || slot_mapping == nullptr))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  const std::int64_t slots = std::int64_t{num_blocks} * block_size;
  for (int32_t t = 0; t < num_tokens; ++t)
    if (slot_mapping[t] >= slots) return KVPAGER_STATUS_INVALID_BLOCK;
  const std::int64_t row = std::int64_t{head_dim} * dtype_bytes(dtype);  // bytes
  const std::int64_t head_stride = std::int64_t{block_size} * row, half = std::int64_t{num_kv_heads} * head_stride;
  auto* cache = static_cast<std::byte*>(kv_cache);
  const auto* k = static_cast<const std::byte*>(key);
  const auto* v = static_cast<const std::byte*>(value);
  for (int32_t t = 0; t < num_tokens; ++t) {
    const int64_t s = slot_mapping[t];
    if (s < 0) continue;
    const std::int64_t b = s / block_size, off = s % block_size;
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      const std::int64_t src = (std::int64_t{t} * num_kv_heads + h) * row;
      const std::int64_t dst = b * 2 * half + h * head_stride + off * row;
      std::memcpy(cache + dst, k + src, static_cast<std::size_t>(row));
      std::memcpy(cache + dst + half, v + src, static_cast<std::size_t>(row));
    }
  }
  return KVPAGER_STATUS_OK;
}

int32_t kvpager_cpu_copy_blocks(void* const* kv_caches, int32_t num_layers, const int64_t* block_mapping,
                                int32_t num_pairs, int32_t num_blocks, int64_t block_bytes) {
  if (num_layers < 0 || num_pairs < 0 || num_blocks <= 0 || block_bytes <= 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (num_pairs > 0 && num_layers > 0 && (kv_caches == nullptr || block_mapping == nullptr))
    return KVPAGER_STATUS_INVALID_ARGUMENT;
  for (int32_t l = 0; l < num_layers && num_pairs > 0; ++l)
    if (kv_caches[l] == nullptr) return KVPAGER_STATUS_INVALID_ARGUMENT;
  for (int32_t p = 0; p < 2 * num_pairs; ++p)
    if (block_mapping[p] < 0 || block_mapping[p] >= num_blocks) return KVPAGER_STATUS_INVALID_BLOCK;
  for (int32_t l = 0; l < num_layers; ++l) {
    auto* cache = static_cast<std::byte*>(kv_caches[l]);
    for (int32_t p = 0; p < num_pairs; ++p)
      std::memcpy(cache + block_mapping[2 * p + 1] * block_bytes, cache + block_mapping[2 * p] * block_bytes,
                  static_cast<std::size_t>(block_bytes));
  }
  return KVPAGER_STATUS_OK;
}

}  // extern "C"
