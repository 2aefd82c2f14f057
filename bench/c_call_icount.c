/* SPDX-License-Identifier: Apache-2.0 */
/* The instruction count of short C kernel calls, for bench/RESULTS.md (issue 22, point 3). Build and count:
 *   gcc -O2 -I include bench/c_call_icount.c -o /tmp/icount -L build/default/kernels -lkvpager_kernels \
 *       -Wl,-rpath,$PWD/build/default/kernels
 *   for n in 10 110; do valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n /tmp/icount $n; done
 * and take the difference of the two totals (100 iterations). */
#include <kvpager/c/kernels.h>

#include <stdio.h>
#include <stdlib.h>

/* N calls of each short C kernel call (8 sequences x 16 tokens, one thread): decode fp16, decode over fp8, prefill
   with 4 rows per sequence. argv[1] = N. */
int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 1;
  enum { S = 8, HKV = 8, HQ = 32, D = 128, BS = 16, NB = 16 };
  static unsigned short pool[NB * 2 * HKV * BS * D];
  static unsigned char pool8[NB * 2 * HKV * BS * D];
  static unsigned short q[S * 4 * HQ * D], out[S * 4 * HQ * D];
  int32_t table[S], lens[S], qo[S + 1];
  for (int s = 0; s < S; ++s) { table[s] = s; lens[s] = 16; qo[s] = 4 * s; }
  qo[S] = 4 * S;
  for (int i = 0; i < NB * 2 * HKV * BS * D; ++i) { pool[i] = 0x3c00; pool8[i] = 0x30; }
  for (int i = 0; i < S * 4 * HQ * D; ++i) q[i] = 0x3c00;
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    bad |= kvpager_cpu_paged_attention_decode(out, q, pool, table, lens, S, HQ, HKV, D, BS, 1, NB, 0.1f, 1, 1);
    bad |= kvpager_cpu_paged_attention_decode_fp8(out, q, pool8, table, lens, S, HQ, HKV, D, BS, 1, NB, 0.1f, 1, 1.0f,
                                                  1.0f, 1);
    bad |= kvpager_cpu_paged_attention_prefill(out, q, pool, qo, table, lens, S, HQ, HKV, D, BS, 1, NB, 0.1f, -1, 0.0f,
                                               1, 1);
  }
  printf("status %d\n", bad);
  return bad;
}
