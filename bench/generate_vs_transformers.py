#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kvpager-generate against Hugging Face transformers (sdpa attention, float32) on one generated checkpoint, same
machine, same run, same threads: prefill and decode tokens/s at batch 1, 16 and 64 and context 512 and 2048, 128 new
tokens per sequence (greedy, eos ignored), every sequence its own prompt (no prefix hits). From kvpager's summary also
the share of the wall time in the scheduler + cache + exports, in GEMM and in attention, and the largest KV slack
(allocated slots not holding a token) per running sequence.

  build/hf-venv/bin/python bench/generate_vs_transformers.py --generate build/default/tools/kvpager-generate \
      --make-checkpoint build/default/tools/kvpager-make-checkpoint --work /tmp/genbench [--threads 2] [--quick]

Prints a Markdown table (bench/RESULTS.md records it with this command).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

import torch
from transformers import AutoModelForCausalLM

NEW_TOKENS = 128


def kvpager_run(a, model_dir, batch, context, work):
    rng = random.Random(batch * 100003 + context)
    path = os.path.join(work, f"req_{batch}_{context}.jsonl")
    prompts = [[rng.randrange(3, a.vocab) for _ in range(context)] for _ in range(batch)]
    with open(path, "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": i, "prompt_ids": p, "max_tokens": NEW_TOKENS, "ignore_eos": True}) + "\n")
    block = 16
    blocks = batch * ((context + NEW_TOKENS + block - 1) // block) + 8  # room for all: no preemption in a speed run
    cmd = [a.generate, model_dir, path, "--json", "--quiet", "--threads", str(a.threads), "--num-blocks", str(blocks),
           "--max-num-seqs", str(batch), "--max-num-batched-tokens", str(a.budget), "--max-model-len",
           str(context + NEW_TOKENS)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return prompts, json.loads(out)


def hf_run(model, prompts):
    ids = torch.tensor(prompts, dtype=torch.long)
    batch, context = ids.shape
    with torch.inference_mode():
        t0 = time.perf_counter()
        model(input_ids=ids, use_cache=True, logits_to_keep=1)  # the prefill alone, logits of the last row as generate
        prefill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        total_s = time.perf_counter() - t0
    assert out.shape[1] == context + NEW_TOKENS
    decode_s = max(total_s - prefill_s, 1e-9)
    return {"prefill_tokens_per_s": batch * context / prefill_s,
            "decode_tokens_per_s": batch * (NEW_TOKENS - 1) / decode_s,
            "generated_tokens_per_s": batch * NEW_TOKENS / total_s, "wall_s": total_s}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--generate", required=True)
    ap.add_argument("--make-checkpoint", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--budget", type=int, default=2048, help="kvpager's --max-num-batched-tokens")
    ap.add_argument("--quick", action="store_true", help="batch 1 and 16 at context 512 only")
    ap.add_argument("--layers", default="4")
    ap.add_argument("--hidden", default="512")
    ap.add_argument("--heads", default="8")
    ap.add_argument("--kv-heads", default="2")
    ap.add_argument("--intermediate", default="1024")
    ap.add_argument("--vocab", type=int, default=2048)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    model_dir = os.path.join(a.work, "llama")
    subprocess.run([a.make_checkpoint, model_dir, "--layers", a.layers, "--hidden", a.hidden, "--heads", a.heads,
                    "--kv-heads", a.kv_heads, "--intermediate", a.intermediate, "--vocab", str(a.vocab), "--max-position",
                    "4096", "--seed", "1"], check=True, capture_output=True)
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.inference_mode():  # warm-up
        model.generate(input_ids=torch.tensor([[5, 6, 7]]), max_new_tokens=4, do_sample=False, pad_token_id=0)
    grid = [(1, 512), (16, 512)] if a.quick else [(b, c) for c in (512, 2048) for b in (1, 16, 64)]
    print(f"llama {a.layers} layers, hidden {a.hidden}, {a.heads}/{a.kv_heads} heads, intermediate {a.intermediate}, vocab {a.vocab}, "
          f"fp32; {NEW_TOKENS} new tokens; {a.threads} threads (torch {torch.__version__})\n")
    print("| batch | context | prefill tok/s kvpager / transformers (x) | decode tok/s kvpager / transformers (x) "
          "| generated tok/s kvpager / transformers (x) | kvpager time: scheduler+cache / GEMM / attention "
          "| KV slack max (tokens/seq) |")
    print("|---|---|---|---|---|---|---|")
    for batch, context in grid:
        prompts, k = kvpager_run(a, model_dir, batch, context, a.work)
        h = hf_run(model, prompts)
        ts = k["time_share"]

        def cell(key):
            return f"{k[key]:.0f} / {h[key]:.0f} ({k[key] / h[key]:.1f}x)"

        print(f"| {batch} | {context} | {cell('prefill_tokens_per_s')} | {cell('decode_tokens_per_s')} "
              f"| {cell('generated_tokens_per_s')} | {100 * ts['scheduler_cache_exports']:.2f}% / "
              f"{100 * ts['gemm']:.0f}% / {100 * ts['attention']:.0f}% | {k['kv_slack_tokens_per_seq_max']:.1f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
