#!/bin/sh
# Packs what `npm run bench -- webgpu --gpu` needs on a GPU machine that has no Node and no
# registry (the device tool's machines): this Node binary (xz), the bench bundled into one file
# (esbuild), the `webgpu` package's linux-x64 Dawn, koffi, and the Vulkan loader's Debian
# packages. Everything lands in .gpu/ (git-ignored), about 40 MiB,
# which the device tool carries: run(command: "sh bench/gpu/run.sh", carry: [".gpu"]).
set -eu
cd "$(dirname "$0")/../.."
rm -rf .gpu && mkdir -p .gpu/b/c .gpu/node_modules/webgpu/dist .gpu/deb
# the bundle sits three folders below the root, so the shaders it reads (../../../shaders) are the checkout's
npx esbuild bench/gpu/entry.ts --bundle --platform=node --format=esm --target=node20 \
  --external:webgpu --external:koffi --external:node-llama-cpp --outfile=.gpu/b/c/bench.mjs --log-level=warning
cp node_modules/webgpu/package.json node_modules/webgpu/index.js .gpu/node_modules/webgpu/
cp -r node_modules/webgpu/dist/linux-x64 .gpu/node_modules/webgpu/dist/
cp -r node_modules/koffi .gpu/node_modules/koffi
xz -T2 -6 -c "$(command -v node)" > .gpu/node.xz
# the Vulkan loader (the machine has NVIDIA's driver and ICD, not always libvulkan1)
( cd .gpu/deb && apt-get download libvulkan1 >/dev/null 2>&1 ) || echo "pack: libvulkan1 not downloaded (the run uses the machine's loader if it has one)"
du -sh .gpu
