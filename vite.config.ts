// One vite config for the app build, the web-component library build and the test runner.
// Tests: a node project (test/**/*.test.ts) and a browser project (test/browser/**) that runs
// in headless Debian Chromium with WebGPU on SwiftShader.
import { defineConfig } from 'vitest/config';
import { playwright } from '@vitest/browser-playwright';

const chromiumPath = process.env.CHROME_PATH ?? '/usr/bin/chromium';

export const chromiumArgs = [
  '--enable-unsafe-webgpu',
  '--headless',
  '--no-sandbox',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

// `vite build` makes the web app (index.html → dist/app, served by `gguf-mesh serve`);
// `vite build --mode components` makes the web-component bundle (dist/components/gguf-mesh.js,
// served at /components/gguf-mesh.js), one ES module plus its worker and chunks.
const appBuild = { outDir: 'dist/app', emptyOutDir: true, target: 'es2022', sourcemap: true };
const componentsBuild = {
  outDir: 'dist/components',
  emptyOutDir: true,
  target: 'es2022',
  sourcemap: true,
  lib: { entry: 'src/components/index.ts', formats: ['es' as const], fileName: () => 'gguf-mesh.js' },
};

export default defineConfig(({ mode }) => ({
  // the bundle finds its worker and chunks beside itself (import.meta.url), wherever it is hosted
  base: mode === 'components' ? './' : '/',
  build: mode === 'components' ? componentsBuild : appBuild,
  worker: { format: 'es' as const },
  test: {
    reporters: ['default', './test/support/count-reporter.ts'],
    globalSetup: ['./test/support/global-setup.ts'],
    setupFiles: ['./test/support/typed-array-equality.ts'],
    testTimeout: 120_000,
    hookTimeout: 180_000,
    projects: [
      {
        extends: true,
        test: {
          name: 'node',
          include: ['test/**/*.test.ts'],
          exclude: ['test/browser/**', 'node_modules/**'],
          environment: 'node',
          pool: 'forks',
          // the CPU engine's fused multiply-add kernels, as in production (src/backends/cpu/node-threads.ts)
          execArgv: ['--experimental-wasm-relaxed-simd'],
        },
      },
      {
        extends: true,
        // pre-bundled up front: a dependency discovered mid-run makes vite reload the page and fail the test
        optimizeDeps: { include: ['comlink', 'simple-peer', 'buffer', 'process', 'events', 'idb-keyval', '@huggingface/gguf'] },
        test: {
          name: 'browser',
          include: ['test/browser/**/*.test.ts'],
          // links stories260K (and its manifest) under .cache/test-models/, where vite can serve it
          globalSetup: ['./test/browser/webgpu-global-setup.ts'],
          browser: {
            enabled: true,
            headless: true,
            provider: playwright({
              launchOptions: { executablePath: chromiumPath, args: chromiumArgs },
            }),
            instances: [{ browser: 'chromium' }],
          },
        },
      },
    ],
  },
}));
