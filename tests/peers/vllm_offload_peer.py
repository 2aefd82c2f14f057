#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kvpager's host_tier against vLLM's own offloading manager: the same random calls through both, every answer compared.

  vllm_offload_peer.py --vllm-src DIR --driver build/default/tests/tier_peer_driver [--calls N]

DIR holds vLLM's Python sources as a wheel unpacks them (DIR/vllm/v1/kv_offload/...; checked with vllm-0.22.0). Only
vLLM's offloading manager and its LRU and ARC policies run (vllm/v1/kv_offload/base.py, cpu/common.py,
cpu/manager.py, cpu/policies/*.py, copied into a temporary package); the two vLLM modules they import besides
(vllm.logger, vllm.v1.core.kv_cache_utils) are replaced by two-line stand-ins, and base.py needs numpy and torch
(build/hf-venv has them). Not part of CI: it needs vLLM's sources. bench/RESULTS.md ("Issue 25") records a run.

Calls: lookups, touches, stores (keys listed once per store, as vLLM's scheduler lists a request's blocks; vLLM
would store a key listed twice twice), completions that succeed or fail, loads of ready blocks and their
completions. Answers compared: each lookup (miss, hit, pending), each store's stored keys, host blocks and evicted
keys in order or its refusal, each load's host blocks. Exits 1 on the first difference, naming the call.
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile


def stage_vllm(src, dst):
    """vLLM's offloading manager and policies under dst/vllm, with stand-ins for the two other modules they import."""
    kv = os.path.join(src, "vllm", "v1", "kv_offload")
    if not os.path.isfile(os.path.join(kv, "cpu", "manager.py")):
        sys.exit(f"vllm_offload_peer: {kv}/cpu/manager.py not found (--vllm-src is the unpacked wheel's root)")
    out = os.path.join(dst, "vllm")
    for d in ("", "v1", "v1/core", "v1/kv_offload", "v1/kv_offload/cpu", "v1/kv_offload/cpu/policies"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
        open(os.path.join(out, d, "__init__.py"), "a").close()
    for f in ("base.py", "cpu/common.py", "cpu/manager.py", "cpu/policies/base.py", "cpu/policies/lru.py",
              "cpu/policies/arc.py"):
        shutil.copy(os.path.join(kv, f), os.path.join(out, "v1", "kv_offload", f))
    with open(os.path.join(out, "logger.py"), "w") as f:
        f.write("import logging\ndef init_logger(name):\n    return logging.getLogger(name)\n")
    with open(os.path.join(out, "v1", "core", "kv_cache_utils.py"), "w") as f:
        f.write("def resolve_kv_cache_block_sizes(*args, **kwargs):\n    raise NotImplementedError\n")


def run(manager_cls, driver, policy, blocks, threshold, seed, calls):
    rng = random.Random(seed)
    m = manager_cls(blocks, policy, store_threshold=threshold)
    key = lambda i: i.to_bytes(8, "big")
    nk = blocks * 3
    ops, want, loading, writing = [], [], [], []

    def run_of(n):
        s = rng.randrange(1, nk + 1)
        return [((s + i) % nk) + 1 if rng.random() > 0.25 else rng.randrange(1, nk + 1)
                for i in range(rng.randrange(1, n + 1))]

    for _ in range(calls):
        r = rng.random()
        if r < 0.25:
            k = rng.randrange(1, nk + 1)
            ops.append(f"lookup {k}")
            want.append(str({False: 0, True: 1, None: 2}[m.lookup(key(k), None)]))
        elif r < 0.35:
            k = run_of(6)
            m.touch([key(x) for x in k], None)
            ops.append("touch " + " ".join(map(str, k)))
            want.append("ok")
        elif r < 0.55:
            k = list(dict.fromkeys(run_of(blocks // 2 + 1)))
            out = m.prepare_store([key(x) for x in k], None)
            ops.append("store " + " ".join(map(str, k)))
            if out is None:
                want.append("none")
                continue
            stored = [int.from_bytes(x, "big") for x in out.keys_to_store]
            ev = [int.from_bytes(x, "big") for x in out.evicted_keys]
            want.append("".join(f"{x} " for x in stored) + "|" + "".join(f"{x} " for x in out.store_spec.block_ids)
                        + "|" + "".join(f"{x} " for x in ev))
            writing += stored
        elif r < 0.68 and writing:
            rng.shuffle(writing)
            n = rng.randrange(1, len(writing) + 1)
            done, writing[:] = writing[:n], writing[n:]
            ok = rng.random() > 0.2
            m.complete_store([key(x) for x in done], None, ok)
            ops.append(("ok " if ok else "fail ") + " ".join(map(str, done)))
            want.append("ok")
        elif r < 0.82:
            k = run_of(4)
            blocks_of = [m._policy.get(key(x)) for x in k]
            if all(b is not None and b.is_ready for b in blocks_of):
                spec = m.prepare_load([key(x) for x in k], None)
                ops.append("load " + " ".join(map(str, k)))
                want.append("".join(f"{x} " for x in spec.block_ids))
                loading += k
        elif loading:
            rng.shuffle(loading)
            n = rng.randrange(1, min(len(loading), 4) + 1)
            done, loading[:] = loading[:n], loading[n:]
            m.complete_load([key(x) for x in done], None)
            ops.append("done_load " + " ".join(map(str, done)))
            want.append("ok")
    p = subprocess.run([driver, policy, str(blocks), str(threshold)], input="\n".join(ops) + "\n",
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"vllm_offload_peer: the driver exited {p.returncode}: {p.stderr}")
    got = p.stdout.split("\n")[:-1]
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            print(f"FAIL {policy} blocks {blocks} threshold {threshold} seed {seed}: call {i} {ops[i]!r}: "
                  f"kvpager {a!r}, vLLM {b!r}")
            return False
    if len(got) != len(want):
        print(f"FAIL {policy}: {len(got)} answers for {len(want)} calls")
        return False
    print(f"{policy} blocks {blocks} threshold {threshold} seed {seed}: {len(ops)} calls, every answer equal")
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-src", required=True)
    ap.add_argument("--driver", required=True)
    ap.add_argument("--calls", type=int, default=100000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stage_vllm(a.vllm_src, tmp)
        sys.path.insert(0, tmp)
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
        ok = True
        for policy in ("lru", "arc"):
            for blocks, threshold, seed in ((8, 1, 1), (8, 1, 2), (16, 2, 3), (64, 1, 4), (1, 1, 5)):
                ok &= run(CPUOffloadingManager, a.driver, policy, blocks, threshold, seed, a.calls)
    print("ALL EQUAL" if ok else "DIFFERENCES")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
