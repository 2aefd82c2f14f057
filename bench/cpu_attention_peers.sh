#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvpager's CPU attention beside IPEX's paged attention and varlen flash attention and torch SDPA, in one run
# (issue 27, point 4). Not part of CI: it installs torch and intel-extension-for-pytorch from PyPI into a venv of its
# own, then runs bench/cpu_attention_peers.py (same inputs for all, checked against an fp64 reference, rounds
# interleaved, best of N, the machine's load and versions recorded, a markdown table at the end).
#
#   cmake --build build/default --target kvpager_kernels -j2
#   bench/cpu_attention_peers.sh [--venv DIR] [--lib PATH] [--no-install] [-- ARGS OF cpu_attention_peers.py]
#   bench/cpu_attention_peers.sh -- --quick          # a few cases, to check the setup
#
# --venv: the venv (default build/peers-venv; created when missing). --lib: libkvpager_kernels.so (default
# build/default/kernels/libkvpager_kernels.so). --no-install: use the venv as it is.
# Environment: PYTHON (the interpreter for the venv, default python3.11), IPEX_VERSION (default 2.8.0, the newest
# IPEX CPU wheel on PyPI: it refuses to load with any torch but its own minor, so torch is installed as
# TORCH_SPEC, default torch==<IPEX major.minor>.*), TORCH_INDEX (a CPU-only torch wheel index such as PyTorch's own;
# used when it answers, else PyPI's torch, which also pulls the CUDA runtime wheels: ~3 GB, unused on the CPU).
# The first install here (PyPI only: torch 2.8.0 with its CUDA wheels, IPEX 2.8.0) took 140 s and left a 6.8 GB venv;
# a later run checks it in a few seconds.
# Without IPEX (its install failed, or IPEX_VERSION=none) the comparison runs torch SDPA alone and says so.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=build/peers-venv
lib=build/default/kernels/libkvpager_kernels.so
install=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --venv) venv=$2; shift 2 ;;
    --lib) lib=$2; shift 2 ;;
    --no-install) install=0; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '3,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see bench/cpu_attention_peers.sh --help)"; exit 2 ;;
  esac
done
[[ -f $lib ]] || { echo "$lib not built: cmake --build build/default --target kvpager_kernels -j2"; exit 77; }

python=${PYTHON:-python3.11}
ipex_version=${IPEX_VERSION:-2.8.0}
torch_index=${TORCH_INDEX:-}
if [[ $ipex_version == none ]]; then torch_spec=${TORCH_SPEC:-torch}
else torch_spec=${TORCH_SPEC:-torch==$(cut -d. -f1,2 <<<"$ipex_version").*}; fi

if [[ $install == 1 ]]; then
  start=$SECONDS
  [[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
  "${pip[@]}" --upgrade pip >/dev/null
  # A CPU-only torch index, when given and reachable, as an extra index: its "+cpu" builds sort above PyPI's.
  if [[ -n $torch_index ]] && curl -fsS --max-time 10 -o /dev/null "${torch_index%/}/torch/" 2>/dev/null; then
    echo "installing $torch_spec, CPU build from $torch_index"
    "${pip[@]}" "$torch_spec" --extra-index-url "$torch_index"
  else
    echo "installing $torch_spec from PyPI (the CUDA build, run on the CPU${torch_index:+; $torch_index not reachable})"
    "${pip[@]}" "$torch_spec"
  fi
  "${pip[@]}" numpy psutil packaging
  if [[ $ipex_version != none ]]; then
    # --no-deps: IPEX's own requirements are numpy, psutil and packaging (above); it must not move torch.
    "${pip[@]}" --no-deps "intel-extension-for-pytorch==$ipex_version" ||
      echo "intel-extension-for-pytorch==$ipex_version did not install: the comparison runs without IPEX" \
           "(or with the one the venv already has, if it matches torch)"
  fi
  echo "install: $((SECONDS - start)) s"
fi

exec "$venv/bin/python" bench/cpu_attention_peers.py --lib "$lib" "$@"
