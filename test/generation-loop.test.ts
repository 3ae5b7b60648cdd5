// The one generation loop (src/route/generation-loop.ts) on stories260K, over two engines that
// sample in different places: a CPU chain with our Sampler, and llama.cpp (node-llama-cpp's
// evaluation). Each stop rule — a stop string split across tokens, EOG (and ignoreEog),
// max_tokens, context_full, abort — must give the same tokens, text and stop reason on both,
// and the loop's import graph must stay loadable in a page.
import { builtinModules } from 'node:module';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { LlamaCppModel } from '../src/backends/llamacpp/generator.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import type { TensorSource } from '../src/gguf/types.ts';
import type { GenerationRequest, GenerationResult } from '../src/model/generation-output.ts';
import { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import { ChainStepper, InProcessChain, generate } from '../src/route/generation.ts';
import { generateWith, runGeneration } from '../src/route/generation-loop.ts';
import type { TelemetryEvent } from '../src/route/telemetry.ts';
import { REPO_ROOT } from './support/cli.ts';
import { errorCode } from './support/errors.ts';
import { STORIES_PROMPT_TOKENS, stories260K } from './support/models.ts';

/** llama.cpp's greedy tokens for STORIES_PROMPT_TOKENS: ',' ' there' ' was' ' a' ' little' ' g' 'ir' 'l' ' named' ' Lily' '.' */
const GREEDY = [432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426];
/** positions llama.cpp's context holds in these tests */
const LLAMA_CONTEXT = 32;
/** GREEDY[6], 'ir': the end-of-generation token of a copy of the model (it never ends a story on its own) */
const EOG_ID = 315;

let dir: string;
let source: TensorSource;
let tokenizer: Tokenizer;
let eogTokenizer: Tokenizer;
let chain: InProcessChain;
let llama: LlamaCppModel;
let llamaEog: LlamaCppModel;

/** the model's own file with its EOS id, a u32 in the header, changed from 2 to `id` */
function withEos(path: string, id: number): string {
  const bytes = readFileSync(path);
  const key = bytes.indexOf('tokenizer.ggml.eos_token_id');
  const at = key + 'tokenizer.ggml.eos_token_id'.length;
  if (key < 0 || bytes.readUInt32LE(at) !== 4 /* GGUF u32 */ || bytes.readUInt32LE(at + 4) !== 2) throw new Error(`${path}: no u32 EOS id 2 to change`);
  bytes.writeUInt32LE(id, at + 4);
  const out = join(dir, 'stories260K-eos.gguf');
  writeFileSync(out, bytes);
  return out;
}

type Engine = (tok: Tokenizer, request: GenerationRequest) => Promise<GenerationResult>;
const engines: Record<string, Engine> = {
  // the chain's weights are the same whichever EOS the tokenizer names
  'cpu chain': (tok, request) => generate(chain, tok, request),
  // llama.cpp reads EOG from its file: the copy when the tokenizer is the copy's
  'llama.cpp': (tok, request) => generateWith(tok, request, (contextLength) => (tok === eogTokenizer ? llamaEog : llama).openStepper({ contextLength })),
};

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'gguf-mesh-loop-'));
  const path = await stories260K();
  source = await openTensorSource(path);
  tokenizer = Tokenizer.fromMetadata(source.header.metadata);
  const cpu = new CpuBackend();
  await cpu.load(source, { start: 0, end: 5 });
  chain = new InProcessChain([cpu]);
  llama = await LlamaCppModel.load(path, { threads: 1, contextLength: LLAMA_CONTEXT });
  const eogPath = withEos(path, EOG_ID);
  const eogSource = await openTensorSource(eogPath);
  eogTokenizer = Tokenizer.fromMetadata(eogSource.header.metadata);
  await eogSource.close();
  llamaEog = await LlamaCppModel.load(eogPath, { threads: 1, contextLength: LLAMA_CONTEXT });
});
afterAll(async () => {
  await chain?.dispose();
  await llama?.dispose();
  await llamaEog?.dispose();
  await source?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const text = (ids: readonly number[]): string => tokenizer.decode(ids);

describe.each(Object.keys(engines))('the loop over %s', (name) => {
  const run = (request: Omit<GenerationRequest, 'promptTokens'>, tok = tokenizer): Promise<GenerationResult> =>
    engines[name]!(tok, { promptTokens: STORIES_PROMPT_TOKENS, ...request });

  it('max_tokens: exactly that many tokens, the last never fed back; 0 gives none', async () => {
    const r = await run({ maxTokens: 8 });
    expect(r.tokens).toEqual(GREEDY.slice(0, 8));
    expect(r.text).toBe(text(GREEDY.slice(0, 8)));
    expect(r.stopReason).toBe('max_tokens');
    expect(r.timings.prompt_tok_s).toBeGreaterThan(0);
    const none = await run({ maxTokens: 0 });
    expect([none.tokens, none.text, none.stopReason]).toEqual([[], '', 'max_tokens']);
  });

  it('a stop string split over three tokens is cut and never streamed; a prefix that does not complete is released', async () => {
    const deltas: string[] = [];
    const r = await run({ maxTokens: 20, stopStrings: ['girl'], onDelta: (d) => deltas.push(d) });
    expect(r.stopReason).toBe('stop_string');
    // ' g', 'ir', 'l': generation ends on the token that completes the stop string
    expect(r.tokens).toEqual(GREEDY.slice(0, 8));
    expect(r.text).toBe(', there was a little ');
    expect(deltas.join('')).toBe(r.text);

    const held: string[] = [];
    const open = await run({ maxTokens: 11, stopStrings: ['gift'], onDelta: (d) => held.push(d) });
    expect(open.stopReason).toBe('max_tokens');
    expect(open.text).toBe(text(GREEDY));
    expect(held.join('')).toBe(open.text);
    // ' g' could start 'gift': only its space goes out, the 'g' follows with 'ir'
    expect(held.slice(4, 7)).toEqual([' little', ' ', 'gir']);
  });

  it('EOG ends generation with the EOG token kept and its text left out; ignoreEog goes on', async () => {
    expect(eogTokenizer.isEog(EOG_ID)).toBe(true);
    const r = await run({ maxTokens: 20 }, eogTokenizer);
    expect(r.stopReason).toBe('eog');
    expect(r.tokens).toEqual(GREEDY.slice(0, 7));
    expect(r.text).toBe(', there was a little g');
    const past = await run({ maxTokens: 10, ignoreEog: true }, eogTokenizer);
    expect(past.stopReason).toBe('max_tokens');
    expect(past.tokens).toEqual(GREEDY.slice(0, 10));
    expect(past.text).toBe(text(GREEDY.slice(0, 10)));
  });

  it('context_full when the KV positions run out, also when the engine holds fewer than asked', async () => {
    const r = await run({ maxTokens: 20, contextLength: STORIES_PROMPT_TOKENS.length + 3 });
    expect(r.stopReason).toBe('context_full');
    // positions 5, 6, 7 are fed; the token sampled at position 7 is the fourth
    expect(r.tokens).toEqual(GREEDY.slice(0, 4));
    // llama.cpp holds LLAMA_CONTEXT positions; the chain is told the same
    const long = await run({ maxTokens: 40, ...(name === 'cpu chain' ? { contextLength: LLAMA_CONTEXT } : {}) });
    expect(long.stopReason).toBe('context_full');
    expect(long.tokens.length).toBe(LLAMA_CONTEXT - STORIES_PROMPT_TOKENS.length + 1);
  });

  it('abort stops after the step in flight and keeps its token; an aborted signal still gives the prefill\'s token', async () => {
    const ctl = new AbortController();
    let n = 0;
    const r = await run({ maxTokens: 20, signal: ctl.signal, onDelta: () => ++n === 3 && ctl.abort() });
    expect(r.stopReason).toBe('aborted');
    expect(r.tokens).toEqual(GREEDY.slice(0, 3));
    expect(r.text).toBe(text(GREEDY.slice(0, 3)));
    const early = await run({ maxTokens: 20, signal: AbortSignal.abort() });
    expect([early.stopReason, early.tokens]).toEqual(['aborted', GREEDY.slice(0, 1)]);
  });

  it('bad requests are named before anything runs, and the engine is free afterwards', async () => {
    expect(await errorCode(engines[name]!(tokenizer, { promptTokens: [], maxTokens: 4 }))).toBe('EMPTY_PROMPT');
    expect(await errorCode(run({ maxTokens: -1 }))).toBe('BAD_REQUEST');
    expect(await errorCode(run({ maxTokens: 1.5 }))).toBe('BAD_REQUEST');
    expect(await errorCode(run({ maxTokens: 4, contextLength: 3 }))).toBe('CONTEXT_FULL');
    const tooLong = Array.from({ length: LLAMA_CONTEXT + 1 }, (_, i) => (i === 0 ? 1 : 300 + i));
    if (name === 'llama.cpp') expect(await errorCode(engines[name]!(tokenizer, { promptTokens: tooLong, maxTokens: 1 }))).toBe('CONTEXT_FULL');
    expect((await run({ maxTokens: 2 })).tokens).toEqual(GREEDY.slice(0, 2));
  });
});

describe('the loop on an open stepper', () => {
  it('reports prefill progress per chunk and every token with the position it goes to; times each decode step', async () => {
    const stepper = await ChainStepper.open(chain, 'events', 32, undefined, 2);
    const events: TelemetryEvent[] = [];
    try {
      const out = await runGeneration(stepper, tokenizer, STORIES_PROMPT_TOKENS, { maxTokens: 4, sessionId: 'events', onEvent: (e) => events.push(e) });
      expect(out.tokens).toEqual(GREEDY.slice(0, 4));
      expect(out.stepMs.length).toBe(3);
      expect(out.decodeSteps).toBe(3);
      expect(stepper.position).toBe(STORIES_PROMPT_TOKENS.length + 3);
    } finally {
      await stepper.close();
    }
    const progress = events.filter((e) => e.type === 'prefill_progress').map((e) => e.type === 'prefill_progress' && [e.tokensDone, e.tokensTotal]);
    expect(progress).toEqual([[2, 5], [4, 5], [5, 5]]);
    const tokens = events.filter((e) => e.type === 'token');
    expect(tokens.map((e) => e.type === 'token' && [e.sessionId, e.id, e.position])).toEqual(GREEDY.slice(0, 4).map((id, i) => ['events', id, 5 + i]));
    // a chain in this process has no per-stage trailer: no step_timing events
    expect(events.some((e) => e.type === 'step_timing')).toBe(false);
  });
});

describe('browser safety', () => {
  /** modules reached by value (type-only imports and dynamic import() left out) from `entry` */
  function staticGraph(entry: string): Map<string, string[]> {
    const graph = new Map<string, string[]>();
    const visit = (file: string): void => {
      if (graph.has(file)) return;
      const specs: string[] = [];
      graph.set(file, specs);
      const sf = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.ES2022);
      for (const st of sf.statements) {
        const from = (ts.isImportDeclaration(st) && !st.importClause?.isTypeOnly) || (ts.isExportDeclaration(st) && !st.isTypeOnly) ? st.moduleSpecifier : undefined;
        if (!from || !ts.isStringLiteral(from)) continue;
        specs.push(from.text);
        if (from.text.startsWith('.')) visit(resolve(dirname(file), from.text));
      }
    };
    visit(resolve(REPO_ROOT, entry));
    return graph;
  }

  it('the loop, the route stepper and the page\'s chat import nothing Node-only', () => {
    for (const entry of ['src/route/generation-loop.ts', 'src/route/route-generation.ts', 'src/ui/chat-engine.ts']) {
      const graph = staticGraph(entry);
      expect(graph.size).toBeGreaterThan(3);
      const nodeOnly = [...graph].flatMap(([file, specs]) => specs.filter((s) => s.startsWith('node:') || builtinModules.includes(s)).map((s) => `${relative(REPO_ROOT, file)} → ${s}`));
      expect(nodeOnly, entry).toEqual([]);
    }
  });
});
