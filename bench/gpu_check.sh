#!/usr/bin/env bash
# GPU offload check, for a machine with a GPU and no network: CUDA where nvidia-smi sees a GPU
# (compute capability $CUDA_ARCH, default 90: H100/H200), Metal on macOS, else Vulkan where a Vulkan
# driver is installed (an AMD or Intel GPU; Mesa's lavapipe on a CPU with GGML_VK_VISIBLE_DEVICES=0).
# Give it the llama-cpp-python sdist; the pinned models must be in $SINKD_HOME/models (or the user
# cache). Builds llama-cpp-python (deploy/vulkan's patch applied: a no-op but for Vulkan on headers
# older than 1.3.261) and, beside it, llama-server from the same sdist; then, every layer offloaded:
#   - the GPU-path group (tests/test_gpu_path.py: eviction and shift, kill -9, parking, prefix
#     states, decode runs, the backend gate, each against the same backend) and
#     bench/backend_rows.py (what a row's bits depend on there: docs/gpu.md);
#   - the engine tests (positions, shift, logits of batched against solo rows, the decode's argmax);
#   - the daemon's batched-step tests and the resume tests (a restart, kill -9, decode runs:
#     bit for bit against a daemon that never stopped), the daemon at its GPU defaults (decode
#     runs of 16);
#   - engine_cpu.py (sinkd's CPU per step outside llama_decode, what the GPU waits for) and
#     concurrency.py (1-8 sessions against the raw batched ceiling);
#   - peer.py --throughput-only: sinkd against llama-server at one session and at eight, same GPU;
#   - the prefix-state tests (a restored system prompt's and side request's bits against a daemon
#     that keeps none: on a GPU a read cut elsewhere may compute other bits) and prefixes.py
#     (against llama-server's prompt cache, same GPU; no Open WebUI side requests: their
#     templates come from PyPI);
#   - speculative decoding: whether a pass's rows equal alone on the GPU (llamafile.py --gpu; sinkd
#     does not draft there until they do), the same-tokens tests and speculative.py --quick;
#   - latency.py (latency vs session age), shortened.
# Prints the figures and keeps them in OUT_DIR. Budget: ten minutes on 16 cores (the two builds run
# at once and take most of it; not yet timed on such a machine).
#
#   bash bench/gpu_check.sh llama_cpp_python-0.3.36.tar.gz [OUT_DIR]
set -euo pipefail
given=$(realpath "${1:?give the llama-cpp-python sdist}")
out=${2:-bench/results/gpu}
mkdir -p "$out"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv | tee "$out/gpu.txt"
  flags="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90}"
elif [ "$(uname)" = Darwin ]; then
  echo "Metal" | tee "$out/gpu.txt"
  flags="-DGGML_METAL=on"
elif ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1; then
  (vulkaninfo --summary 2>/dev/null | grep -E "deviceName|deviceType" || echo "Vulkan") | tee "$out/gpu.txt"
  flags="-DGGML_VULKAN=ON"
else
  echo "gpu_check: no CUDA, Metal or Vulkan driver here" >&2
  exit 2
fi
# the sdist unpacked and patched (docs/gpu.md), then built from that folder
src=$(mktemp -d)
tar -xzf "$given" -C "$src"
sdist=$(echo "$src"/llama_cpp_python-*/)
(cd "$sdist" && patch -p1 < "$OLDPWD/deploy/vulkan/ggml-vulkan-layer-settings.patch")
python3 -m venv --system-site-packages /tmp/sinkd-gpu
. /tmp/sinkd-gpu/bin/activate
cuda="$flags"  # the flags of the backend found above
start=$(date +%s)
# llama-server from the same sources, built while pip builds the bindings (each on half the cores)
half=$(( ($(nproc) + 1) / 2 ))
export SINKD_PEER_SDIST="$given" SINKD_PEER_CMAKE_ARGS="$cuda" SINKD_PEER_GPU_LAYERS=99 SINKD_PEER_ROUNDS=1
CMAKE_BUILD_PARALLEL_LEVEL=$half python3 bench/peer.py --build-only > "$out/peer-build.txt" 2>&1 &
peer_build=$!
CMAKE_ARGS="$cuda -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$half pip install --no-index --no-deps --no-build-isolation -q "$sdist"
pip install --no-index --no-deps --no-build-isolation -q .  # sinkd itself (imports as sinkd.*)
echo "bindings built: $(( $(date +%s) - start )) s" | tee -a "$out/gpu.txt"
# the engine's own tests read SINKD_GPU_LAYERS, a daemon's settings SINKD_N_GPU_LAYERS
export SINKD_GPU_LAYERS=99 SINKD_N_GPU_LAYERS=99 SINKD_ALLOW_UNCHECKED=1
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_path.py 2>&1 | tee "$out/gpu-path-tests.txt"
python3 bench/backend_rows.py --gpu-layers 99 2>&1 | grep -v '^llama' | tee "$out/backend_rows.txt"
cp bench/results/backend_rows_*.json "$out/" 2>/dev/null || true
python3 -m pytest -q -p no:cacheprovider tests/test_engine.py 2>&1 | tee "$out/engine-tests.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_decode_runs.py tests/test_daemon.py \
  tests/test_durability.py -k "batched or scattered or share_a_step or restarted or runs" \
  2>&1 | tee "$out/daemon-tests.txt"
python3 bench/engine_cpu.py 2>&1 | grep -v '^llama' | tee "$out/engine_cpu.txt"
cp bench/results/engine_cpu.json "$out/engine_cpu.json" 2>/dev/null || true
python3 bench/concurrency.py 2>&1 | grep -v '^llama' | tee "$out/concurrency.txt"
cp bench/results/concurrency.json "$out/concurrency.json" 2>/dev/null || true
wait "$peer_build" || { echo "llama-server did not build (see $out/peer-build.txt)"; exit 1; }
echo "llama-server built: $(( $(date +%s) - start )) s" | tee -a "$out/gpu.txt"
python3 bench/peer.py --throughput-only 2>&1 | grep -v '^llama' | tee "$out/peer.txt"
cp bench/results/peer_throughput.json "$out/peer_throughput.json" 2>/dev/null || true
python3 -m pytest -q -p no:cacheprovider tests/test_prefixes.py 2>&1 | tee "$out/prefix-tests.txt"
SINKD_PREFIX_ROUNDS=2 SINKD_PREFIX_SIDE=0 python3 bench/prefixes.py 2>&1 | grep -v '^llama' | tee "$out/prefixes.txt"
cp bench/results/prefixes.json "$out/prefixes.json" 2>/dev/null || true
# speculative decoding: whether a pass's rows equal the same tokens alone on this GPU (sinkd
# does not draft there until they do), and the same-tokens tests and speculative.py offloaded
python3 bench/llamafile.py --gpu 2>&1 | grep -v '^llama' | tee "$out/rows.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_speculative_model.py 2>&1 | tee "$out/speculative-tests.txt" || true
python3 bench/speculative.py --quick 2>&1 | grep -v '^llama' | tee "$out/speculative.txt"
cp bench/results/speculative_quick.json "$out/speculative_quick.json" 2>/dev/null || true
python3 bench/latency.py --tokens 2600 --full-tokens 2048 2>&1 | grep -v '^llama' | tee "$out/latency.txt"
cp bench/results/latency.json "$out/latency.json" 2>/dev/null || true
echo "total: $(( $(date +%s) - start )) s" | tee -a "$out/gpu.txt"
