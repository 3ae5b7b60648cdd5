// Admission control and readiness, on a real serve (--max-active 2 --max-queue 3) and one cpu
// node: /v1/health is 503 before the route is ready and while the queue is full, 200 otherwise;
// 30 concurrent completions are each either completed or answered 429 with a Retry-After, and
// nothing is left in the session table afterwards.
import { afterAll, describe, expect, it } from 'vitest';
import { killAll, spawnMesh, spawnServe, waitForRoute } from '../support/mesh.ts';
import { stories260K } from '../support/models.ts';

afterAll(() => killAll());

describe('admission control', () => {
  it('answers 429 with Retry-After beyond the queue, completes the rest, and /v1/health tells a load balancer', async () => {
    const s = await spawnServe(await stories260K(), ['--max-active', '2', '--max-queue', '3']);
    const health = async (): Promise<{ status: number; body: { status: string; queue: { active: number; waiting: number }; sessions: number; keptSessions: number } }> => {
      const r = await fetch(`${s.base}/v1/health`);
      return { status: r.status, body: (await r.json()) as never };
    };
    expect((await health()).status).toBe(503); // no route yet
    spawnMesh(['node', '--join', s.joinUrl]);
    await waitForRoute(s, 'ready');
    expect(await health()).toMatchObject({ status: 200, body: { status: 'ready' } });
    const one = (): Promise<{ status: number; retryAfter: string | null; text: string }> =>
      fetch(`${s.base}/v1/completions`, { method: 'POST', headers: { authorization: `Bearer ${s.secret}`, 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 24, temperature: 0 }) }).then(async (r) => ({ status: r.status, retryAfter: r.headers.get('retry-after'), text: await r.text() }));
    const all = Array.from({ length: 30 }, one);
    await new Promise((r) => setTimeout(r, 30));
    const busy = await health();
    const results = await Promise.all(all);
    const by = (code: number) => results.filter((r) => r.status === code);
    console.log(`overload: ${by(200).length} completed, ${by(429).length} answered 429; health while busy: ${busy.status} ${JSON.stringify(busy.body.queue)}`);
    expect(by(200).length + by(429).length).toBe(30);
    expect(by(200).length).toBeGreaterThanOrEqual(5);
    expect(by(429).length).toBeGreaterThan(0);
    for (const r of by(429)) {
      expect(Number(r.retryAfter)).toBeGreaterThanOrEqual(1);
      expect(JSON.parse(r.text).error).toMatchObject({ code: 'QUEUE_FULL', type: 'rate_limit_error' });
    }
    for (const r of by(200)) expect(JSON.parse(r.text).choices[0].text.length).toBeGreaterThan(0);
    const after = await health();
    expect(after).toMatchObject({ status: 200, body: { queue: { active: 0, waiting: 0 } } });
    // nothing left but the sessions KV reuse keeps idle for the next request (bounded by its cache)
    expect(after.body.sessions).toBe(after.body.keptSessions);
  });
});
