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

export default defineConfig({
  test: {
    reporters: ['default', './test/support/count-reporter.ts'],
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
        },
      },
      {
        extends: true,
        optimizeDeps: { include: ['comlink'] },
        test: {
          name: 'browser',
          include: ['test/browser/**/*.test.ts'],
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
});
