// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// KV-cache sizing: bytes of KV per token (per layer and over all layers), bytes per block, the KV budget of a card
/// (card memory x utilization fraction - weights - activation reserve), the blocks it holds and the most concurrent
/// sequences of a given length, per tensor-parallel rank. The arithmetic vLLM uses to size its pool
/// (kv_cache_utils.get_num_blocks: num_blocks = available bytes / page bytes / layers, page = 2 x block_size x KV
/// heads x head dim x dtype bytes), as constexpr functions returning result<> on bad input. All in 64 bits.
///
/// A block here is one block id of the cache: its block_size tokens' K and V in every layer (one block table serves
/// all layers), so block bytes = block_size x KV bytes per token over all layers. Example, Llama-2-7B in fp16:
/// 2 (K and V) x 32 KV heads x 128 dims x 2 bytes = 16 KiB per token per layer, x 32 layers = 512 KiB per token;
/// a 16-token block is 8 MiB.

#include <cstdint>
#include <optional>
#include <limits>

#include "kvpager/core/checked_math.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/sizing/model_shape.hpp"
#include "kvpager/sizing/tensor_parallel.hpp"

KVPAGER_NAMESPACE_BEGIN

namespace detail {
// Unchecked arithmetic on inputs the public functions have validated (result::value() is not constexpr, so the
// checked functions and plan_pool share these instead of each other's results).
[[nodiscard]] constexpr std::int64_t kv_heads_on_rank(const model_shape& m, std::int32_t tp) noexcept {
  return m.num_kv_heads >= tp ? m.num_kv_heads / tp : 1;
}
[[nodiscard]] constexpr std::int64_t token_layer_bytes(const model_shape& m, std::int32_t dtype_bytes, std::int32_t tp) noexcept {
  return 2 * kv_heads_on_rank(m, tp) * m.head_dim * dtype_bytes;
}
[[nodiscard]] constexpr std::int64_t usable_bytes(std::int64_t card_bytes, double utilization) noexcept {
  return static_cast<std::int64_t>(static_cast<double>(card_bytes) * utilization);
}
}  // namespace detail

/// KV bytes one token takes in one layer on one rank: 2 (K and V) x KV heads on the rank (max(1, KV heads / tp),
/// split_heads) x head dim x `dtype_bytes`. tp = 1 is the whole model's figure. Errors (errc::invalid_argument):
/// validate(m), dtype_bytes <= 0, and split_heads(m.num_q_heads, m.num_kv_heads, tp).
[[nodiscard]] constexpr result<std::int64_t> kv_bytes_per_token_per_layer(const model_shape& m, std::int32_t dtype_bytes,
                                                                         std::int32_t tp = 1) noexcept {
  if (const status st = validate(m); !st) return st;
  if (dtype_bytes <= 0) return status{errc::invalid_argument, "kv sizing: dtype_bytes must be positive", dtype_bytes};
  if (const result<tp_head_split> s = split_heads(m.num_q_heads, m.num_kv_heads, tp); !s.ok()) return s.error();
  return detail::token_layer_bytes(m, dtype_bytes, tp);
}

/// KV bytes one token takes over all layers on one rank: kv_bytes_per_token_per_layer x num_layers. Same errors, and
/// errc::invalid_argument for a product beyond int64.
[[nodiscard]] constexpr result<std::int64_t> kv_bytes_per_token(const model_shape& m, std::int32_t dtype_bytes,
                                                               std::int32_t tp = 1) noexcept {
  const result<std::int64_t> per_layer = kv_bytes_per_token_per_layer(m, dtype_bytes, tp);
  if (!per_layer.ok()) return per_layer.error();
  const std::optional<std::int64_t> b = checked_mul(detail::token_layer_bytes(m, dtype_bytes, tp), m.num_layers);
  if (!b) return status{errc::invalid_argument, "kv sizing: KV bytes per token exceed int64", m.num_layers};
  return *b;
}

/// Bytes of one block (block_size tokens, every layer) on one rank. Errors: those of kv_bytes_per_token, and
/// errc::invalid_argument for block_size <= 0.
[[nodiscard]] constexpr result<std::int64_t> kv_block_bytes(const model_shape& m, std::int32_t dtype_bytes,
                                                            std::int32_t block_size, std::int32_t tp = 1) noexcept {
  if (block_size <= 0) return status{errc::invalid_argument, "kv sizing: block_size must be positive", block_size};
  const result<std::int64_t> per_token = kv_bytes_per_token(m, dtype_bytes, tp);
  if (!per_token.ok()) return per_token.error();
  const std::optional<std::int64_t> b =
      checked_mul(checked_mul(detail::token_layer_bytes(m, dtype_bytes, tp), m.num_layers).value_or(0), block_size);
  if (!b) return status{errc::invalid_argument, "kv sizing: KV bytes per block exceed int64", block_size};
  return *b;
}

/// Bytes of the weights on one rank: ceil(num_params x weight_dtype_bytes / tp) (tensor parallelism splits the
/// weights; replicated KV projections under tp > KV heads are small and not counted). Errors
/// (errc::invalid_argument): validate(m), weight_dtype_bytes <= 0 (use 1 for 8-bit weights), tp <= 0, a product
/// beyond int64.
[[nodiscard]] constexpr result<std::int64_t> weight_bytes_per_rank(const model_shape& m, std::int32_t weight_dtype_bytes,
                                                                  std::int32_t tp = 1) noexcept {
  if (const status st = validate(m); !st) return st;
  if (weight_dtype_bytes <= 0)
    return status{errc::invalid_argument, "kv sizing: weight_dtype_bytes must be positive", weight_dtype_bytes};
  if (tp <= 0) return status{errc::invalid_argument, "kv sizing: tensor-parallel degree must be positive", tp};
  if (m.num_params > std::numeric_limits<std::int64_t>::max() / weight_dtype_bytes)
    return status{errc::invalid_argument, "kv sizing: weight bytes exceed int64", m.num_params};
  const std::int64_t total = m.num_params * weight_dtype_bytes;
  return (total + tp - 1) / tp;
}

/// One card's memory and what it must keep besides the KV cache.
struct memory_budget {
  std::int64_t card_bytes = 0;                ///< the card's memory
  double utilization = 0.9;                   ///< fraction of it the engine may use (vLLM's gpu_memory_utilization)
  std::int64_t weight_bytes = 0;              ///< weights on this card (per rank under TP: weight_bytes_per_rank)
  std::int64_t activation_reserve_bytes = 0;  ///< activations and workspaces at peak (vLLM measures it by a profile run)
};

/// KV bytes the card can give the cache: floor(card_bytes x utilization) - weight_bytes - activation_reserve_bytes.
/// Errors: errc::invalid_argument (card_bytes <= 0, utilization not in (0, 1], negative weights or reserve; detail =
/// the value), errc::out_of_blocks when weights and reserve take all the usable memory (the model does not fit; detail =
/// the bytes missing for a non-empty budget).
[[nodiscard]] constexpr result<std::int64_t> kv_budget_bytes(const memory_budget& b) noexcept {
  if (b.card_bytes <= 0) return status{errc::invalid_argument, "kv_budget_bytes: card_bytes must be positive", b.card_bytes};
  if (!(b.utilization > 0.0 && b.utilization <= 1.0))  // also rejects NaN
    return status{errc::invalid_argument, "kv_budget_bytes: utilization must be in (0, 1]"};
  if (b.weight_bytes < 0)
    return status{errc::invalid_argument, "kv_budget_bytes: weight_bytes must not be negative", b.weight_bytes};
  if (b.activation_reserve_bytes < 0)
    return status{errc::invalid_argument, "kv_budget_bytes: activation_reserve_bytes must not be negative",
                  b.activation_reserve_bytes};
  const std::int64_t usable = detail::usable_bytes(b.card_bytes, b.utilization);
  // Both terms are at most usable <= card_bytes when the budget is positive, so compare before subtracting.
  if (b.weight_bytes >= usable || b.activation_reserve_bytes >= usable - b.weight_bytes)
    return status{errc::out_of_blocks, "kv_budget_bytes: weights and activation reserve exceed the usable memory",
                  b.weight_bytes - usable + b.activation_reserve_bytes + 1};
  return usable - b.weight_bytes - b.activation_reserve_bytes;
}

/// Whole blocks of `block_bytes` bytes in `budget_bytes`: floor(budget / block_bytes). Errors
/// (errc::invalid_argument): budget_bytes < 0, block_bytes <= 0.
[[nodiscard]] constexpr result<std::int64_t> blocks_for_budget(std::int64_t budget_bytes, std::int64_t block_bytes) noexcept {
  if (budget_bytes < 0)
    return status{errc::invalid_argument, "blocks_for_budget: budget_bytes must not be negative", budget_bytes};
  if (block_bytes <= 0) return status{errc::invalid_argument, "blocks_for_budget: block_bytes must be positive", block_bytes};
  return budget_bytes / block_bytes;
}

/// The most sequences of `seq_len` tokens that fit in `num_blocks` blocks at once, each taking ceil(seq_len /
/// block_size) blocks of its own (no prefix sharing). Errors (errc::invalid_argument): num_blocks < 0,
/// block_size <= 0, seq_len <= 0.
[[nodiscard]] constexpr result<std::int64_t> max_concurrent_sequences(std::int64_t num_blocks, std::int32_t block_size,
                                                                      std::int64_t seq_len) noexcept {
  if (num_blocks < 0)
    return status{errc::invalid_argument, "max_concurrent_sequences: num_blocks must not be negative", num_blocks};
  if (block_size <= 0)
    return status{errc::invalid_argument, "max_concurrent_sequences: block_size must be positive", block_size};
  if (seq_len <= 0) return status{errc::invalid_argument, "max_concurrent_sequences: seq_len must be positive", seq_len};
  return num_blocks / (seq_len / block_size + (seq_len % block_size != 0 ? 1 : 0));  // ceil without overflow
}

/// What plan_pool sizes: a model on cards of one size, under tensor-parallel degree tp.
struct pool_request {
  model_shape model{};
  std::int64_t card_bytes = 0;                ///< memory of each card
  double utilization = 0.9;                   ///< fraction of a card the engine may use
  std::int32_t kv_dtype_bytes = 2;            ///< 2 for fp16/bf16 KV, 1 for fp8
  std::int32_t weight_dtype_bytes = 2;        ///< 2 for fp16/bf16 weights
  std::int32_t block_size = default_block_size;  ///< tokens per block
  std::int32_t tp = 1;                        ///< tensor-parallel degree (cards)
  std::int64_t activation_reserve_bytes = 0;  ///< per card
  std::int64_t seq_len = 2048;                ///< sequence length for max_sequences
};

/// The pool of one rank (every rank's is the same: they follow one cache).
struct pool_plan {
  std::int32_t kv_heads_per_rank = 0;
  std::int64_t kv_bytes_per_token_per_layer = 0;  ///< on one rank
  std::int64_t kv_bytes_per_token = 0;            ///< on one rank, all layers
  std::int64_t model_kv_bytes_per_token = 0;      ///< the whole model (tp = 1), all layers
  std::int64_t block_bytes = 0;                   ///< on one rank, all layers
  std::int64_t weight_bytes = 0;                  ///< on one rank
  std::int64_t budget_bytes = 0;                  ///< KV budget of one rank
  std::int64_t num_blocks = 0;                    ///< blocks of the cache (each rank holds its heads of all of them)
  std::int64_t token_capacity = 0;                ///< num_blocks x block_size
  std::int64_t max_sequences = 0;                 ///< concurrent sequences of seq_len tokens

  friend constexpr bool operator==(const pool_plan&, const pool_plan&) = default;
};

/// Sizes the pool of `r`: the composition of the functions above. Errors: theirs (errc::out_of_blocks when the
/// model does not fit on r.tp cards of r.card_bytes).
[[nodiscard]] constexpr result<pool_plan> plan_pool(const pool_request& r) noexcept {
  const result<std::int64_t> per_layer = kv_bytes_per_token_per_layer(r.model, r.kv_dtype_bytes, r.tp);
  if (!per_layer.ok()) return per_layer.error();
  if (r.block_size <= 0) return status{errc::invalid_argument, "plan_pool: block_size must be positive", r.block_size};
  if (r.seq_len <= 0) return status{errc::invalid_argument, "plan_pool: seq_len must be positive", r.seq_len};
  const result<std::int64_t> weights = weight_bytes_per_rank(r.model, r.weight_dtype_bytes, r.tp);
  if (!weights.ok()) return weights.error();
  pool_plan p;
  p.kv_heads_per_rank = static_cast<std::int32_t>(detail::kv_heads_on_rank(r.model, r.tp));
  p.kv_bytes_per_token_per_layer = detail::token_layer_bytes(r.model, r.kv_dtype_bytes, r.tp);
  // Checked: a custom model_shape or block size can make these products pass int64.
  const std::optional<std::int64_t> per_token = checked_mul(p.kv_bytes_per_token_per_layer, r.model.num_layers);
  const std::optional<std::int64_t> block = per_token ? checked_mul(*per_token, r.block_size) : std::nullopt;
  if (!block)
    return status{errc::invalid_argument, "plan_pool: the KV bytes of a block do not fit in 64 bits", r.block_size};
  p.kv_bytes_per_token = *per_token;
  p.model_kv_bytes_per_token = detail::token_layer_bytes(r.model, r.kv_dtype_bytes, 1) * r.model.num_layers;
  p.block_bytes = *block;
  p.weight_bytes = (r.model.num_params * r.weight_dtype_bytes + r.tp - 1) / r.tp;
  const result<std::int64_t> budget =
      kv_budget_bytes({r.card_bytes, r.utilization, p.weight_bytes, r.activation_reserve_bytes});
  if (!budget.ok()) return budget.error();
  p.budget_bytes = detail::usable_bytes(r.card_bytes, r.utilization) - p.weight_bytes - r.activation_reserve_bytes;
  p.num_blocks = p.budget_bytes / p.block_bytes;
  p.token_capacity = p.num_blocks * r.block_size;
  p.max_sequences = p.num_blocks / (r.seq_len / r.block_size + (r.seq_len % r.block_size != 0 ? 1 : 0));
  return p;
}

KVPAGER_NAMESPACE_END
