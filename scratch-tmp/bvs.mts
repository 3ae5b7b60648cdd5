import { CpuBackend } from '../src/backends/cpu/backend.ts';
import { openTensorSource } from '../src/gguf/source.ts';
import { syntheticModel } from '../test/support/synthetic.ts';
const paths = [ '/work/shared/models/stories260K.gguf', await syntheticModel({ type: 'q8_0', layers: 4, embd: 256 }), await syntheticModel({ type: 'q4_k_m', layers: 4, embd: 256 }) ];
for (const path of paths) {
  const src = await openTensorSource(path);
  const nLayer = Number(src.header.metadata[`${src.header.metadata['general.architecture']}.block_count`]);
  for (const shard of [{ start: 0, end: 2 }, { start: 2, end: nLayer }]) {
    const b = new CpuBackend(); await b.load(src, shard);
    const N = 40; const toks = Int32Array.from({ length: N }, (_, i) => (i * 7 + 3) % 200 + 1);
    const emb = 64;
    // inputs: tokens for stage 0, random hidden for stage 1
    const cfgE = Number(src.header.metadata[`${src.header.metadata['general.architecture']}.embedding_length`]);
    const hidden = Float32Array.from({ length: N * cfgE }, (_, i) => Math.sin(i * 0.37));
    const input = (a: number, n: number) => shard.start === 0 ? { kind: 'tokens' as const, tokens: toks.slice(a, a + n) } : { kind: 'hidden' as const, hidden: hidden.slice(a * cfgE, (a + n) * cfgE), nTokens: n };
    // A: prefill 16 then 1-by-1 ; B: prefill 16 then one batch of 24
    await b.openSession('a', { contextLength: 64 }); await b.openSession('b', { contextLength: 64 });
    const outA: Float32Array[] = []; const outB: Float32Array[] = [];
    const flat = (r: any) => r.output.kind === 'hidden' ? r.output.hidden : r.output.logits;
    outA.push(flat(await b.forward('a', input(0, 16), 0)));
    for (let p = 16; p < N; p++) outA.push(flat(await b.forward('a', input(p, 1), p)));
    outB.push(flat(await b.forward('b', input(0, 16), 0)));
    const rb = flat(await b.forward('b', input(16, N - 16), 16));
    // compare: for hidden outputs compare rows; for logits only last
    const a = Float32Array.from(outA.slice(1).flatMap((x) => [...x]));
    let diff = 0, n = 0;
    if (shard.end !== nLayer) { for (let i = 0; i < a.length; i++) { diff = Math.max(diff, Math.abs(a[i]! - rb[i]!)); if (a[i] !== rb[i]) n++; } }
    else { const la = outA[outA.length - 1]!; for (let i = 0; i < la.length; i++) { diff = Math.max(diff, Math.abs(la[i]! - rb[i]!)); if (la[i] !== rb[i]) n++; } }
    // then one more decode step on both: compare
    const na = flat(await b.forward('a', input(N - 1, 1), N).catch(() => null) ?? { output: { kind: 'logits', logits: new Float32Array() } });
    console.log(path.split('/').pop(), shard, 'maxdiff', diff, 'ndiff', n);
  }
}
