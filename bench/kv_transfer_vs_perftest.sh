#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# KV transfer over UCX (bench_kv_transfer) beside ucx_perftest (Debian's ucx-utils) on the same transports, in one run,
# rounds interleaved, best of N (issue 26, point 5). Two transport sets:
#   detect   the transports that detect a dead peer (UCX peer error handling: TCP here): ucx_transport's default,
#            ucx_perftest -e
#   all      every transport UCX has (shared memory, cma): ucx_options::detect_peer_failure = false, ucx_perftest;
#            the sender's pools ordinary memory registered with UCX (read through cma)
#   all-ucx  the same, the sender's pools allocated by UCX (ucx_transport::allocate_memory: shared memory the reader
#            maps, as ucx_perftest's own buffers)
# Sizes: a Llama-3-8B-shaped request (32 layers, 8 KV heads, head dim 128, fp16) of 2048 tokens (256 MiB) and 128
# tokens (16 MiB); ucx_perftest moves the same total in one ucp_get. Also prints the machine's load.
#   bench/kv_transfer_vs_perftest.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
build=${1:-build/default}
rounds=${2:-3}
bench=$build/bench/bench_kv_transfer
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt-get install ucx-utils)"; exit 77; }
[[ -x $bench ]] || { echo "$bench not built"; exit 77; }

port=$((20000 + RANDOM % 20000))
perftest() {  # $1: bytes, $2: extra flag (-e or empty): MB/s of the final line
  local p=$((port++))
  timeout 120 ucx_perftest -p "$p" >/dev/null 2>&1 &
  local srv=$!
  sleep 0.5
  local mbs
  mbs=$(timeout 120 ucx_perftest 127.0.0.1 -p "$p" -t ucp_get $2 -s "$1" -n 8 -w 2 2>/dev/null | awk '/^Final:/ {print $6}')
  wait "$srv" 2>/dev/null || true
  echo "${mbs:-0}"
}
ours() {  # $1: 0 (detect) or 1 (all), $2: 1 for UCX-allocated pools: "MB/s at 128, MB/s at 2048, overhead us"
  KVPAGER_KV_BENCH_ALL_TRANSPORTS=$1 KVPAGER_KV_BENCH_UCX_POOLS=${2:-0} "$bench" --benchmark_filter='ucx' --benchmark_min_time=0.5 \
      --benchmark_format=json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)["benchmarks"]
get = lambda n, k: next(b[k] for b in d if b["name"] == n)
print(get("bm_ucx_read/128/real_time", "bytes_per_second") / 1e6, get("bm_ucx_read/2048/real_time", "bytes_per_second") / 1e6,
      get("bm_ucx_overhead/real_time", "real_time"))'
}
memcpy_runs() {
  "$bench" --benchmark_filter='memcpy' --benchmark_min_time=0.5 --benchmark_format=json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)["benchmarks"]
print(*[b["bytes_per_second"] / 1e6 for b in d])'
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A best
keep() { awk -v a="${best[$1]:-0}" -v b="$2" -v lower="${3:-0}" 'BEGIN { if (a == 0 || (lower ? b < a : b > a)) print b; else print a }'; }
for ((r = 1; r <= rounds; r++)); do
  for set in detect all all-ucx; do
    flag=""; all=1; pools=0
    [[ $set == detect ]] && { flag="-e"; all=0; }
    [[ $set == all-ucx ]] && pools=1
    read -r o128 o2k oh < <(ours $all $pools)
    best[ours_128_$set]=$(keep ours_128_$set "$o128")
    best[ours_2k_$set]=$(keep ours_2k_$set "$o2k")
    best[ours_oh_$set]=$(keep ours_oh_$set "$oh" 1)
    best[pt_128_$set]=$(keep pt_128_$set "$(perftest 16777216 "$flag")")
    best[pt_2k_$set]=$(keep pt_2k_$set "$(perftest 268435456 "$flag")")
  done
  read -r m128 m2k < <(memcpy_runs)
  best[memcpy_128]=$(keep memcpy_128 "$m128")
  best[memcpy_2k]=$(keep memcpy_2k "$m2k")
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| transports | tokens | kvpager MB/s | ucx_perftest MB/s | ratio | memcpy of the same runs MB/s |\n|---|---|---|---|---|---|\n'
for set in detect all all-ucx; do
  for t in 128 2k; do
    awk -v s="$set" -v t="$t" -v o="${best[ours_${t}_$set]}" -v p="${best[pt_${t}_$set]}" -v m="${best[memcpy_$t]}" \
        'BEGIN { printf "| %s | %s | %.0f | %.0f | %.2f | %.0f |\n", s, t, o, p, o / p, m }'
  done
done
for set in detect all all-ucx; do
  echo "overhead per transfer ($set): kvpager ${best[ours_oh_$set]} us (one 64-byte run: post, completion)"
done
