// The bounded pieces on their own: the stage's compute queue (decode steps first, prefill
// chunks in turns, cancel drops queued work and waits for the running job), fragment
// reassembly bounded in announced bytes and in age, and the rejoin back-off.
import { describe, expect, it } from 'vitest';
import { MeshError } from '../../src/errors.ts';
import { ComputeQueue } from '../../src/peer/compute-queue.ts';
import { reconnectDelay, rejoin } from '../../src/peer/reconnect.ts';
import { fragment, Reassembler } from '../../src/protocol/fragment.ts';
import { encodeFrame, FrameType } from '../../src/protocol/frame.ts';
import { tokensFrame } from '../../src/protocol/payload.ts';

const tick = (ms = 5): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('ComputeQueue', () => {
  it('runs decode steps before queued prefill chunks, and the prefill of the session served longest ago first', async () => {
    const q = new ComputeQueue();
    const order: string[] = [];
    const job = (label: string) => async () => {
      order.push(label);
      await tick();
    };
    const all = [
      q.run('a', 'prefill', job('a1')),
      q.run('a', 'prefill', job('a2')),
      q.run('a', 'prefill', job('a3')),
      q.run('b', 'prefill', job('b1')),
      q.run('b', 'prefill', job('b2')),
      q.run('c', 'decode', job('c1')),
    ];
    await Promise.all(all);
    expect(order).toEqual(['c1', 'a1', 'b1', 'a2', 'b2', 'a3']);
  });

  it('holds other sessions\' prefill chunks briefly for a session that just opened, and never longer than asked', async () => {
    const q = new ComputeQueue();
    const order: string[] = [];
    const job = (label: string) => async () => void order.push(label);
    q.expect('new', 40);
    const long = q.run('long', 'prefill', job('long'));
    await tick(15);
    expect(order).toEqual([]);
    await q.run('new', 'prefill', job('new'));
    await long;
    expect(order).toEqual(['new', 'long']);
    // an expected session that never sends: the others go on after the hold
    q.expect('silent', 30);
    const t0 = performance.now();
    await q.run('long', 'prefill', job('long2'));
    expect(performance.now() - t0).toBeGreaterThan(25);
  });

  it('reports how long a job waited, and cancel rejects queued jobs at once and waits only for the one running', async () => {
    const q = new ComputeQueue();
    let release!: () => void;
    const running = q.run('a', 'prefill', () => new Promise<void>((r) => (release = r)));
    await tick(); // it starts once the loop has polled for I/O
    const queued = [q.run('a', 'prefill', async () => 'never'), q.run('a', 'decode', async () => 'never')];
    const other = q.run('b', 'decode', async () => 'b ran');
    const rejected = Promise.allSettled(queued);
    let cancelled = false;
    const cancel = q.cancel('a', new MeshError('SESSION_CLOSED', 'closed')).then(() => (cancelled = true));
    const settled = await rejected;
    expect(settled.map((s) => s.status)).toEqual(['rejected', 'rejected']);
    expect((settled[0] as PromiseRejectedResult).reason.code).toBe('SESSION_CLOSED');
    await tick();
    expect(cancelled).toBe(false); // its running job is still computing
    release();
    await cancel;
    await running;
    const b = await other;
    expect(b.value).toBe('b ran');
    expect(b.waitedMs).toBeGreaterThan(0);
  });
});

describe('Reassembler bounds', () => {
  const bigFrame = encodeFrame(tokensFrame(FrameType.Prefill, { routeId: 1, sessionId: 'ab'.repeat(16) }, 0, Array.from({ length: 4096 }, (_, i) => i)));

  it('refuses a message whose announced frame would pass the pending-bytes limit, before keeping anything', () => {
    const r = new Reassembler({ maxPendingBytes: 8 * 1024 });
    const parts = fragment(bigFrame, 1024, 1);
    expect(() => r.push(parts[0]!)).toThrow(expect.objectContaining({ code: 'FRAGMENT_TOO_MANY' }));
    expect(r.pendingCount).toBe(0);
    // under the limit the same frame reassembles
    const roomy = new Reassembler({ maxPendingBytes: 64 * 1024 });
    let out = null;
    for (const p of parts) out = roomy.push(p);
    expect(out?.nTokens).toBe(4096);
    expect(roomy.pendingBytes).toBe(0);
  });

  it('drops a message whose next fragment is overdue', async () => {
    const r = new Reassembler({ maxAgeMs: 20 });
    const parts = fragment(bigFrame, 1024, 7);
    r.push(parts[0]!);
    expect(r.pendingBytes).toBe(bigFrame.byteLength);
    await tick(40);
    expect(r.expire()).toBe(1);
    expect(r.pendingCount).toBe(0);
    // its later fragments are now out of order, not silently appended
    expect(() => r.push(parts[1]!)).toThrow(expect.objectContaining({ code: 'FRAGMENT_OUT_OF_ORDER' }));
  });
});

describe('rejoin back-off', () => {
  it('doubles from the base with jitter between half and all of it, capped', () => {
    expect(reconnectDelay(0, 500, 15_000, () => 0)).toBe(250);
    expect(reconnectDelay(0, 500, 15_000, () => 1)).toBe(500);
    expect(reconnectDelay(3, 500, 15_000, () => 1)).toBe(4000);
    expect(reconnectDelay(20, 500, 15_000, () => 1)).toBe(15_000);
    expect(reconnectDelay(20, 500, 15_000, () => 0)).toBe(7500);
  });

  it('retries until the join succeeds, gives up at once on AUTH_FAILED, and at the deadline otherwise', async () => {
    let n = 0;
    const ok = await rejoin(async () => (++n < 3 ? Promise.reject(new MeshError('JOIN_FAILED', 'down')) : 'joined'), { baseMs: 1, maxMs: 2 }, () => false, () => undefined);
    expect([ok, n]).toEqual(['joined', 3]);
    let m = 0;
    await expect(rejoin(async () => (m++, Promise.reject(new MeshError('AUTH_FAILED', 'wrong secret'))), { baseMs: 1 }, () => false, () => undefined)).rejects.toMatchObject({ code: 'AUTH_FAILED' });
    expect(m).toBe(1);
    await expect(rejoin(() => Promise.reject(new MeshError('JOIN_FAILED', 'down')), { forMs: 30, baseMs: 5, maxMs: 10 }, () => false, () => undefined)).rejects.toMatchObject({ code: 'JOIN_FAILED' });
  });
});
