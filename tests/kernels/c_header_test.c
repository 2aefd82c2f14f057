/* SPDX-License-Identifier: Apache-2.0 */
/* kvpager/c/kernels.h compiled as C (C11, -Wall -Wextra -Werror -pedantic): the struct-taking entry points and their
 * initializers from C, one fp32 decode over a one-block pool checked against its closed form (one token: the output
 * is V), and the struct_size rule. Exit status 0 on success. */
#include <kvpager/c/kernels.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  enum { heads = 1, dim = 64, bs = 16 };
  static float pool[2 * heads * bs * dim];
  float q[dim], out[dim];
  int32_t table[1] = {0}, lens[1] = {1};
  int i;
  for (i = 0; i < dim; ++i) {
    pool[i] = 0.5f;                        /* K of token 0 */
    pool[heads * bs * dim + i] = (float)i; /* V of token 0 */
    q[i] = 1.0f;
    out[i] = -1.0f;
  }
  kvpager_decode_args a = KVPAGER_DECODE_ARGS_INIT;
  a.num_seqs = 1;
  a.out = out;
  a.query = q;
  a.kv.data = pool;
  a.kv.dtype = KVPAGER_DTYPE_FP32;
  a.kv.num_blocks = 1;
  a.kv.num_kv_heads = heads;
  a.kv.block_size = bs;
  a.kv.head_dim = dim;
  a.kv.stride_block = 2 * heads * bs * dim;
  a.kv.stride_kv = heads * bs * dim;
  a.kv.stride_head = bs * dim;
  a.kv.stride_token = dim;
  a.pages.block_table = table;
  a.pages.row_stride = 1;
  a.pages.seq_lens = lens;
  a.num_q_heads = heads;
  a.num_threads = 1;
  if (kvpager_cpu_decode(&a) != KVPAGER_STATUS_OK) return fprintf(stderr, "decode refused\n"), 1;
  for (i = 0; i < dim; ++i)
    if (out[i] != (float)i) return fprintf(stderr, "out[%d] = %g, want %d\n", i, (double)out[i], i), 1;
  a.struct_size = (uint32_t)sizeof a - 4u;
  if (kvpager_cpu_decode(&a) != KVPAGER_STATUS_INVALID_ARGUMENT) return fprintf(stderr, "short struct taken\n"), 1;
  {
    kvpager_prefill_args p = KVPAGER_PREFILL_ARGS_INIT;
    kvpager_append_args k = KVPAGER_APPEND_ARGS_INIT;
    if (kvpager_cpu_prefill(&p) != KVPAGER_STATUS_BAD_HEADS || kvpager_cpu_append(&k) != KVPAGER_STATUS_BAD_HEADS)
      return fprintf(stderr, "defaults not answered as C++'s\n"), 1;
  }
  puts("kvpager/c/kernels.h from C: ok");
  return 0;
}
