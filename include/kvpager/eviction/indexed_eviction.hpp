// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The indexed eviction policies: cached, unreferenced blocks are kept in an index of their own, apart from the
/// allocator's clean free blocks; allocation uses clean blocks first and evicts only when none are left (vLLM V0's
/// evictor; keeps partial, never-hit-able blocks out of the cache order as vLLM PR #42656 asks). Each policy is an
/// ordering of that index:
///
/// | policy               | evicts first                                                           | complexity |
/// |----------------------|------------------------------------------------------------------------|------------|
/// | `lru_index_eviction` | least recently released                                                | O(1)       |
/// | `lfu_eviction`       | fewest hits since the block was cached, then least recently released   | O(log n)   |
/// | `priority_lru`       | lowest retention priority (per request), then least recently released  | O(log n)   |
/// | `fifo_eviction`      | cached earliest (first became evictable), whatever its hits since      | O(log n)   |
///
/// n = evictable blocks. Memory: O(num_blocks), allocated by reset; no allocation per operation.
///
/// Each policy has a header of its own (named after it); this one includes all four.

#include "kvpager/eviction/fifo_eviction.hpp"
#include "kvpager/eviction/lfu_eviction.hpp"
#include "kvpager/eviction/lru_index_eviction.hpp"
#include "kvpager/eviction/priority_lru.hpp"
