// `serve` + a two-node route (CPU nodes, or llama.cpp ones) over a synthetic model, as real
// processes on loopback: what the serve and batch benchmarks run against.
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { makeModelFile } from '../../src/model/synthetic-model.ts';
import { MODEL_TYPES } from '../../src/model/synthetic-tensors.ts';
import type { ModelType } from '../../src/model/synthetic-tensors.ts';
import { spawnCli } from '../processes.ts';

export const round = (x: number, d = 1): number => Math.round(x * 10 ** d) / 10 ** d;
/** words the benches' prompts are made of */
export const WORDS = 'the little bird saw a big red ball near the old tree and wanted to play with it all day long'.split(' ');

export interface ModelShape {
  layers: number;
  embd: number;
  ffn: number;
  vocab: number;
  heads: number;
  /** weight type (default f32) */
  type?: ModelType;
}

export interface ServeRoute {
  base: string;
  secret: string;
  /** the model id /v1/models names */
  model: string;
  path: string;
  roomId: string;
  /** the processes' ids: serve, then the nodes in stage order */
  pids: { serve: number; nodes: number[] };
}

/** `--name N` from the bench's arguments, else `fallback` */
export function numberArg(args: string[], name: string, fallback: number): number {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : fallback;
}

/** `--layers 8 --embd 512 --ffn 1536 --vocab 4096` (these defaults) from the bench's arguments */
export function shapeFrom(args: string[]): ModelShape {
  const arg = (name: string, fallback: number): number => numberArg(args, name, fallback);
  const i = args.indexOf('--type');
  const type = i >= 0 ? args[i + 1] : 'f32';
  if (!MODEL_TYPES.includes(type as ModelType)) throw new Error(`--type must be one of ${MODEL_TYPES.join(', ')}, got '${type}'`);
  return { layers: arg('layers', 8), embd: arg('embd', 512), ffn: arg('ffn', 1536), vocab: arg('vocab', 4096), heads: 8, type: type as ModelType };
}

/**
 * Makes the model (once, under .cache), starts serve and two nodes holding half the layers each
 * (CPU nodes on `threads` threads each, else the node's default: every core; or `--backend
 * llamacpp` nodes, on llama.cpp's default threads), and waits for the route.
 */
export async function startServeRoute(shape: ModelShape, threads?: number, backend: 'cpu' | 'llamacpp' = 'cpu'): Promise<ServeRoute> {
  const dir = join(process.cwd(), '.cache');
  mkdirSync(dir, { recursive: true });
  const type = shape.type ?? 'f32';
  const path = join(dir, `bench-serve-${shape.layers}x${shape.embd}x${shape.ffn}x${shape.vocab}${type === 'f32' ? '' : `-${type}`}.gguf`);
  if (!existsSync(path)) await makeModelFile(path, { arch: 'llama', ...shape, ctx: 4096, type, seed: 7 });
  // admission and per-client limits above the batch bench's 32 sessions (the defaults, 16, would run 32 requests as two waves of 16)
  const serve = spawnCli(['serve', '--port', '0', '--ui', 'off', '--quiet', '--model', path, '--min-peers', '2', '--max-active', '64', '--max-sessions', '64']);
  const [, joinUrl] = await serve.waitFor(/join:\s+(\S+)/);
  const [, secret] = await serve.waitFor(/secret:\s+(\S+)/);
  const base = new URL(joinUrl!).origin;
  const half = Math.round(shape.layers / 2);
  const nodes: number[] = [];
  for (const [i, layers] of [`0-${half}`, `${half}-${shape.layers}`].entries()) {
    const node = spawnCli(['node', '--join', joinUrl!, '--no-cache', '--memory', '2GiB', '--name', `s${i}`, '--layers', layers, ...(backend === 'llamacpp' ? ['--backend', 'llamacpp'] : threads ? ['--threads', String(threads)] : [])]);
    await node.waitFor(/joined room/);
    nodes.push(node.child.pid!);
  }
  const models = async () => (await (await fetch(`${base}/v1/models`, { headers: { authorization: `Bearer ${secret}` } })).json()) as { data: Array<{ id: string; route_status: string }> };
  for (let i = 0; i < 600; i++) {
    if ((await models()).data[0]!.route_status === 'ready') break;
    await new Promise((r) => setTimeout(r, 200));
  }
  return { base, secret: secret!, model: (await models()).data[0]!.id, path, roomId: new URL(joinUrl!).pathname.split('/').pop()!, pids: { serve: serve.child.pid!, nodes } };
}
