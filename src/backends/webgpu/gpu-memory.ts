// Every GPU buffer of a stage is created and destroyed here, so the stage can say how many
// buffers and bytes it holds (dispose() must bring both to zero) and so allocation failures
// become MeshErrors naming what was being allocated.

import { BufferUsage } from './usage.ts';

export class GpuMemory {
  private readonly live = new Map<GPUBuffer, number>(); // buffer → bytes
  private liveBytes = 0;

  constructor(readonly device: GPUDevice) {}

  create(label: string, size: number, usage: GPUBufferUsageFlags): GPUBuffer {
    const bytes = Math.max(4, Math.ceil(size / 4) * 4);
    const buffer = this.device.createBuffer({ label, size: bytes, usage });
    this.live.set(buffer, bytes);
    this.liveBytes += bytes;
    return buffer;
  }

  /** a storage buffer holding `data` (padded to 4 bytes) */
  upload(label: string, data: ArrayBufferView, extraUsage: GPUBufferUsageFlags = 0): GPUBuffer {
    const buffer = this.create(label, data.byteLength, BufferUsage.STORAGE | BufferUsage.COPY_DST | extraUsage);
    const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    const whole = bytes.byteLength & ~3;
    if (whole > 0) this.device.queue.writeBuffer(buffer, 0, bytes as Uint8Array<ArrayBuffer>, 0, whole);
    if (whole < bytes.byteLength) {
      const tail = new Uint8Array(4);
      tail.set(bytes.subarray(whole));
      this.device.queue.writeBuffer(buffer, whole, tail);
    }
    return buffer;
  }

  destroy(buffer: GPUBuffer | null | undefined): void {
    if (!buffer) return;
    const bytes = this.live.get(buffer);
    if (bytes === undefined) return;
    this.live.delete(buffer);
    this.liveBytes -= bytes;
    buffer.destroy();
  }

  /** the buffers alive now, to free what a failed operation made since (see destroyAllExcept) */
  snapshot(): Set<GPUBuffer> {
    return new Set(this.live.keys());
  }

  destroyAllExcept(keep: Set<GPUBuffer>): void {
    for (const b of [...this.live.keys()]) if (!keep.has(b)) this.destroy(b);
  }

  destroyAll(): void {
    for (const b of [...this.live.keys()]) this.destroy(b);
  }

  get count(): number {
    return this.live.size;
  }

  get bytes(): number {
    return this.liveBytes;
  }
}
