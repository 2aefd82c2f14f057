"""libkvpager_kernels.so from Python through ctypes (standard library only): the exact C signature of
kvpager_cpu_paged_attention_decode against a reference computed here, and a bad block id answered with a status."""
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

before = list(out)
bad = (ctypes.c_int32 * (num_seqs * max_blocks))(4, 1, 0, 2, num_blocks, 3)
rc = call(bad)
assert rc == 3, f"a block id outside the pool must give KVPAGER_STATUS_INVALID_BLOCK (3), got {rc}"
assert list(out) == before, "a rejected call must not write the output"
print(f"ctypes: ok, path {lib.kvpager_cpu_decode_path().decode()}, worst error {worst:.2e}")
