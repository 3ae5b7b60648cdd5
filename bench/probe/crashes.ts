// Probes of what kills or wedges `serve` and the GGUF readers (issue 16, "crashes and hangs").

import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { corruptCorpus } from '../../test/hardening/gguf-corpus.ts';
import { layoutOf } from '../../test/hardening/gguf-layout.ts';
import { answers, freePort, node, proofFor, rawPeer, serve, sleep, spawnCli, waitReady, withTempDir } from './procs.ts';

/** Sends one text message on a peer socket (before or after the hello) and reports whether serve lived. */
export async function crashMessages(root: string, model: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  const cases: Array<[string, string, boolean]> = [
    ['hello with numeric proof, before auth', '{"t":"hello","proof":123}', false],
    ['null, before auth', 'null', false],
    ['null, after auth', 'null', true],
    ['ready with mistyped fields, after auth', '{"t":"ready","routeId":"x","stage":{}}', true],
  ];
  for (const [label, text, auth] of cases) {
    const s = await serve(root, model, ['--min-peers', '9']);
    try {
      const p = await rawPeer(s);
      const challenge = await p.next();
      if (auth) {
        p.send(JSON.stringify({ t: 'hello', proof: proofFor(s.secret, String(challenge?.nonce)), backend: 'cpu', memoryBytes: 1 }));
        await p.next();
      }
      p.send(text);
      const reply = await p.next(1500);
      await sleep(300);
      out[label] = s.proc.alive() && (await answers(s)) ? `alive${reply ? ` (answered ${JSON.stringify(reply).slice(0, 80)})` : ''}` : `serve died: ${s.proc.output().split('\n').filter((l) => /Error/.test(l))[0] ?? ''}`;
      p.ws.terminate();
    } finally {
      await s.proc.kill();
    }
  }
  return out;
}

function patched(model: string, dir: string, name: string, edit: (b: Uint8Array, v: DataView) => void): string {
  const b = new Uint8Array(readFileSync(model));
  edit(b, new DataView(b.buffer));
  const path = join(dir, `${name}.gguf`);
  writeFileSync(path, b);
  return path;
}

/** serve on tensor_count = 0 (then a peer joins), on a file refused with BAD_MODEL_METADATA; inspect on block_count = 2^31. */
export async function badModels(root: string, model: string): Promise<Record<string, unknown>> {
  return withTempDir('probe-gguf-', async (dir) => {
    const l = layoutOf(new Uint8Array(readFileSync(model)));
    const at = (k: string): number => l.kvs.find((x) => x.key === k)!.valueAt;
    const out: Record<string, unknown> = {};

    const zero = patched(model, dir, 'tensors0', (_b, v) => v.setBigUint64(8, 0n, true));
    out['serve, tensor_count = 0, a peer joins'] = await serveThenJoin(root, zero);

    const huge = patched(model, dir, 'blocks2p31', (_b, v) => v.setUint32(at('llama.block_count'), 0x80000000, true));
    for (const cmd of ['inspect', 'manifest']) {
      const t0 = Date.now();
      const p = spawnCli(root, [cmd, huge], { NODE_OPTIONS: '--max-old-space-size=1024' });
      const timer = setTimeout(() => void p.kill(), 60_000);
      const code = await p.exited;
      clearTimeout(timer);
      out[`${cmd}, block_count = 2^31`] = { exit: code, ms: Date.now() - t0, said: p.output().trim().split('\n').filter(Boolean).slice(-1)[0]?.slice(0, 160) };
    }
    out['serve, block_count = 2^31'] = await serveOutcome(root, huge);

    const noEps = patched(model, dir, 'noeps', (b) => void (b[at('llama.attention.layer_norm_rms_epsilon') - 5] = 0x78));
    out['serve, BAD_MODEL_METADATA file'] = await serveOutcome(root, noEps);
    return out;
  });
}

async function serveOutcome(root: string, file: string): Promise<unknown> {
  const port = await freePort();
  const p = spawnCli(root, ['serve', '--port', String(port), '--ui', 'off', '--model', file], { NODE_OPTIONS: '--max-old-space-size=1024' });
  const exited = await Promise.race([p.exited, sleep(8000).then(() => null)]);
  if (exited !== null) return { exit: exited, said: p.output().trim().split('\n').slice(-1)[0]?.slice(0, 160) };
  const ctl = AbortSignal.timeout(5000);
  const answer = await fetch(`http://127.0.0.1:${port}/v1/rooms`, { headers: { authorization: 'Bearer x' }, signal: ctl }).then(async (res) => `${res.status} ${(await res.text()).slice(0, 120)}`, (e: Error) => `no answer within 5 s: ${e.message}`);
  await p.kill();
  return { exit: 'still running after 8 s', holdsPort: port, answer };
}

async function serveThenJoin(root: string, file: string): Promise<unknown> {
  let s;
  try {
    s = await serve(root, file);
  } catch (e) {
    return { refusedAtStart: (e as Error).message.slice(0, 200) };
  }
  const n = await node(root, s).catch((e: Error) => e);
  await sleep(3000);
  const r = { serveAlive: s.proc.alive(), said: s.proc.output().split('\n').filter((x) => /MeshError|Error:/.test(x))[0]?.slice(0, 200) ?? null };
  await s.proc.kill();
  if (!(n instanceof Error)) await n.kill();
  return r;
}

/** How many corrupted copies `inspect` and `manifest` accept (a CLI run each, two at a time). */
export async function corpusAcceptance(root: string, model: string): Promise<Record<string, unknown>> {
  return withTempDir('probe-corpus-', async (dir) => {
    const corpus = corruptCorpus(new Uint8Array(readFileSync(model)));
    const results: Array<{ name: string; inspect: string; manifest: string }> = [];
    const run = async (file: string, cmd: string): Promise<string> => {
      const p = spawnCli(root, [cmd, file], { NODE_OPTIONS: '--max-old-space-size=512' });
      const timer = setTimeout(() => void p.kill(), 30_000);
      const code = await p.exited;
      clearTimeout(timer);
      if (code === 0) return 'accepted';
      const said = /\b([A-Z][A-Z0-9_]{3,}):/.exec(p.output())?.[1];
      return code === 1 && said ? said : `crash(${code})`;
    };
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < corpus.length) {
        const c = corpus[next++]!;
        const file = join(dir, `c${results.length}-${next}.gguf`);
        writeFileSync(file, c.bytes);
        results.push({ name: c.name, inspect: await run(file, 'inspect'), manifest: await run(file, 'manifest') });
      }
    };
    await Promise.all([worker(), worker()]);
    const count = (k: 'inspect' | 'manifest', pred: (s: string) => boolean): number => results.filter((r) => pred(r[k])).length;
    return {
      files: corpus.length,
      inspectAccepted: count('inspect', (s) => s === 'accepted'),
      manifestAccepted: count('manifest', (s) => s === 'accepted'),
      crashed: results.filter((r) => r.inspect.startsWith('crash') || r.manifest.startsWith('crash')).map((r) => `${r.name}: ${r.inspect}/${r.manifest}`),
      acceptedByBoth: results.filter((r) => r.inspect === 'accepted' && r.manifest === 'accepted').map((r) => r.name),
    };
  });
}

/** Wrong-typed JSON bodies on the OpenAI API: the statuses and codes they get. */
export async function jsonBodies(root: string, model: string): Promise<Record<string, string>> {
  const s = await serve(root, model);
  const n = await node(root, s);
  await waitReady(s);
  const out: Record<string, string> = {};
  const bodies: Array<[string, string, string]> = [
    ['/v1/chat/completions', 'null', 'null'],
    ['/v1/chat/completions', 'messages: [null]', '{"messages":[null]}'],
    ['/v1/chat/completions', 'content: 5', '{"messages":[{"role":"user","content":5}]}'],
    ['/v1/chat/completions', 'messages: "hi"', '{"messages":"hi"}'],
    ['/v1/completions', 'prompt: 5', '{"prompt":5}'],
    ['/v1/completions', 'stop: {}', '{"prompt":"a","stop":{},"max_tokens":1}'],
    ['/v1/completions', 'max_tokens: "9"', '{"prompt":"a","max_tokens":"9"}'],
  ];
  for (const [path, label, body] of bodies) {
    const res = await fetch(`${s.base}${path}`, { method: 'POST', headers: { authorization: `Bearer ${s.secret}`, 'content-type': 'application/json' }, body });
    const j = (await res.json().catch(() => ({}))) as { error?: { code?: string; message?: string } };
    out[`${path} ${label}`] = `${res.status} ${j.error?.code ?? ''} ${j.error?.message?.slice(0, 90) ?? ''}`.trim();
  }
  await n.kill();
  await s.proc.kill();
  return out;
}
