#!/usr/bin/env bash
# The one prepared script for a session lent a GPU machine (device tool): builds with CUDA for sm_90, runs the CUDA
# tests (they compare with the CPU backend) and the CUDA benchmarks, and writes everything under $OUT.
#   run: bash .ci/gpu_check.sh     (timeout ~480 s leaves room to rerun)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-/tmp/kvpager-gpu}"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
cmake -S . -B build/gpu $(command -v ninja >/dev/null && echo -G Ninja) -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKVPAGER_BUILD_EXAMPLES=OFF > "$out/configure.txt" 2>&1 || { tail -50 "$out/configure.txt"; exit 1; }
cmake --build build/gpu -j"$(nproc)" --target cuda_test kernels_test bench_cuda > "$out/build.txt" 2>&1 \
  || { tail -50 "$out/build.txt"; exit 1; }
build/gpu/tests/cuda_test > "$out/cuda_test.txt" 2>&1; echo "cuda_test rc=$?" | tee -a "$out/summary.txt"
build/gpu/tests/kernels_test > "$out/kernels_test.txt" 2>&1; echo "kernels_test rc=$?" | tee -a "$out/summary.txt"
build/gpu/bench/bench_cuda --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$out/bench_cuda.json" --benchmark_out_format=json > "$out/bench_cuda.txt" 2>&1
echo "bench_cuda rc=$?" | tee -a "$out/summary.txt"
tail -30 "$out/cuda_test.txt"; tail -30 "$out/bench_cuda.txt"
