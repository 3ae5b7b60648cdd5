#!/bin/sh
# Runs on the GPU machine (after bench/gpu/pack.sh here; carry .gpu): the WebGPU bench's GPU
# preset on Dawn over the machine's Vulkan driver, CPU engine beside it (llama.cpp is not
# carried: its CUDA build alone is 180 MB). The JSON lands in $OUT/webgpu-gpu.json.
set -u
cd "$(dirname "$0")/../.."
for f in .gpu/deb/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done
ldconfig 2>/dev/null
[ -e /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
# the bundle finds the shaders three folders up (the root) and the repo two up (.gpu): the
# synthetic model's generator source is hashed from there
ln -sfn ../src .gpu/src
xz -dc .gpu/node.xz > /tmp/node && chmod +x /tmp/node
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv 2>&1 | tee "${OUT:-/tmp}/gpu.txt"
/tmp/node .gpu/b/c/bench.mjs --gpu --backends webgpu,cpu "$@" > "${OUT:-/tmp}/webgpu-gpu.json" 2> "${OUT:-/tmp}/webgpu-gpu.err"
rc=$?
tail -c 4000 "${OUT:-/tmp}/webgpu-gpu.err"
exit $rc
