// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// KV sizing for models whose layers mix attention kinds (issue 24, point 3): what one request holds at a context
/// length when a sliding-window or chunked-local layer keeps only the blocks its next token reads (the release rule
/// of hybrid_kv_cache and vLLM), against what its held tokens strictly need, against one full-attention group (every
/// layer keeps every block) and against vLLM's padded grouping (groups of equal layer counts, a short group padded,
/// every group's block as large as the largest group's). Plain constexpr arithmetic over built-in hybrid shapes taken
/// from the models' config.json (docs/notes/hybrid_models.md gives each field's source).
///
/// | model           | repository                          | layers | KV heads | head dim | local kind / size | local | global |
/// |-----------------|-------------------------------------|--------|----------|----------|-------------------|-------|--------|
/// | gpt-oss-20b     | openai/gpt-oss-20b                  | 24     | 8        | 64       | sliding 128       | 12    | 12     |
/// | gpt-oss-120b    | openai/gpt-oss-120b                 | 36     | 8        | 64       | sliding 128       | 18    | 18     |
/// | Gemma-2-9b      | google/gemma-2-9b                   | 42     | 8        | 256      | sliding 4096      | 21    | 21     |
/// | Gemma-2-27b     | google/gemma-2-27b                  | 46     | 16       | 128      | sliding 4096      | 23    | 23     |
/// | Gemma-3-12b     | google/gemma-3-12b-it               | 48     | 8        | 256      | sliding 1024      | 40    | 8      |
/// | Gemma-3-27b     | google/gemma-3-27b-it               | 62     | 16       | 128      | sliding 1024      | 52    | 10     |
/// | Mistral-7B-v0.1 | mistralai/Mistral-7B-v0.1           | 32     | 8        | 128      | sliding 4096      | 32    | 0      |
/// | Llama-4-Scout   | meta-llama/Llama-4-Scout-17B-16E    | 48     | 8        | 128      | chunked 8192      | 36    | 12     |

#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>

#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// `layers` layers of one attention kind (size: the window or chunk in tokens; 0 for full).
struct layer_kind_count {
  layer_attention kind = layer_attention::full;
  std::int64_t size = 0;
  std::int32_t layers = 0;
};

/// The shape of a hybrid model for KV sizing: the per-layer K/V shape and its layers by kind (up to 3 kinds).
struct hybrid_model {
  std::string_view name;
  std::string_view source;  ///< the Hugging Face repository of its config.json
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::array<layer_kind_count, 3> kinds{};
  std::int32_t num_kinds = 0;
  [[nodiscard]] constexpr std::int32_t num_layers() const noexcept {
    std::int32_t n = 0;
    for (std::int32_t k = 0; k < num_kinds; ++k) n += kinds[static_cast<std::size_t>(k)].layers;
    return n;
  }
};

inline constexpr std::array<hybrid_model, 8> builtin_hybrid_models{{
    {"gpt-oss-20b", "huggingface.co/openai/gpt-oss-20b", 8, 64,
     {{{layer_attention::sliding_window, 128, 12}, {layer_attention::full, 0, 12}}}, 2},
    {"gpt-oss-120b", "huggingface.co/openai/gpt-oss-120b", 8, 64,
     {{{layer_attention::sliding_window, 128, 18}, {layer_attention::full, 0, 18}}}, 2},
    {"Gemma-2-9b", "huggingface.co/google/gemma-2-9b", 8, 256,
     {{{layer_attention::sliding_window, 4096, 21}, {layer_attention::full, 0, 21}}}, 2},
    {"Gemma-2-27b", "huggingface.co/google/gemma-2-27b", 16, 128,
     {{{layer_attention::sliding_window, 4096, 23}, {layer_attention::full, 0, 23}}}, 2},
    {"Gemma-3-12b", "huggingface.co/google/gemma-3-12b-it", 8, 256,
     {{{layer_attention::sliding_window, 1024, 40}, {layer_attention::full, 0, 8}}}, 2},
    {"Gemma-3-27b", "huggingface.co/google/gemma-3-27b-it", 16, 128,
     {{{layer_attention::sliding_window, 1024, 52}, {layer_attention::full, 0, 10}}}, 2},
    {"Mistral-7B-v0.1", "huggingface.co/mistralai/Mistral-7B-v0.1", 8, 128,
     {{{layer_attention::sliding_window, 4096, 32}}}, 1},
    {"Llama-4-Scout", "huggingface.co/meta-llama/Llama-4-Scout-17B-16E", 8, 128,
     {{{layer_attention::chunked_local, 8192, 36}, {layer_attention::full, 0, 12}}}, 2},
}};

/// The built-in hybrid model named `name` (case-sensitive), or nullptr.
[[nodiscard]] constexpr const hybrid_model* find_hybrid_model(std::string_view name) noexcept {
  for (const hybrid_model& m : builtin_hybrid_models)
    if (m.name == name) return &m;
  return nullptr;
}

/// Tokens a layer of kind `k` still reads when a sequence of `ctx` tokens computes its next one: the strictly
/// needed K/V (full: ctx; a window of W: its last W - 1; chunked local of C: those of the current chunk).
[[nodiscard]] constexpr std::int64_t needed_tokens(const layer_kind_count& k, std::int64_t ctx) noexcept {
  switch (k.kind) {
    case layer_attention::sliding_window: return std::min(ctx, k.size - 1);
    case layer_attention::chunked_local: return ctx - ctx / k.size * k.size;
    default: return ctx;
  }
}

/// Blocks of `block_size` a layer of kind `k` holds for a sequence of `ctx` tokens that computes its next token,
/// under the release rule (blocks wholly before the next token's window are back in the pool).
[[nodiscard]] constexpr std::int64_t held_blocks(const layer_kind_count& k, std::int64_t ctx, std::int32_t block_size) noexcept {
  std::int64_t skipped = 0;
  if (k.kind == layer_attention::sliding_window) skipped = std::max<std::int64_t>(0, ctx - k.size + 1);
  if (k.kind == layer_attention::chunked_local) skipped = ctx / k.size * k.size;
  return blocks_for_tokens(ctx, block_size) - skipped / block_size;
}

/// One request's KV at a context length, in bytes, four ways.
struct hybrid_request_kv {
  std::int64_t needed = 0;     ///< the tokens its layers still read (needed_tokens) x bytes per token-layer
  std::int64_t groups = 0;     ///< kvpager's groups without padding: each kind's held blocks x its layers
  std::int64_t vllm_padded = 0;  ///< vLLM's grouping: groups of group_size layers, short groups padded
  std::int64_t one_group = 0;  ///< one full-attention group: every layer keeps every block
  std::int32_t vllm_group_size = 0;  ///< layers per vLLM group
  std::int32_t vllm_groups = 0;      ///< vLLM's groups
  std::int32_t vllm_padding_layers = 0;
  std::array<std::int64_t, 3> kind_blocks{};  ///< held blocks per layer of each kind
  [[nodiscard]] constexpr double allocated_over_needed() const noexcept {
    return needed > 0 ? static_cast<double>(groups) / static_cast<double>(needed) : 1.0;
  }
};

/// The KV one request of `ctx` tokens holds in model `m` with blocks of `block_size` tokens and elements of
/// `dtype_bytes`. errc::invalid_argument for a context below 1, a block size or dtype size below 1, a model without
/// layers, or a window or chunk below 1.
[[nodiscard]] constexpr result<hybrid_request_kv> request_kv(const hybrid_model& m, std::int64_t ctx,
                                                             std::int32_t block_size, std::int32_t dtype_bytes) noexcept {
  if (ctx < 1 || block_size < 1 || dtype_bytes < 1)
    return status{errc::invalid_argument, "hybrid sizing: context, block size and dtype bytes must be positive"};
  if (m.num_kinds < 1 || m.num_kinds > 3 || m.num_kv_heads < 1 || m.head_dim < 1)
    return status{errc::invalid_argument, "hybrid sizing: a model needs 1 to 3 kinds and a K/V shape"};
  const std::int64_t token_layer = 2 * std::int64_t{m.num_kv_heads} * m.head_dim * dtype_bytes;
  const std::int64_t block_layer = token_layer * block_size;
  hybrid_request_kv r;
  std::int32_t lo = 0, hi = 0;
  for (std::int32_t i = 0; i < m.num_kinds; ++i) {
    const layer_kind_count& k = m.kinds[static_cast<std::size_t>(i)];
    if (k.layers < 1 || (k.kind != layer_attention::full && k.size < 1))
      return status{errc::invalid_argument, "hybrid sizing: a kind needs layers and a window or chunk of at least 1"};
    lo = i == 0 ? k.layers : std::min(lo, k.layers);
    hi = std::max(hi, k.layers);
  }
  r.vllm_group_size = 2 * hi < 3 * lo ? hi : lo;  // vLLM's kv_cache_utils rule
  for (std::int32_t i = 0; i < m.num_kinds; ++i) {
    const layer_kind_count& k = m.kinds[static_cast<std::size_t>(i)];
    const std::int64_t blocks = held_blocks(k, ctx, block_size);
    const std::int32_t groups = (k.layers + r.vllm_group_size - 1) / r.vllm_group_size;
    r.kind_blocks[static_cast<std::size_t>(i)] = blocks;
    r.needed += needed_tokens(k, ctx) * k.layers * token_layer;
    r.groups += blocks * k.layers * block_layer;
    r.vllm_padded += blocks * groups * r.vllm_group_size * block_layer;
    r.vllm_groups += groups;
    r.vllm_padding_layers += groups * r.vllm_group_size - k.layers;
  }
  r.one_group = blocks_for_tokens(ctx, block_size) * m.num_layers() * block_layer;
  return r;
}

KVPAGER_NAMESPACE_END
