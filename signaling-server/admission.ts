// Admission control for the OpenAI API: at most `maxActive` generations run at once, at most
// `maxQueue` more wait for a turn, and a request beyond that is answered at once with 429
// QUEUE_FULL and a Retry-After — the queue never grows without bound, and a load balancer
// sees through /v1/health when this server is full.

import { MeshError } from '../src/errors.ts';

export interface AdmissionLimits {
  /** generations running at once (default 16) */
  maxActive?: number;
  /** requests waiting for a turn beyond those (default 64) */
  maxQueue?: number;
}

export const ADMISSION_DEFAULTS = { maxActive: 16, maxQueue: 64 };

export class AdmissionGate {
  readonly maxActive: number;
  readonly maxQueue: number;
  private active = 0;
  private readonly waiting: Array<{ go: () => void; fail: (e: Error) => void }> = [];
  /** requests answered 429 so far */
  refused = 0;

  constructor(limits: AdmissionLimits = {}) {
    this.maxActive = Math.max(1, limits.maxActive ?? ADMISSION_DEFAULTS.maxActive);
    this.maxQueue = Math.max(0, limits.maxQueue ?? ADMISSION_DEFAULTS.maxQueue);
  }

  get counts(): { active: number; waiting: number; maxActive: number; maxQueue: number; refused: number } {
    return { active: this.active, waiting: this.waiting.length, maxActive: this.maxActive, maxQueue: this.maxQueue, refused: this.refused };
  }

  /** True while another request would still be admitted (running or queued). */
  get open(): boolean {
    return this.active < this.maxActive || this.waiting.length < this.maxQueue;
  }

  /**
   * Waits for a turn; resolves with the function that gives it back. QUEUE_FULL (429, with the
   * seconds to wait in details.retryAfterS) when the queue is full; the signal's abort leaves the queue.
   */
  async enter(signal?: AbortSignal): Promise<() => void> {
    if (this.active < this.maxActive) return this.take();
    if (this.waiting.length >= this.maxQueue) {
      this.refused++;
      // a turn frees per finished generation: the queue ahead, shared among the running slots
      const retryAfterS = Math.min(60, 1 + Math.ceil(this.waiting.length / this.maxActive));
      throw new MeshError('QUEUE_FULL', `the server runs ${this.active} generations and ${this.waiting.length} wait, its limits; retry in ${retryAfterS} s`, { retryAfterS });
    }
    await new Promise<void>((go, fail) => {
      const entry = { go, fail };
      this.waiting.push(entry);
      signal?.addEventListener('abort', () => {
        const i = this.waiting.indexOf(entry);
        if (i >= 0) this.waiting.splice(i, 1);
        fail(new MeshError('SESSION_CLOSED', 'the client went away while queued'));
      }, { once: true });
    });
    return this.take();
  }

  private take(): () => void {
    this.active++;
    let given = false;
    return () => {
      if (given) return;
      given = true;
      this.active--;
      const next = this.waiting.shift();
      if (next) next.go();
    };
  }
}
