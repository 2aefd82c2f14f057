// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The shipped KV cache group kinds (concepts/group_kind.hpp): what the layers of a group can still read, as vLLM
/// v1's single-type managers count it (`get_num_skipped_tokens`).
///
/// | kind                | skipped_tokens(t)          | models                                               |
/// |---------------------|----------------------------|------------------------------------------------------|
/// | `full_attention`    | 0                          | every decoder; the global layers of hybrid models    |
/// | `sliding_window{W}` | max(0, t - W + 1)          | Mistral-7B-v0.1 (4096), Gemma 2/3 local layers, gpt-oss (128) |
/// | `chunked_local{C}`  | C * floor(t / C)           | Llama 4's local layers (8192)                        |
///
/// With W tokens of window, the token at position t attends to [t - W + 1, t] (transformers' and FlashInfer's
/// `window_left = W - 1`); with chunks of C tokens, to the tokens of its own chunk up to itself.

#include <cstdint>

#include "kvpager/concepts/group_kind.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Every layer of the group reads every earlier token: nothing is ever skipped (today's one-group cache).
struct full_attention {
  static constexpr const char* kind_name = "full";
  [[nodiscard]] constexpr std::int64_t skipped_tokens(std::int64_t) const noexcept { return 0; }
  [[nodiscard]] constexpr status validate() const noexcept { return ok_status(); }
  friend constexpr bool operator==(const full_attention&, const full_attention&) = default;
};

/// A sliding window of `window` tokens, the token itself included.
struct sliding_window {
  static constexpr const char* kind_name = "sliding_window";
  std::int64_t window = 1;
  [[nodiscard]] constexpr std::int64_t skipped_tokens(std::int64_t computed) const noexcept {
    return computed - window + 1 > 0 ? computed - window + 1 : 0;
  }
  [[nodiscard]] constexpr status validate() const noexcept {
    return window >= 1 ? ok_status() : status{errc::invalid_argument, "sliding_window: the window must be at least 1", window};
  }
  friend constexpr bool operator==(const sliding_window&, const sliding_window&) = default;
};

/// Chunked local attention: the sequence is cut into chunks of `chunk` tokens, and a token reads only its own chunk.
struct chunked_local {
  static constexpr const char* kind_name = "chunked_local";
  std::int64_t chunk = 1;
  [[nodiscard]] constexpr std::int64_t skipped_tokens(std::int64_t computed) const noexcept {
    return chunk >= 1 ? computed / chunk * chunk : 0;
  }
  [[nodiscard]] constexpr status validate() const noexcept {
    return chunk >= 1 ? ok_status() : status{errc::invalid_argument, "chunked_local: the chunk must be at least 1", chunk};
  }
  friend constexpr bool operator==(const chunked_local&, const chunked_local&) = default;
};

static_assert(group_kind<full_attention> && group_kind<sliding_window> && group_kind<chunked_local>);

KVPAGER_NAMESPACE_END
