#!/usr/bin/env bash
# GPU offload check, for a machine with an NVIDIA GPU (compute capability 9.0, e.g. H100/H200) and no
# network. Give it the llama-cpp-python sdist; the pinned models must be in $SINKD_HOME/models (or
# the user cache). Builds for CUDA sm_90 only, runs the engine tests with every layer offloaded,
# latency.py (latency vs session age) and the batched path (raw batching, then 1-8 sessions through
# the daemon against the raw ceiling), and prints the figures. About 12 minutes, most of it the build.
#
#   bash bench/gpu_check.sh llama_cpp_python-0.3.36.tar.gz [OUT_DIR]
set -euo pipefail
sdist=${1:?give the llama-cpp-python sdist}
out=${2:-bench/results/gpu}
mkdir -p "$out"
nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv | tee "$out/gpu.txt"
python3 -m venv --system-site-packages /tmp/sinkd-gpu
. /tmp/sinkd-gpu/bin/activate
start=$(date +%s)
CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) pip install --no-index --no-deps --no-build-isolation -q "$sdist"
echo "build: $(( $(date +%s) - start )) s" | tee -a "$out/gpu.txt"
pip install --no-index --no-deps --no-build-isolation -q .  # sinkd itself (imports as sinkd.*)
export SINKD_GPU_LAYERS=99 SINKD_ALLOW_UNCHECKED=1
python3 -m pytest -q -p no:cacheprovider tests/test_engine.py 2>&1 | tee "$out/engine-tests.txt"
python3 bench/latency.py --tokens 5200 --full-tokens 4096 2>&1 | grep -v '^llama' | tee "$out/latency.txt"
cp bench/results/latency.json "$out/latency.json" 2>/dev/null || true
python3 -m pytest -q -p no:cacheprovider tests/test_daemon.py -k "batched or scattered or share_a_step" \
  2>&1 | tee "$out/batched-tests.txt"
python3 bench/batching.py --json "$out/batching.json" 2>&1 | grep -v '^llama' | tee "$out/batching.txt"
python3 bench/concurrency.py 2>&1 | grep -v '^llama' | tee "$out/concurrency.txt"
cp bench/results/concurrency.json "$out/concurrency.json" 2>/dev/null || true
# sinkd's own CPU per step outside llama_decode, what a GPU waits for (issue 47): the number that
# matters there, since a step's decode is a few milliseconds
python3 bench/engine_cpu.py 2>&1 | grep -v '^llama' | tee "$out/engine_cpu.txt"
cp bench/results/engine_cpu.json "$out/engine_cpu.json" 2>/dev/null || true
