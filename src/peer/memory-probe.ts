// How much a tab can really hold: allocate GPU buffers of the adapter's largest size (at most
// `chunkBytes`), clear each one so the driver commits its memory, until the cap, an
// out-of-memory error or device loss; then free them all and destroy the probe's device.
// navigator.deviceMemory cannot answer this: Chromium rounds it and caps it at 8, Safari and
// Firefox have none, and a phone's browser lets a tab keep far less than the phone has.

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

/** The smallest probe buffer: below it an out-of-memory answer ends the probe. */
const MIN_CHUNK = 16 * MiB;

/** A multiple of 4 bytes: clearBuffer takes only those. */
const wordAligned = (n: number): number => Math.floor(n / 4) * 4;

/** Part of what the probe held that a budget keeps back for KV caches and scratch activations. */
export const PROBE_HEADROOM = 0.2;

export interface MemoryProbe {
  /** bytes the probe held at once, all buffers cleared and submitted */
  measuredBytes: number;
  /** what the tab offers for weights: measured less the headroom */
  offeredBytes: number;
  /** the most the probe tried (a policy ceiling, not a measurement) */
  capBytes: number;
  /** the first probe buffer's size: min(chunk option, adapter maxBufferSize, cap) */
  chunkBytes: number;
  /** what stopped it: the cap (the tab holds at least that), out-of-memory, device loss, or a refused allocation */
  limitedBy: 'cap' | 'out-of-memory' | 'device-lost' | 'error';
  /** allocations answered out-of-memory (each halved the chunk) */
  outOfMemory: number;
  /** buffers created and destroyed (equal once the probe returns) */
  buffers: { created: number; destroyed: number };
  ms: number;
}

export interface ProbeOptions {
  capBytes: number;
  /** size of one probe buffer (default 256 MiB, never above the adapter's maxBufferSize) */
  chunkBytes?: number;
}

/**
 * The ceiling a probe tries by default. A software adapter's "GPU memory" is the page's own
 * heap, so it probes little; a phone's tab is killed rather than told it is out of memory, so
 * it stays under the browser's own figure (reported exactly below 8 GiB) or 2 GiB; elsewhere 8 GiB.
 */
export function defaultProbeCap(adapter: { isFallbackAdapter: boolean }, nav: { deviceMemory?: number; userAgent?: string; userAgentData?: { mobile?: boolean } } = globalThis.navigator ?? {}): number {
  if (adapter.isFallbackAdapter) return 128 * MiB;
  const mobile = nav.userAgentData?.mobile ?? /Mobi|Android|iPhone|iPad/.test(nav.userAgent ?? '');
  if (mobile) return nav.deviceMemory ? Math.min(2 * GiB, (nav.deviceMemory * GiB) / 2) : 1 * GiB;
  return 8 * GiB;
}

/** Probes `adapter` (a device of its own, destroyed afterwards) up to `capBytes`. */
export async function probeGpuMemory(adapter: GPUAdapter, opts: ProbeOptions): Promise<MemoryProbe> {
  const t0 = performance.now();
  const capBytes = Math.max(0, Math.floor(opts.capBytes));
  const chunkBytes = wordAligned(Math.min(opts.chunkBytes ?? 256 * MiB, adapter.limits.maxBufferSize, capBytes));
  const device = await adapter.requestDevice({ label: 'gguf-mesh memory probe', requiredLimits: { maxBufferSize: adapter.limits.maxBufferSize } });
  let lost = false;
  void device.lost.then(() => (lost = true));
  const held: GPUBuffer[] = [];
  const buffers = { created: 0, destroyed: 0 };
  let limitedBy: MemoryProbe['limitedBy'] = 'cap';
  let measuredBytes = 0;
  let outOfMemory = 0;
  let chunk = chunkBytes;
  try {
    // an out-of-memory answer halves the chunk (a driver may refuse one buffer of the adapter's
    // largest size yet hold two of half of it: SwiftShader does), down to MIN_CHUNK
    while (chunk >= Math.min(MIN_CHUNK, chunkBytes) && chunk > 0) {
      if (measuredBytes + chunk > capBytes) {
        if (measuredBytes + MIN_CHUNK > capBytes) {
          limitedBy = 'cap'; // what is left below the cap is smaller than a probe buffer
          break;
        }
        chunk = wordAligned(capBytes - measuredBytes);
        continue;
      }
      device.pushErrorScope('out-of-memory');
      device.pushErrorScope('validation');
      const buf = device.createBuffer({ label: `memory probe ${held.length}`, size: chunk, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST });
      buffers.created++;
      held.push(buf);
      const enc = device.createCommandEncoder();
      enc.clearBuffer(buf); // touches every byte, so the memory is committed, not just reserved
      device.queue.submit([enc.finish()]);
      const invalid = await device.popErrorScope();
      const oom = await device.popErrorScope();
      await device.queue.onSubmittedWorkDone();
      if (lost) {
        limitedBy = 'device-lost';
        break;
      }
      // an out-of-memory buffer is invalid, so clearing it is also a validation error: oom first
      if (oom) {
        outOfMemory++;
        limitedBy = 'out-of-memory';
        buf.destroy();
        buffers.destroyed++;
        held.pop();
        chunk = wordAligned(chunk / 2);
        continue;
      }
      if (invalid) {
        limitedBy = 'error';
        break;
      }
      measuredBytes += chunk;
      if (measuredBytes >= capBytes) limitedBy = 'cap';
    }
  } finally {
    for (const b of held) {
      b.destroy();
      buffers.destroyed++;
    }
    device.destroy();
  }
  return { measuredBytes, offeredBytes: Math.floor(measuredBytes * (1 - PROBE_HEADROOM)), capBytes, chunkBytes, limitedBy, outOfMemory, buffers, ms: performance.now() - t0 };
}

/**
 * The budget after a shard of `failedBytes` could not be kept (out of memory, device lost): at
 * most half the old budget and below the failed shard, so the same range (or any that holds
 * it) is never planned onto this tab again, and repeated failures shrink it until it is left out.
 */
export function budgetAfterFailure(currentBytes: number, failedBytes: number): number {
  return Math.max(0, Math.floor(Math.min(currentBytes / 2, failedBytes * 0.75)));
}
