// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// model_shape: what KV-cache sizing needs to know about a decoder-only transformer (layers, query and KV heads,
/// head dim, parameter count for the weights), and built-in shapes of common models taken from their published
/// Hugging Face config.json files. Plain constexpr data; never throws.

#include <array>
#include <cstdint>
#include <string_view>

#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"

KVPAGER_NAMESPACE_BEGIN

/// The shape of a model as far as its KV cache and weight memory go.
struct model_shape {
  std::string_view name;         ///< e.g. "Llama-2-7B"; find_model matches it case-insensitively
  std::string_view source;       ///< where the numbers come from (Hugging Face repository of the config.json)
  std::int32_t num_layers = 0;   ///< config.json num_hidden_layers
  std::int32_t num_q_heads = 0;  ///< config.json num_attention_heads
  std::int32_t num_kv_heads = 0; ///< config.json num_key_value_heads (= num_q_heads without GQA)
  std::int32_t head_dim = 0;     ///< hidden_size / num_attention_heads (or config.json head_dim)
  std::int64_t num_params = 0;   ///< parameters, for the weights' memory (num_params x weight dtype bytes)
  // The config fields num_params follows from (embeddings, attention with optional q/k/v bias, gated MLP, RMSNorms,
  // untied LM head), kept so a test can recompute it.
  std::int32_t hidden_size = 0;        ///< config.json hidden_size
  std::int32_t intermediate_size = 0;  ///< config.json intermediate_size
  std::int32_t vocab_size = 0;         ///< config.json vocab_size
  bool qkv_bias = false;               ///< q/k/v projections with bias (Qwen2)
};

/// Built-in shapes. Every field is the model's published config.json on Hugging Face (repository in `source`):
///
/// | model        | repository                    | layers | q heads | KV heads | hidden | head dim | interm. | vocab  | params         |
/// |--------------|-------------------------------|--------|---------|----------|--------|----------|---------|--------|----------------|
/// | Llama-2-7B   | meta-llama/Llama-2-7b-hf      | 32     | 32      | 32       | 4096   | 128      | 11008   | 32000  | 6,738,415,616  |
/// | Llama-2-13B  | meta-llama/Llama-2-13b-hf     | 40     | 40      | 40       | 5120   | 128      | 13824   | 32000  | 13,015,864,320 |
/// | Llama-2-70B  | meta-llama/Llama-2-70b-hf     | 80     | 64      | 8 (GQA)  | 8192   | 128      | 28672   | 32000  | 68,976,648,192 |
/// | Llama-3-8B   | meta-llama/Meta-Llama-3-8B    | 32     | 32      | 8        | 4096   | 128      | 14336   | 128256 | 8,030,261,248  |
/// | Llama-3-70B  | meta-llama/Meta-Llama-3-70B   | 80     | 64      | 8        | 8192   | 128      | 28672   | 128256 | 70,553,706,496 |
/// | Mistral-7B   | mistralai/Mistral-7B-v0.1     | 32     | 32      | 8        | 4096   | 128      | 14336   | 32000  | 7,241,732,096  |
/// | Qwen2.5-7B   | Qwen/Qwen2.5-7B               | 28     | 28      | 4        | 3584   | 128      | 18944   | 152064 | 7,615,616,512  |
///
/// (config.json fields num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size, intermediate_size,
/// vocab_size; head dim = hidden_size / num_attention_heads.) The parameter counts follow from those fields and are
/// the model pages' published sizes: 6.74B, 13.0B, 69.0B ("7B", "13B", "70B" in the names), 8.03B, 70.6B, 7.24B,
/// 7.61B.
inline constexpr std::array<model_shape, 7> builtin_models{{
    {"Llama-2-7B", "huggingface.co/meta-llama/Llama-2-7b-hf", 32, 32, 32, 128, 6'738'415'616, 4096, 11008, 32000, false},
    {"Llama-2-13B", "huggingface.co/meta-llama/Llama-2-13b-hf", 40, 40, 40, 128, 13'015'864'320, 5120, 13824, 32000,
     false},
    {"Llama-2-70B", "huggingface.co/meta-llama/Llama-2-70b-hf", 80, 64, 8, 128, 68'976'648'192, 8192, 28672, 32000,
     false},
    {"Llama-3-8B", "huggingface.co/meta-llama/Meta-Llama-3-8B", 32, 32, 8, 128, 8'030'261'248, 4096, 14336, 128256,
     false},
    {"Llama-3-70B", "huggingface.co/meta-llama/Meta-Llama-3-70B", 80, 64, 8, 128, 70'553'706'496, 8192, 28672, 128256,
     false},
    {"Mistral-7B", "huggingface.co/mistralai/Mistral-7B-v0.1", 32, 32, 8, 128, 7'241'732'096, 4096, 14336, 32000, false},
    {"Qwen2.5-7B", "huggingface.co/Qwen/Qwen2.5-7B", 28, 28, 4, 128, 7'615'616'512, 3584, 18944, 152064, true},
}};

namespace detail {
[[nodiscard]] constexpr char ascii_lower(char c) noexcept { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }
[[nodiscard]] constexpr bool iequal(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  return true;
}
}  // namespace detail

/// The built-in shape named `name` (ASCII case-insensitive: "llama-2-7b" finds Llama-2-7B). Error:
/// errc::invalid_argument when there is none (list the choices from builtin_models).
[[nodiscard]] constexpr result<model_shape> find_model(std::string_view name) noexcept {
  for (const model_shape& m : builtin_models)
    if (detail::iequal(m.name, name)) return m;
  return status{errc::invalid_argument, "find_model: no built-in model of that name"};
}

/// Checks a shape before sizing: errc::invalid_argument (detail = the offending value) for num_layers, num_kv_heads,
/// num_q_heads or head_dim <= 0, num_params < 0, or query heads not a multiple of KV heads.
[[nodiscard]] constexpr status validate(const model_shape& m) noexcept {
  if (m.num_layers <= 0) return status{errc::invalid_argument, "model_shape: num_layers must be positive", m.num_layers};
  if (m.num_kv_heads <= 0)
    return status{errc::invalid_argument, "model_shape: num_kv_heads must be positive", m.num_kv_heads};
  if (m.num_q_heads <= 0) return status{errc::invalid_argument, "model_shape: num_q_heads must be positive", m.num_q_heads};
  if (m.num_q_heads % m.num_kv_heads != 0)
    return status{errc::invalid_argument, "model_shape: num_q_heads must be a multiple of num_kv_heads", m.num_q_heads};
  if (m.head_dim <= 0) return status{errc::invalid_argument, "model_shape: head_dim must be positive", m.head_dim};
  if (m.num_params < 0) return status{errc::invalid_argument, "model_shape: num_params must not be negative", m.num_params};
  return ok_status();
}

KVPAGER_NAMESPACE_END
