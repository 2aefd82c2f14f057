#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The one prepared script for a session lent a GPU machine (device tool). Writes everything under $OUT.
#   1. builds and runs kvpager-gpu-check (needs only CMake, nvcc and the CUDA runtime: the GPU image has no
#      GoogleTest, Google Benchmark or xxHash): decode/split-KV/LSE against the CPU backend, kv_append/copy/swap
#      bit-exact, and the bandwidth of decode, copy_blocks and swap against memcpy baselines;
#   2. where GoogleTest and Google Benchmark are installed, also the GoogleTest CUDA tests and bench_cuda.
#   run: bash .ci/gpu_check.sh     (timeout ~480 s leaves room to rerun)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-/tmp/kvpager-gpu}"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
gen=$(command -v ninja >/dev/null && echo -G Ninja)
cmake -S . -B build/gpu-min $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DKVPAGER_BUILD_TESTS=OFF \
  -DKVPAGER_BUILD_BENCHMARKS=OFF -DKVPAGER_BUILD_TOOLS=OFF -DKVPAGER_BUILD_EXAMPLES=OFF > "$out/configure.txt" 2>&1 \
  || { tail -50 "$out/configure.txt"; exit 1; }
cmake --build build/gpu-min -j"$(nproc)" --target kvpager-gpu-check > "$out/build.txt" 2>&1 || { tail -50 "$out/build.txt"; exit 1; }
build/gpu-min/kvpager-gpu-check > "$out/gpu_check.txt" 2>&1
echo "kvpager-gpu-check rc=$?" | tee -a "$out/summary.txt"
grep -E "FAIL|bw|flop|failed|device 0" "$out/gpu_check.txt"
if cmake -S . -B build/gpu $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DKVPAGER_BUILD_EXAMPLES=OFF \
     > "$out/configure_full.txt" 2>&1; then
  cmake --build build/gpu -j"$(nproc)" --target cuda_test bench_cuda > "$out/build_full.txt" 2>&1 || tail -20 "$out/build_full.txt"
  build/gpu/tests/cuda_test > "$out/cuda_test.txt" 2>&1; echo "cuda_test rc=$?" | tee -a "$out/summary.txt"
  build/gpu/bench/bench_cuda --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_out="$out/bench_cuda.json" --benchmark_out_format=json > "$out/bench_cuda.txt" 2>&1
  echo "bench_cuda rc=$?" | tee -a "$out/summary.txt"
else
  echo "full configure failed (GoogleTest / Google Benchmark / xxHash missing?): GoogleTest CUDA tests not run" | tee -a "$out/summary.txt"
fi
