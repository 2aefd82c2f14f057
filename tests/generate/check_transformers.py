#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kvpager-generate against Hugging Face transformers itself (eager attention, float32) on generated checkpoints.

For each model shape below, kvpager-make-checkpoint writes a random-weight checkpoint, kvpager-generate runs a batch of
greedy requests over it (shared prefixes, a pool small enough to preempt, a token budget that chunks the prompts), and
transformers' generate() runs each request alone. Greedy tokens must be identical and the logits of every generated
position within the tolerance (compared on kvpager's top ids, and the log-sum-exp); a divergence is accepted only at a
position where transformers' two best logits are within the tolerance (a near tie), and nothing after it is compared.

Exit status: 0 all matched, 1 a mismatch, 77 transformers or torch is not installed (ctest reports the test skipped).
  check_transformers.py --generate BIN --make-checkpoint BIN --work DIR [--quick]
"""
import argparse
import json
import os
import random
import subprocess
import sys


def wait_for_install(limit_s=480):
    """.ci/run installs torch and transformers in the background, beside the build: while it runs, the venv holds a
    file with the installer's pid. Wait for the install to end (or its process to be gone), at most limit_s."""
    import time
    marker = os.path.join(sys.prefix, ".kvpager-installing")
    deadline = time.monotonic() + limit_s
    said = False
    while os.path.exists(marker) and time.monotonic() < deadline:
        try:
            with open(marker) as f:
                pid = int(f.read().strip())
            if pid <= 0:
                return
            os.kill(pid, 0)  # the installer is still running
        except (OSError, ValueError):
            return  # its process is gone (or the file is unreadable): nothing to wait for
        if not said:
            print(f"waiting for the install of torch and transformers into {sys.prefix} to end", flush=True)
            said = True
        time.sleep(5)


wait_for_install()
try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
except ImportError as e:  # pragma: no cover - the skip path
    print(f"SKIP: transformers/torch not importable ({e}); install them (see .ci/run) to run this check")
    sys.exit(77)

TOL = 2e-3

# name, kvpager-make-checkpoint options, kvpager-generate options
CASES = [
    ("llama_gqa", ["--family", "llama", "--layers", "2", "--hidden", "256", "--heads", "4", "--kv-heads", "2"],
     ["--num-blocks", "24", "--max-num-batched-tokens", "48"]),
    ("llama_mqa_hd128_tied_v5", ["--family", "llama", "--layers", "3", "--hidden", "256", "--heads", "4", "--kv-heads",
                                 "1", "--head-dim", "128", "--tie", "--config-format", "5", "--shards", "3"],
     ["--num-blocks", "40", "--block-size", "8", "--preemption", "swap"]),
    ("llama3_rope_bf16", ["--family", "llama", "--hidden", "384", "--heads", "6", "--kv-heads", "2", "--dtype", "bf16",
                          "--rope-scaling", "llama3", "--rope-factor", "8", "--max-position", "256", "--rope-theta",
                          "500000"],
     ["--num-blocks", "30", "--preemption", "recompute", "--kv-dtype", "fp32"]),
    ("llama_linear_rope_f16", ["--family", "llama", "--hidden", "320", "--heads", "4", "--kv-heads", "4", "--head-dim",
                               "80", "--dtype", "f16", "--rope-scaling", "linear", "--rope-factor", "4"],
     ["--block-size", "32"]),
    ("qwen2_bias", ["--family", "qwen2", "--layers", "2", "--hidden", "512", "--heads", "8", "--kv-heads", "2"],
     ["--num-blocks", "26", "--max-num-batched-tokens", "32"]),
    ("mistral_window", ["--family", "mistral", "--layers", "2", "--hidden", "256", "--heads", "4", "--kv-heads", "1",
                        "--window", "24"],
     ["--num-blocks", "30"]),
    ("qwen2_window_v5", ["--family", "qwen2", "--hidden", "192", "--heads", "2", "--kv-heads", "1", "--head-dim", "96",
                         "--window", "17", "--config-format", "5"],
     ["--block-size", "8", "--max-num-batched-tokens", "40"]),
    # Hybrid layers (layer_types): served on KV cache groups (a sliding-window group releases its blocks while the
    # requests decode), under preemption.
    ("qwen2_layer_types_groups", ["--family", "qwen2", "--layers", "4", "--hidden", "256", "--heads", "4", "--kv-heads",
                                  "2", "--window", "20", "--layer-types", "sliding,full,sliding,full"],
     ["--num-blocks", "40", "--block-size", "8"]),
]
QUICK = {"llama_gqa", "qwen2_bias", "mistral_window", "qwen2_layer_types_groups"}

# Checkpoints written by transformers itself (its config classes and save_pretrained), weights drawn as
# kvpager-make-checkpoint draws them: name, config class, config arguments, save dtype, kvpager-generate options.
HF_WRITTEN = [
    ("hf_llama_gqa4", "LlamaConfig", dict(num_hidden_layers=3, hidden_size=384, num_attention_heads=8,
                                          num_key_value_heads=2, head_dim=48 * 2, intermediate_size=512),
     torch.float32, ["--num-blocks", "22", "--block-size", "8"]),
    ("hf_qwen2_mqa_bf16", "Qwen2Config", dict(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                                              num_key_value_heads=1, intermediate_size=384, tie_word_embeddings=True),
     torch.bfloat16, ["--num-blocks", "24", "--max-num-batched-tokens", "24"]),
    ("hf_mistral_window", "MistralConfig", dict(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                                                num_key_value_heads=2, intermediate_size=512, sliding_window=12),
     torch.float32, ["--num-blocks", "20", "--preemption", "recompute"]),
    ("hf_qwen2_layer_types", "Qwen2Config", dict(num_hidden_layers=3, hidden_size=256, num_attention_heads=4,
                                                 num_key_value_heads=2, intermediate_size=384, use_sliding_window=True,
                                                 sliding_window=13, max_window_layers=0,
                                                 layer_types=["full_attention", "sliding_attention",
                                                              "full_attention"]),
     torch.float32, ["--num-blocks", "36", "--block-size", "8"]),
    # Gemma 2: alternating sliding-window (even layers) and full layers on KV cache groups, the attention's logit soft
    # cap in the kernels (small enough to bite on these scores), query_pre_attn_scalar, the final logit soft cap.
    ("hf_gemma2_softcap", "Gemma2Config", dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                              num_key_value_heads=2, head_dim=64, intermediate_size=384,
                                              sliding_window=12, query_pre_attn_scalar=48,
                                              attn_logit_softcapping=4.0, final_logit_softcapping=8.0),
     torch.float32, ["--num-blocks", "40", "--block-size", "8", "--num-host-blocks", "48"]),
]


def hf_checkpoint(d, cls, kw, dtype):
    cfg = getattr(transformers, cls)(vocab_size=512, max_position_embeddings=1024, rms_norm_eps=1e-6, eos_token_id=2,
                                     bos_token_id=1, **kw)
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(torch.randn_like(p))
            elif "lm_head" in name:
                p.copy_(torch.randn_like(p) * 4 / p.shape[1] ** 0.5)
            else:
                gain = 0.5 if ("o_proj" in name or "down_proj" in name) else 1.0
                p.copy_(torch.randn_like(p) * gain / p.shape[1] ** 0.5)
    model.to(dtype).save_pretrained(d, safe_serialization=True)


def requests(vocab, rng, count=8):
    shared = [rng.randrange(3, vocab) for _ in range(64)]
    out = []
    for i in range(count):
        n = rng.randrange(5, 60)
        prompt = (shared[: rng.randrange(16, 64)] if i % 2 == 0 else []) + [rng.randrange(3, vocab) for _ in range(n)]
        out.append({"id": f"r{i}", "prompt_ids": prompt, "max_tokens": rng.randrange(20, 64), "ignore_eos": i % 3 == 0})
    return out


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if p.returncode != 0:
        print(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
        sys.exit(1)
    return p.stdout


def hf_generate(model, req, eos):
    ids = torch.tensor([req["prompt_ids"]], dtype=torch.long)
    eos_ids = None if req["ignore_eos"] else eos
    with torch.no_grad():
        g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=req["max_tokens"], do_sample=False,
                           output_logits=True, return_dict_in_generate=True, eos_token_id=eos_ids,
                           pad_token_id=eos[0], temperature=None, top_p=None, top_k=None)
    toks = g.sequences[0, ids.shape[1]:].tolist()
    logits = [x[0].double() for x in g.logits]
    return toks[: len(logits)], logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--generate", required=True)
    ap.add_argument("--make-checkpoint", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    failures = 0
    group_swaps = 0
    cases = [(n, mk, None, gen) for n, mk, gen in CASES]
    cases += [(n, None, (cls, kw, dt), gen) for n, cls, kw, dt, gen in HF_WRITTEN]
    for name, mk, hf, gen in cases:
        if a.quick and name not in QUICK:
            continue
        d = os.path.join(a.work, name)
        if mk is not None:
            run([a.make_checkpoint, d] + mk)
        else:
            hf_checkpoint(d, *hf)
        cfg = json.load(open(os.path.join(d, "config.json")))
        eos = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]]
        rng = random.Random(sum(map(ord, name)))
        reqs = requests(cfg["vocab_size"], rng)
        rp = os.path.join(d, "requests.jsonl")
        with open(rp, "w") as f:
            for r in reqs:
                f.write(json.dumps(r) + "\n")
        outp = os.path.join(d, "out.jsonl")
        summary = json.loads(run([a.generate, d, rp, "--output", outp, "--top-logits", "8", "--json", "--quiet"] + gen))
        got = {}
        for line in open(outp):
            o = json.loads(line)
            got[o["id"]] = o["samples"][0]
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
        model.eval()
        worst, ties, compared = 0.0, 0, 0
        bad = None
        for r in reqs:
            want, logits = hf_generate(model, r, eos)
            s = got[r["id"]]
            mine = s["token_ids"]
            for i in range(max(len(mine), len(want))):
                if i >= len(mine) or i >= len(want):
                    bad = bad or f"{r['id']}: {len(mine)} tokens, transformers {len(want)}"
                    break
                lg = logits[i]
                compared += 1
                for tid, tl in zip(s["top_ids"][i], s["top_logits"][i]):
                    worst = max(worst, abs(tl - lg[tid].item()))
                worst = max(worst, abs(s["lse"][i] - torch.logsumexp(lg, 0).item()))
                if mine[i] != want[i]:
                    top2 = torch.topk(lg, 2).values
                    if (top2[0] - top2[1]).item() <= TOL:
                        ties += 1
                    else:
                        bad = bad or f"{r['id']}: token {i} is {mine[i]}, transformers {want[i]}"
                    break
        # A checkpoint with sliding-window layers is served on KV cache groups whose window groups give blocks back.
        groups = summary.get("kv_groups", [])
        if "sliding_attention" in cfg.get("layer_types", []) or cfg.get("sliding_window"):
            released = sum(g["released_blocks"] for g in groups if g["kind"].startswith("sliding_window"))
            if summary["kv"]["composition"] == "kv_groups" and released == 0:
                bad = bad or f"kv_groups: no window group released a block ({groups})"
        # Under memory pressure with a host pool big enough for a victim (--num-host-blocks given), the cache swaps
        # (with KV cache groups, every group's table of the victim moves); the groups' swaps are counted below.
        if "--num-host-blocks" in gen and summary["preemptions_recompute"] > 0 and summary["preemptions_swap"] == 0:
            bad = bad or "preempted only by recompute although the host pool has room"
        if summary["kv"]["composition"] == "kv_groups":
            group_swaps += summary["preemptions_swap"]
        ok = bad is None and worst <= TOL
        pre = f"{summary['preemptions_swap']} swap + {summary['preemptions_recompute']} recompute"
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {len(reqs)} requests, {compared} positions, max logit diff "
              f"{worst:.2e} (tol {TOL}), near ties {ties}, preemptions {pre}, prefix hit "
              f"{100 * summary['prefix_hit_rate']:.0f}%, steps {summary['steps']}" +
              (f", groups {[(g['kind'], g['peak_blocks'], g['released_blocks']) for g in groups]}" if groups else "") +
              (f"  [{bad}]" if bad else ""))
        failures += not ok
    if group_swaps == 0:
        print("FAIL: no checkpoint served on KV cache groups was preempted by swap")
        failures += 1
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
