// SPDX-License-Identifier: Apache-2.0
#pragma once
// Extreme and malformed arguments for the kernels' C ABI, run against every buffer placed behind PROT_NONE guard
// pages: each buffer ends exactly where a guard page starts and has another guard page before its first page, so
// a read or write where none is allowed crashes the test instead of passing unseen. One list of cases, run against
// the CPU entry points (abi_guard_test.cpp) and against the CUDA kernels' host checks plus their device code on the
// CUDA emulation (cuda_emulation_test.cpp): both must answer every case with the same documented status code and
// leave the KV cache (and, where the backend promises it, the output) untouched on error.
#include <kvpager/c/kernels.h>

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace kvpager_abi_cases {

constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

/// `bytes` bytes that end exactly at a PROT_NONE page, with another PROT_NONE page before the first page holding
/// them. Pages never written read as zeros without taking memory, so a large buffer costs only what is touched.
class guarded_buffer {
 public:
  explicit guarded_buffer(std::size_t bytes) : bytes_(bytes) {
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t body = (bytes + page - 1) / page * page;
    map_bytes_ = body + 2 * page;
    void* m = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      ADD_FAILURE() << "mmap of " << map_bytes_ << " bytes failed";
      return;
    }
    map_ = static_cast<unsigned char*>(m);
    mprotect(map_, page, PROT_NONE);
    mprotect(map_ + page + body, page, PROT_NONE);
    data_ = map_ + page + body - bytes;
  }
  ~guarded_buffer() {
    if (map_ != nullptr) munmap(map_, map_bytes_);
  }
  guarded_buffer(const guarded_buffer&) = delete;
  guarded_buffer& operator=(const guarded_buffer&) = delete;

  template <class T = unsigned char>
  [[nodiscard]] T* as() const noexcept {
    return reinterpret_cast<T*>(data_);
  }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  /// A copy of the contents, to show that a failed call changed nothing.
  [[nodiscard]] std::vector<unsigned char> snapshot() const { return {data_, data_ + bytes_}; }
  /// Makes the buffer (and the rest of its pages) read-only: a write crashes.
  void read_only() const {
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    mprotect(map_ + page, map_bytes_ - 2 * page, PROT_READ);
  }

 private:
  std::size_t bytes_ = 0, map_bytes_ = 0;
  unsigned char* map_ = nullptr;
  unsigned char* data_ = nullptr;
};

/// The entry points under test, as the CPU C ABI declares them. `swap` may be null (a backend without one).
struct kernels_api {
  const char* name;
  int32_t (*decode)(void*, const void*, const void*, const int32_t*, const int32_t*, int32_t, int32_t, int32_t, int32_t,
                    int32_t, int32_t, int32_t, float, int32_t);
  int32_t (*append)(void*, const void*, const void*, const int64_t*, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t);
  int32_t (*copy)(void* const*, int32_t, const int64_t*, int32_t, int32_t, int64_t);
  int32_t (*swap)(void*, int32_t, const void*, int32_t, int64_t, const int64_t*, int32_t);
  /// Every id and length is checked before anything is read or written (the CPU). The CUDA kernels check them while
  /// they run: cases that would make them walk INT32_MAX items (grid rows or tokens) are left to the CPU.
  bool host_checks_everything;
};

// Geometry of every case: fp32, 2 query heads on 1 KV head of dim 64, blocks of 16 tokens, a pool of 4 blocks.
constexpr int32_t kHq = 2, kHkv = 1, kD = 64, kBs = 16, kNb = 4, kF32 = KVPAGER_DTYPE_FP32;
constexpr int64_t kBlockBytes = int64_t{2} * kHkv * kBs * kD * 4;

/// The KV pool behind guard pages, filled with a pattern.
struct pool {
  guarded_buffer kv{static_cast<std::size_t>(kNb * kBlockBytes)};
  pool() {
    for (std::size_t i = 0; i < kv.size() / 4; ++i) kv.as<float>()[i] = static_cast<float>(i % 97) / 97.0F;
  }
};

template <class Call>
void decode_host_checked_cases(const kernels_api& api, Call& call, guarded_buffer& lens);

inline void decode_cases(const kernels_api& api) {
  pool p;
  p.kv.read_only();  // decode never writes the cache
  guarded_buffer q(static_cast<std::size_t>(kHq) * kD * 4), out(q.size()), lens(4), table(4 * 4);
  for (std::size_t i = 0; i < q.size() / 4; ++i) q.as<float>()[i] = 0.01F * static_cast<float>(i % 13);
  std::memset(out.as(), 0x5A, out.size());
  const auto out_before = out.snapshot();
  for (int32_t b = 0; b < 4; ++b) table.as<int32_t>()[b] = b;
  lens.as<int32_t>()[0] = 40;
  const float sc = 0.125F;
  auto call = [&](int32_t expect, const std::string& what, int32_t num_seqs, int32_t hq, int32_t hkv, int32_t maxb,
                  int32_t nb, float scale = 0.125F, const int32_t* tab = nullptr, int32_t dtype = kF32) {
    SCOPED_TRACE(std::string(api.name) + " decode: " + what);
    const int32_t rc = api.decode(out.as(), q.as(), p.kv.as(), tab != nullptr ? tab : table.as<int32_t>(),
                                  lens.as<int32_t>(), num_seqs, hq, hkv, kD, kBs, maxb, nb, scale, dtype);
    EXPECT_EQ(rc, expect);
    if (expect != KVPAGER_STATUS_OK && (api.host_checks_everything || expect == KVPAGER_STATUS_INVALID_ARGUMENT ||
                                        expect == KVPAGER_STATUS_BAD_HEADS)) {
      EXPECT_EQ(out.snapshot(), out_before) << "output written on error";
    }
  };
  // Nothing to do: every pointer may be null.
  {
    SCOPED_TRACE(api.name);
    EXPECT_EQ(api.decode(nullptr, nullptr, nullptr, nullptr, nullptr, 0, kHq, kHkv, kD, kBs, 4, kNb, sc, kF32),
              KVPAGER_STATUS_OK);
    EXPECT_EQ(api.decode(nullptr, q.as(), p.kv.as(), table.as<int32_t>(), lens.as<int32_t>(), 1, kHq, kHkv, kD, kBs, 4,
                         kNb, sc, kF32),
              KVPAGER_STATUS_INVALID_ARGUMENT);
  }
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "max_blocks_per_seq 0", 1, kHq, kHkv, 0, kNb);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "scale NaN", 1, kHq, kHkv, 4, kNb, std::nanf(""));
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "scale inf", 1, kHq, kHkv, 4, kNb, std::numeric_limits<float>::infinity());
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "num_seqs -1", -1, kHq, kHkv, 4, kNb);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "num_blocks 0", 1, kHq, kHkv, 4, 0);
  call(KVPAGER_STATUS_BAD_HEADS, "INT32_MAX query heads on 2 KV heads", 1, kI32Max, 2, 4, kNb);
  call(KVPAGER_STATUS_BAD_HEADS, "KV heads -1", 1, kHq, -1, 4, kNb);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "pool bytes beyond int64 (INT32_MAX heads and blocks)", 1, kI32Max, kI32Max, 4,
       kI32Max);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "query bytes beyond int64", kI32Max, kI32Max, kI32Max, 4, 1);
  call(KVPAGER_STATUS_SEQ_TOO_LONG, "seq_len 40 > 2 blocks", 1, kHq, kHkv, 2, kNb);
  call(KVPAGER_STATUS_INVALID_BLOCK, "block 2 of a 2-block pool", 1, kHq, kHkv, 4, 2);
  table.as<int32_t>()[1] = -1;
  call(KVPAGER_STATUS_INVALID_BLOCK, "block id -1", 1, kHq, kHkv, 4, kNb);
  table.as<int32_t>()[1] = kNb;
  call(KVPAGER_STATUS_INVALID_BLOCK, "block id num_blocks", 1, kHq, kHkv, 4, kNb);
  table.as<int32_t>()[1] = 1;
  lens.as<int32_t>()[0] = -1;
  call(KVPAGER_STATUS_SEQ_TOO_LONG, "seq_len -1", 1, kHq, kHkv, 4, kNb);
  lens.as<int32_t>()[0] = kI32Max;
  call(KVPAGER_STATUS_SEQ_TOO_LONG, "seq_len INT32_MAX, 4 blocks per row", 1, kHq, kHkv, 4, kNb);
  lens.as<int32_t>()[0] = kI32Max - 5;  // needs exactly 2^27 blocks of 16
  call(KVPAGER_STATUS_SEQ_TOO_LONG, "seq_len INT32_MAX - 5, one block short", 1, kHq, kHkv, (1 << 27) - 1, kNb);
  lens.as<int32_t>()[0] = 40;
  if (api.host_checks_everything) decode_host_checked_cases(api, call, lens);
  call(KVPAGER_STATUS_OK, "a valid call", 1, kHq, kHkv, 4, kNb);
}

/// Cases only a backend that checks every id before reading answers quickly (the CUDA kernels would walk INT32_MAX
/// sequences or tokens to find the same error).
template <class Call>
void decode_host_checked_cases(const kernels_api& /*api*/, Call& call, guarded_buffer& lens) {
  const float sc = 0.125F;
  // The first sequence's status ends the checks: the rest of an INT32_MAX batch is never read.
  lens.as<int32_t>()[0] = -1;
  call(KVPAGER_STATUS_SEQ_TOO_LONG, "INT32_MAX sequences, the first too long", kI32Max, kHq, kHkv, 4, kNb);
  // A sequence within block_size of INT32_MAX in a row of 2^27 blocks: every id is checked, so the bad last one is
  // found (the page table is 512 MiB of zeros, block 0, ending at the guard page).
  {
    guarded_buffer big(std::size_t{1} << 29);
    lens.as<int32_t>()[0] = kI32Max - 5;
    for (const int32_t bad : {-1, kNb}) {
      big.as<int32_t>()[(1 << 27) - 1] = bad;
      call(KVPAGER_STATUS_INVALID_BLOCK, "seq_len INT32_MAX - 5, last of 2^27 ids " + std::to_string(bad), 1, kHq, kHkv,
           1 << 27, kNb, sc, big.as<int32_t>());
    }
  }
  lens.as<int32_t>()[0] = 40;
}

inline void append_cases(const kernels_api& api) {
  pool p;
  guarded_buffer k(static_cast<std::size_t>(kHkv) * kD * 4), v(k.size()), slots(8);
  std::memset(k.as(), 0x11, k.size());
  std::memset(v.as(), 0x22, v.size());
  const auto kv_before = p.kv.snapshot();
  auto call = [&](int32_t expect, const std::string& what, int64_t slot, int32_t num_tokens, int32_t hkv = kHkv,
                  int32_t d = kD, int32_t bs = kBs, int32_t nb = kNb, int32_t dtype = kF32) {
    SCOPED_TRACE(std::string(api.name) + " kv_append: " + what);
    slots.as<int64_t>()[0] = slot;
    EXPECT_EQ(api.append(p.kv.as(), k.as(), v.as(), slots.as<int64_t>(), num_tokens, hkv, d, bs, nb, dtype), expect);
    if (expect != KVPAGER_STATUS_OK) {
      EXPECT_EQ(p.kv.snapshot(), kv_before) << "KV written on error";
    }
  };
  {
    SCOPED_TRACE(api.name);
    EXPECT_EQ(api.append(nullptr, nullptr, nullptr, nullptr, 0, kHkv, kD, kBs, kNb, kF32), KVPAGER_STATUS_OK);
    EXPECT_EQ(api.append(p.kv.as(), nullptr, v.as(), slots.as<int64_t>(), 1, kHkv, kD, kBs, kNb, kF32),
              KVPAGER_STATUS_INVALID_ARGUMENT);
  }
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "num_tokens -1", 0, -1);
  // One geometry check with decode: what decode rejects, kv_append rejects with the same code.
  call(KVPAGER_STATUS_BAD_HEADS, "KV heads 0", 0, 1, 0);
  call(KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM, "head dim 72", 0, 1, kHkv, 72);
  call(KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM, "head dim 0", 0, 1, kHkv, 0);
  call(KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE, "block size 12", 0, 1, kHkv, kD, 12);
  call(KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE, "block size INT32_MAX", 0, 1, kHkv, kD, kI32Max);
  call(KVPAGER_STATUS_UNSUPPORTED_DTYPE, "dtype 3", 0, 1, kHkv, kD, kBs, kNb, 3);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "num_blocks 0", 0, 1, kHkv, kD, kBs, 0);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "pool bytes beyond int64", 0, 1, kI32Max, kD, kBs, kI32Max);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "key bytes beyond int64", 0, kI32Max, 1 << 30, kD, kBs, 1);
  call(KVPAGER_STATUS_INVALID_BLOCK, "slot num_blocks x block_size", int64_t{kNb} * kBs, 1);
  call(KVPAGER_STATUS_INVALID_BLOCK, "slot INT64_MAX", kI64Max, 1);
  call(KVPAGER_STATUS_OK, "a negative slot is skipped", -1, 1);
  EXPECT_EQ(p.kv.snapshot(), kv_before) << api.name << ": a skipped slot wrote";
  if (api.host_checks_everything) call(KVPAGER_STATUS_INVALID_BLOCK, "INT32_MAX tokens, the first slot bad", kI64Max, kI32Max);
  call(KVPAGER_STATUS_OK, "the last slot of the pool", int64_t{kNb} * kBs - 1, 1);
  EXPECT_EQ(std::memcmp(p.kv.as() + (kNb - 1) * kBlockBytes + (kBs - 1) * kD * 4, k.as(), k.size()), 0);
}

inline void copy_cases(const kernels_api& api) {
  pool a, b;
  void* const layers[2] = {a.kv.as(), b.kv.as()};
  guarded_buffer caches(sizeof(layers)), mapping(2 * sizeof(int64_t));
  std::memcpy(caches.as(), layers, sizeof(layers));
  void* const* kv_caches = caches.as<void* const>();
  const auto a_before = a.kv.snapshot(), b_before = b.kv.snapshot();
  auto call = [&](int32_t expect, const std::string& what, int64_t src, int64_t dst, void* const* c, int32_t num_layers,
                  const int64_t* m, int32_t num_pairs, int32_t nb = kNb, int64_t bb = kBlockBytes) {
    SCOPED_TRACE(std::string(api.name) + " copy_blocks: " + what);
    mapping.as<int64_t>()[0] = src;
    mapping.as<int64_t>()[1] = dst;
    EXPECT_EQ(api.copy(c, num_layers, m, num_pairs, nb, bb), expect);
    EXPECT_EQ(a.kv.snapshot(), a_before) << "KV changed";
    EXPECT_EQ(b.kv.snapshot(), b_before) << "KV changed";
  };
  const int64_t* m = mapping.as<int64_t>();
  // Nothing to copy: OK whatever the other pointers; ids are still checked without layers.
  call(KVPAGER_STATUS_OK, "no pairs, kv_caches NULL", 0, 1, nullptr, 2, m, 0);
  call(KVPAGER_STATUS_OK, "no pairs, no layers, all NULL", 0, 1, nullptr, 0, nullptr, 0);
  call(KVPAGER_STATUS_OK, "no pairs, INT32_MAX layers (none read)", 0, 1, kv_caches, kI32Max, m, 0);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "no layers, a pair, mapping NULL", 0, 1, nullptr, 0, nullptr, 1);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "layers, a pair, kv_caches NULL", 0, 1, nullptr, 2, m, 1);
  call(KVPAGER_STATUS_INVALID_BLOCK, "no layers, id num_blocks", 0, kNb, kv_caches, 0, m, 1);
  call(KVPAGER_STATUS_INVALID_BLOCK, "no layers, id -1", -1, 0, kv_caches, 0, m, 1);
  call(KVPAGER_STATUS_OK, "no layers, valid ids", 0, 1, kv_caches, 0, m, 1);
  call(KVPAGER_STATUS_INVALID_BLOCK, "id -1", -1, 0, kv_caches, 2, m, 1);
  call(KVPAGER_STATUS_INVALID_BLOCK, "id num_blocks", 0, kNb, kv_caches, 2, m, 1);
  call(KVPAGER_STATUS_INVALID_BLOCK, "id INT64_MAX", kI64Max, 0, kv_caches, 2, m, 1);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "num_layers -1", 0, 1, kv_caches, -1, m, 1);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "num_pairs -1", 0, 1, kv_caches, 2, m, -1);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "block_bytes 0", 0, 1, kv_caches, 2, m, 1, kNb, 0);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "block_bytes INT64_MAX", 0, 1, kv_caches, 2, m, 1, kNb, kI64Max);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "pool bytes beyond int64", 0, 1, kv_caches, 2, m, 1, kI32Max, int64_t{1} << 33);
  call(KVPAGER_STATUS_OK, "a pair onto itself copies nothing", 2, 2, kv_caches, 2, m, 1);
  {
    void* const null_layer[1] = {nullptr};
    call(KVPAGER_STATUS_INVALID_ARGUMENT, "a NULL layer", 0, 1, null_layer, 1, m, 1);
    void* const second_null[2] = {a.kv.as(), nullptr};  // the CPU checks every layer before copying into any
    if (api.host_checks_everything) call(KVPAGER_STATUS_INVALID_ARGUMENT, "a NULL second layer", 0, 1, second_null, 2, m, 1);
  }
  if (api.host_checks_everything) call(KVPAGER_STATUS_INVALID_BLOCK, "INT32_MAX pairs, the first bad", -1, 0, kv_caches, 2, m, kI32Max);
  SCOPED_TRACE(api.name);
  mapping.as<int64_t>()[0] = 3;
  mapping.as<int64_t>()[1] = 0;
  ASSERT_EQ(api.copy(kv_caches, 2, m, 1, kNb, kBlockBytes), KVPAGER_STATUS_OK);
  EXPECT_EQ(std::memcmp(a.kv.as(), a.kv.as() + 3 * kBlockBytes, kBlockBytes), 0);
  EXPECT_EQ(std::memcmp(b.kv.as(), b.kv.as() + 3 * kBlockBytes, kBlockBytes), 0);
}

inline void swap_cases(const kernels_api& api) {
  if (api.swap == nullptr) return;
  pool src, dst;
  guarded_buffer pairs(2 * sizeof(int64_t));
  const auto src_before = src.kv.snapshot(), dst_before = dst.kv.snapshot();
  auto call = [&](int32_t expect, const std::string& what, int64_t from, int64_t to, void* d, const void* s,
                  const int64_t* pr, int32_t num_pairs, int64_t bb = kBlockBytes, int32_t dst_blocks = kNb) {
    SCOPED_TRACE(std::string(api.name) + " swap_blocks: " + what);
    pairs.as<int64_t>()[0] = from;
    pairs.as<int64_t>()[1] = to;
    EXPECT_EQ(api.swap(d, dst_blocks, s, kNb, bb, pr, num_pairs), expect);
    EXPECT_EQ(src.kv.snapshot(), src_before);
    EXPECT_EQ(dst.kv.snapshot(), dst_before);
  };
  const int64_t* pr = pairs.as<int64_t>();
  call(KVPAGER_STATUS_OK, "no pairs, all NULL", 0, 0, nullptr, nullptr, nullptr, 0);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "a pair, pairs NULL", 0, 0, dst.kv.as(), src.kv.as(), nullptr, 1);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "a pair, dst NULL", 0, 0, nullptr, src.kv.as(), pr, 1);
  call(KVPAGER_STATUS_INVALID_BLOCK, "src id -1", -1, 0, dst.kv.as(), src.kv.as(), pr, 1);
  call(KVPAGER_STATUS_INVALID_BLOCK, "dst id num_blocks", 0, kNb, dst.kv.as(), src.kv.as(), pr, 1);
  call(KVPAGER_STATUS_INVALID_BLOCK, "INT32_MAX pairs, the first bad", kNb, 0, dst.kv.as(), src.kv.as(), pr, kI32Max);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "block_bytes INT64_MAX", 0, 0, dst.kv.as(), src.kv.as(), pr, 1, kI64Max);
  call(KVPAGER_STATUS_INVALID_ARGUMENT, "dst pool bytes beyond int64", 0, 0, dst.kv.as(), src.kv.as(), pr, 1,
       int64_t{1} << 40, kI32Max);
  call(KVPAGER_STATUS_OK, "a block onto itself in one pool", 2, 2, src.kv.as(), src.kv.as(), pr, 1);
}

/// Every case above against one backend.
inline void run_all(const kernels_api& api) {
  decode_cases(api);
  append_cases(api);
  copy_cases(api);
  swap_cases(api);
}

}  // namespace kvpager_abi_cases
