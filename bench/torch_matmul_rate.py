#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# torch's one-thread matmul rate for the GEMMs of a q_len 1024 attention over 3072 tokens at head_dim 128 (Q.K^T,
# P.V) and a square 1024 matmul, bf16 and fp32: the "torch bf16 matmul" bound of issue 27, point 3. Not in CI; run with
# the peers venv: build/peers-venv/bin/python bench/torch_matmul_rate.py (bench/cpu_attention_peers.sh installs it).
import torch, time, sys
torch.set_num_threads(1)
def rate(a, b, reps=20):
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps): torch.matmul(a, b)
        best = min(best, (time.perf_counter() - t) / reps)
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] / best / 1e9
for dt in (torch.bfloat16, torch.float32):
    q = torch.randn(1024, 128, dtype=dt); k = torch.randn(128, 3072, dtype=dt)
    p = torch.randn(1024, 3072, dtype=dt); v = torch.randn(3072, 128, dtype=dt)
    sq = torch.randn(1024, 1024, dtype=dt)
    print(dt, "QK^T 1024x128x3072 %.1f" % rate(q, k), "PV 1024x3072x128 %.1f" % rate(p, v), "square 1024 %.1f GFLOP/s" % rate(sq, sq, 10))
print(torch.__version__, torch.backends.mkldnn.is_available())
