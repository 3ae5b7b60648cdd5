// The production build of the web app that `gguf-mesh serve` hosts: dist/app (the page) and
// dist/components (the web-component bundle), made by vite from the sources (vite.config.ts).
// `npm install`/`npm ci` build it (the package's `prepare` runs this file); `serve` checks it
// on start and rebuilds what is missing or older than a source, so an edited checkout never
// serves a stale page. A lock keeps two processes (two servers, parallel test files) from
// building over each other. vite runs in a child process with NODE_ENV=production: a build made
// inside a process that set NODE_ENV otherwise (vitest sets `test`) is a different bundle.
//
// Run as a script (`node bin/run-ts.js signaling-server/app-build.ts`): builds what is stale.

import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, rmSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { MeshError } from '../src/errors.ts';

export const REPO_ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');

/** What the bundles are built from (a change in any of them makes a build stale). */
export const APP_SOURCES = ['index.html', 'src', 'workers', 'shaders', 'vite.config.ts'];

/** The two builds: vite's mode, and the file whose age stands for the whole build. */
const BUILDS = [
  { name: 'app', mode: 'production', marker: join('dist', 'app', 'index.html') },
  { name: 'components', mode: 'components', marker: join('dist', 'components', 'gguf-mesh.js') },
] as const;

/** a lock older than this was left by a killed process (a build takes seconds) */
const STALE_LOCK_MS = 120_000;
const LOCK_WAIT_MS = 180_000;

export type BuildState = 'fresh' | 'stale' | 'missing';

export function newestMtime(paths: string[]): number {
  let newest = 0;
  const visit = (p: string): void => {
    if (!existsSync(p)) return;
    const s = statSync(p);
    if (s.isDirectory()) for (const e of readdirSync(p)) visit(join(p, e));
    else newest = Math.max(newest, s.mtimeMs);
  };
  for (const p of paths) visit(p);
  return newest;
}

/** Per build: missing, older than a source, or fresh. */
export function buildStates(root: string): Record<'app' | 'components', BuildState> {
  const sources = newestMtime(APP_SOURCES.map((p) => join(root, p)));
  const state = (marker: string): BuildState => {
    const f = join(root, marker);
    if (!existsSync(f)) return 'missing';
    return statSync(f).mtimeMs >= sources ? 'fresh' : 'stale';
  };
  return { app: state(BUILDS[0].marker), components: state(BUILDS[1].marker) };
}

async function withBuildLock<T>(root: string, fn: () => Promise<T>): Promise<T> {
  mkdirSync(join(root, 'dist'), { recursive: true });
  const lock = join(root, 'dist', '.build.lock');
  const deadline = Date.now() + LOCK_WAIT_MS;
  for (;;) {
    try {
      mkdirSync(lock);
      break;
    } catch {
      if (existsSync(lock) && Date.now() - statSync(lock).mtimeMs > STALE_LOCK_MS) rmSync(lock, { recursive: true, force: true });
      if (Date.now() > deadline) throw new MeshError('UI_BUILD_LOCKED', `${lock} held for ${LOCK_WAIT_MS / 1000} s: remove it if no build runs`);
      await new Promise((r) => setTimeout(r, 250));
    }
  }
  try {
    return await fn();
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}

/** vite's command-line entry in `root`'s dependencies, or null where vite is not installed. */
function viteBin(root: string): string | null {
  try {
    return join(dirname(createRequire(join(root, 'package.json')).resolve('vite/package.json')), 'bin', 'vite.js');
  } catch {
    return null;
  }
}

/** `vite build --mode <mode>` in `root`, as `npm run build` runs it. */
function viteBuild(bin: string, root: string, mode: string): Promise<void> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(process.execPath, [bin, 'build', '--mode', mode, '--logLevel', 'error'], {
      cwd: root,
      env: { ...process.env, NODE_ENV: 'production' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    child.on('error', (e) => reject(new MeshError('UI_BUILD_FAILED', `vite build --mode ${mode}: ${e.message}`)));
    child.on('close', (code) => {
      if (code === 0) resolvePromise();
      else reject(new MeshError('UI_BUILD_FAILED', `vite build --mode ${mode} exited with ${code}: ${output.trim().slice(-2000)}`));
    });
  });
}

export interface EnsureBuiltResult {
  /** the builds made now (empty when all were fresh) */
  built: Array<'app' | 'components'>;
  /** a stale build served as it is, because vite is not installed */
  staleKept: boolean;
}

/**
 * Builds dist/app and dist/components where missing or older than a source. Without vite (an
 * install without dev dependencies) a stale build is kept and a missing one is `UI_NOT_BUILT`.
 */
export async function ensureAppBuilt(root: string = REPO_ROOT, log: (line: string) => void = () => undefined): Promise<EnsureBuiltResult> {
  const before = buildStates(root);
  if (before.app === 'fresh' && before.components === 'fresh') return { built: [], staleKept: false };
  const vite = viteBin(root);
  if (!vite) {
    if (before.app === 'missing' || before.components === 'missing') {
      throw new MeshError('UI_NOT_BUILT', `the web app is not built under ${join(root, 'dist')} and vite is not installed: install the dev dependencies and run \`npm run build\`, or serve with --ui off`);
    }
    log('the web app build is older than its sources and vite is not installed: serving it as it is');
    return { built: [], staleKept: true };
  }
  return withBuildLock(root, async () => {
    const built: Array<'app' | 'components'> = [];
    // another process may have built it while this one waited for the lock
    const states = buildStates(root);
    for (const b of BUILDS) {
      if (states[b.name] === 'fresh') continue;
      const started = Date.now();
      log(`building the web app (${b.name}, ${states[b.name] === 'missing' ? 'not built yet' : 'sources changed'})…`);
      await viteBuild(vite, root, b.mode);
      log(`built dist/${b.name} in ${((Date.now() - started) / 1000).toFixed(1)} s`);
      built.push(b.name);
    }
    return { built, staleKept: false };
  });
}

// npm's `prepare`: build at install time so the first `npm start` serves at once
if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await ensureAppBuilt(REPO_ROOT, (line) => console.log(line)).catch((e: unknown) => {
    console.error(`gguf-mesh build: ${e instanceof MeshError ? `${e.code}: ` : ''}${(e as Error).message}`);
    // an install without dev dependencies still succeeds; `serve` says the same on start
    if (!(e instanceof MeshError && e.code === 'UI_NOT_BUILT')) process.exitCode = 1;
  });
}
