// SPDX-License-Identifier: Apache-2.0
// Host-side hot paths of kvpager against a baseline measured in the same run: `seed_pool`, the seed document's
// GlobalBlockPool / BlockAllocator design (a free list as a vector, block tables in a hash map of vectors)
// written in straightforward C++. Ratios against it are what bench/RESULTS.md records.
#include <kvpager/kvpager.hpp>

#include <benchmark/benchmark.h>

#include "bench_util.hpp"

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace {

using namespace kvpager;

// ------------------------------------------------------------------------------------------- baseline
/// The seed's design in C++: free list = vector (pop from the back), per-sequence vectors in an unordered_map,
/// refcounts in an unordered_map. No sharing checks, no plan: the least a block manager can do.
class seed_pool {
 public:
  seed_pool(std::int32_t num_blocks, std::int32_t block_size) : block_size_(block_size) {
    for (std::int32_t b = 0; b < num_blocks; ++b) free_.push_back(b);
  }
  std::int32_t allocate_one() {
    const std::int32_t b = free_.back();
    free_.pop_back();
    refcount_[b] = 1;
    return b;
  }
  void release_one(std::int32_t b) {
    if (--refcount_[b] <= 0) {
      free_.push_back(b);
      refcount_.erase(b);
    }
  }
  bool allocate_and_track(std::uint64_t seq, std::int32_t num_tokens) {
    const std::int32_t need = (num_tokens + block_size_ - 1) / block_size_;
    if (static_cast<std::int32_t>(free_.size()) < need) return false;
    auto& blocks = seq_blocks_[seq];
    for (std::int32_t i = 0; i < need; ++i) blocks.push_back(allocate_one());
    seq_tokens_[seq] = num_tokens;
    return true;
  }
  bool add_decode_tokens(std::uint64_t seq, std::int32_t n) {
    std::int32_t& tokens = seq_tokens_[seq];
    const std::int32_t old_blocks = (tokens + block_size_ - 1) / block_size_;
    const std::int32_t new_blocks = (tokens + n + block_size_ - 1) / block_size_;
    if (new_blocks - old_blocks > static_cast<std::int32_t>(free_.size())) return false;
    auto& blocks = seq_blocks_[seq];
    for (std::int32_t i = old_blocks; i < new_blocks; ++i) blocks.push_back(allocate_one());
    tokens += n;
    return true;
  }
  void complete_request(std::uint64_t seq) {
    for (std::int32_t b : seq_blocks_[seq]) release_one(b);
    seq_blocks_.erase(seq);
    seq_tokens_.erase(seq);
  }

 private:
  std::int32_t block_size_;
  std::vector<std::int32_t> free_;
  std::unordered_map<std::int32_t, std::int32_t> refcount_;
  std::unordered_map<std::uint64_t, std::vector<std::int32_t>> seq_blocks_;
  std::unordered_map<std::uint64_t, std::int32_t> seq_tokens_;
};

using kvbench::must;

// ------------------------------------------------------------------------------------------- allocate + free
template <class A>
void BM_AllocateFree(benchmark::State& state) {
  auto pool = must(block_pool<A>::create({65536, 0}));
  // Keep half the pool in use so the free structure is not trivially small.
  std::vector<block_id> held(32768);
  must(pool.allocate(held));
  for (auto _ : state) {
    const block_id b = pool.pop_free();
    benchmark::DoNotOptimize(b);
    if (pool.drop_ref(b) == 0) pool.recycle(b);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AllocateFree<free_list_allocator>)->Name("allocate_free/fifo");
BENCHMARK(BM_AllocateFree<lifo_allocator>)->Name("allocate_free/lifo");
BENCHMARK(BM_AllocateFree<lowest_id_allocator>)->Name("allocate_free/lowest_id");

// The checked public API (range and double-free checks on release).
void BM_AllocateFreeChecked(benchmark::State& state) {
  auto pool = must(block_pool<free_list_allocator>::create({65536, 0}));
  std::vector<block_id> held(32768);
  must(pool.allocate(held));
  for (auto _ : state) {
    const block_id b = *pool.allocate();
    benchmark::DoNotOptimize(b);
    must(pool.release(b));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AllocateFreeChecked)->Name("allocate_free/fifo_checked");

void BM_AllocateFreeSeed(benchmark::State& state) {
  seed_pool pool(65536, 16);
  std::vector<std::int32_t> held;
  for (int i = 0; i < 32768; ++i) held.push_back(pool.allocate_one());
  for (auto _ : state) {
    const std::int32_t b = pool.allocate_one();
    benchmark::DoNotOptimize(b);
    pool.release_one(b);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AllocateFreeSeed)->Name("allocate_free/seed_baseline");

// ------------------------------------------------------------------------------------------- prefill
constexpr std::int32_t prompt_tokens = 2048;  // 128 blocks of 16

void BM_Prefill2048(benchmark::State& state) {
  auto cache = must(paged_kv_cache<>::create({16, 65536, 1, 0}));
  seq_id id = 0;
  for (auto _ : state) {
    must(cache.add_sequence(id, prompt_tokens));
    cache.begin_step();  // the prefill ran
    must(cache.free_sequence(id));
    ++id;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["blocks/prefill"] = prompt_tokens / 16;
}
BENCHMARK(BM_Prefill2048)->Name("prefill_2048_tokens/kvpager");

void BM_Prefill2048Seed(benchmark::State& state) {
  seed_pool pool(65536, 16);
  std::uint64_t id = 0;
  for (auto _ : state) {
    if (!pool.allocate_and_track(id, prompt_tokens)) std::abort();
    pool.complete_request(id);
    ++id;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Prefill2048Seed)->Name("prefill_2048_tokens/seed_baseline");

// ------------------------------------------------------------------------------------------- decode step
constexpr int batch = 256;

/// One decode step for 256 running sequences: begin_step + one token each (a new block every 16th token).
/// With exports, also the slot mapping and the dense block table the kernels need.
template <bool Exports>
void BM_DecodeStep(benchmark::State& state) {
  constexpr std::int32_t start = 1024, limit = 2048;
  auto cache = must(paged_kv_cache<>::create({16, batch * (limit / 16 + 2) + 1, 1, limit / 16}));
  for (seq_id id = 0; id < batch; ++id) must(cache.add_sequence(id, start));
  std::vector<seq_id> ids(batch);
  for (seq_id id = 0; id < batch; ++id) ids[id] = id;
  std::vector<std::int64_t> slots(batch);
  std::vector<std::int32_t> table(static_cast<std::size_t>(batch) * (limit / 16)), lens(batch);
  std::int32_t tokens = start;
  for (auto _ : state) {
    if (tokens == limit) {  // restart the batch outside the timed region
      state.PauseTiming();
      for (seq_id id = 0; id < batch; ++id) must(cache.free_sequence(id));
      cache.begin_step();
      for (seq_id id = 0; id < batch; ++id) must(cache.add_sequence(id, start));
      tokens = start;
      state.ResumeTiming();
    }
    cache.begin_step();
    for (seq_id id = 0; id < batch; ++id) must(cache.append_tokens(id));
    if constexpr (Exports) {
      must(cache.export_slot_mapping(slots));
      must(cache.export_block_table(ids, table, limit / 16, lens));
      benchmark::DoNotOptimize(slots.data());
      benchmark::DoNotOptimize(table.data());
    }
    ++tokens;
  }
  state.SetItemsProcessed(state.iterations() * batch);
}
BENCHMARK(BM_DecodeStep<false>)->Name("decode_step_256/kvpager");
BENCHMARK(BM_DecodeStep<true>)->Name("decode_step_256/kvpager_with_exports");

void BM_DecodeStepSeed(benchmark::State& state) {
  constexpr std::int32_t start = 1024, limit = 2048;
  seed_pool pool(batch * (limit / 16 + 2), 16);
  for (std::uint64_t id = 0; id < batch; ++id) pool.allocate_and_track(id, start);
  std::int32_t tokens = start;
  for (auto _ : state) {
    if (tokens == limit) {
      state.PauseTiming();
      for (std::uint64_t id = 0; id < batch; ++id) pool.complete_request(id);
      for (std::uint64_t id = 0; id < batch; ++id) pool.allocate_and_track(id, start);
      tokens = start;
      state.ResumeTiming();
    }
    for (std::uint64_t id = 0; id < batch; ++id)
      if (!pool.add_decode_tokens(id, 1)) std::abort();
    ++tokens;
  }
  state.SetItemsProcessed(state.iterations() * batch);
}
BENCHMARK(BM_DecodeStepSeed)->Name("decode_step_256/seed_baseline");

// ------------------------------------------------------------------------------------------- fork + CoW
/// Parallel sampling: fork a 1000-token sequence (63 blocks, the last partly filled), the child writes one token
/// (copy-on-write of the last block), then the child finishes. The baseline is the same with a copying fork
/// (no_sharing), which plans 63 block copies instead of sharing.
template <class Cache>
void BM_Fork(benchmark::State& state) {
  auto cache = must(Cache::create({16, 4096, 1, 0}));
  must(cache.add_sequence(0, 1000));
  cache.begin_step();
  seq_id child = 1;
  for (auto _ : state) {
    must(cache.fork(0, child));
    must(cache.append_tokens(child));
    must(cache.free_sequence(child));
    cache.begin_step();
    ++child;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Fork<paged_kv_cache<>>)->Name("fork_cow_1000_tokens/kvpager");
BENCHMARK(BM_Fork<paged_kv_cache<free_list_allocator, no_eviction, no_sharing>>)
    ->Name("fork_cow_1000_tokens/copying_fork_baseline");

}  // namespace

BENCHMARK_MAIN();
