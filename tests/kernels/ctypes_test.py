# SPDX-License-Identifier: Apache-2.0
"""libkvpager_kernels.so from Python through ctypes (standard library only): the exact C signature of
kvpager_cpu_paged_attention_decode and kvpager_cpu_paged_attention_prefill (window and soft cap) against a reference
computed here, a bad block id answered with a status,
kvpager_status_string naming every code (never NULL), and kvpager_can_implement on the kernels' geometries."""
import ctypes
import math
import random
import sys

lib = ctypes.CDLL(sys.argv[1])
i32, f32 = ctypes.c_int32, ctypes.c_float
P = ctypes.c_void_p
lib.kvpager_cpu_paged_attention_decode.argtypes = [P, P, P, P, P] + [i32] * 7 + [f32, i32, i32]
lib.kvpager_cpu_paged_attention_decode.restype = i32
lib.kvpager_cpu_decode_path.restype = ctypes.c_char_p
lib.kvpager_status_string.argtypes = [i32]
lib.kvpager_status_string.restype = ctypes.c_char_p
lib.kvpager_can_implement.argtypes = [i32] * 5
lib.kvpager_can_implement.restype = i32
lib.kvpager_cpu_paged_attention_prefill.argtypes = [P] * 6 + [i32] * 7 + [f32, i32, f32, i32, i32]
lib.kvpager_cpu_paged_attention_prefill.restype = i32
lib.kvpager_cpu_kv_append.argtypes = [P, P, P, P] + [i32] * 6
lib.kvpager_cpu_kv_append.restype = i32

num_seqs, hq, hkv, dim, bs, num_blocks, max_blocks = 2, 4, 2, 64, 16, 6, 3
lens = [20, 33]
rng = random.Random(7)
kv = (ctypes.c_float * (num_blocks * 2 * hkv * bs * dim))(*[rng.uniform(-1, 1) for _ in range(num_blocks * 2 * hkv * bs * dim)])
q = (ctypes.c_float * (num_seqs * hq * dim))(*[rng.uniform(-1, 1) for _ in range(num_seqs * hq * dim)])
out = (ctypes.c_float * (num_seqs * hq * dim))()
table = (ctypes.c_int32 * (num_seqs * max_blocks))(4, 1, 0, 2, 5, 3)
seq_lens = (ctypes.c_int32 * num_seqs)(*lens)
scale = 1.0 / math.sqrt(dim)


def at(block, kv_index, head, token, d):
    return kv[(((block * 2 + kv_index) * hkv + head) * bs + token) * dim + d]


def call(tab):
    return lib.kvpager_cpu_paged_attention_decode(out, q, kv, tab, seq_lens, num_seqs, hq, hkv, dim, bs, max_blocks,
                                                  num_blocks, scale, 0, 0)


rc = call(table)
assert rc == 0, f"status {rc}"
worst = 0.0
for s in range(num_seqs):
    for h in range(hq):
        kvh = h // (hq // hkv)
        rows = [(table[s * max_blocks + t // bs], t % bs) for t in range(lens[s])]
        scores = [sum(q[(s * hq + h) * dim + d] * at(b, 0, kvh, o, d) for d in range(dim)) * scale for b, o in rows]
        m = max(scores)
        w = [math.exp(x - m) for x in scores]
        total = sum(w)
        for d in range(dim):
            ref = sum(wi * at(b, 1, kvh, o, d) for wi, (b, o) in zip(w, rows)) / total
            worst = max(worst, abs(out[(s * hq + h) * dim + d] - ref) / (1 + abs(ref)))
assert worst <= 1e-5, f"worst relative error {worst}"

# Prefill: the last 3 rows of sequence 0 and all 33 of sequence 1, window 10, soft cap 5.
q_lens, window, cap = [3, 33], 10, 5.0
rows_total = sum(q_lens)
qp = (ctypes.c_float * (rows_total * hq * dim))(*[rng.uniform(-1, 1) for _ in range(rows_total * hq * dim)])
outp = (ctypes.c_float * (rows_total * hq * dim))()
qo = (ctypes.c_int32 * (num_seqs + 1))(0, q_lens[0], rows_total)
rc = lib.kvpager_cpu_paged_attention_prefill(outp, qp, kv, qo, table, seq_lens, num_seqs, hq, hkv, dim, bs, max_blocks,
                                             num_blocks, scale, window, cap, 0, 0)
assert rc == 0, f"prefill status {rc}"
worst_prefill = 0.0
for s in range(num_seqs):
    for i in range(q_lens[s]):
        r = qo[s] + i
        pos = lens[s] - q_lens[s] + i
        keys = range(max(0, pos - window), pos + 1)
        for h in range(hq):
            kvh = h // (hq // hkv)
            rows = [(table[s * max_blocks + t // bs], t % bs) for t in keys]
            scores = [cap * math.tanh(sum(qp[(r * hq + h) * dim + d] * at(b, 0, kvh, o, d) for d in range(dim)) * scale / cap)
                      for b, o in rows]
            m = max(scores)
            w = [math.exp(x - m) for x in scores]
            total = sum(w)
            for d in range(dim):
                ref = sum(wi * at(b, 1, kvh, o, d) for wi, (b, o) in zip(w, rows)) / total
                worst_prefill = max(worst_prefill, abs(outp[(r * hq + h) * dim + d] - ref) / (1 + abs(ref)))
assert worst_prefill <= 1e-5, f"prefill worst relative error {worst_prefill}"
before_prefill = list(outp)
bad_qo = (ctypes.c_int32 * (num_seqs + 1))(0, 21, 24)  # q_len 21 above seq_len 20
rc = lib.kvpager_cpu_paged_attention_prefill(outp, qp, kv, bad_qo, table, seq_lens, num_seqs, hq, hkv, dim, bs,
                                             max_blocks, num_blocks, scale, window, cap, 0, 0)
assert rc == 1 and list(outp) == before_prefill, f"q_len above seq_len: status {rc}, output must be untouched"

before = list(out)
bad = (ctypes.c_int32 * (num_seqs * max_blocks))(4, 1, 0, 2, num_blocks, 3)
rc = call(bad)
assert rc == 3, f"a block id outside the pool must give KVPAGER_STATUS_INVALID_BLOCK (3), got {rc}"
assert list(out) == before, "a rejected call must not write the output"
names = ["OK", "INVALID_ARGUMENT", "NO_DEVICE", "INVALID_BLOCK", "SEQ_TOO_LONG", "BAD_HEADS", "UNSUPPORTED_HEAD_DIM",
         "UNSUPPORTED_DTYPE", "UNSUPPORTED_BLOCK_SIZE", "OUT_OF_MEMORY", "DEVICE_ERROR"]
for code, name in enumerate(names):
    text = lib.kvpager_status_string(code)
    assert text is not None and text.decode().startswith(f"KVPAGER_STATUS_{name}:"), f"code {code}: {text!r}"
for code in (-1, len(names), 2**31 - 1, -2**31):
    assert lib.kvpager_status_string(code) == b"unknown kvpager status code", f"code {code}"

# num_blocks, block_size, num_kv_heads, head_dim, dtype -> the code decode and kv_append give for that pool
for args, want in (((6, 16, 2, 64, 0), 0), ((6, 64, 2, 64, 0), 8), ((6, 16, 0, 64, 0), 5), ((6, 16, 2, 48, 1), 6),
                   ((6, 16, 2, 64, 4), 7), ((0, 16, 2, 64, 2), 1)):
    rc = lib.kvpager_can_implement(*args)
    assert rc == want, f"kvpager_can_implement{args} = {rc}, expected {want}"
    assert lib.kvpager_cpu_kv_append(None, None, None, None, 0, args[2], args[3], args[1], args[0], args[4]) == want, args

# An fp8 E4M3 pool (dtype 3): accepted by can_implement and the _fp8 functions, refused by the plain kv_append.
assert lib.kvpager_can_implement(6, 16, 2, 64, 3) == 0
assert lib.kvpager_cpu_kv_append(None, None, None, None, 0, 2, 64, 16, 6, 3) == 7
lib.kvpager_cpu_kv_append_fp8.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int32] * 6 + [ctypes.c_float] * 2
assert lib.kvpager_cpu_kv_append_fp8(None, None, None, None, 0, 2, 64, 16, 6, 1, 0.5, 0.25) == 0
assert lib.kvpager_cpu_kv_append_fp8(None, None, None, None, 0, 2, 64, 16, 6, 1, 0.0, 0.25) == 1, "scale 0"

print(f"ctypes: ok, path {lib.kvpager_cpu_decode_path().decode()}, worst error {worst:.2e}, prefill {worst_prefill:.2e}")
