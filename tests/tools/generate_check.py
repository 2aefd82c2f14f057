# SPDX-License-Identifier: Apache-2.0
"""Checks of kvpager-generate on checkpoints made by kvpager-make-checkpoint (Python standard library only).

  generate_check.py CHECK GENERATE MAKE_CHECKPOINT

Each check forces one thing an engine does and runs kvpager-generate --reference (every sample again, alone, over
contiguous K/V without the cache): the outputs must match it, and the summary must show the forced thing happened.
  pressure_swap, pressure_recompute, pressure_hybrid   a pool too small for the batch, each preemption mode
  tiny_budget      a step budget of 3 tokens: every prompt in chunks
  prefix           prompts sharing a long prefix: hits, and only the rest computed
  fork             n = 4, greedy (samples identical) and sampled (samples differ): forks and copy-on-write copies
  kv_dtypes        fp16, bf16 and fp8 E4M3 pools under pressure
  vllm_v1          the vllm_v1 composition under pressure (recompute only)
  window           mistral, a window shorter than the prompts, under pressure
  determinism      sampled requests give the same tokens alone, batched, chunked and preempted
  eos              an eos id ends a sample ("stop", the eos kept), ignore_eos runs on; generation_config.json wins
  report           --report: steps.csv (one row per step), chart.svg (XML: four panels, one line each, as many
                   points as steps), metrics.prom (parsed by prometheus_client when installed), summary.json equal to
                   --json
  bad_input        every malformed checkpoint, config and request: exit 2 and a message naming the file, tensor or
                   field (and FILE:LINE for the requests), never a crash
  disaggregated    --role prefill in one process, --role decode in one or two others (UCX over the loopback, block
                   sizes differing): the decode side's outputs are exactly a single process's, checked against
                   --reference too, every prompt's KV read and every held request released
  disaggregated_faults   the prefill process killed (the decode side computes what it did not get, same outputs), the
                   decode process killed (the prefill side releases everything and exits), nothing listening, bad
                   options; every process reaped
"""
import json
import os
import random
import signal
import socket
import subprocess
import time
import shutil
import struct
import sys
import tempfile
import xml.etree.ElementTree as ET


from check_util import check, fail, run  # tests/tools/check_util.py


class Ctx:
    def __init__(self, gen, make, tmp):
        self.gen, self.make, self.tmp = gen, make, tmp
        self.n = 0

    def checkpoint(self, *opts):
        self.n += 1
        d = os.path.join(self.tmp, f"ck{self.n}")
        p = run([self.make, d] + list(opts))
        check(p.returncode == 0, f"kvpager-make-checkpoint {opts}: {p.stderr}")
        return d

    def requests(self, reqs, name="requests.jsonl"):
        path = os.path.join(self.tmp, f"{self.n}_{name}")
        with open(path, "w") as f:
            for r in reqs:
                f.write(json.dumps(r) + "\n")
        return path

    def generate(self, ck, reqs_path, *opts, expect=0):
        out = os.path.join(self.tmp, f"out{self.n}_{random.random():.6f}.jsonl")
        p = run([self.gen, ck, reqs_path, "--json", "--quiet", "--output", out] + list(opts))
        check(p.returncode == expect, f"kvpager-generate {' '.join(opts)} exited {p.returncode}, want {expect}:\n"
                                      f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        summary = json.loads(p.stdout) if p.returncode == 0 else None
        outputs = {}
        if p.returncode == 0:
            for line in open(out):
                o = json.loads(line)
                outputs[o["id"]] = o["samples"]
        return summary, outputs

    def reference(self, ck, reqs_path, *opts):
        s, o = self.generate(ck, reqs_path, "--reference", *opts)
        ref = s["reference"]
        check(ref["matched"] and ref["mismatched"] == 0, f"reference check failed: {ref}")
        check(ref["samples"] > 0 and ref["positions"] > 0, f"nothing compared: {ref}")
        return s, o


def batch(rng, vocab, count=10, shared_len=40, tail=(5, 40), gen=(10, 40)):
    shared = [rng.randrange(3, vocab) for _ in range(shared_len)]
    out = []
    for i in range(count):
        prompt = (shared[: rng.randrange(shared_len // 2, shared_len + 1)] if i % 2 == 0 else [])
        prompt += [rng.randrange(3, vocab) for _ in range(rng.randrange(*tail))]
        out.append({"id": f"r{i}", "prompt_ids": prompt, "max_tokens": rng.randrange(*gen), "ignore_eos": True})
    return out


def pressure(c, mode):
    ck = c.checkpoint("--layers", "2", "--seed", "11")
    reqs = c.requests(batch(random.Random(1), 512))
    s, _ = c.reference(ck, reqs, "--num-blocks", "14", "--block-size", "8", "--preemption", mode,
                       "--num-host-blocks", "64")
    if mode == "swap":
        check(s["preemptions_swap"] > 0 and s["swapped_out_blocks"] > 0 and s["swapped_in_blocks"] > 0,
              f"no swap: {s}")
    elif mode == "recompute":
        check(s["preemptions_recompute"] > 0 and s["preemptions_swap"] == 0, f"no recompute preemption: {s}")
    else:
        check(s["preemptions_swap"] + s["preemptions_recompute"] > 0, f"no preemption: {s}")
    check(s["finished"] == s["samples"], f"a sample did not finish: {s}")


def host_tier(c):
    """--host-tier-blocks: a conversation's prefix evicted from a small device pool comes back from the host tier;
    the outputs are the same tokens as without the tier, and --reference holds with the tier's loads."""
    ck = c.checkpoint("--seed", "29")
    rng = random.Random(12)
    shared = [rng.randrange(3, 512) for _ in range(64)]
    reqs = []
    for i in range(6):  # a turn over the shared prefix, then traffic that pushes it out of the device pool
        reqs.append({"id": f"turn{i}", "prompt_ids": shared + [rng.randrange(3, 512) for _ in range(6)],
                     "max_tokens": 8, "ignore_eos": True})
        reqs.append({"id": f"other{i}", "prompt_ids": [rng.randrange(3, 512) for _ in range(70)], "max_tokens": 8,
                     "ignore_eos": True})
    path = c.requests(reqs)
    opts = ["--num-blocks", "12", "--block-size", "8", "--max-num-seqs", "1"]
    s0, o0 = c.reference(ck, path, *opts)
    s1, o1 = c.reference(ck, path, *opts, "--host-tier-blocks", "64")
    check(o0 == o1, "the host tier changed the outputs")
    s1_one = f"{s1['prefix_hit_tokens_host']} prompt tokens loaded from the tier"
    check(s0["prefix_hit_tokens_host"] == 0, f"host hits without a tier: {s0}")
    check(s1["prefix_hit_tokens_host"] >= 3 * 64, f"the tier served too little: {s1}")
    check(s1["host_tier"]["loaded_blocks"] * 8 == s1["prefix_hit_tokens_host"], f"loads and hits disagree: {s1}")
    check(s1["prefill_tokens"] + s1["prefix_hit_tokens_host"] <= s0["prefill_tokens"],
          f"loaded tokens were computed too: {s0['prefill_tokens']} -> {s1['prefill_tokens']}")
    c.generate(ck, path, "--host-tier-blocks", "8", "--composition", "vllm_v1", expect=2)
    # A sliding-window model (KV cache groups: the window group loads only the blocks its window reads): the same
    # tokens with the tier, token for token with transformers, its loads served instead of computed.
    ck = c.checkpoint("--family", "mistral", "--window", "20", "--seed", "31")
    s0, o0 = c.reference(ck, path, *opts)
    s1, o1 = c.reference(ck, path, *opts, "--host-tier-blocks", "128")
    check(o0 == o1, "the host tier changed a windowed model's outputs")
    check(s1["prefix_hit_tokens_host"] >= 64 and s1["host_tier"]["loaded_blocks"] > 0 and
          s1["prefix_hit_tokens"] > s0["prefix_hit_tokens"],
          f"the tier served too little with KV cache groups: {s0['prefix_hit_tokens']} hit tokens without, {s1}")
    check(s1["prefill_tokens"] + s1["prefix_hit_tokens_host"] <= s0["prefill_tokens"],
          f"loaded tokens were computed too (groups): {s0['prefill_tokens']} -> {s1['prefill_tokens']}")
    print(f"ok host_tier: one group {s1_one}; KV cache groups {s0['prefix_hit_tokens']} -> {s1['prefix_hit_tokens']} "
          f"prompt tokens hit ({s1['prefix_hit_tokens_host']} loaded from the tier), outputs identical")


def tiny_budget(c):
    ck = c.checkpoint("--family", "qwen2", "--hidden", "256", "--heads", "4", "--kv-heads", "1")
    reqs = c.requests(batch(random.Random(2), 512, count=6))
    s, _ = c.reference(ck, reqs, "--max-num-batched-tokens", "3")
    check(s["steps"] * 3 >= s["computed_tokens"] and s["steps"] > s["prompt_tokens"] / 3, f"not chunked: {s}")


def prefix(c):
    ck = c.checkpoint("--seed", "5")
    rng = random.Random(3)
    shared = [rng.randrange(3, 512) for _ in range(96)]
    reqs = [{"id": i, "prompt_ids": shared + [rng.randrange(3, 512) for _ in range(rng.randrange(1, 9))],
             "max_tokens": 12, "ignore_eos": True} for i in range(8)]
    s, _ = c.reference(ck, c.requests(reqs), "--max-num-seqs", "1")  # one at a time: every later prompt hits
    check(s["prefix_hit_rate"] > 0.6, f"prefix hit rate {s['prefix_hit_rate']}")
    check(s["prefill_tokens"] < s["prompt_tokens"] * 0.4, f"prefix hits were computed again: {s}")


def fork(c):
    ck = c.checkpoint("--seed", "9")
    rng = random.Random(4)
    reqs = [{"id": "greedy", "prompt_ids": [rng.randrange(3, 512) for _ in range(21)], "max_tokens": 20, "n": 4,
             "ignore_eos": True},
            {"id": "sampled", "prompt_ids": [rng.randrange(3, 512) for _ in range(13)], "max_tokens": 24, "n": 4,
             "temperature": 0.9, "top_p": 0.95, "top_k": 50, "seed": 1234, "ignore_eos": True}]
    s, o = c.reference(ck, c.requests(reqs), "--num-blocks", "20", "--block-size", "8")
    check(s["forks"] == 6 and s["block_copies"] > 0, f"no forks or copy-on-write copies: {s}")
    g = [x["token_ids"] for x in o["greedy"]]
    check(all(x == g[0] for x in g) and len(g) == 4, f"greedy samples differ: {g}")
    t = [tuple(x["token_ids"]) for x in o["sampled"]]
    check(len(t) == 4 and len(set(t)) > 1, f"sampled samples are all equal: {t}")


def kv_dtypes(c):
    ck = c.checkpoint("--seed", "13", "--hidden", "256", "--heads", "4", "--kv-heads", "2")
    reqs = c.requests(batch(random.Random(5), 512, count=8))
    for dt in ["fp16", "bf16", "fp8"]:
        s, _ = c.reference(ck, reqs, "--kv-dtype", dt, "--num-blocks", "16", "--block-size", "8")
        check(s["preemptions_swap"] + s["preemptions_recompute"] > 0, f"{dt}: no preemption: {s}")


def vllm_v1(c):
    ck = c.checkpoint("--seed", "17")
    reqs = c.requests(batch(random.Random(6), 512))
    s, _ = c.reference(ck, reqs, "--composition", "vllm_v1", "--num-blocks", "14", "--block-size", "8")
    check(s["preemptions_recompute"] > 0 and s["preemptions_swap"] == 0, f"no recompute preemption: {s}")


def window(c):
    ck = c.checkpoint("--family", "mistral", "--window", "20", "--seed", "19")
    reqs = c.requests(batch(random.Random(7), 512, tail=(30, 60)))
    s, _ = c.reference(ck, reqs, "--num-blocks", "24", "--block-size", "8", "--max-num-batched-tokens", "24")
    check(s["preemptions_swap"] + s["preemptions_recompute"] > 0, f"no preemption: {s}")


def determinism(c):
    ck = c.checkpoint("--seed", "23")
    rng = random.Random(8)
    reqs = [{"id": i, "prompt_ids": [rng.randrange(3, 512) for _ in range(rng.randrange(4, 40))], "max_tokens": 30,
             "temperature": 1.0, "top_p": 0.9, "seed": 100 + i, "n": 1 + i % 3, "ignore_eos": True} for i in range(8)]
    path = c.requests(reqs)
    _, a = c.generate(ck, path)
    s, b = c.generate(ck, path, "--num-blocks", "14", "--block-size", "8", "--max-num-batched-tokens", "5")
    check(s["preemptions_swap"] + s["preemptions_recompute"] > 0, f"no preemption: {s}")
    for r in reqs[:3]:
        _, one = c.generate(ck, c.requests([r], f"one{r['id']}.jsonl"))
        check(one[r["id"]] == a[r["id"]], f"request {r['id']} alone differs from the batch")
    check(a == b, "sampled outputs depend on the batching")


def eos(c):
    ck = c.checkpoint("--seed", "29")
    prompt = [5, 6, 7, 8, 9, 10, 11]
    base = c.requests([{"id": 0, "prompt_ids": prompt, "max_tokens": 12, "ignore_eos": True}])
    _, o = c.generate(ck, base)
    toks = o[0][0]["token_ids"]
    stop = toks[4]
    first = toks.index(stop)
    with open(os.path.join(ck, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [stop, 511]}, f)
    reqs = c.requests([{"id": 0, "prompt_ids": prompt, "max_tokens": 12},
                       {"id": 1, "prompt_ids": prompt, "max_tokens": 12, "ignore_eos": True}])
    s, o = c.reference(ck, reqs)
    check(o[0][0]["token_ids"] == toks[: first + 1] and o[0][0]["finish_reason"] == "stop",
          f"eos {stop}: {o[0][0]}, full run {toks}")
    check(o[1][0]["token_ids"] == toks and o[1][0]["finish_reason"] == "length", f"ignore_eos: {o[1][0]}")


def report(c):
    ck = c.checkpoint()
    reqs = c.requests(batch(random.Random(9), 512, count=4))
    d = os.path.join(c.tmp, "report")
    s, _ = c.generate(ck, reqs, "--report", d)
    rows = open(os.path.join(d, "steps.csv")).read().strip().split("\n")
    check(len(rows) == s["steps"] + 1, f"steps.csv has {len(rows) - 1} rows for {s['steps']} steps")
    with open(os.path.join(d, "summary.json")) as f:
        doc = json.load(f)
    for k in ["steps", "generated_tokens", "prompt_tokens", "preemptions_swap"]:
        check(doc[k] == s[k], f"summary.json {k} {doc[k]} != --json {s[k]}")
    svg = ET.parse(os.path.join(d, "chart.svg")).getroot()
    check(svg.tag == "{http://www.w3.org/2000/svg}svg", f"chart.svg root is {svg.tag}")
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    check(len(lines) == 4, f"chart.svg has {len(lines)} lines, expected one in each of 4 panels")
    for ln in lines:
        pts = ln.get("points").split()
        check(len(pts) == s["steps"], f"chart.svg line of {len(pts)} points for {s['steps']} steps")
    prom = open(os.path.join(d, "metrics.prom")).read()
    check("kvpager:" in prom, "metrics.prom holds no kvpager metric")
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        print("note: prometheus_client not installed; metrics.prom not parsed")
        return
    fams = list(text_string_to_metric_families(prom))
    check(len(fams) > 5, f"metrics.prom parsed to {len(fams)} families")


def write_st(path, tensors, header_patch=None, raw_header=None, truncate=None):
    """A safetensors file of {name: (dtype, shape, bytes)}; hooks to break it."""
    h, off, blob = {}, 0, b""
    for name, (dt, shape, data) in tensors.items():
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blob += data
    if header_patch:
        header_patch(h)
    hb = raw_header if raw_header is not None else json.dumps(h).encode()
    b = struct.pack("<Q", len(hb)) + hb + blob
    if truncate is not None:
        b = b[:truncate]
    with open(path, "wb") as f:
        f.write(b)


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    data = b[8 + n:]
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        out[k] = (v["dtype"], v["shape"], data[s:e])
    return out


def bad_input(c):
    good = c.checkpoint()
    tensors = read_st(os.path.join(good, "model.safetensors"))
    cfg = json.load(open(os.path.join(good, "config.json")))
    reqs_ok = c.requests([{"id": 1, "prompt_ids": [1, 2, 3], "max_tokens": 2}])
    cases = []

    def variant(name, st=None, config=None, files=None):
        d = os.path.join(c.tmp, "bad_" + name)
        shutil.copytree(good, d)
        if st:
            st(os.path.join(d, "model.safetensors"))
        if config:
            cc = json.loads(json.dumps(cfg))
            config(cc)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cc, f)
        if files:
            files(d)
        return d

    emb = "model.embed_tokens.weight"
    cases += [
        ("truncated", variant("truncated", st=lambda p: open(p, "wb").write(b"\x10\x00\x00")), "truncated"),
        ("header_past_end", variant("hdr", st=lambda p: write_st(p, tensors, raw_header=b"{}", truncate=None) or
                                     open(p, "r+b").write(struct.pack("<Q", 1 << 40))), "past the end"),
        ("not_json", variant("nj", st=lambda p: write_st(p, tensors, raw_header=b"{not json")), "not valid JSON"),
        ("not_object", variant("no", st=lambda p: write_st(p, tensors, raw_header=b"[1, 2]")), "not a JSON object"),
        ("offsets_outside", variant("oo", st=lambda p: write_st(p, tensors, header_patch=lambda h: h[emb].update(
            data_offsets=[h[emb]["data_offsets"][0], 1 << 40]))), "outside the file"),
        ("overlap", variant("ov", st=lambda p: write_st(p, tensors, header_patch=lambda h: h[
            "model.layers.0.post_attention_layernorm.weight"].update(
            data_offsets=h["model.layers.0.input_layernorm.weight"]["data_offsets"]))), "overlaps"),
        ("dtype_unsupported", variant("dt", st=lambda p: write_st(p, tensors, header_patch=lambda h: h[emb].update(
            dtype="I64"))), "dtype I64"),
        ("size_mismatch", variant("sz", st=lambda p: write_st(p, tensors, header_patch=lambda h: h[emb].update(
            dtype="F16"))), "bytes for a F16 tensor"),
        ("shape_vs_config", variant("shape", config=lambda cc: cc.update(vocab_size=cc["vocab_size"] * 2)),
         "model.embed_tokens.weight' has shape"),
        ("missing_tensor", variant("miss", st=lambda p: write_st(p, {k: v for k, v in tensors.items()
                                                                      if k != "model.norm.weight"})),
         "missing tensor 'model.norm.weight'"),
        ("config_missing_field", variant("cm", config=lambda cc: cc.pop("hidden_size")), "'hidden_size' is missing"),
        ("config_nonpositive", variant("cn", config=lambda cc: cc.update(num_hidden_layers=0)), "num_hidden_layers"),
        ("unknown_model_type", variant("mt", config=lambda cc: cc.update(model_type="gpt2")), "model_type 'gpt2'"),
        # A Gemma 2 config whose activation kvpager does not compute, and one whose tensors lack Gemma's extra norms.
        ("gemma2_activation", variant("ga", config=lambda cc: cc.update(model_type="gemma2", hidden_activation="relu")),
         "hidden_activation \"relu\" is not supported (gelu_pytorch_tanh)"),
        ("gemma2_norms", variant("gn", config=lambda cc: cc.update(model_type="gemma2",
                                                               hidden_activation="gelu_pytorch_tanh")),
         "missing tensor 'model.layers.0.pre_feedforward_layernorm.weight'"),
        ("rope_scaling", variant("rs", config=lambda cc: cc.update(rope_scaling={"rope_type": "yarn", "factor": 2})),
         "rope_type 'yarn'"),
        ("config_not_json", variant("cj", files=lambda d: open(os.path.join(d, "config.json"), "w").write("{")),
         "config.json: not valid JSON"),
        ("no_weights", variant("nw", files=lambda d: os.remove(os.path.join(d, "model.safetensors"))),
         "model.safetensors: cannot open"),
    ]
    for name, d, want in cases:
        p = run([c.gen, d, reqs_ok, "--quiet"])
        check(p.returncode == 2, f"{name}: exit {p.returncode}, want 2:\n{p.stderr}")
        check(want in p.stderr, f"{name}: message {p.stderr.strip()!r} does not say {want!r}")
    vocab = cfg["vocab_size"]
    lines = [
        ('{"prompt_ids": [1, 2], "max_tokens": 3}\n{"prompt_ids": [1, ', ":2: not valid JSON"),
        ('{"prompt_ids": []}', ":1: field 'prompt_ids' is empty"),
        ('{"prompt_ids": [1], "n": 0}', ":1: field 'n' must be in [1, 256]"),
        ('{"prompt_ids": [1], "max_tokens": -1}', ":1: field 'max_tokens' must be in"),
        ('{"prompt_ids": [%d]}' % vocab, "is outside the vocabulary"),
        ('{"prompt_ids": [%s]}' % ", ".join(["1"] * (cfg["max_position_embeddings"] + 1)), "longer than the model's context"),
        ('[1, 2]', ":1: not a JSON object"),
        ('{"prompt_ids": [1], "temperature": -1}', "field 'temperature' must not be negative"),
        ('{"prompt_ids": [1], "top_p": 0}', "field 'top_p' must be in (0, 1]"),
        ('{"prompt_ids": [1], "colour": 1}', "unknown field 'colour'"),
        ('{"id": 1, "prompt_ids": [1]}\n{"id": 1, "prompt_ids": [2]}', ":2: id 1 is used by an earlier request"),
        ('{"max_tokens": 3}', "required field 'prompt_ids' is missing"),
    ]
    for i, (text, want) in enumerate(lines):
        path = os.path.join(c.tmp, f"bad_req{i}.jsonl")
        open(path, "w").write(text + "\n")
        p = run([c.gen, good, path, "--quiet"])
        check(p.returncode == 2, f"request {text[:60]!r}: exit {p.returncode}, want 2:\n{p.stderr}")
        check(want in p.stderr and path in p.stderr, f"request {text[:60]!r}: message {p.stderr.strip()!r} lacks {want!r}")
    for opts, want in [(["--kv-dtype", "int4"], "--kv-dtype"), (["--block-size", "0"], "--block-size"),
                       (["--preemption", "never"], "--preemption"), (["--composition", "x"], "--composition"),
                       (["--block-size", "12"], "block size")]:
        p = run([c.gen, good, reqs_ok, "--quiet"] + opts)
        check(p.returncode == 2 and want in p.stderr, f"{opts}: exit {p.returncode}: {p.stderr.strip()}")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Procs:
    """Processes a check starts: each reaped (killed first if it still runs) when the check ends."""

    def __init__(self):
        self.procs = []

    def start(self, args):
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def finish(self, p, timeout=300):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            fail(f"{' '.join(p.args[:4])}... did not end within {timeout} s:\n{err[-2000:]}")
        return p.returncode, out, err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def tcp_state(port, state):
    """Whether /proc/net/tcp lists a socket on loopback port `port` in `state` (0A: listening, 01: established)."""
    try:
        lines = open("/proc/net/tcp").read().splitlines()[1:]
    except OSError:
        return False
    for line in lines:
        f = line.split()
        local, remote, st = f[1], f[2], f[3]
        if st == state and (int(local.split(":")[1], 16) == port or int(remote.split(":")[1], 16) == port):
            return True
    return False


def wait_for(cond, what, timeout=60):
    end = time.time() + timeout
    while not cond():
        check(time.time() < end, f"{what} did not happen within {timeout} s")
        time.sleep(0.01)


def read_outputs(path):
    return {o["id"]: [(x["token_ids"], x["finish_reason"]) for x in o["samples"]]
            for o in (json.loads(line) for line in open(path))}


def disagg_batch():
    reqs = batch(random.Random(5), 512, count=9, shared_len=60, tail=(5, 70), gen=(5, 20))
    reqs[3]["n"] = 3  # forks on the decode side, sampled with a seed
    reqs[3].update({"temperature": 0.9, "seed": 7})
    return reqs


def disaggregated(c):
    reqs = c.requests(disagg_batch())
    # A dense model (one KV cache group) and a sliding-window one (KV cache groups: the decode side takes, and reads,
    # only the window blocks its first computed token still reads).
    dense = c.checkpoint("--layers", "2", "--seed", "21")
    windowed = c.checkpoint("--family", "mistral", "--window", "24", "--layers", "2", "--seed", "23")
    for name, ck in (("dense", dense), ("sliding window", windowed)):
        _, single = c.generate(ck, reqs, "--num-blocks", "40")
        want = {k: [(x["token_ids"], x["finish_reason"]) for x in v] for k, v in single.items()}
        for decoders in ((1, 2) if name == "dense" else (1,)):
            got, received, bytes_, pre_s = disaggregated_run(c, ck, reqs, decoders)
            check(got == want, f"{name}, {decoders} decode instance(s): outputs differ from a single process's")
            check(pre_s["offered"] == 9 and pre_s["released"] == 9, f"{name}, prefill side: {pre_s}")
            check(received >= 7 and bytes_ > 0, f"{name}: KV read for {received} requests, {bytes_} bytes")
            print(f"ok disaggregated {name}, {decoders} decode instance(s): {received} reads, {bytes_} bytes")


def disaggregated_run(c, ck, reqs, decoders):
    """One prefill process and `decoders` decode processes over UCX: the outputs, reads, bytes, prefill's stats."""
    port = free_port()
    with Procs() as ps:
        pre = ps.start([c.gen, ck, reqs, "--role", "prefill", "--kv-listen", f"127.0.0.1:{port}", "--kv-peers",
                        str(decoders), "--json", "--quiet", "--num-blocks", "64", "--kv-timeout-ms", "20000"])
        decs, outs = [], []
        for k in range(decoders):
            out = os.path.join(c.tmp, f"decode{decoders}_{k}.jsonl")
            outs.append(out)
            decs.append(ps.start([c.gen, ck, reqs, "--role", "decode", "--kv-connect", f"127.0.0.1:{port}",
                                  "--kv-peers", str(decoders), "--kv-peer-index", str(k), "--output", out,
                                  "--reference", "--block-size", "32", "--num-blocks", "40", "--json", "--quiet",
                                  "--kv-timeout-ms", "20000"]))
        got, received, bytes_ = {}, 0, 0
        for d, out in zip(decs, outs):
            rc, so, se = ps.finish(d)
            check(rc == 0, f"decode exited {rc}: {se[-3000:]}")
            summ = json.loads(so)
            check(summ["reference"]["matched"], f"decode side against --reference: {summ['reference']}")
            received += summ["kv_transfer"]["received"]
            bytes_ += summ["kv_transfer_bytes"]
            check(summ["kv_transfer"]["failed"] == 0 and summ["kv_transfer"]["recomputed_locally"] == 0,
                  f"a transfer failed: {summ['kv_transfer']}")
            check(summ["kv_transfer_s"] > 0 and 0 < summ["kv_transfer"]["mean_share_of_ttft"] < 1,
                  f"transfer time: {summ['kv_transfer']}")
            got.update(read_outputs(out))
        rc, so, se = ps.finish(pre)
        check(rc == 0, f"prefill exited {rc}: {se[-3000:]}")
        pre_s = json.loads(so)["kv_transfer"]
    return got, received, bytes_, pre_s


def disaggregated_faults(c):
    ck = c.checkpoint("--layers", "2", "--seed", "21")
    reqs = c.requests(disagg_batch())
    _, single = c.generate(ck, reqs, "--num-blocks", "40")
    want = {k: [(x["token_ids"], x["finish_reason"]) for x in v] for k, v in single.items()}
    common = ["--json", "--quiet", "--num-blocks", "40", "--kv-timeout-ms", "3000"]
    # The prefill process killed while it is still computing prompts (a budget of 16 tokens a step makes it slow):
    # the decode side computes what it did not get; its outputs are still exactly a single process's.
    big = c.checkpoint("--layers", "4", "--hidden", "512", "--heads", "8", "--kv-heads", "2", "--intermediate",
                       "1024", "--vocab", "2048", "--seed", "3")
    rng = random.Random(9)
    long_reqs = c.requests([{"id": i, "prompt_ids": [rng.randrange(3, 2048) for _ in range(200)], "max_tokens": 4,
                             "ignore_eos": True} for i in range(24)], "long.jsonl")
    _, single_long = c.generate(big, long_reqs, "--num-blocks", "400")
    want_long = {k: [(x["token_ids"], x["finish_reason"]) for x in v] for k, v in single_long.items()}
    port = free_port()
    with Procs() as ps:
        pre = ps.start([c.gen, big, long_reqs, "--role", "prefill", "--kv-listen", f"127.0.0.1:{port}", "--json",
                        "--quiet", "--num-blocks", "400", "--max-num-batched-tokens", "16", "--threads", "1"])
        wait_for(lambda: tcp_state(port, "0A") or pre.poll() is not None, "the prefill process listening")
        out = os.path.join(c.tmp, "faults_decode.jsonl")
        dec = ps.start([c.gen, big, long_reqs, "--role", "decode", "--kv-connect", f"127.0.0.1:{port}", "--output",
                        out, "--json", "--quiet", "--num-blocks", "400", "--kv-timeout-ms", "3000"])
        wait_for(lambda: tcp_state(port, "01") or dec.poll() is not None, "the decode process connected")
        time.sleep(0.2)
        pre.send_signal(signal.SIGKILL)
        rc, so, se = ps.finish(dec)
        check(rc == 0, f"decode after the prefill process died: exit {rc}: {se[-3000:]}")
        kt = json.loads(so)["kv_transfer"]
        check(read_outputs(out) == want_long, "decode after the prefill process died: outputs differ")
        check(kt["recomputed_locally"] + kt["failed"] > 0,
              f"the prefill process was killed after it had offered everything (too fast to test): {kt}")
        print(f"prefill killed: {kt}")
        ps.finish(pre)
    # The decode process killed: the prefill side releases what it held for it and exits.
    port = free_port()
    with Procs() as ps:
        pre = ps.start([c.gen, ck, reqs, "--role", "prefill", "--kv-listen", f"127.0.0.1:{port}"] + common)
        dec = ps.start([c.gen, ck, reqs, "--role", "decode", "--kv-connect", f"127.0.0.1:{port}"] + common)
        time.sleep(0.3)
        dec.send_signal(signal.SIGKILL)
        rc, so, se = ps.finish(pre, timeout=120)
        check(rc == 0, f"prefill after the decode process died: exit {rc}: {se[-3000:]}")
        kt = json.loads(so)["kv_transfer"]
        check(kt["released"] == kt["offered"], f"prefill after the decode process died: {kt}")
        ps.finish(dec)
    # Nothing listening: a bounded wait, then a message naming the option.
    t0 = time.time()
    p = run([c.gen, ck, reqs, "--role", "decode", "--kv-connect", f"127.0.0.1:{free_port()}", "--quiet",
             "--kv-timeout-ms", "1500"])
    check(p.returncode == 1 and "--kv-connect" in p.stderr, f"nothing listening: exit {p.returncode}: {p.stderr}")
    check(time.time() - t0 < 60, "nothing listening: the wait was not bounded")
    for opts, want_msg in [(["--role", "middle"], "--role"), (["--role", "prefill"], "--kv-listen"),
                           (["--role", "decode"], "--kv-connect"),
                           (["--role", "decode", "--kv-connect", "localhost"], "HOST:PORT"),
                           (["--role", "decode", "--kv-connect", "127.0.0.1:1", "--kv-peers", "2",
                             "--kv-peer-index", "2"], "--kv-peer-index")]:
        p = run([c.gen, ck, reqs, "--quiet"] + opts)
        check(p.returncode == 2 and want_msg in p.stderr, f"{opts}: exit {p.returncode}: {p.stderr.strip()}")


CHECKS = {
    "pressure_swap": lambda c: pressure(c, "swap"),
    "pressure_recompute": lambda c: pressure(c, "recompute"),
    "pressure_hybrid": lambda c: pressure(c, "hybrid"),
    "tiny_budget": tiny_budget, "prefix": prefix, "host_tier": host_tier, "fork": fork, "kv_dtypes": kv_dtypes, "vllm_v1": vllm_v1,
    "window": window, "determinism": determinism, "eos": eos, "report": report, "bad_input": bad_input,
    "disaggregated": disaggregated, "disaggregated_faults": disaggregated_faults,
}


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in CHECKS:
        print(__doc__)
        sys.exit(2)
    with tempfile.TemporaryDirectory() as tmp:
        CHECKS[sys.argv[1]](Ctx(sys.argv[2], sys.argv[3], tmp))
    print("ok: " + sys.argv[1])


if __name__ == "__main__":
    main()
