// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// KV cache events (core/kv_events.hpp) in vLLM's wire format: one step's events as one msgpack-encoded
/// `KVEventBatch`, exactly as vLLM 0.22.0's `vllm/distributed/kv_events.py` encodes it (msgspec structs declared
/// `array_like`, `tag=True`), so a consumer of vLLM's events decodes kvpager's unchanged:
///
///     batch            [ts: float64, events: [event...], data_parallel_rank: int (nil if not given)]
///     BlockStored      ["BlockStored", block_hashes: [uint64...], parent_block_hash: uint64 | nil,
///                       token_ids: [int...], block_size: int, lora_id: nil, medium: "GPU" | "CPU", lora_name: nil,
///                       extra_keys: nil, group_idx: int, kv_cache_spec_kind: nil, kv_cache_spec_sliding_window: nil]
///     BlockRemoved     ["BlockRemoved", block_hashes: [uint64...], medium: "GPU" | "CPU", group_idx: int]
///     AllBlocksCleared ["AllBlocksCleared"]
///
/// Every field is present (msgspec writes defaults as nil in array form); integers take msgpack's smallest form
/// (as msgspec writes them), so a hash at or above 2^63 is a uint64. Dependency-free: the few msgpack forms this
/// needs are written here (tests decode them with Python's msgpack). Nothing allocates once `out` has grown.

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "kvpager/core/config.hpp"
#include "kvpager/core/kv_events.hpp"

KVPAGER_NAMESPACE_BEGIN

namespace detail {

/// Appends msgpack values to a string (the forms the events need).
class msgpack_writer {
 public:
  explicit msgpack_writer(std::string& out) noexcept : out_(out) {}
  void nil() { out_.push_back(static_cast<char>(0xc0)); }
  void array(std::uint32_t n) {
    if (n < 16) {
      byte(0x90 | n);
    } else if (n <= 0xffff) {
      byte(0xdc);
      be(n, 2);
    } else {
      byte(0xdd);
      be(n, 4);
    }
  }
  void str(std::string_view s) {
    const auto n = static_cast<std::uint32_t>(s.size());
    if (n < 32) {
      byte(0xa0 | n);
    } else if (n <= 0xff) {
      byte(0xd9);
      be(n, 1);
    } else if (n <= 0xffff) {
      byte(0xda);
      be(n, 2);
    } else {
      byte(0xdb);
      be(n, 4);
    }
    out_.append(s);
  }
  void uint(std::uint64_t v) {
    if (v < 128) {
      byte(static_cast<std::uint32_t>(v));
    } else if (v <= 0xff) {
      byte(0xcc);
      be(v, 1);
    } else if (v <= 0xffff) {
      byte(0xcd);
      be(v, 2);
    } else if (v <= 0xffffffffULL) {
      byte(0xce);
      be(v, 4);
    } else {
      byte(0xcf);
      be(v, 8);
    }
  }
  void sint(std::int64_t v) {
    if (v >= 0) {
      uint(static_cast<std::uint64_t>(v));
    } else if (v >= -32) {
      byte(static_cast<std::uint32_t>(v) & 0xff);  // negative fixint
    } else if (v >= -128) {
      byte(0xd0);
      be(static_cast<std::uint64_t>(v), 1);
    } else if (v >= -32768) {
      byte(0xd1);
      be(static_cast<std::uint64_t>(v), 2);
    } else if (v >= INT32_MIN) {
      byte(0xd2);
      be(static_cast<std::uint64_t>(v), 4);
    } else {
      byte(0xd3);
      be(static_cast<std::uint64_t>(v), 8);
    }
  }
  void float64(double d) {
    byte(0xcb);
    be(std::bit_cast<std::uint64_t>(d), 8);
  }

 private:
  void byte(std::uint32_t b) { out_.push_back(static_cast<char>(b & 0xff)); }
  /// The low `n` bytes of v, big-endian.
  void be(std::uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string& out_;
};

}  // namespace detail

/// Writes the events of `buf` as one vLLM `KVEventBatch` (above) into `out` (replaced). `ts`: the batch's wall-clock
/// time in seconds (vLLM: time.time()); `data_parallel_rank`: nil when absent (vLLM's publisher always fills its
/// rank in, 0 without data parallelism: kv_event_publisher passes it). Allocates only while `out` grows.
inline void encode_kv_event_batch(const kv_event_buffer& buf, double ts, std::string& out,
                                  std::optional<std::int32_t> data_parallel_rank = std::nullopt) {
  out.clear();
  detail::msgpack_writer w(out);
  w.array(3);
  w.float64(ts);
  w.array(static_cast<std::uint32_t>(buf.events.size()));
  for (const kv_event& e : buf.events) {
    switch (e.type) {
      case kv_event_type::block_stored: {
        w.array(12);
        w.str("BlockStored");
        w.array(e.num_hashes);
        for (const std::uint64_t h : buf.hashes_of(e)) w.uint(h);
        if (e.has_parent) {
          w.uint(e.parent_hash);
        } else {
          w.nil();
        }
        w.array(e.num_tokens);
        for (const token_id t : buf.tokens_of(e)) w.sint(t);
        w.sint(e.block_size);
        w.nil();  // lora_id
        w.str(medium_name(e.medium));
        w.nil();  // lora_name
        w.nil();  // extra_keys
        w.sint(e.group);
        w.nil();  // kv_cache_spec_kind
        w.nil();  // kv_cache_spec_sliding_window
        break;
      }
      case kv_event_type::block_removed:
        w.array(4);
        w.str("BlockRemoved");
        w.array(e.num_hashes);
        for (const std::uint64_t h : buf.hashes_of(e)) w.uint(h);
        w.str(medium_name(e.medium));
        w.sint(e.group);
        break;
      case kv_event_type::all_blocks_cleared:
        w.array(1);
        w.str("AllBlocksCleared");
        break;
    }
  }
  if (data_parallel_rank) {
    w.sint(*data_parallel_rank);
  } else {
    w.nil();
  }
}

KVPAGER_NAMESPACE_END
