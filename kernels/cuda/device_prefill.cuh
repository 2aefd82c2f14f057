// SPDX-License-Identifier: Apache-2.0
#pragma once
// Device code of paged prefill (extend) attention, included by kernels/cuda/prefill.cu, which launches it. Like
// device_kernels.cuh it also compiles as plain C++ over the CPU emulation of the CUDA execution model
// (tests/kernels/cuda_emulation.hpp), so tests/kernels/cuda_prefill_emulation_test.cpp checks its logic everywhere;
// what differs between the two builds (WMMA fragments, cp.async, CUB) sits behind device_primitives.cuh.
// Needs sm_80 or newer for bf16 fragments (the build's default is sm_90).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/common/decode_math.hpp"
#include "kernels/cuda/device_primitives.cuh"
#include "kvpager/c/kernels.h"
#include "kvpager/kernels/float8.hpp"

namespace kvpager::kernels::detail {

/// Rows of a prefill tile: (query token, query head of the KV head's group) pairs, token-major, 16 per warp.
constexpr int kPrefillTileRows = 16 * kPrefillWarps;
/// Threads of the single-CTA kernel that turns qo_indptr into the tile offsets.
constexpr int kPrefillPrepThreads = 256;
/// The running max of a row is only raised (and the output rescaled) when a new score exceeds it by more than this:
/// exp(8) ~ 3e3 keeps P well inside fp16 and bf16, and the final division by the same sum makes the result exact.
constexpr float kRescaleThreshold = 8.0F;

/// Everything a prefill launch needs (passed by value to the kernels).
struct prefill_params {
  void* out;
  const void* q;
  const void* kv;
  const int32_t* indptr;  ///< qo_indptr [num_seqs + 1], device
  const int32_t* table;   ///< [num_seqs, max_blocks], device
  const int32_t* lens;    ///< [num_seqs], device
  int64_t* tiles;         ///< workspace: tile offsets [num_seqs + 1], written by prefill_prepare_kernel
  int num_seqs, hq, hkv, d, bs, max_blocks, num_blocks;
  float scale;
  int window_left;
  float cap;
  int32_t* error;
  float* lse;     ///< [rows, hq] natural log of each row's softmax denominator, or null
  float v_scale;  ///< multiplies the output (fp8 KV: the V scale; 1 otherwise). `scale` already holds k_scale.
};

/// The 16 bits of x rounded to T (fp16 or bf16; exact for a decoded e4m3 value), little-endian packing order.
template <class T>
__device__ __forceinline__ uint32_t t_bits(float x) {
  const T h = pf_from_f<T>(x);
  uint16_t b = 0;
  memcpy(&b, &h, sizeof b);  // no type punning through pointers: a 2-byte copy of a register
  return b;
}

/// A KV element as float: the stored value, or an fp8 E4M3 byte decoded (exact, kvpager/kernels/float8.hpp).
__device__ __forceinline__ float kv_to_f(float x) { return x; }
__device__ __forceinline__ float kv_to_f(uint8_t x) { return kvpager::detail::e4m3_to_float(x); }

/// Score of a query-key dot product: scaled, then soft-capped when cap > 0.
__device__ __forceinline__ float prefill_score(float dot, float scale, float cap) {
  return kvpager::kernels::detail::soft_cap(dot * scale, cap);  // the decode's function (decode_math.hpp)
}

/// Grid 1, kPrefillPrepThreads threads: tiles[s] = first tile of sequence s (tiles[num_seqs] = total), a sequence of
/// q_len query tokens having ceil(q_len x group / kPrefillTileRows) tiles. Checks the rows on the device as the host
/// does on the CPU: qo_indptr[0] != 0 (then no tile at all) or a decreasing entry is INVALID_ARGUMENT, and a
/// sequence gets no tile unless 0 <= qo_indptr[s] <= qo_indptr[s + 1] <= qo_indptr[num_seqs] (so no row outside the
/// caller's [qo_indptr[num_seqs], ...] buffers is ever touched); a seq_len outside its page table row is SEQ_TOO_LONG and a q_len above it INVALID_ARGUMENT
/// (their rows are written as zeros by the attention kernels).
/// A template (of its thread count) only so that every translation unit that includes this header may instantiate it.
template <int kThreads = kPrefillPrepThreads>
__global__ void __launch_bounds__(kThreads) prefill_prepare_kernel(prefill_params a) {
  __shared__ int s_bad;
  if (threadIdx.x == 0) {
    s_bad = a.indptr[0] != 0 ? 1 : 0;
    a.tiles[0] = 0;
    if (s_bad != 0 && a.error != nullptr) atomicExch(a.error, KVPAGER_STATUS_INVALID_ARGUMENT);
  }
  __syncthreads();
  const bool bad = s_bad != 0;
  const int group = a.hq / a.hkv;
  const int32_t total_rows = a.indptr[a.num_seqs];
  int64_t carry = 0;
  for (int base = 0; base < a.num_seqs; base += kThreads) {  // the same trip count for every thread
    const int s = base + static_cast<int>(threadIdx.x);
    int64_t n = 0;
    if (!bad && s < a.num_seqs) {
      const int32_t begin = a.indptr[s], end = a.indptr[s + 1];
      const int64_t q_len = static_cast<int64_t>(end) - begin;
      const int32_t len = a.lens[s];
      int32_t rc = KVPAGER_STATUS_OK;
      // Rows only inside [0, qo_indptr[num_seqs]), the rows the caller's buffers hold, whatever a bad entry says.
      if (begin < 0 || q_len < 0 || end > total_rows) {
        rc = KVPAGER_STATUS_INVALID_ARGUMENT;
      } else {
        if (len < 0 || (static_cast<int64_t>(len) + a.bs - 1) / a.bs > a.max_blocks) rc = KVPAGER_STATUS_SEQ_TOO_LONG;
        else if (q_len > len) rc = KVPAGER_STATUS_INVALID_ARGUMENT;
        n = (q_len * group + kPrefillTileRows - 1) / kPrefillTileRows;
      }
      if (rc != KVPAGER_STATUS_OK && a.error != nullptr) atomicExch(a.error, rc);
    }
    int64_t inclusive = 0, total = 0;
    block_inclusive_sum<kThreads>(n, inclusive, total);
    if (s < a.num_seqs) a.tiles[s + 1] = bad ? 0 : carry + inclusive;
    carry += total;
  }
}

/// One work item: a tile of rows [r0, r1) of sequence seq's (token, group head) rows over KV head h, and the KV
/// positions [kv_begin, kv_end) any of its rows attends to (empty for a sequence the prepare kernel flagged).
struct prefill_tile {
  int seq, h, group;
  int64_t r0, r1, row_base, q_len, kv_begin, kv_end;
  int32_t len;
  /// Position of flattened row r (token r / group of the new tokens).
  __device__ __forceinline__ int64_t pos(int64_t r) const { return len - q_len + r / group; }
  /// Element offset of row r's query (and output) vector.
  __device__ __forceinline__ int64_t qoff(int64_t r, int hq, int d) const {
    return ((row_base + r / group) * hq + static_cast<int64_t>(h) * group + r % group) * d;
  }
};

__device__ __forceinline__ prefill_tile locate_tile(const prefill_params& a, int64_t item) {
  prefill_tile t{};
  const int64_t tile = item / a.hkv;
  t.h = static_cast<int>(item % a.hkv);
  t.group = a.hq / a.hkv;
  int lo = 0, hi = a.num_seqs - 1;  // the last s with tiles[s] <= tile (sequences without tiles share offsets)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.tiles[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  t.seq = lo;
  t.row_base = a.indptr[lo];
  t.q_len = static_cast<int64_t>(a.indptr[lo + 1]) - t.row_base;
  t.len = a.lens[lo];
  t.r0 = (tile - a.tiles[lo]) * kPrefillTileRows;
  t.r1 = t.r0 + kPrefillTileRows < t.q_len * t.group ? t.r0 + kPrefillTileRows : t.q_len * t.group;
  const bool ok = t.len >= 0 && (static_cast<int64_t>(t.len) + a.bs - 1) / a.bs <= a.max_blocks && t.q_len <= t.len;
  if (!ok) return t;  // kv range empty: the rows are written as zeros
  const int64_t p_lo = t.pos(t.r0), p_hi = t.pos(t.r1 - 1);
  t.kv_end = p_hi + 1;
  t.kv_begin = a.window_left >= 0 && p_lo - a.window_left > 0 ? p_lo - a.window_left : 0;
  return t;
}

/// Whether row position p attends KV position j.
__device__ __forceinline__ bool prefill_visible(int64_t j, int64_t p, int window_left) {
  return j <= p && (window_left < 0 || j >= p - window_left);
}

/// Element offset of KV token j's K row of head h, or -1 (flagged) for a block id outside the pool.
__device__ __forceinline__ int64_t prefill_kv_row(const prefill_params& a, const prefill_tile& t, int64_t j, int d) {
  const int jj = static_cast<int>(j);  // j < seq_len <= INT32_MAX: 32-bit division on the hot path
  const int blk = a.table[static_cast<int64_t>(t.seq) * a.max_blocks + jj / a.bs];
  if (blk < 0 || blk >= a.num_blocks) {
    if (a.error != nullptr) atomicExch(a.error, KVPAGER_STATUS_INVALID_BLOCK);
    return -1;
  }
  const int64_t head_stride = static_cast<int64_t>(a.bs) * d;
  return static_cast<int64_t>(blk) * 2 * a.hkv * head_stride + t.h * head_stride + static_cast<int64_t>(jj % a.bs) * d;
}

/// Tensor-core prefill for fp16/bf16, persistent: grid (num_ctas), 4 warps; work items (tile, KV head) are walked
/// with a stride of the grid. Per item the CTA stages the tile's 64 query rows (each warp keeps its 16 as fragments),
/// then walks the tile's KV range in chunks of BN tokens read through the block table into shared memory, two stages
/// (the next chunk's cp.async copies are in flight while the current one is computed); each warp
/// computes S = Q K^T (fp32), its rows' online softmax in fp32 (two lanes per row), and O += P V with P in T, O in
/// fp32 fragments. The output is normalized once at the end (times a.v_scale), and each row's LSE written when a.lse
/// is set. KV = T reads the pool as T with cp.async; KV = uint8_t reads an fp8 E4M3 pool through registers (16-byte
/// loads issued before the current chunk's math, cp.async cannot convert), each byte decoded to T on its way into
/// shared memory after it (exact: every e4m3 value is an fp16 and a bf16 value), so the tensor-core part is the same.
template <class T, int D, class KV = T>
__global__ void __launch_bounds__(kPrefillWarps * 32) prefill_mma_kernel(prefill_params a) {
  static_assert(std::is_same_v<KV, T> || std::is_same_v<KV, uint8_t>, "KV is the query type or fp8 E4M3 bytes");
  constexpr int BN = D > 128 ? 16 : 32;  // KV tokens per chunk (registers: D/16 Q and O fragments per warp)
  constexpr int LD = D + 8;              // padded row of staged Q/K/V (bank conflicts), a multiple of 8 elements
  constexpr int kVec = 16 / static_cast<int>(sizeof(T)), kChunks = D / kVec;
  constexpr int kQBytes = kPrefillTileRows * LD * static_cast<int>(sizeof(T));
  constexpr int kKvBytes = 2 * 2 * BN * LD * static_cast<int>(sizeof(T));  // two stages of K and V
  alignas(128) __shared__ unsigned char s_stage[kQBytes > kKvBytes ? kQBytes : kKvBytes];  // Q, then K and V
  alignas(128) __shared__ float s_scr[kPrefillWarps][16 * BN];  // S, then 16x16 pieces of O
  alignas(128) __shared__ unsigned char s_p[kPrefillWarps][16 * BN * sizeof(T)];
  __shared__ float s_alpha[kPrefillWarps][16], s_linv[kPrefillWarps][16];
  __shared__ int s_tok_ok[2][BN];
  T* const sq = reinterpret_cast<T*>(s_stage);
  T* const skv = reinterpret_cast<T*>(s_stage);  // stage st: K at skv + st * 2 * BN * LD, V BN * LD after it
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int row = lane / 2, half = lane % 2;  // softmax: two lanes per row, BN/2 columns each
  float* const scr = s_scr[warp];
  T* const sp = reinterpret_cast<T*>(s_p[warp]);
  const T* q = static_cast<const T*>(a.q);
  const KV* kv = static_cast<const KV*>(a.kv);
  const int64_t half_stride = static_cast<int64_t>(a.hkv) * a.bs * D;
  const int64_t items = a.tiles[a.num_seqs] * a.hkv;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const prefill_tile t = locate_tile(a, item);
    for (int i = static_cast<int>(threadIdx.x); i < kPrefillTileRows * kChunks; i += kPrefillWarps * 32) {
      const int rr = i / kChunks, c = i % kChunks;
      const int64_t r = t.r0 + rr;
      uint4 v{0, 0, 0, 0};
      if (r < t.r1) v = *reinterpret_cast<const uint4*>(q + t.qoff(r, a.hq, D) + c * kVec);
      *reinterpret_cast<uint4*>(sq + rr * LD + c * kVec) = v;
    }
    __syncthreads();
    tile_mma::frag_a<T> qa[D / 16];
    tile_mma::frag_acc o[D / 16];
    KVPAGER_UNROLL
    for (int k = 0; k < D / 16; ++k) {
      tile_mma::load(qa[k], sq + warp * 16 * LD + k * 16, LD);
      tile_mma::zero(o[k]);
    }
    __syncthreads();  // the stage is K/V from here on
    const int64_t my_r = t.r0 + warp * 16 + row;
    const bool row_ok = my_r < t.r1;
    const int64_t p = t.pos(my_r);
    float m = -INFINITY, l = 0.0F;
    // Queues chunk [j0, j0 + BN) into stage st: tokens outside the tile's range or behind a bad block id are zeros
    // (and masked through s_tok_ok).
    auto load_chunk = [&](int st, int64_t j0) {
      T* const dk = skv + st * 2 * BN * LD;
      for (int i = static_cast<int>(threadIdx.x); i < BN * kChunks; i += kPrefillWarps * 32) {
        const int n = i / kChunks, c = i % kChunks;
        const int64_t j = j0 + n;
        const int64_t off = j >= t.kv_begin && j < t.kv_end ? prefill_kv_row(a, t, j, D) : -1;
        T* const kd = dk + n * LD + c * kVec;
        if (off >= 0) {
          async_copy::copy16(kd, kv + off + c * kVec);
          async_copy::copy16(kd + BN * LD, kv + off + half_stride + c * kVec);
        } else {
          *reinterpret_cast<uint4*>(kd) = uint4{0, 0, 0, 0};
          *reinterpret_cast<uint4*>(kd + BN * LD) = uint4{0, 0, 0, 0};
        }
        if (c == 0) s_tok_ok[st][n] = off >= 0 ? 1 : 0;
      }
      async_copy::commit();
    };
    // fp8 pools: cp.async cannot convert, so a chunk goes through registers in two steps, the second chunk's loads
    // in flight while the current one is computed as cp.async does for fp16/bf16: fetch8 issues this thread's 16-byte
    // loads of K and V (16 elements each) into raw8; store8 decodes them to T (exact) and writes them to a stage.
    constexpr int kChunks8 = D / 16, kPieces8 = (BN * kChunks8 + kPrefillWarps * 32 - 1) / (kPrefillWarps * 32);
    uint4 raw8[kPieces8][2];
    bool ok8[kPieces8];
    auto fetch8 = [&](int64_t j0) {
      KVPAGER_UNROLL
      for (int pc = 0; pc < kPieces8; ++pc) {
        const int i = static_cast<int>(threadIdx.x) + pc * kPrefillWarps * 32;
        const int n = i / kChunks8, c = i % kChunks8;
        const int64_t j = j0 + n;
        const int64_t off = i < BN * kChunks8 && j >= t.kv_begin && j < t.kv_end ? prefill_kv_row(a, t, j, D) : -1;
        ok8[pc] = off >= 0;
        raw8[pc][0] = raw8[pc][1] = uint4{0, 0, 0, 0};
        if (off >= 0) {
          raw8[pc][0] = *reinterpret_cast<const uint4*>(kv + off + c * 16);
          raw8[pc][1] = *reinterpret_cast<const uint4*>(kv + off + half_stride + c * 16);
        }
      }
    };
    auto store8 = [&](int st) {
      KVPAGER_UNROLL
      for (int pc = 0; pc < kPieces8; ++pc) {
        const int i = static_cast<int>(threadIdx.x) + pc * kPrefillWarps * 32;
        if (i >= BN * kChunks8) break;
        const int n = i / kChunks8, c = i % kChunks8;
        T* const kd = skv + st * 2 * BN * LD + n * LD + c * 16;
        KVPAGER_UNROLL
        for (int kvi = 0; kvi < 2; ++kvi) {  // K, then V: 16 bytes -> 16 elements of T -> two 16-byte stores
          const uint32_t w[4] = {raw8[pc][kvi].x, raw8[pc][kvi].y, raw8[pc][kvi].z, raw8[pc][kvi].w};
          uint32_t packed[8];
          KVPAGER_UNROLL
          for (int x = 0; x < 8; ++x) {
            const uint32_t lo = t_bits<T>(kv_to_f(static_cast<uint8_t>(w[x / 2] >> (16 * (x % 2)))));
            const uint32_t hi = t_bits<T>(kv_to_f(static_cast<uint8_t>(w[x / 2] >> (16 * (x % 2) + 8))));
            packed[x] = lo | (hi << 16);
          }
          *reinterpret_cast<uint4*>(kd + kvi * BN * LD) = uint4{packed[0], packed[1], packed[2], packed[3]};
          *reinterpret_cast<uint4*>(kd + kvi * BN * LD + 8) = uint4{packed[4], packed[5], packed[6], packed[7]};
        }
        if (c == 0) s_tok_ok[st][n] = ok8[pc] ? 1 : 0;
      }
    };
    constexpr bool kFp8 = std::is_same_v<KV, uint8_t>;
    (void)load_chunk;  // each instantiation uses one of the two load paths
    (void)fetch8;
    (void)store8;
    const int64_t first = t.kv_begin / BN * BN;
    if (first < t.kv_end) {
      if constexpr (kFp8) {
        fetch8(first);
        store8(0);
      } else {
        load_chunk(0, first);
      }
    }
    int st = 0;
    for (int64_t j0 = first; j0 < t.kv_end; j0 += BN, st ^= 1) {
      // The other stage was last read by the previous chunk, which ended with a barrier: refill it now (fp8: fetch
      // now, decode into it after this chunk's math, before the barrier that ends it).
      const bool more = j0 + BN < t.kv_end;
      if constexpr (kFp8) {
        if (more) fetch8(j0 + BN);
      } else {
        if (more) load_chunk(st ^ 1, j0 + BN);
        async_copy::wait_prior(more ? 1 : 0);  // this thread's copies of chunk j0 have landed
      }
      const T* const sk = skv + st * 2 * BN * LD;
      const T* const sv = sk + BN * LD;
      __syncthreads();
      KVPAGER_UNROLL
      for (int nt = 0; nt < BN / 16; ++nt) {
        tile_mma::frag_acc s;
        tile_mma::zero(s);
        KVPAGER_UNROLL
        for (int k = 0; k < D / 16; ++k) {
          tile_mma::frag_bt<T> kb;
          tile_mma::load(kb, sk + nt * 16 * LD + k * 16, LD);
          tile_mma::mma(s, qa[k], kb);
        }
        tile_mma::store(scr + nt * 16, s, BN);
      }
      tile_mma::sync_warp();
      float sc[BN / 2];
      float mx = -INFINITY;
      KVPAGER_UNROLL
      for (int c = 0; c < BN / 2; ++c) {
        const int col = half * (BN / 2) + c;
        const bool vis = row_ok && s_tok_ok[st][col] != 0 && prefill_visible(j0 + col, p, a.window_left);
        sc[c] = vis ? prefill_score(scr[row * BN + col], a.scale, a.cap) : -INFINITY;
        mx = fmaxf(mx, sc[c]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffU, mx, 1));  // the row's other lane: one hand-written shuffle
      float alpha = 1.0F;
      bool rescale = false;
      if (mx > m) {
        if (m == -INFINITY) {
          m = mx;  // O and l are still zero
        } else if (mx > m + kRescaleThreshold) {
          alpha = __expf(m - mx);
          m = mx;
          rescale = true;
        }
      }
      l *= alpha;
      KVPAGER_UNROLL
      for (int c = 0; c < BN / 2; ++c) {
        const float pr = sc[c] == -INFINITY ? 0.0F : __expf(sc[c] - m);
        l += pr;
        sp[row * BN + half * (BN / 2) + c] = pf_from_f<T>(pr);
      }
      if (half == 0) s_alpha[warp][row] = alpha;
      const bool any_rescale = tile_mma::warp_any(rescale);
      tile_mma::sync_warp();
      if (any_rescale) {
        KVPAGER_UNROLL
        for (int f = 0; f < D / 16; ++f) {
          tile_mma::store(scr, o[f], 16);
          tile_mma::sync_warp();
          for (int e = lane; e < 256; e += 32) scr[e] *= s_alpha[warp][e / 16];
          tile_mma::sync_warp();
          tile_mma::load_acc(o[f], scr, 16);
          tile_mma::sync_warp();
        }
      }
      // Each 16-token slice of P, for the warp's 16 rows: all zero (nothing to add: skipped), none zero (one MMA), or
      // mixed: some row may not see some of its tokens. A tensor-core product would add 0 x V there, and an inf or
      // NaN in V at a masked position would reach a row that must not see it (issue 21), so a mixed slice is added
      // exactly, each product with P = 0 left out, through the accumulator's 16 x 16 pieces in shared memory.
      bool slice_mma[BN / 16], slice_exact[BN / 16];
      KVPAGER_UNROLL
      for (int k = 0; k < BN / 16; ++k) {
        bool zero = false, nonzero = false;
        KVPAGER_UNROLL
        for (int c = 0; c < BN / 2; ++c) {
          const int col = half * (BN / 2) + c;
          if (col / 16 != k) continue;
          const bool z = pf_to_f(sp[row * BN + col]) == 0.0F;
          zero = zero || z;
          nonzero = nonzero || !z;
        }
        const bool any_zero = tile_mma::warp_any(zero), any_nonzero = tile_mma::warp_any(nonzero);
        slice_mma[k] = any_nonzero && !any_zero;
        slice_exact[k] = any_nonzero && any_zero;
      }
      tile_mma::frag_a<T> pa[BN / 16];
      KVPAGER_UNROLL
      for (int k = 0; k < BN / 16; ++k) tile_mma::load(pa[k], sp + k * 16, BN);
      KVPAGER_UNROLL
      for (int f = 0; f < D / 16; ++f) {
        KVPAGER_UNROLL
        for (int k = 0; k < BN / 16; ++k) {
          if (slice_mma[k]) {
            tile_mma::frag_b<T> vb;
            tile_mma::load(vb, sv + k * 16 * LD + f * 16, LD);
            tile_mma::mma(o[f], pa[k], vb);
          } else if (slice_exact[k]) {
            tile_mma::store(scr, o[f], 16);
            tile_mma::sync_warp();
            for (int e = lane; e < 256; e += 32) {
              const int er = e / 16, ed = e % 16;
              float acc = scr[e];
              for (int n = 0; n < 16; ++n) {
                const float pj = pf_to_f(sp[er * BN + k * 16 + n]);
                if (pj != 0.0F) acc += pj * pf_to_f(sv[(k * 16 + n) * LD + f * 16 + ed]);
              }
              scr[e] = acc;
            }
            tile_mma::sync_warp();
            tile_mma::load_acc(o[f], scr, 16);
            tile_mma::sync_warp();
          }
        }
      }
      if constexpr (kFp8) {
        if (more) store8(st ^ 1);  // the next chunk, made visible by the barrier below
      }
      __syncthreads();  // K, V and P are rewritten by the next chunk
    }
    const float l_row = l + __shfl_xor_sync(0xffffffffU, l, 1);
    if (half == 0) {
      s_linv[warp][row] = l_row > 0.0F ? a.v_scale / l_row : 0.0F;
      // m is the row's reference max (within kRescaleThreshold of the true one) and l_row its sum of exp(s - m).
      if (a.lse != nullptr && row_ok) a.lse[t.qoff(my_r, a.hq, 1)] = lse_of(m, l_row);
    }
    tile_mma::sync_warp();
    T* out = static_cast<T*>(a.out);
    KVPAGER_UNROLL
    for (int f = 0; f < D / 16; ++f) {
      tile_mma::store(scr, o[f], 16);
      tile_mma::sync_warp();
      for (int e = lane; e < 256; e += 32) {
        const int64_t r = t.r0 + warp * 16 + e / 16;
        if (r < t.r1) out[t.qoff(r, a.hq, D) + f * 16 + e % 16] = pf_from_f<T>(scr[e] * s_linv[warp][e / 16]);
      }
      tile_mma::sync_warp();
    }
  }
}

/// fp32 prefill without tensor cores (CUDA cores, exact fp32), same grid and work items as prefill_mma_kernel, any
/// head dim up to 256. Each warp takes its 16 rows one after another: lane i scores KV token j0 + i of a 32-token
/// chunk against the row's query (staged in shared memory), the warp shares the chunk's max and its P, and each lane
/// accumulates its own dims of P V (lane + 32 k).
/// KV = float reads an fp32 pool, KV = uint8_t an fp8 E4M3 one (each byte decoded to fp32, exact).
template <class KV = float>
__global__ void __launch_bounds__(kPrefillWarps * 32) prefill_simt_kernel(prefill_params a) {
  constexpr int kMaxPerLane = 256 / 32;
  __shared__ float s_q[kPrefillWarps][256];
  __shared__ float s_p[kPrefillWarps][32];
  __shared__ int64_t s_off[kPrefillWarps][32];
  __shared__ float s_linv[kPrefillWarps];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const float* q = static_cast<const float*>(a.q);
  const KV* kv = static_cast<const KV*>(a.kv);
  float* out = static_cast<float*>(a.out);
  const int D = a.d;
  const int64_t half_stride = static_cast<int64_t>(a.hkv) * a.bs * D;
  const int64_t items = a.tiles[a.num_seqs] * a.hkv;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const prefill_tile t = locate_tile(a, item);
    for (int i = 0; i < 16; ++i) {
      const int64_t r = t.r0 + warp * 16 + i;
      if (r >= t.r1) break;  // the same for the whole warp
      const int64_t qo = t.qoff(r, a.hq, D), p = t.pos(r);
      for (int d = lane; d < D; d += 32) s_q[warp][d] = q[qo + d];
      float acc[kMaxPerLane] = {};
      float m = -INFINITY, l = 0.0F;
      int64_t begin = a.window_left >= 0 && p - a.window_left > t.kv_begin ? p - a.window_left : t.kv_begin;
      const int64_t end = t.kv_end > p + 1 ? p + 1 : t.kv_end;
      tile_mma::sync_warp();
      for (int64_t j0 = begin; j0 < end; j0 += 32) {
        const int64_t j = j0 + lane;
        const int64_t off = j < end ? prefill_kv_row(a, t, j, D) : -1;
        float s = -INFINITY;
        if (off >= 0) {
          float dot = 0.0F;
          for (int d = 0; d < D; ++d) dot += s_q[warp][d] * kv_to_f(kv[off + d]);
          s = prefill_score(dot, a.scale, a.cap);
        }
        const float mx = warp_max_all(s);
        if (mx == -INFINITY) continue;  // the same for the whole warp
        const float m_new = fmaxf(m, mx);
        const float alpha = m == -INFINITY ? 0.0F : __expf(m - m_new);
        const float pr = off >= 0 ? __expf(s - m_new) : 0.0F;
        l = l * alpha + pr;
        s_p[warp][lane] = pr;
        s_off[warp][lane] = off;
        tile_mma::sync_warp();
        KVPAGER_UNROLL
        for (int k = 0; k < kMaxPerLane; ++k) acc[k] *= alpha;
        for (int jj = 0; jj < 32; ++jj) {
          const float pj = s_p[warp][jj];
          if (pj == 0.0F) continue;
          const KV* vrow = kv + s_off[warp][jj] + half_stride;
          KVPAGER_UNROLL
          for (int k = 0; k < kMaxPerLane; ++k)
            if (lane + 32 * k < D) acc[k] += pj * kv_to_f(vrow[lane + 32 * k]);
        }
        m = m_new;
        tile_mma::sync_warp();
      }
      const float total = warp_sum_lane0(l);
      if (lane == 0) {
        s_linv[warp] = total > 0.0F ? a.v_scale / total : 0.0F;
        if (a.lse != nullptr) a.lse[qo / D] = lse_of(m, total);
      }
      tile_mma::sync_warp();
      KVPAGER_UNROLL
      for (int k = 0; k < kMaxPerLane; ++k)
        if (lane + 32 * k < D) out[qo + lane + 32 * k] = acc[k] * s_linv[warp];
      tile_mma::sync_warp();
    }
  }
}

}  // namespace kvpager::kernels::detail
