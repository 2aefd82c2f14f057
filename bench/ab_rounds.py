#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Interleaved rounds of one Google Benchmark binary under several environments (A/B on a shared, noisy machine):
#   bench/ab_rounds.py ROUNDS FILTER BIN:ENV=VAL,ENV=VAL ... (e.g. LD_LIBRARY_PATH=<a build of the library>,
#   KVPAGER_DECODE_PREFETCH=t1); prints per benchmark and configuration the median/max/min of x_read (decode), else
#   ns_per_token_kv_head, x_bound or real_time, over the rounds. The roofline is skipped (KVPAGER_BENCH_NO_ROOFLINE).
import subprocess, sys, os, re, json, statistics
rounds=int(sys.argv[1]); filt=sys.argv[2]; cfgs=sys.argv[3:]
res={}
for r in range(rounds):
    for c in cfgs:
        b,_,envs=c.partition(':')
        env=dict(os.environ, KVPAGER_BENCH_NO_ROOFLINE='1')
        for kv in filter(None,envs.split(',')):
            k,v=kv.split('='); env[k]=v
        out=subprocess.run([b,'--benchmark_filter='+filt,'--benchmark_min_time=0.2','--benchmark_format=json'],env=env,capture_output=True,text=True).stdout
        for bm in json.loads(out)['benchmarks']:
            n=bm['name'].replace('ctx/kv_heads/dtype/threads/','').replace('/manual_time','').replace('kv_heads/dtype/','')
            v=bm.get('x_read') or bm.get('ns_per_token_kv_head') or bm.get('x_bound') or bm['real_time']
            res.setdefault(n,{}).setdefault(c,[]).append(v)
for n,d in res.items():
    print(f"{n:55s}", "  ".join(f"{statistics.median(v):8.3f}/{max(v):6.3f}/{min(v):6.3f}" for v in d.values()))
print("cols:", cfgs, "(median/max/min)")
