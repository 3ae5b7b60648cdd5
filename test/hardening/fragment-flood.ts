// The fragment flood of issue 16: `messages` fragmented messages, each announcing a frame of
// 256 MiB and sending `fragmentsEach` slices of 1 MiB of it, then nothing — what a client that
// reserves reassembly memory and never finishes does. Shared by the limits test and the probe.
import type WebSocket from 'ws';

export function floodFragments(ws: WebSocket, messages = 16, fragmentsEach = 16): void {
  for (let id = 1; id <= messages; id++) {
    for (let k = 0; k < fragmentsEach && ws.readyState === ws.OPEN; k++) {
      const msg = new Uint8Array(20 + (1 << 20));
      const v = new DataView(msg.buffer);
      v.setUint32(0, 0x46534d47, true); // "GMSF"
      v.setUint8(4, 1);
      v.setUint32(8, id, true);
      v.setUint32(12, k, true);
      v.setUint32(16, 256 * 1024 * 1024 + 52, true);
      msg.fill(1, 20);
      ws.send(msg);
    }
  }
}
