#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kvpager-sim's KV cache events read with vLLM's own event classes: decoded, and rebuilt by vLLM to the same bytes.

  vllm_events_peer.py --vllm-src DIR --sim build/default/tools/kvpager-sim [--workload default|multiturn]

DIR holds vLLM's Python sources as a wheel unpacks them (DIR/vllm/distributed/kv_events.py; checked with
vllm-0.22.0). Its kv_events.py runs from a temporary package; the three vLLM modules it imports besides
(vllm.config.kv_events, vllm.logger, vllm.v1.core.kv_cache_utils) are replaced by stand-ins of a line or two. Needs
msgspec and pyzmq (pip install msgspec pyzmq). Not part of CI: it needs vLLM's sources. docs/kv_events.md records a
run.

The tool publishes on a loopback port this script binds; every batch must decode with vLLM's KVEventBatch decoder,
carry data-parallel rank 0, and equal, byte for byte, the batch vLLM itself builds from the decoded events with the
rank filled in as its publisher does. Exits 1 otherwise.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile


def stage_vllm(src, dst):
    f = os.path.join(src, "vllm", "distributed", "kv_events.py")
    if not os.path.isfile(f):
        sys.exit(f"vllm_events_peer: {f} not found (--vllm-src is the unpacked wheel's root)")
    out = os.path.join(dst, "vllm")
    for d in ("", "config", "distributed", "v1", "v1/core"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
        open(os.path.join(out, d, "__init__.py"), "a").close()
    shutil.copy(f, os.path.join(out, "distributed", "kv_events.py"))
    with open(os.path.join(out, "config", "kv_events.py"), "w") as g:
        g.write("class KVEventsConfig:\n    pass\n")
    with open(os.path.join(out, "logger.py"), "w") as g:
        g.write("import logging\ndef init_logger(name):\n    return logging.getLogger(name)\n")
    with open(os.path.join(out, "v1", "core", "kv_cache_utils.py"), "w") as g:
        g.write("ExternalBlockHash = bytes | int\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-src", required=True)
    ap.add_argument("--sim", required=True)
    ap.add_argument("--workload", default="default", choices=["default", "multiturn"])
    a = ap.parse_args()
    import msgspec
    import zmq
    with tempfile.TemporaryDirectory() as tmp:
        stage_vllm(a.vllm_src, tmp)
        sys.path.insert(0, tmp)
        from vllm.distributed.kv_events import KVEventBatch
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        port = sub.bind_to_random_port("tcp://127.0.0.1")
        p = subprocess.Popen([a.sim, "--quiet", "--json", "--workload", a.workload, "--requests", "300", "--blocks",
                              "300", "--kv-events", f"tcp://127.0.0.1:{port}"], stdout=subprocess.PIPE)
        dec, enc = msgspec.msgpack.Decoder(type=KVEventBatch), msgspec.msgpack.Encoder()
        n, kinds, bad = 0, {}, None
        try:
            while sub.poll(3000):
                _, seq, payload = sub.recv_multipart()
                b = dec.decode(payload)
                v = KVEventBatch(ts=b.ts, events=b.events)
                if v.data_parallel_rank is None:
                    v.data_parallel_rank = 0  # as vLLM's ZmqEventPublisher.publish fills it
                if (b.data_parallel_rank != 0 or enc.encode(v) != payload) and bad is None:
                    bad = int.from_bytes(seq, "big")
                for e in b.events:
                    kinds[type(e).__name__] = kinds.get(type(e).__name__, 0) + 1
                n += 1
        finally:
            p.wait(timeout=120)
            sub.close()
            ctx.term()
    if bad is not None or n == 0:
        print(f"FAIL: {n} batches; first not rebuilt by vLLM byte for byte: {bad}")
        sys.exit(1)
    print(f"{a.workload}: {n} batches decoded by vLLM's KVEventBatch, rank 0, each rebuilt by vLLM byte for byte; "
          f"events {kinds}")


if __name__ == "__main__":
    main()
