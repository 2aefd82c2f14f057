#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kvpager-sim --kv-events, read as a consumer of vLLM's KV cache events reads vLLM's (pyzmq and msgpack, Debian's
python3-zmq and python3-msgpack).

  check_kv_events.py KVPAGER_SIM MODE      MODE: connect (this script binds, the tool connects) or bind (tool binds)

The tool publishes on loopback; this script subscribes, asks the replay socket for every batch it missed (a PUB
socket drops what it sends before a subscriber's subscription arrives), and checks:
  - the frames: (topic, sequence as 8 bytes big-endian, payload), sequences 0, 1, ... with none missing after replay,
    replayed payloads byte-identical to those received live, and the replay's end marker (-1, empty payload);
  - the payload: vLLM 0.22.0's KVEventBatch as positional msgpack arrays ([ts, events, data_parallel_rank = 0];
    BlockStored with 11 fields, BlockRemoved with 3, AllBlocksCleared with none), every type as vLLM's (hashes
    unsigned 64-bit integers, medium "GPU", lora fields and the unset defaults nil);
  - the state: from the events alone it rebuilds the cached blocks (a count per hash) and after every batch compares
    their number and hash sum with the cache's own, which the tool wrote beside (a hidden test option); at the end,
    with the JSON's kv_events (batches, events, final_stored_blocks) and the cache's cached blocks.
Exits 77 (ctest: skipped) only when zmq or msgpack cannot be imported; every process it starts is stopped.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

try:
    import msgpack
    import zmq
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (Debian: python3-zmq python3-msgpack; .ci/run installs them)")
    sys.exit(77)

TOPIC = b"kv-events"
U64 = 1 << 64


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def check_hashes(hashes, where):
    if not hashes or not all(isinstance(h, int) and 0 <= h < U64 for h in hashes):
        fail(f"{where}: block_hashes must be a non-empty list of unsigned 64-bit integers: {hashes!r}")


def check_event(ev, where):
    if not isinstance(ev, list) or not ev or not isinstance(ev[0], str):
        fail(f"{where}: an event is not a tagged array: {ev!r}")
    tag = ev[0]
    if tag == "BlockStored":
        if len(ev) != 12:
            fail(f"{where}: BlockStored has {len(ev) - 1} fields, vLLM 0.22.0 has 11")
        _, hashes, parent, tokens, block_size, lora_id, medium, lora_name, extra, group, kind, window = ev
        check_hashes(hashes, where)
        if parent is not None and not (isinstance(parent, int) and 0 <= parent < U64):
            fail(f"{where}: parent_block_hash {parent!r}")
        if not isinstance(block_size, int) or block_size <= 0 or len(tokens) != len(hashes) * block_size:
            fail(f"{where}: {len(tokens)} token ids for {len(hashes)} blocks of {block_size}")
        if not all(isinstance(t, int) for t in tokens):
            fail(f"{where}: token_ids must be integers")
        if (lora_id, lora_name, extra, kind, window) != (None, None, None, None, None):
            fail(f"{where}: lora_id, lora_name, extra_keys, kv_cache_spec_* must be nil: {ev[5:]!r}")
        if medium != "GPU" or group != 0:
            fail(f"{where}: medium {medium!r}, group_idx {group!r}: expected 'GPU', 0")
    elif tag == "BlockRemoved":
        if len(ev) != 4:
            fail(f"{where}: BlockRemoved has {len(ev) - 1} fields, vLLM 0.22.0 has 3")
        _, hashes, medium, group = ev
        check_hashes(hashes, where)
        if medium != "GPU" or group != 0:
            fail(f"{where}: medium {medium!r}, group_idx {group!r}")
    elif tag == "AllBlocksCleared":
        if len(ev) != 1:
            fail(f"{where}: AllBlocksCleared has fields")
    else:
        fail(f"{where}: unknown event tag {tag!r}")


def run(sim, mode):
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
    sub.setsockopt(zmq.LINGER, 0)
    replay_port = free_port()
    if mode == "connect":  # vLLM's rule: tcp://HOST:PORT connects
        port = sub.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
    else:  # tcp://*:PORT binds
        port = free_port()
        endpoint = f"tcp://*:{port}"
        sub.connect(f"tcp://127.0.0.1:{port}")
    tmp = tempfile.mkdtemp(prefix="kvpager_events_")
    check_file = os.path.join(tmp, "state.txt")
    cmd = [sim, "--quiet", "--json", "--requests", "160", "--blocks", "300", "--kv-events", endpoint,
           "--kv-events-replay", f"tcp://127.0.0.1:{replay_port}", "--kv-events-topic", TOPIC.decode(),
           "--kv-events-linger", "60", "--kv-events-check", check_file]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, done = [], threading.Event()

    def read_stdout():
        for line in proc.stdout:
            lines.append(line)
            if line.rstrip("\n") == "}":  # the JSON document's last line: the run is over, the tool lingers
                done.set()
        done.set()

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    live = {}
    try:
        deadline = time.monotonic() + 120
        quiet_since = None
        while time.monotonic() < deadline:
            if sub.poll(100):
                topic, seq, payload = sub.recv_multipart()
                if topic != TOPIC or len(seq) != 8:
                    fail(f"frames: topic {topic!r}, sequence of {len(seq)} bytes")
                live[int.from_bytes(seq, "big")] = payload
                quiet_since = None
                continue
            if done.is_set():
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 1.0:
                    break
        if not done.is_set():
            fail("kvpager-sim did not finish its run within 120 s")
        if proc.poll() is not None and proc.returncode != 0:
            fail(f"kvpager-sim exited {proc.returncode}: {proc.stderr.read()}")
        doc = json.loads("".join(lines))
        kv = doc["kv_events"]
        batches = kv["batches"]
        if batches < 10:
            fail(f"only {batches} batches")
        # Replay from the first batch missed (vLLM's protocol; a DEALER speaks it as a REQ does, frame for frame).
        missing = [s for s in range(batches) if s not in live]
        start = missing[0] if missing else max(0, batches - 5)
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        replayed, ended = {}, False
        end_deadline = time.monotonic() + 30
        while time.monotonic() < end_deadline:
            if not dealer.poll(1000):
                continue
            empty, seq, payload = dealer.recv_multipart()
            if empty != b"":
                fail("replay: the delimiter frame is not empty")
            if seq == b"\xff" * 8:
                if payload != b"":
                    fail("replay: the end marker carries a payload")
                ended = True
                break
            replayed[int.from_bytes(seq, "big")] = payload
        dealer.close()
        if not ended:
            fail("replay: no end marker")
        if sorted(replayed) != list(range(start, batches)):
            fail(f"replay from {start}: got {len(replayed)} batches, expected {batches - start}")
        for s, p in replayed.items():
            if s in live and live[s] != p:
                fail(f"replay: batch {s} differs from the one published")
        batches_by_seq = {**replayed, **live}
        # Rebuild the cached blocks from the events alone, batch by batch.
        state = {}
        with open(check_file) as f:
            cache_rows = [tuple(int(x) for x in line.split()) for line in f]
        if len(cache_rows) != batches:
            fail(f"{len(cache_rows)} cache states for {batches} batches")
        events = 0
        last_ts = 0.0
        for s in range(batches):
            batch = msgpack.unpackb(batches_by_seq[s], raw=False, strict_map_key=False)
            if not (isinstance(batch, list) and len(batch) == 3 and isinstance(batch[0], float)
                    and isinstance(batch[1], list) and batch[2] == 0 and isinstance(batch[2], int)):
                fail(f"batch {s}: not [ts: float, events, data_parallel_rank: 0] (vLLM fills its rank in)")
            if batch[0] < last_ts or abs(batch[0] - time.time()) > 3600:
                fail(f"batch {s}: ts {batch[0]} is not the wall-clock time of its step")
            last_ts = batch[0]
            for i, ev in enumerate(batch[1]):
                check_event(ev, f"batch {s} event {i}")
                if ev[0] == "BlockStored":
                    for h in ev[1]:
                        state[h] = state.get(h, 0) + 1
                elif ev[0] == "BlockRemoved":
                    for h in ev[1]:
                        if state.get(h, 0) == 0:
                            fail(f"batch {s}: removal of {h}, never stored")
                        state[h] -= 1
                        if state[h] == 0:
                            del state[h]
                else:
                    state.clear()
            events += len(batch[1])
            count = sum(state.values())
            hsum = sum(h * n for h, n in state.items()) % U64
            if cache_rows[s] != (s, count, hsum):
                fail(f"after batch {s}: the events say {count} blocks (hash sum {hsum}), the cache {cache_rows[s][1:]}")
        if events != kv["events"]:
            fail(f"{events} events decoded, the tool says {kv['events']}")
        final = sum(state.values())
        if final != kv["final_stored_blocks"]["GPU"] or final != kv["cached_blocks_at_end"] \
                or kv["final_stored_blocks"]["CPU"] != 0:
            fail(f"final: events {final}, JSON {kv['final_stored_blocks']}, cache {kv['cached_blocks_at_end']}")
        print(f"OK ({mode}): {batches} batches ({len(live)} live, {len(missing)} by replay), {events} events, "
              f"{final} blocks cached at the end, equal to the cache after every batch")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        sub.close()
        ctx.term()
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in ("connect", "bind"):
        print(__doc__)
        sys.exit(2)
    run(sys.argv[1], sys.argv[2])
