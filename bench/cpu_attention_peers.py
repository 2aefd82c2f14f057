#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kvpager's CPU attention beside IPEX and torch SDPA on the same inputs, in one run (issue 27, point 4).

Run through bench/cpu_attention_peers.sh, which installs torch and intel-extension-for-pytorch into a venv first:

    bench/cpu_attention_peers.sh                       # the whole grid, markdown table at the end
    bench/cpu_attention_peers.sh -- --quick            # a few cases
    build/peers-venv/bin/python bench/cpu_attention_peers.py --lib build/default/kernels/libkvpager_kernels.so

What is compared, per case (every implementation gets the same K, V and query values, each in its own layout):
  decode   kvpager_cpu_paged_attention_decode (C ABI through ctypes; pool [blocks, 2, kv_heads, 16, dim], shuffled
           block table) | IPEX's PagedAttention.single_query_cached_kv_attention (key and value caches apart, each
           [blocks, kv_heads, 16, dim], the layout its reshape_and_cache writes; the same shuffled block table) |
           torch SDPA on contiguous [batch, heads, ctx, dim] K/V. torch 2.8's CPU SDPA has no fused kernel for
           enable_gqa=True (it takes the math path, 3-5x slower here), so by default SDPA gets K/V expanded to the
           query heads once before timing, as HF transformers' repeat_kv does (--sdpa-gqa enable: enable_gqa=True).
  prefill  one sequence: q_len new tokens over a cached prefix (their K/V already in the cache), causal.
           kvpager_cpu_paged_attention_prefill | IPEX's PagedAttention.flash_attn_varlen_func (paged, causal, the
           same caches as decode) | torch SDPA (is_causal=True without a prefix, else a bottom-right causal boolean
           mask built before timing).
Each output is checked against an fp64 reference (max abs error printed; a MISMATCH line when it exceeds 4 ulps of
the output type at the reference's largest magnitude). Timing: for each thread count (torch.set_num_threads and
kvpager's num_threads), R rounds; each round runs every implementation once, in an order rotated each round, and
one sample is a pass over L copies of the KV ("layers", L such that they hold at least 128 MiB, as an engine's step
walks its layers: a small pool is then not in cache when its call starts); the reported time is the best sample per
call. The load average is recorded before and after, and its 1-minute figure at each case and thread count (the
table's "load" column). kvpager rate: KV bytes read per second (decode) or the FLOPs the causal mask requires
(4 x dim x q_heads x visible positions) per second (prefill).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import sys
import time
import warnings

import torch

BLOCK = 16
DIM = 128
DTYPES = {"bf16": (torch.bfloat16, 2, 2.0**-7), "fp16": (torch.float16, 1, 2.0**-10)}  # torch, kvpager id, epsilon


def cpu_model() -> str:
    """The model name, and family/model numbers (a VM may show only "AMD EPYC")."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = (x.strip() for x in line.split(":", 1))
                    info.setdefault(k, v)
    except OSError:
        pass
    name = info.get("model name", platform.processor() or "unknown")
    if "cpu family" in info:
        name += f" (family {info['cpu family']} model {info.get('model', '?')})"
    return name


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def load1() -> float:
    return float(loadavg().split()[0])


# ------------------------------------------------------------------------------------------------------ kvpager (C ABI)
class Kvpager:
    """libkvpager_kernels through ctypes: the positional C functions of include/kvpager/c/kernels.h."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        i32, f32, vp = ctypes.c_int32, ctypes.c_float, ctypes.c_void_p
        self.lib.kvpager_cpu_paged_attention_decode.restype = i32
        self.lib.kvpager_cpu_paged_attention_decode.argtypes = [vp] * 5 + [i32] * 7 + [f32, i32, i32]
        self.lib.kvpager_cpu_paged_attention_prefill.restype = i32
        self.lib.kvpager_cpu_paged_attention_prefill.argtypes = [vp] * 6 + [i32] * 7 + [f32, i32, f32, i32, i32]
        self.lib.kvpager_status_string.restype = ctypes.c_char_p
        self.lib.kvpager_status_string.argtypes = [i32]
        self.lib.kvpager_cpu_decode_path.restype = ctypes.c_char_p
        self.lib.kvpager_version.restype = i32
        v = self.lib.kvpager_version()
        self.version = f"{v // 10000}.{v // 100 % 100}.{v % 100}"
        self.path = self.lib.kvpager_cpu_decode_path().decode()

    def check(self, rc: int) -> None:
        if rc != 0:
            raise RuntimeError(self.lib.kvpager_status_string(rc).decode())


def ptr(t: torch.Tensor) -> ctypes.c_void_p:
    assert t.is_contiguous()
    return ctypes.c_void_p(t.data_ptr())


# ------------------------------------------------------------------------------------------------------------- inputs
class Inputs:
    """One case's K, V (logical [batch, kv_len, kv_heads, dim]), query and block table, and each implementation's
    copy of the KV in its own layout, replicated over `layers` copies."""

    def __init__(self, batch, kv_len, hq, hkv, dtype, q_len, layers, seed):
        self.batch, self.kv_len, self.hq, self.hkv, self.q_len, self.layers = batch, kv_len, hq, hkv, q_len, layers
        self.dtype = dtype
        g = torch.Generator().manual_seed(seed)
        self.nb = (kv_len + BLOCK - 1) // BLOCK
        self.num_blocks = batch * self.nb
        # One sequence at a time through fp32, so the peak stays near one copy of the KV in 16 bits.
        self.k = torch.empty(batch, kv_len, hkv, DIM, dtype=dtype)
        self.v = torch.empty_like(self.k)
        for b in range(batch):
            self.k[b] = torch.randn(kv_len, hkv, DIM, generator=g).to(dtype)
            self.v[b] = torch.randn(kv_len, hkv, DIM, generator=g).to(dtype)
        self.q = torch.randn(batch * q_len, hq, DIM, generator=g).to(dtype)  # [tokens, heads, dim], sequence-major
        self.table = torch.randperm(self.num_blocks, generator=g).to(torch.int32).view(batch, self.nb).contiguous()
        self.lens = torch.full((batch,), kv_len, dtype=torch.int32)
        self.scale = 1.0 / math.sqrt(DIM)

    def paged(self, x: torch.Tensor) -> torch.Tensor:
        """x [batch, kv_len, hkv, dim] as blocks [num_blocks, hkv, BLOCK, dim] placed through the block table."""
        pad = self.nb * BLOCK - self.kv_len
        blocks = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)).view(self.batch, self.nb, BLOCK, self.hkv, DIM)
        out = torch.zeros(self.num_blocks, self.hkv, BLOCK, DIM, dtype=x.dtype)
        out[self.table.view(-1).long()] = blocks.permute(0, 1, 3, 2, 4).reshape(-1, self.hkv, BLOCK, DIM)
        return out

    def kvpager_pool(self) -> torch.Tensor:
        pool = torch.empty(self.num_blocks, 2, self.hkv, BLOCK, DIM, dtype=self.dtype)
        pool[:, 0] = self.paged(self.k)
        pool[:, 1] = self.paged(self.v)
        return pool

    def reference(self) -> torch.Tensor:
        """fp64 attention, [batch * q_len, hq, dim]: row i of a sequence sits at kv_len - q_len + i (causal)."""
        out = torch.empty(self.batch * self.q_len, self.hq, DIM, dtype=torch.float64)
        g = self.hq // self.hkv
        pos = torch.arange(self.q_len) + self.kv_len - self.q_len
        masked = torch.arange(self.kv_len)[None, :] > pos[:, None]  # [q_len, kv_len]
        for b in range(self.batch):
            q = self.q[b * self.q_len:(b + 1) * self.q_len].double().view(self.q_len, self.hkv, g, DIM)
            for h in range(self.hkv):  # one KV head at a time: the scores stay small at long contexts
                k = self.k[b, :, h].double()
                v = self.v[b, :, h].double()
                s = torch.einsum("qgd,td->gqt", q[:, h], k) * self.scale
                s.masked_fill_(masked, float("-inf"))
                o = torch.einsum("gqt,td->qgd", torch.softmax(s, dim=-1), v)
                out[b * self.q_len:(b + 1) * self.q_len, h * g:(h + 1) * g] = o
        return out


# ------------------------------------------------------------------------------------------------------ the contenders
class KvpagerImpl:
    name = "kvpager"

    def __init__(self, kp: Kvpager, inp: Inputs, kind: str, kvid: int):
        self.kp, self.inp, self.kind, self.kvid = kp, inp, kind, kvid
        pool = inp.kvpager_pool()
        self.pools = [pool] + [pool.clone() for _ in range(inp.layers - 1)]
        self.out = torch.empty_like(inp.q)
        self.qo = torch.arange(inp.batch + 1, dtype=torch.int32) * inp.q_len
        self.threads = 1
        i = inp
        if kind == "decode":
            f = kp.lib.kvpager_cpu_paged_attention_decode
            self.calls = [(f, (ptr(self.out), ptr(i.q), ptr(p), ptr(i.table), ptr(i.lens), i.batch, i.hq, i.hkv, DIM,
                               BLOCK, i.nb, i.num_blocks, i.scale, kvid)) for p in self.pools]
        else:
            f = kp.lib.kvpager_cpu_paged_attention_prefill
            self.calls = [(f, (ptr(self.out), ptr(i.q), ptr(p), ptr(self.qo), ptr(i.table), ptr(i.lens), i.batch, i.hq,
                               i.hkv, DIM, BLOCK, i.nb, i.num_blocks, i.scale, -1, 0.0, kvid)) for p in self.pools]

    def run(self, layer: int) -> None:
        f, args = self.calls[layer]
        rc = f(*args, self.threads)
        if rc != 0:
            self.kp.check(rc)

    def output(self) -> torch.Tensor:
        return self.out


class IpexImpl:
    name = "IPEX"

    def __init__(self, ipex, inp: Inputs, kind: str):
        self.pa = ipex.llm.modules.PagedAttention
        self.inp, self.kind = inp, kind
        kc, vc = inp.paged(inp.k), inp.paged(inp.v)
        self.caches = [(kc, vc)] + [(kc.clone(), vc.clone()) for _ in range(inp.layers - 1)]
        self.out = torch.empty_like(inp.q)
        self.head_mapping = (torch.arange(inp.hq) // (inp.hq // inp.hkv)).to(torch.int32)
        self.cu_q = torch.arange(inp.batch + 1, dtype=torch.int32) * inp.q_len
        self.cu_kv = torch.arange(inp.batch + 1, dtype=torch.int32) * inp.kv_len

    def run(self, layer: int) -> None:
        i = self.inp
        kc, vc = self.caches[layer]
        if self.kind == "decode":
            self.pa.single_query_cached_kv_attention(self.out, i.q, kc, vc, self.head_mapping, i.scale, i.table,
                                                     i.lens, BLOCK, i.kv_len, None)
        else:
            self.pa.flash_attn_varlen_func(self.out, i.q, kc, vc, self.cu_q, self.cu_kv, i.q_len, i.kv_len, i.scale,
                                           True, i.table, None)

    def output(self) -> torch.Tensor:
        return self.out


class SdpaImpl:
    name = "SDPA"

    def __init__(self, inp: Inputs, kind: str, gqa: str):
        self.inp, self.kind = inp, kind
        g = inp.hq // inp.hkv
        self.enable_gqa = gqa == "enable" and g > 1
        rep = 1 if self.enable_gqa else g

        def layout(x):  # [batch, kv_len, hkv, dim] -> contiguous [batch, heads, kv_len, dim]
            x = x.permute(0, 2, 1, 3)
            return (x.repeat_interleave(rep, dim=1) if rep > 1 else x).contiguous()

        k, v = layout(inp.k), layout(inp.v)
        self.kv = [(k, v)] + [(k.clone(), v.clone()) for _ in range(inp.layers - 1)]
        self.q = inp.q.view(inp.batch, inp.q_len, inp.hq, DIM).permute(0, 2, 1, 3).contiguous()
        self.mask = None
        self.causal = kind == "prefill" and inp.q_len == inp.kv_len
        if kind == "prefill" and not self.causal:
            # Bottom-right aligned: row i sees positions <= kv_len - q_len + i (SDPA's is_causal is top-left).
            self.mask = torch.ones(inp.q_len, inp.kv_len, dtype=torch.bool).tril(inp.kv_len - inp.q_len)
        self.out = None
        self.kwargs = {"enable_gqa": True} if self.enable_gqa else {}

    def run(self, layer: int) -> None:
        k, v = self.kv[layer]
        self.out = torch.nn.functional.scaled_dot_product_attention(
            self.q, k, v, attn_mask=self.mask, is_causal=self.causal, scale=self.inp.scale, **self.kwargs)

    def output(self) -> torch.Tensor:
        return self.out.permute(0, 2, 1, 3).reshape(-1, self.inp.hq, DIM)


# ------------------------------------------------------------------------------------------------------------- timing
def best_times(impls, threads: int, rounds: int, layers: int) -> dict[str, float]:
    """Seconds per call, best sample of `rounds` interleaved rounds (order rotated each round)."""
    torch.set_num_threads(threads)
    for im in impls:
        if isinstance(im, KvpagerImpl):
            im.threads = threads
    with torch.inference_mode():
        for im in impls:  # warm-up: thread pools, pages, lazily built kernels
            im.run(0)
        best = {im.name: math.inf for im in impls}
        for r in range(rounds):
            for j in range(len(impls)):
                im = impls[(r + j) % len(impls)]
                # OpenMP's workers spin for a while after a torch call; let them sleep before the next one is timed.
                time.sleep(0.01)
                t0 = time.perf_counter()
                for layer in range(layers):
                    im.run(layer)
                best[im.name] = min(best[im.name], (time.perf_counter() - t0) / layers)
    return best


def layers_for(pool_bytes: int, min_bytes: int) -> int:
    return max(1, -(-min_bytes // pool_bytes))


# -------------------------------------------------------------------------------------------------------------- table
def print_table(env: dict, rows: list[dict]) -> None:
    """The summary line and the markdown table (also re-printed from a saved run by --from-json)."""
    print()
    print(f"CPU: {env['cpu']} ({env['cores']} cores, {env['isa']}); torch {env['torch']}, IPEX {env['ipex']}, "
          f"kvpager {env['kvpager']}; load average before {env['load_before']}, after {env['load_after']} (1-min at "
          f"the cases {env['load1_during']}); best of {env['rounds']} interleaved rounds; SDPA: {env['sdpa_gqa']}; "
          f"{env['run_seconds']} s")
    print()
    names = [n for n in ("kvpager", "IPEX", "SDPA") if rows and n in rows[0]["seconds"]]
    head = ["case", "threads", "load"] + [f"{n} ms" for n in names] + [f"kvpager/{n}" for n in names[1:]] + \
        ["kvpager rate", "max abs err " + " / ".join(names)]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        if r["kind"] == "decode":
            case = f"decode {r['dtype']} b{r['batch']} ctx {r['kv_len']} {r['hq']}/{r['hkv']}"
            rate = f"{r['kvpager_rate']:.1f} GB/s"
        else:
            case = f"prefill bf16 q {r['q_len']} + prefix {r['kv_len'] - r['q_len']} {r['hq']}/{r['hkv']}"
            rate = f"{r['kvpager_rate']:.0f} GFLOP/s"
        s = r["seconds"]
        cells = [case, str(r["threads"]), f"{r['load1']:.2f}"] + [f"{s[n] * 1e3:.3f}" for n in names] + \
            [f"{s['kvpager'] / s[n]:.2f}" for n in names[1:]] + \
            [rate, " / ".join(f"{r['max_abs_err'][n]:.1e}" for n in names)]
        print("| " + " | ".join(cells) + " |")


# --------------------------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default="build/default/kernels/libkvpager_kernels.so")
    # None: the grid's value below (or --quick's); an option given explicitly wins over --quick.
    ap.add_argument("--rounds", type=int, help="interleaved rounds per case and thread count, best of (5)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batches", help="decode batch sizes (1,8)")
    ap.add_argument("--contexts", help="decode context lengths (1024,4096,16384)")
    ap.add_argument("--heads", default="32/8,32/32", help="query/KV heads")
    ap.add_argument("--dtypes", help="decode KV (and query) types (bf16,fp16)")
    ap.add_argument("--q-lens", help="prefill query rows (256,1024)")
    ap.add_argument("--prefixes", help="prefill cached prefix (0,2048)")
    ap.add_argument("--min-layer-mib", type=int, default=128, help="KV copies so a pass reads at least this")
    ap.add_argument("--sdpa-gqa", choices=["expand", "enable"], default="expand")
    ap.add_argument("--no-ipex", action="store_true")
    ap.add_argument("--skip", default="", help="comma list: decode, prefill")
    ap.add_argument("--quick", action="store_true", help="a few small cases, 3 rounds")
    ap.add_argument("--json", help="write every result here too")
    ap.add_argument("--from-json", help="print the table of a run saved with --json, run nothing")
    a = ap.parse_args()
    if a.from_json:
        with open(a.from_json) as f:
            saved = json.load(f)
        print_table(saved["env"], saved["rows"])
        return 0
    grid = {"rounds": 5, "batches": "1,8", "contexts": "1024,4096,16384", "dtypes": "bf16,fp16",
            "q_lens": "256,1024", "prefixes": "0,2048"}
    if a.quick:
        grid.update(rounds=3, batches="1", contexts="1024", dtypes="bf16", q_lens="256")
    for k, v in grid.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    ints = lambda s: [int(x) for x in s.split(",") if x]
    thread_counts = ints(a.threads)

    load_before = loadavg()
    start = time.perf_counter()
    kp = Kvpager(a.lib)
    ipex = None
    ipex_note = "not installed"
    if not a.no_ipex:
        try:
            # IPEX checks the torch minor itself at import, and then fails on a typo (os.exit): check it here.
            from importlib.metadata import version as dist_version
            ipex_dist = dist_version("intel_extension_for_pytorch")
            if ipex_dist.split(".")[:2] != torch.__version__.split(".")[:2]:
                raise ImportError(f"intel-extension-for-pytorch {ipex_dist} needs torch "
                                  f"{'.'.join(ipex_dist.split('.')[:2])}.*, this is torch {torch.__version__}")
            # IPEX prints a page of "Overriding a previously registered kernel" on stderr at import: hidden.
            saved = os.dup(2)
            try:
                with open(os.devnull, "w") as null, warnings.catch_warnings():
                    os.dup2(null.fileno(), 2)
                    warnings.simplefilter("ignore")
                    import intel_extension_for_pytorch as ipex  # noqa: F811
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            ipex_note = ipex.__version__
        except Exception as e:  # ImportError, or IPEX refusing this torch
            ipex = None
            ipex_note = f"missing ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    else:
        ipex_note = "skipped (--no-ipex)"

    flags = cpu_flags()
    env = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "isa": ",".join(f for f in ("avx512f", "avx512_bf16", "amx_tile", "amx_bf16") if f in flags),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "ipex": ipex_note,
        "kvpager": f"{kp.version}, decode path {kp.path}",
        "lib": a.lib,
        "load_before": load_before,
        "rounds": a.rounds,
        "sdpa_gqa": "enable_gqa=True" if a.sdpa_gqa == "enable" else "K/V expanded to the query heads",
    }
    print("# kvpager vs IPEX vs torch SDPA, CPU attention")
    for k, v in env.items():
        print(f"#   {k}: {v}")
    if ipex is None:
        print("# IPEX is missing: only torch SDPA is compared")
    sys.stdout.flush()

    rows, mismatches, loads = [], 0, [load1()]
    heads = [tuple(int(x) for x in h.split("/")) for h in a.heads.split(",")]
    skip = set(a.skip.split(","))
    cases = []
    if "decode" not in skip:
        for dt in a.dtypes.split(","):
            for hq, hkv in heads:
                for b in ints(a.batches):
                    for ctx in ints(a.contexts):
                        cases.append(("decode", dt, hq, hkv, b, 1, ctx))
    if "prefill" not in skip:
        for hq, hkv in heads:
            for ql in ints(a.q_lens):
                for pre in ints(a.prefixes):
                    cases.append(("prefill", "bf16", hq, hkv, 1, ql, pre + ql))

    for n, (kind, dt, hq, hkv, batch, q_len, kv_len) in enumerate(cases):
        tdt, kvid, eps = DTYPES[dt]
        pool_bytes = batch * ((kv_len + BLOCK - 1) // BLOCK) * BLOCK * 2 * hkv * DIM * 2
        layers = layers_for(pool_bytes, a.min_layer_mib << 20) if kind == "decode" else 1
        t0 = time.perf_counter()
        inp = Inputs(batch, kv_len, hq, hkv, tdt, q_len, layers, seed=1000 + n)
        impls = [KvpagerImpl(kp, inp, kind, kvid)]
        if ipex is not None:
            impls.append(IpexImpl(ipex, inp, kind))
        impls.append(SdpaImpl(inp, kind, a.sdpa_gqa))
        ref = inp.reference()
        inp.k = inp.v = None  # every implementation has its own copy now
        errs = {}
        torch.set_num_threads(max(thread_counts))
        with torch.inference_mode():
            for im in impls:
                im.run(0)
                errs[im.name] = (im.output().double() - ref).abs().max().item()
        refmax = ref.abs().max().item()
        tol = 4 * eps * refmax
        if kind == "decode":
            label = f"decode {dt} b{batch} ctx{kv_len} {hq}/{hkv}"
        else:
            label = f"prefill bf16 q{q_len} prefix{kv_len - q_len} {hq}/{hkv}"
        err_txt = ", ".join(f"{k} {v:.2e}" for k, v in errs.items())
        print(f"{label}: layers {layers}, max |ref| {refmax:.3f}, max abs err vs fp64: {err_txt} "
              f"(setup {time.perf_counter() - t0:.1f} s)")
        for k, v in errs.items():
            if not v <= tol:
                mismatches += 1
                print(f"MISMATCH {label}: {k} max abs err {v:.3e} > {tol:.3e}")
        for th in thread_counts:
            loads.append(load1())
            best = best_times(impls, th, a.rounds, layers)
            kv_bytes = batch * kv_len * 2 * hkv * DIM * 2
            flops = 4.0 * DIM * hq * batch * sum(kv_len - q_len + i + 1 for i in range(q_len))
            row = {"kind": kind, "dtype": dt, "hq": hq, "hkv": hkv, "batch": batch, "q_len": q_len,
                   "kv_len": kv_len, "threads": th, "layers": layers, "load1": loads[-1],
                   "seconds": best, "max_abs_err": errs, "max_abs_ref": refmax,
                   "kvpager_rate": (kv_bytes / best["kvpager"] / 1e9) if kind == "decode"
                   else (flops / best["kvpager"] / 1e9)}
            rows.append(row)
            ratio = ", ".join(f"kvpager/{k} {best['kvpager'] / v:.2f}" for k, v in best.items() if k != "kvpager")
            times = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in best.items())
            print(f"  {th} thread(s): {times}; {ratio}")
            sys.stdout.flush()
        del impls, inp, ref

    env["load_after"] = loadavg()
    env["load1_during"] = f"{min(loads):.2f}-{max(loads):.2f}"
    env["run_seconds"] = round(time.perf_counter() - start)
    print_table(env, rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)
    if mismatches:
        print(f"\n{mismatches} output(s) disagree with the fp64 reference (MISMATCH lines above)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
