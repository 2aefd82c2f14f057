// SPDX-License-Identifier: Apache-2.0
#ifndef KVPAGER_C_KERNELS_H
#define KVPAGER_C_KERNELS_H
/**
 * \file
 * C ABI of libkvpager_kernels (loadable from Python ctypes). Every function returns 0 on success or a
 * non-zero KVPAGER_STATUS_* code; none throws, none aborts on bad input. kvpager_status_string names every code;
 * C++ callers get a kvpager::status from the one mapping in kvpager/kernels/kernel_status.hpp. An engine checks its
 * KV geometry once, when it creates its cache, with kvpager_can_implement (C++: kvpager::can_implement).
 *
 * Rules every entry point follows (CPU and CUDA alike, kernels/common/checks.hpp):
 *  - One geometry check for every kernel that takes a KV pool's shape (decode and kv_append): num_kv_heads positive
 *    (else KVPAGER_STATUS_BAD_HEADS), head_dim, dtype and block_size supported (the UNSUPPORTED_* codes, in this
 *    order), num_blocks positive.
 *  - Every size and offset is computed in 64 bits; a buffer whose size in bytes would overflow int64 (the pool,
 *    num_blocks x 2 x num_kv_heads x block_size x head_dim x element size or num_blocks x block_bytes; the query and
 *    output; key and value; the split workspace) is KVPAGER_STATUS_INVALID_ARGUMENT.
 *  - A pointer may be NULL only when nothing is read or written through it (its count is zero); a call with nothing
 *    to do is OK, though the ids it carries are still checked.
 *  - A CPU function that returns an error has written nothing and read nothing from the KV cache; a CUDA function
 *    that returns an argument error has launched nothing (what its kernels check on the device is described below);
 *    KVPAGER_STATUS_DEVICE_ERROR means the CUDA runtime refused a launch or copy, possibly after earlier ones of the
 *    same call were queued.
 */

#include <stdint.h>

#if defined(_WIN32)
#define KVPAGER_C_API __declspec(dllexport)
#else
#define KVPAGER_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Status codes of the C ABI. Every check happens before any KV memory is read or written. */
enum {
  KVPAGER_STATUS_OK = 0,
  KVPAGER_STATUS_INVALID_ARGUMENT = 1, /**< a null pointer, or a size or count out of range */
  KVPAGER_STATUS_NO_DEVICE = 2,        /**< CUDA not built in, no driver, or no device */
  KVPAGER_STATUS_INVALID_BLOCK = 3,    /**< a block id outside [0, num_blocks), or a slot outside the pool */
  KVPAGER_STATUS_SEQ_TOO_LONG = 4,     /**< a seq_len larger than max_blocks_per_seq x block_size (or negative) */
  KVPAGER_STATUS_BAD_HEADS = 5,        /**< num_kv_heads not positive, or num_q_heads not a positive multiple of it */
  KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM = 6, /**< head_dim is not 64, 80, 96, 112, 128 or 256 */
  KVPAGER_STATUS_UNSUPPORTED_DTYPE = 7,    /**< dtype is not 0 (fp32), 1 (fp16) or 2 (bf16); or 3 (fp8) outside the
                                                _fp8 functions and kvpager_can_implement */
  KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE = 8, /**< block_size is not 8, 16 or 32 */
  KVPAGER_STATUS_OUT_OF_MEMORY = 9,   /**< a CPU decode's split workspace could not be allocated (nothing written) */
  KVPAGER_STATUS_DEVICE_ERROR = 10,   /**< the CUDA runtime or a kernel launch failed on a present device */
};

/**
 * Text of a KVPAGER_STATUS_* code ("KVPAGER_STATUS_<NAME>: <what it means>"). Never NULL: a code this library does
 * not define gets the fixed text "unknown kvpager status code". Static storage; safe from any thread.
 */
KVPAGER_C_API const char* kvpager_status_string(int32_t status);

/**
 * Whether the kernels run a KV pool of this geometry, checked the way every kernel that takes a pool checks it
 * (decode and kv_append, CPU and CUDA, in this order): num_kv_heads positive (else KVPAGER_STATUS_BAD_HEADS),
 * head_dim, dtype and block_size supported (UNSUPPORTED_HEAD_DIM, UNSUPPORTED_DTYPE, UNSUPPORTED_BLOCK_SIZE),
 * num_blocks positive and the pool's size in bytes within int64 (else INVALID_ARGUMENT). A geometry this accepts is
 * accepted by every decode and kv_append call over it, and one it rejects is rejected by them with the same code.
 * Call it once when the cache is created (the CUTLASS can_implement pattern): a kernel never has to refuse a pool
 * shape mid-run. Pure arithmetic (no device needed).
 * dtype KVPAGER_DTYPE_FP8_E4M3 is accepted here (element size 1): such a pool is run by the _fp8 functions
 * (kvpager_cpu_kv_append_fp8, kvpager_cpu_paged_attention_decode_fp8 and their CUDA counterparts), which take the
 * per-tensor scales; the plain decode and kv_append functions answer KVPAGER_STATUS_UNSUPPORTED_DTYPE for it.
 */
KVPAGER_C_API int32_t kvpager_can_implement(int32_t num_blocks, int32_t block_size, int32_t num_kv_heads,
                                            int32_t head_dim, int32_t dtype);

/**
 * Element types. The plain functions: KV cache, query and output share one of 0-2. KVPAGER_DTYPE_FP8_E4M3 (3) is a
 * KV cache type only (OCP FP8 E4M3FN, as NVIDIA's __nv_fp8_e4m3 and vLLM's "fp8_e4m3": sign, 4 exponent bits with
 * bias 7, 3 mantissa bits, no infinities, largest magnitude 448, NaN = S.1111.111; one byte per element), read and
 * written by the _fp8 functions below with per-tensor scales: stored = e4m3(x / scale), x = e4m3 x scale (K with
 * k_scale, V with v_scale). Their query and output are fp32, fp16 or bf16 (q_dtype); the key and value they append
 * are fp32, fp16 or bf16 (src_dtype). Prefill over an fp8 pool: the _prefill_fp8 functions (the plain
 * prefill entry points take dtypes 0-2), the same scheme as decode_fp8: k_scale folded into the softmax scale, v_scale
 * into the output, KV rows read as bytes and converted with kvpager/kernels/float8.hpp.
 */
enum { KVPAGER_DTYPE_FP32 = 0, KVPAGER_DTYPE_FP16 = 1, KVPAGER_DTYPE_BF16 = 2, KVPAGER_DTYPE_FP8_E4M3 = 3 };

/** Library version as major * 10000 + minor * 100 + patch. */
KVPAGER_C_API int32_t kvpager_version(void);

/** 1 if the library was built with the CUDA kernels, 0 otherwise. */
KVPAGER_C_API int32_t kvpager_built_with_cuda(void);

/**
 * Number of usable CUDA devices in *count. Returns KVPAGER_STATUS_NO_DEVICE (and *count = 0) when CUDA is not
 * built in or the runtime reports any error (no driver, no device), KVPAGER_STATUS_INVALID_ARGUMENT for a null
 * pointer.
 */
KVPAGER_C_API int32_t kvpager_cuda_device_count(int32_t* count);

/**
 * The CPU decode path this process uses: "avx512bf16" (AVX-512 F/BW/DQ/VL and AVX512_BF16: the scores of bf16 KV
 * through vdpbf16ps, the query exact; the probabilities stay fp32 for the product with V, as on every path, so its
 * accuracy is theirs), "avx512" (AVX-512
 * F/BW/DQ/VL), "avx2" (AVX2 + FMA + F16C) or "portable",
 * chosen once at first use from what the CPU supports (the library itself targets baseline x86-64). The environment
 * variable KVPAGER_CPU_DISPATCH=portable|avx2|avx512|avx512bf16 caps the choice (for tests and comparisons). The vector paths
 * are built with GCC; other compilers get the portable path.
 */
KVPAGER_C_API const char* kvpager_cpu_decode_path(void);

/**
 * Paged attention for decode (one query token per sequence) on the CPU.
 * out, query: contiguous [num_seqs, num_q_heads, head_dim]; kv_cache: one layer in the default layout
 * [num_blocks, 2, num_kv_heads, block_size, head_dim] (K then V in a block), contiguous; block_table:
 * [num_seqs, max_blocks_per_seq] int32 (entries past a sequence's blocks are not read); seq_lens: [num_seqs].
 * GQA/MQA: query head h reads KV head h / (num_q_heads / num_kv_heads). Softmax in fp32 with the given scale;
 * a sequence of length 0 produces zeros. num_threads 0 = all cores. When the work is split into KV chunks (long
 * contexts, few sequences) this call allocates its fp32 merge workspace per call (KVPAGER_STATUS_OUT_OF_MEMORY when
 * that fails); the C++ kvpager::paged_attention_decode_cpu takes a caller's workspace instead (per-step paths). Returns a KVPAGER_STATUS_* code: every argument,
 * then every sequence's length (ceil(seq_len / block_size) <= max_blocks_per_seq, computed in 64 bits, so a seq_len
 * close to INT32_MAX is checked like any other) and every block id it uses, is checked before anything is read from
 * the KV cache or written to out. With num_seqs = 0 every pointer may be NULL. Safe to call at any time, including
 * from a static object's destructor at exit (the worker threads are gone then: the call runs on the caller's thread).
 */
KVPAGER_C_API int32_t kvpager_cpu_paged_attention_decode(void* out, const void* query, const void* kv_cache,
                                                         const int32_t* block_table, const int32_t* seq_lens,
                                                         int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads,
                                                         int32_t head_dim, int32_t block_size,
                                                         int32_t max_blocks_per_seq, int32_t num_blocks, float scale,
                                                         int32_t dtype, int32_t num_threads);

/**
 * kvpager_cpu_paged_attention_decode with a sliding window and a logit soft cap (the plain function is this one with
 * window_left = -1, logits_soft_cap = 0). The query of sequence s sits at position p = seq_lens[s] - 1 and, when
 * window_left >= 0, attends only to KV positions j >= p - window_left (-1: no window); blocks wholly before the
 * window are not read (split-KV work is planned over the window only). Score = scale * q.k; when
 * logits_soft_cap > 0 it becomes logits_soft_cap * tanh(score / logits_soft_cap) before the softmax (0: no cap).
 * A window_left below -1, or a negative, NaN or infinite logits_soft_cap, is KVPAGER_STATUS_INVALID_ARGUMENT
 * (checked after the arguments of the plain function, before anything is read or written). Everything else as
 * kvpager_cpu_paged_attention_decode.
 */
KVPAGER_C_API int32_t kvpager_cpu_paged_attention_decode_ex(void* out, const void* query, const void* kv_cache,
                                                            const int32_t* block_table, const int32_t* seq_lens,
                                                            int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads,
                                                            int32_t head_dim, int32_t block_size,
                                                            int32_t max_blocks_per_seq, int32_t num_blocks, float scale,
                                                            int32_t window_left, float logits_soft_cap, int32_t dtype,
                                                            int32_t num_threads);

/**
 * Paged prefill (extend) attention on the CPU: the new query rows of each sequence over its whole paged KV (cached
 * prefix and the new tokens, whose K and V were appended before the call, e.g. with kvpager_cpu_kv_append).
 * qo_indptr: [num_seqs + 1] query row offsets, qo_indptr[0] = 0, never decreasing; q_len(s) = qo_indptr[s+1] -
 * qo_indptr[s] may be 0 and is at most seq_lens[s] (the whole KV length, new tokens included). query, out:
 * contiguous [qo_indptr[num_seqs], num_q_heads, head_dim]; kv_cache, block_table, dtype, GQA/MQA as for decode.
 * Row i of sequence s sits at position p = seq_lens[s] - q_len + i and attends to KV positions j <= p (causal) and,
 * when window_left >= 0, j >= p - window_left (-1 = no window; below -1 is INVALID_ARGUMENT). Score = scale * q.k;
 * when logits_soft_cap > 0 it becomes cap * tanh(score / cap) (0 = off; negative or not finite: INVALID_ARGUMENT).
 * Softmax in fp32. num_threads 0 = all cores; no per-call allocation (per-thread buffers are kept).
 * Checks, in order, before anything is read from the KV cache or written to out: decode's argument checks
 * (max_blocks_per_seq, num_seqs, scale, heads, geometry, same codes), window_left and logits_soft_cap, the pointers
 * (NULL only with num_seqs = 0; qo_indptr may then be NULL too), qo_indptr (qo_indptr[0] != 0 or a decrease:
 * KVPAGER_STATUS_INVALID_ARGUMENT; the query size in bytes within int64), then per sequence its length
 * (KVPAGER_STATUS_SEQ_TOO_LONG as for decode), a q_len above its seq_len (KVPAGER_STATUS_INVALID_ARGUMENT) and every
 * block id (KVPAGER_STATUS_INVALID_BLOCK). A batch of one query row per sequence without window or cap runs the decode
 * kernel (the result of kvpager_cpu_paged_attention_decode on the same arguments).
 */
KVPAGER_C_API int32_t kvpager_cpu_paged_attention_prefill(void* out, const void* query, const void* kv_cache,
                                                          const int32_t* qo_indptr, const int32_t* block_table,
                                                          const int32_t* seq_lens, int32_t num_seqs,
                                                          int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                                          int32_t block_size, int32_t max_blocks_per_seq,
                                                          int32_t num_blocks, float scale, int32_t window_left,
                                                          float logits_soft_cap, int32_t dtype, int32_t num_threads);

/**
 * Writes new tokens' K and V into the paged cache through the slot mapping (slot = block * block_size + offset;
 * a negative slot is skipped). key, value: contiguous [num_tokens, num_kv_heads, head_dim]; kv_cache as above.
 * The geometry is checked as for decode (KVPAGER_STATUS_BAD_HEADS for num_kv_heads <= 0, UNSUPPORTED_HEAD_DIM,
 * UNSUPPORTED_DTYPE, UNSUPPORTED_BLOCK_SIZE), then the sizes; a slot >= num_blocks x block_size is
 * KVPAGER_STATUS_INVALID_BLOCK, found before anything is written. With num_tokens = 0 every pointer may be NULL.
 */
KVPAGER_C_API int32_t kvpager_cpu_kv_append(void* kv_cache, const void* key, const void* value,
                                            const int64_t* slot_mapping, int32_t num_tokens, int32_t num_kv_heads,
                                            int32_t head_dim, int32_t block_size, int32_t num_blocks, int32_t dtype);

/**
 * kv_append into an fp8 E4M3 cache (KVPAGER_DTYPE_FP8_E4M3, default layout as above, one byte per element): key and
 * value are contiguous [num_tokens, num_kv_heads, head_dim] of src_dtype (0 fp32, 1 fp16, 2 bf16), and each element
 * is stored as e4m3(x / k_scale) (K) or e4m3(x / v_scale) (V), computed in fp32, rounded to nearest even and
 * saturated to +-448 (a NaN stays NaN); a negative slot is skipped. Checks, in this order: num_tokens non-negative
 * and k_scale, v_scale finite and > 0 (else KVPAGER_STATUS_INVALID_ARGUMENT); the geometry as kvpager_can_implement
 * with dtype 3 (BAD_HEADS, UNSUPPORTED_HEAD_DIM, UNSUPPORTED_BLOCK_SIZE, INVALID_ARGUMENT); src_dtype (else
 * UNSUPPORTED_DTYPE); the key/value size within int64 and the pointers (INVALID_ARGUMENT); every slot (INVALID_BLOCK
 * for slot >= num_blocks x block_size), all before anything is written. With num_tokens = 0 every pointer may be
 * NULL. The scales are the engine's (vLLM's k_scale / v_scale): per tensor, one pair per layer, the same pair for
 * every append and decode of that layer.
 */
KVPAGER_C_API int32_t kvpager_cpu_kv_append_fp8(void* kv_cache, const void* key, const void* value,
                                                const int64_t* slot_mapping, int32_t num_tokens, int32_t num_kv_heads,
                                                int32_t head_dim, int32_t block_size, int32_t num_blocks,
                                                int32_t src_dtype, float k_scale, float v_scale);

/**
 * Decode attention over an fp8 E4M3 cache: as kvpager_cpu_paged_attention_decode, with K read as e4m3 x k_scale
 * and V as e4m3 x v_scale (fp32 arithmetic; the scales are folded into the query scale and the output), and query
 * and out of q_dtype (0 fp32, 1 fp16, 2 bf16). Reads one byte per KV element. Checks, in this order:
 * max_blocks_per_seq positive, num_seqs non-negative, scale finite, k_scale and v_scale finite and > 0 (else
 * INVALID_ARGUMENT); the heads (BAD_HEADS); the geometry as kvpager_can_implement with dtype 3; q_dtype (else
 * UNSUPPORTED_DTYPE); the query/output size and the pointers (INVALID_ARGUMENT); then every sequence length and block
 * id (SEQ_TOO_LONG, INVALID_BLOCK) before anything is read from the cache or written to out.
 */
KVPAGER_C_API int32_t kvpager_cpu_paged_attention_decode_fp8(void* out, const void* query, const void* kv_cache,
                                                             const int32_t* block_table, const int32_t* seq_lens,
                                                             int32_t num_seqs, int32_t num_q_heads,
                                                             int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                                                             int32_t max_blocks_per_seq, int32_t num_blocks,
                                                             float scale, int32_t q_dtype, float k_scale,
                                                             float v_scale, int32_t num_threads);

/**
 * kvpager_cpu_paged_attention_decode_fp8 with a sliding window and a logit soft cap, as
 * kvpager_cpu_paged_attention_decode_ex adds them to the plain decode (window_left -1 = none, logits_soft_cap 0 =
 * none; a bad one is KVPAGER_STATUS_INVALID_ARGUMENT, checked after the arguments of
 * kvpager_cpu_paged_attention_decode_fp8, before anything is read or written). The plain fp8 function is this one
 * with -1 and 0.
 */
KVPAGER_C_API int32_t kvpager_cpu_paged_attention_decode_fp8_ex(
    void* out, const void* query, const void* kv_cache, const int32_t* block_table, const int32_t* seq_lens,
    int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
    int32_t max_blocks_per_seq, int32_t num_blocks, float scale, int32_t window_left, float logits_soft_cap,
    int32_t q_dtype, float k_scale, float v_scale, int32_t num_threads);

/**
 * Prefill (extend) attention over an fp8 E4M3 cache: as kvpager_cpu_paged_attention_prefill (same rows, positions,
 * causal mask, window_left, logits_soft_cap, GQA), with K read as e4m3 x k_scale and V as e4m3 x v_scale (fp32
 * arithmetic; k_scale is folded into the softmax scale, v_scale into the output, and the KV rows of each tile are
 * read one byte per element and converted to fp32 once), and query and out of q_dtype (0 fp32, 1 fp16, 2 bf16).
 * Checks, in this order, before anything is read from the cache or written to out: max_blocks_per_seq positive,
 * num_seqs non-negative, scale finite, k_scale and v_scale finite and > 0 (else INVALID_ARGUMENT); the heads
 * (BAD_HEADS); the geometry as kvpager_can_implement with dtype 3; q_dtype (else UNSUPPORTED_DTYPE); window_left and
 * logits_soft_cap (INVALID_ARGUMENT); the pointers (NULL only with num_seqs = 0); then qo_indptr (the query size
 * counted in q_dtype), every sequence length, q_len and block id as the plain prefill. A batch of one query
 * row per sequence without window or cap runs the fp8 decode kernel (the result of
 * kvpager_cpu_paged_attention_decode_fp8 on the same arguments).
 */
KVPAGER_C_API int32_t kvpager_cpu_paged_attention_prefill_fp8(
    void* out, const void* query, const void* kv_cache, const int32_t* qo_indptr, const int32_t* block_table,
    const int32_t* seq_lens, int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
    int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks, float scale, int32_t window_left,
    float logits_soft_cap, int32_t q_dtype, float k_scale, float v_scale, int32_t num_threads);

/**
 * Copies whole blocks (K and V, all heads) within each of num_layers caches: block_mapping is [num_pairs, 2]
 * int64 (src, dst). kv_caches: num_layers pointers to caches of num_blocks blocks of block_bytes bytes each.
 * Pairs must not chain (no destination is also a source), as in a cache step plan; a pair with src == dst copies
 * nothing. Every id is checked (KVPAGER_STATUS_INVALID_BLOCK outside [0, num_blocks)) before anything is copied,
 * whatever num_layers, also 0. block_mapping may be NULL only when num_pairs = 0; kv_caches (and each of its
 * pointers) may be NULL only when there is nothing to copy (num_layers = 0 or num_pairs = 0). Negative counts, a
 * non-positive num_blocks or block_bytes, or num_blocks x block_bytes beyond int64: KVPAGER_STATUS_INVALID_ARGUMENT.
 */
KVPAGER_C_API int32_t kvpager_cpu_copy_blocks(void* const* kv_caches, int32_t num_layers, const int64_t* block_mapping,
                                              int32_t num_pairs, int32_t num_blocks, int64_t block_bytes);

/**
 * Copies whole blocks from the pool `src` (src_blocks blocks of block_bytes) to the pool `dst` (dst_blocks blocks):
 * pairs is [num_pairs, 2] int64 (src block, dst block). Runs of consecutive pairs (src and dst both ascending by one)
 * are merged into one copy each. The CPU counterpart of kvpager_cuda_swap_blocks (device <-> host), for CPU pools
 * and as its reference; every id is checked before anything is copied. dst, src and pairs may be NULL only when
 * num_pairs = 0; either pool's size in bytes must fit in int64 (else KVPAGER_STATUS_INVALID_ARGUMENT); a run whose
 * source and destination are the same memory copies nothing.
 */
KVPAGER_C_API int32_t kvpager_cpu_swap_blocks(void* dst, int32_t dst_blocks, const void* src, int32_t src_blocks,
                                              int64_t block_bytes, const int64_t* pairs, int32_t num_pairs);

/* ------------------------------------------------------------------------- struct-taking entry points (0.3)
 * One argument struct per operation, as the C++ interface has (kvpager/kernels/attention.hpp, prefill.hpp,
 * block_moves.hpp): any pool strides (HND, NHD, K and V interleaved or apart), dense or CSR page tables, the LSE
 * output, a caller's split workspace, window, soft cap and fp8 pools as a dtype value, none of which the positional
 * functions above can express. Each struct starts with its own size: the caller sets struct_size = sizeof(the struct)
 * as its header declares it. A size below this release's is KVPAGER_STATUS_INVALID_ARGUMENT; a larger one (a caller
 * built against a later header) is accepted when every byte past the fields this library knows is zero (a later
 * field's zero is its default), else INVALID_ARGUMENT. A NULL args pointer is INVALID_ARGUMENT. The fields, their
 * defaults and every check and its order are the C++ params' (the struct is copied into them field by field and
 * validated once); start from KVPAGER_*_ARGS_INIT, which sets the size and the C++ defaults.
 */

/** A paged KV pool: element (block, kv, head, token, dim) of K (kv = 0) or V (kv = 1) is at data[block *
 *  stride_block + kv * stride_kv + head * stride_head + token * stride_token + dim], in elements of dtype. */
typedef struct kvpager_kv_view {
  const void* data;
  int32_t dtype, num_blocks, num_kv_heads, block_size, head_dim, reserved; /**< reserved: 0 */
  int64_t stride_block, stride_kv, stride_head, stride_token;
} kvpager_kv_view;

/** Which blocks each sequence reads: dense (block_table non-NULL: row s at block_table + s * row_stride, length
 *  seq_lens[s]) or CSR (block_table NULL: blocks indices[indptr[s] .. indptr[s+1]), length (pages - 1) x block_size
 *  + last_page_len[s]). */
typedef struct kvpager_page_table {
  const int32_t* block_table;
  int64_t row_stride;
  const int32_t* seq_lens;
  const int32_t* indptr;
  const int32_t* indices;
  const int32_t* last_page_len;
} kvpager_page_table;

/** kvpager_cpu_decode's arguments: kvpager::decode_params field for field. */
typedef struct kvpager_decode_args {
  uint32_t struct_size; /**< sizeof(kvpager_decode_args) */
  int32_t num_seqs;
  void* out;
  const void* query;
  float* lse; /**< optional [num_seqs, num_q_heads] */
  kvpager_kv_view kv;
  kvpager_page_table pages;
  int32_t num_q_heads;
  float scale;
  int32_t num_splits;  /**< 0 = chosen per call */
  int32_t num_threads; /**< 0 = all cores */
  void* workspace;
  int64_t workspace_bytes;
  int32_t window_left; /**< -1 = none */
  float logits_soft_cap; /**< 0 = none */
  int32_t q_dtype;       /**< -1 = the pool's dtype; an fp8 pool needs 0, 1 or 2 */
  float k_scale, v_scale;
  int32_t reserved; /**< 0 */
} kvpager_decode_args;

/** kvpager_cpu_prefill's arguments: kvpager::prefill_params field for field. */
typedef struct kvpager_prefill_args {
  uint32_t struct_size; /**< sizeof(kvpager_prefill_args) */
  int32_t num_seqs;
  void* out;
  const void* query;
  float* lse; /**< optional [qo_indptr[num_seqs], num_q_heads] */
  kvpager_kv_view kv;
  kvpager_page_table pages;
  const int32_t* qo_indptr; /**< [num_seqs + 1] query row offsets */
  int32_t num_q_heads;
  float scale;
  int32_t window_left;
  float logits_soft_cap;
  int32_t num_threads;
  int32_t q_dtype;
  float k_scale, v_scale;
} kvpager_prefill_args;

/** kvpager_cpu_append's arguments: kvpager::append_params field for field. */
typedef struct kvpager_append_args {
  uint32_t struct_size; /**< sizeof(kvpager_append_args) */
  int32_t num_tokens;
  kvpager_kv_view kv; /**< written through data */
  const void* key;
  const void* value;
  const int64_t* slot_mapping;
  int32_t src_dtype; /**< -1 = the pool's dtype; an fp8 pool needs 0, 1 or 2 */
  float k_scale, v_scale;
  int32_t reserved; /**< 0 */
} kvpager_append_args;

/** Initializers with the size set and the C++ defaults (q_dtype, src_dtype and window -1, scales 1). */
#define KVPAGER_KV_VIEW_INIT {0, 1, 0, 0, 16, 128, 0, 0, 0, 0, 0}
#define KVPAGER_PAGE_TABLE_INIT {0, 0, 0, 0, 0, 0}
#define KVPAGER_DECODE_ARGS_INIT                                                                                     \
  {(uint32_t)sizeof(kvpager_decode_args), 0, 0, 0, 0, KVPAGER_KV_VIEW_INIT, KVPAGER_PAGE_TABLE_INIT, 0, 1.0f, 0, 0, 0, \
   0, -1, 0.0f, -1, 1.0f, 1.0f, 0}
#define KVPAGER_PREFILL_ARGS_INIT                                                                                   \
  {(uint32_t)sizeof(kvpager_prefill_args), 0, 0, 0, 0, KVPAGER_KV_VIEW_INIT, KVPAGER_PAGE_TABLE_INIT, 0, 0, 1.0f, -1, \
   0.0f, 0, -1, 1.0f, 1.0f}
#define KVPAGER_APPEND_ARGS_INIT {(uint32_t)sizeof(kvpager_append_args), 0, KVPAGER_KV_VIEW_INIT, 0, 0, 0, -1, 1.0f, 1.0f, 0}

/** Decode attention over any view and page table (kvpager::paged_attention_decode_cpu; its checks, same order). */
KVPAGER_C_API int32_t kvpager_cpu_decode(const kvpager_decode_args* args);
/** Prefill attention over any view and page table (kvpager::paged_attention_prefill_cpu; its checks, same order). */
KVPAGER_C_API int32_t kvpager_cpu_prefill(const kvpager_prefill_args* args);
/** kv_append into any view, fp8 pools included (kvpager::kv_append_cpu; its checks, same order). */
KVPAGER_C_API int32_t kvpager_cpu_append(const kvpager_append_args* args);

/* ----------------------------------------------------------------------------------------------- CUDA
 * Same semantics on device memory, launched on `stream` (a cudaStream_t, NULL = default stream). Host-visible
 * arguments are checked before launch; block ids and slots live in device memory, so the kernels check them
 * themselves: an out-of-range id is never dereferenced, the affected output is written as zeros, and
 * *error_flag (device int32, may be NULL) is set to KVPAGER_STATUS_INVALID_BLOCK (KVPAGER_STATUS_SEQ_TOO_LONG for
 * a decode sequence longer than its page table row, KVPAGER_STATUS_INVALID_ARGUMENT for a NULL layer pointer in
 * copy_blocks). The host-side checks are the CPU functions' (same codes, same order). Grid rows are capped at 65535;
 * the kernels walk any further KV heads, query heads or layers themselves, so no count is limited by the grid. No
 * allocation and no host synchronization inside these calls. Without a CUDA build or device they return
 * KVPAGER_STATUS_NO_DEVICE; a launch or copy the CUDA runtime refuses on a present device (cudaGetLastError after
 * the launch, or the copy's own error) is KVPAGER_STATUS_DEVICE_ERROR.
 */
/** Decode attention without splits (one CTA per sequence and KV head); arguments as the CPU function. */
KVPAGER_C_API int32_t kvpager_cuda_paged_attention_decode(void* out, const void* query, const void* kv_cache,
                                                          const int32_t* block_table, const int32_t* seq_lens,
                                                          int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads,
                                                          int32_t head_dim, int32_t block_size,
                                                          int32_t max_blocks_per_seq, int32_t num_blocks, float scale,
                                                          int32_t dtype, int32_t* error_flag, void* stream);

/**
 * Split-KV decode: each sequence's tokens are cut into num_splits chunks of whole blocks (1 <= num_splits <= 256),
 * one CTA per (sequence, KV head, chunk); partial (max, sum, output) states go to `workspace` in fp32 and a second
 * kernel merges them in fp32 into `out` and, when lse is not NULL, lse [num_seqs, num_q_heads] (natural log of the
 * softmax denominator of the scaled scores). Choose num_splits with kvpager_cuda_plan_decode (on the host, from the
 * longest sequence) and size the workspace with kvpager_cuda_decode_workspace_size; num_splits = 1 needs none.
 * No allocation and no synchronization: both kernels are queued on `stream`. A workspace smaller than needed is
 * KVPAGER_STATUS_INVALID_ARGUMENT.
 */
KVPAGER_C_API int32_t kvpager_cuda_paged_attention_decode_split(
    void* out, float* lse, const void* query, const void* kv_cache, const int32_t* block_table, const int32_t* seq_lens,
    int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
    int32_t max_blocks_per_seq, int32_t num_blocks, float scale, int32_t dtype, int32_t num_splits, void* workspace,
    int64_t workspace_bytes, int32_t* error_flag, void* stream);

/**
 * kvpager_cuda_paged_attention_decode_split with a sliding window and a logit soft cap, with the meaning and the checks
 * of kvpager_cpu_paged_attention_decode_ex (window_left -1 = none, logits_soft_cap 0 = none; a bad one is
 * KVPAGER_STATUS_INVALID_ARGUMENT before anything is queued). Splits cover each sequence's window only (the blocks
 * from the one that holds its first visible position), so plan num_splits with the longest window,
 * min(seq_len, window_left + 1), as max_seq_len.
 */
KVPAGER_C_API int32_t kvpager_cuda_paged_attention_decode_split_ex(
    void* out, float* lse, const void* query, const void* kv_cache, const int32_t* block_table, const int32_t* seq_lens,
    int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
    int32_t max_blocks_per_seq, int32_t num_blocks, float scale, int32_t window_left, float logits_soft_cap,
    int32_t dtype, int32_t num_splits, void* workspace, int64_t workspace_bytes, int32_t* error_flag, void* stream);

/**
 * Bytes of device workspace kvpager_cuda_paged_attention_decode_split needs, in *bytes: num_seqs x num_q_heads x
 * num_splits x (head_dim + 2) x 4, or 0 for num_splits = 1. Pure arithmetic (works without a GPU).
 * KVPAGER_STATUS_INVALID_ARGUMENT when the size overflows int64.
 */
KVPAGER_C_API int32_t kvpager_cuda_decode_workspace_size(int32_t num_seqs, int32_t num_q_heads, int32_t head_dim,
                                                         int32_t num_splits, int64_t* bytes);

/**
 * Host-side split plan for `device`: enough (sequence, KV head, split) CTAs for two per streaming multiprocessor,
 * chunks of at least 256 tokens, at most 64 splits (kvpager::plan_decode with the SM count as parallelism).
 * max_seq_len is the longest sequence of the batch. Returns KVPAGER_STATUS_NO_DEVICE without a usable device.
 */
KVPAGER_C_API int32_t kvpager_cuda_plan_decode(int32_t num_seqs, int32_t num_kv_heads, int32_t max_seq_len,
                                               int32_t device, int32_t* num_splits);

/**
 * Paged prefill (extend) attention on the GPU: the CUDA counterpart of kvpager_cpu_paged_attention_prefill, same
 * arguments and semantics (qo_indptr [num_seqs + 1], block_table, seq_lens: device memory; query and out:
 * [qo_indptr[num_seqs], num_q_heads, head_dim]; query row i of sequence s sits at position p = seq_lens[s] - q_len + i
 * and attends to KV positions j <= p, and j >= p - window_left when window_left >= 0; score = scale * q.k, soft-capped
 * to cap * tanh(score / cap) when logits_soft_cap > 0; GQA as in decode), with num_threads replaced by num_ctas (the
 * grid, >= 1, from kvpager_cuda_plan_prefill; any value gives the same result) and a workspace of
 * kvpager_cuda_prefill_workspace_size bytes (8-byte aligned device memory, required when num_seqs > 0; its content
 * is rewritten by every call, so calls sharing one must be on one stream). lse: NULL, or device float
 * [qo_indptr[num_seqs], num_q_heads] that receives, per query row and head, the natural log of its softmax denominator
 * over the scaled (and soft-capped) scores, as the split decode's lse (-INFINITY for a row the device flagged and wrote
 * as zeros); with it, partial attentions over disjoint KV ranges can be merged. fp16 and bf16 run on tensor cores (WMMA
 * 16x16x16, fp32 accumulation and fp32 online softmax; sm_80 or newer), fp32 on CUDA cores in fp32.
 * Host checks, in this order: num_ctas < 1 or a negative workspace_bytes, then the CPU function's argument checks
 * (max_blocks_per_seq, num_seqs, scale, heads, the pool geometry, window_left >= -1 and logits_soft_cap finite and
 * non-negative, the pointers: kernels/common/checks.hpp check_dense_prefill), then a workspace smaller than needed
 * (INVALID_ARGUMENT). The rows live
 * in device memory and are checked by the first kernel: qo_indptr[0] != 0 (nothing computed) or a decreasing entry
 * sets *error_flag to KVPAGER_STATUS_INVALID_ARGUMENT, and a sequence is only computed when 0 <= qo_indptr[s] <=
 * qo_indptr[s + 1] <= qo_indptr[num_seqs], so no row outside the buffers' qo_indptr[num_seqs] rows is touched; a seq_len beyond its page table row
 * to KVPAGER_STATUS_SEQ_TOO_LONG and a q_len above its seq_len to KVPAGER_STATUS_INVALID_ARGUMENT, and those
 * sequences' rows are written as zeros; a block id outside the pool is never read (the token is skipped,
 * KVPAGER_STATUS_INVALID_BLOCK). The caller's out must hold qo_indptr[num_seqs] rows: the device cannot check that.
 * Two kernels are queued on `stream`; no allocation, no synchronization.
 */
KVPAGER_C_API int32_t kvpager_cuda_paged_attention_prefill(
    void* out, float* lse, const void* query, const void* kv_cache, const int32_t* qo_indptr, const int32_t* block_table,
    const int32_t* seq_lens, int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
    int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks, float scale, int32_t window_left,
    float logits_soft_cap, int32_t dtype, int32_t num_ctas, void* workspace, int64_t workspace_bytes,
    int32_t* error_flag, void* stream);

/**
 * Bytes of device workspace kvpager_cuda_paged_attention_prefill needs for num_seqs sequences, in *bytes:
 * (num_seqs + 1) x 8 (the tiles' offsets). Pure arithmetic (works without a GPU); KVPAGER_STATUS_INVALID_ARGUMENT
 * for a null pointer or a negative count.
 */
KVPAGER_C_API int32_t kvpager_cuda_prefill_workspace_size(int32_t num_seqs, int64_t* bytes);

/**
 * Paged prefill over an fp8 E4M3 cache (see KVPAGER_DTYPE_FP8_E4M3): kvpager_cuda_paged_attention_prefill with K read
 * as e4m3 x k_scale and V as e4m3 x v_scale (k_scale folded into the score scale, before the soft cap; v_scale into
 * the output) and query, out of q_dtype (0 fp32, 1 fp16, 2 bf16); lse as there, of the scores over the dequantized K.
 * The argument list of kvpager_cpu_paged_attention_prefill_fp8 with num_threads replaced by the CUDA prefill's own
 * (num_ctas, workspace, workspace_bytes, error_flag, stream; workspace and plan as for the plain prefill) and lse
 * after out, as in kvpager_cuda_paged_attention_prefill. fp16 and
 * bf16 queries run on tensor cores: each KV tile is read as bytes and decoded to the query type (exact) on its way
 * into shared memory; an fp32 query runs on CUDA cores. Host checks, in this order: num_ctas < 1 or a negative
 * workspace_bytes, then max_blocks_per_seq, num_seqs, scale, k_scale and v_scale (finite and > 0, else
 * INVALID_ARGUMENT), heads, the pool geometry with dtype 3, q_dtype (UNSUPPORTED_DTYPE), the query size, window_left
 * and logits_soft_cap, the pointers (kernels/common/checks.hpp check_dense_prefill on the fp8 path), then the workspace; the rows
 * and block ids are checked on the device as for the plain prefill.
 */
KVPAGER_C_API int32_t kvpager_cuda_paged_attention_prefill_fp8(
    void* out, float* lse, const void* query, const void* kv_cache, const int32_t* qo_indptr, const int32_t* block_table,
    const int32_t* seq_lens, int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
    int32_t block_size, int32_t max_blocks_per_seq, int32_t num_blocks, float scale, int32_t window_left,
    float logits_soft_cap, int32_t q_dtype, float k_scale, float v_scale, int32_t num_ctas, void* workspace,
    int64_t workspace_bytes, int32_t* error_flag, void* stream);

/**
 * Host-side grid plan of a prefill on `device`: one CTA per tile of 64 (query token, query head) rows, i.e.
 * ceil(total_q_rows x num_q_heads / 64), at least 1 and at most 64 per streaming multiprocessor (the CTAs walk any
 * further tiles). total_q_rows is qo_indptr[num_seqs], known on the host when the batch is built. Returns
 * KVPAGER_STATUS_INVALID_ARGUMENT for a null num_ctas or a negative count or device, KVPAGER_STATUS_BAD_HEADS for
 * heads as decode refuses them, KVPAGER_STATUS_NO_DEVICE without a usable device.
 */
KVPAGER_C_API int32_t kvpager_cuda_plan_prefill(int32_t total_q_rows, int32_t num_q_heads, int32_t num_kv_heads,
                                                int32_t device, int32_t* num_ctas);

KVPAGER_C_API int32_t kvpager_cuda_kv_append(void* kv_cache, const void* key, const void* value,
                                             const int64_t* slot_mapping, int32_t num_tokens, int32_t num_kv_heads,
                                             int32_t head_dim, int32_t block_size, int32_t num_blocks, int32_t dtype,
                                             int32_t* error_flag, void* stream);
/**
 * fp8 E4M3 cache (see KVPAGER_DTYPE_FP8_E4M3): the CUDA counterparts of kvpager_cpu_kv_append_fp8 and
 * kvpager_cpu_paged_attention_decode_fp8, same arguments, same host checks in the same order, plus error_flag and
 * stream as the other CUDA functions (slots and block ids are checked on the device). decode_fp8_split is
 * kvpager_cuda_paged_attention_decode_split over an fp8 cache (workspace from kvpager_cuda_decode_workspace_size,
 * which does not depend on the KV dtype); decode_fp8 is it with num_splits = 1.
 */
KVPAGER_C_API int32_t kvpager_cuda_kv_append_fp8(void* kv_cache, const void* key, const void* value,
                                                 const int64_t* slot_mapping, int32_t num_tokens, int32_t num_kv_heads,
                                                 int32_t head_dim, int32_t block_size, int32_t num_blocks,
                                                 int32_t src_dtype, float k_scale, float v_scale, int32_t* error_flag,
                                                 void* stream);
KVPAGER_C_API int32_t kvpager_cuda_paged_attention_decode_fp8(void* out, const void* query, const void* kv_cache,
                                                              const int32_t* block_table, const int32_t* seq_lens,
                                                              int32_t num_seqs, int32_t num_q_heads,
                                                              int32_t num_kv_heads, int32_t head_dim,
                                                              int32_t block_size, int32_t max_blocks_per_seq,
                                                              int32_t num_blocks, float scale, int32_t q_dtype,
                                                              float k_scale, float v_scale, int32_t* error_flag,
                                                              void* stream);
KVPAGER_C_API int32_t kvpager_cuda_paged_attention_decode_fp8_split(
    void* out, float* lse, const void* query, const void* kv_cache, const int32_t* block_table, const int32_t* seq_lens,
    int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
    int32_t max_blocks_per_seq, int32_t num_blocks, float scale, int32_t q_dtype, float k_scale, float v_scale,
    int32_t num_splits, void* workspace, int64_t workspace_bytes, int32_t* error_flag, void* stream);

/**
 * kvpager_cuda_paged_attention_decode_fp8_split with a sliding window and a logit soft cap, as
 * kvpager_cpu_paged_attention_decode_fp8_ex (the same host checks in the same order, then the workspace, as
 * kvpager_cuda_paged_attention_decode_split_ex). The plain fp8 functions are this one with -1 and 0.
 */
KVPAGER_C_API int32_t kvpager_cuda_paged_attention_decode_fp8_split_ex(
    void* out, float* lse, const void* query, const void* kv_cache, const int32_t* block_table, const int32_t* seq_lens,
    int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
    int32_t max_blocks_per_seq, int32_t num_blocks, float scale, int32_t window_left, float logits_soft_cap,
    int32_t q_dtype, float k_scale, float v_scale, int32_t num_splits, void* workspace, int64_t workspace_bytes,
    int32_t* error_flag, void* stream);

/**
 * kv_caches: device array of num_layers device pointers; block_mapping: device [num_pairs, 2] int64. Host checks as
 * kvpager_cpu_copy_blocks (the ids, in device memory, are checked by the kernel, also when num_layers = 0 if
 * error_flag is given).
 */
KVPAGER_C_API int32_t kvpager_cuda_copy_blocks(void* const* kv_caches, int32_t num_layers, const int64_t* block_mapping,
                                               int32_t num_pairs, int32_t num_blocks, int64_t block_bytes,
                                               int32_t* error_flag, void* stream);
/**
 * Copies blocks between two pools (device <-> pinned host, or device <-> device): pairs is a HOST [num_pairs, 2]
 * int64 array (src block, dst block); runs of consecutive pairs (src and dst both consecutive) are merged into one
 * cudaMemcpyAsync each. Block ids are checked on the host against src_blocks / dst_blocks before anything is copied.
 */
KVPAGER_C_API int32_t kvpager_cuda_swap_blocks(void* dst, int32_t dst_blocks, const void* src, int32_t src_blocks,
                                               int64_t block_bytes, const int64_t* pairs, int32_t num_pairs,
                                               void* stream);

#ifdef __cplusplus
}
#endif

#endif /* KVPAGER_C_KERNELS_H */
