import { describe, expect, it } from 'vitest';
import { decodeFrame, DType, encodeFrame, FrameFlag, FrameType, HEADER_BYTES, makeFrame } from '../src/protocol/frame.ts';
import type { Frame } from '../src/protocol/frame.ts';
import { FrameDecoder } from '../src/protocol/decoder.ts';
import { fragment, Fragmenter, FRAGMENT_HEADER_BYTES, Reassembler } from '../src/protocol/fragment.ts';
import { decodeI32, decodeJson, decodeRows, hiddenFrame, payloadBody, timingsOf, tokensFrame, withTimings } from '../src/protocol/payload.ts';
import { isMeshError } from '../src/errors.ts';

const hex = (s: string): Uint8Array => Uint8Array.from(s.replace(/\s+/g, '').match(/../g)!.map((b) => parseInt(b, 16)));
const toHex = (b: Uint8Array): string => Buffer.from(b).toString('hex');
const SESSION = '00112233445566778899aabbccddeeff';

// Written by hand from docs/protocol.md, not produced by the encoder.
const DECODE_HEX = `
  474d5348 01 04 0100 07000000 ${SESSION}
  03000000 05000000 01000000 03 000000 01000000 04000000
  7a010000`;
// Hidden states, 2 tokens × width 2, f16: [1, -2, 0.5, 65504]
const HIDDEN_HEX = `
  474d5348 01 05 0000 07000000 ${SESSION}
  04000000 05000000 02000000 02 000000 02000000 08000000
  003c 00c0 0038 ff7b`;
// Error {"code":"X","message":"m"} (27 bytes) as a reply
const ERROR_JSON = '{"code":"X","message":"m"}';
const ERROR_HEX = `
  474d5348 01 08 0200 07000000 ${SESSION}
  04000000 00000000 00000000 04 000000 00000000 1a000000
  ${toHex(new TextEncoder().encode(ERROR_JSON))}`;

function expectCode(fn: () => unknown, code: string, field?: string): void {
  try {
    fn();
  } catch (e) {
    if (!isMeshError(e)) throw e;
    expect(e.code).toBe(code);
    if (field) expect(e.details?.field).toBe(field);
    return;
  }
  throw new Error(`expected ${code}, nothing thrown`);
}

function patched(base: string, offset: number, bytes: number[]): Uint8Array {
  const b = hex(base);
  bytes.forEach((x, i) => (b[offset + i] = x));
  return b;
}

describe('frame codec: hex fixtures', () => {
  it('decodes a decode-step fixture and re-encodes it byte for byte', () => {
    const f = decodeFrame(hex(DECODE_HEX));
    expect(f).toMatchObject({ type: FrameType.Decode, flags: FrameFlag.Sample, routeId: 7, sessionId: SESSION, seq: 3, position: 5, nTokens: 1, dtype: DType.I32, width: 1 });
    expect([...decodeI32(f.payload)]).toEqual([378]);
    expect(toHex(encodeFrame(f))).toBe(toHex(hex(DECODE_HEX)));
    expect(toHex(encodeFrame(tokensFrame(FrameType.Decode, { routeId: 7, sessionId: SESSION, seq: 3 }, 5, [378], FrameFlag.Sample)))).toBe(toHex(hex(DECODE_HEX)));
  });

  it('decodes f16 hidden states and encodes f32 rows to the same bytes', () => {
    const f = decodeFrame(hex(HIDDEN_HEX));
    expect(f).toMatchObject({ type: FrameType.Hidden, nTokens: 2, width: 2, dtype: DType.F16 });
    expect([...decodeRows(f.payload, f.dtype)]).toEqual([1, -2, 0.5, 65504]);
    const built = hiddenFrame({ routeId: 7, sessionId: SESSION, seq: 4 }, 5, new Float32Array([1, -2, 0.5, 65504]), 2, DType.F16);
    expect(toHex(encodeFrame(built))).toBe(toHex(hex(HIDDEN_HEX)));
    const f32 = hiddenFrame({ routeId: 7, sessionId: SESSION }, 5, new Float32Array([0.1, -0.2]), 1, DType.F32);
    expect(f32.payload.byteLength).toBe(8);
    expect([...decodeRows(decodeFrame(encodeFrame(f32)).payload, DType.F32)]).toEqual([Math.fround(0.1), Math.fround(-0.2)]);
  });

  it('decodes an error fixture carrying code and message', () => {
    const f = decodeFrame(hex(ERROR_HEX));
    expect(f.type).toBe(FrameType.Error);
    expect(decodeJson(f.payload)).toEqual({ code: 'X', message: 'm' });
  });
});

// A Token reply with a timing trailer of one record: stage 2, position 5, compute 1000 µs,
// downstream 0, handle 1500 µs, queue 20 µs, 1076 bytes in, 0 out; then the count (1).
const TOKEN_TIMED_HEX = `
  474d5348 01 06 1200 07000000 ${SESSION}
  03000000 06000000 01000000 03 000000 01000000 28000000
  7a010000
  02000000 05000000 e8030000 00000000 dc050000 14000000 34040000 00000000
  01000000`;

describe('timing trailer', () => {
  it('decodes a Token reply whose payload ends with per-stage step timings', () => {
    const f = decodeFrame(hex(TOKEN_TIMED_HEX));
    expect(f.flags).toBe(FrameFlag.Reply | FrameFlag.Timings);
    expect([...decodeI32(payloadBody(f))]).toEqual([378]);
    expect(timingsOf(f)).toEqual([{ stage: 2, position: 5, computeUs: 1000, downstreamUs: 0, handleUs: 1500, queueUs: 20, bytesIn: 1076, bytesOut: 0 }]);
    const rebuilt = withTimings({ ...tokensFrame(FrameType.Token, { routeId: 7, sessionId: SESSION, seq: 3 }, 6, [378]), flags: FrameFlag.Reply }, timingsOf(f));
    expect(toHex(encodeFrame(rebuilt))).toBe(toHex(hex(TOKEN_TIMED_HEX)));
    // appending a stage's record on the way up keeps earlier ones
    const two = withTimings(f, [{ stage: 1, position: 5, computeUs: 1, downstreamUs: 2, handleUs: 3, queueUs: 0, bytesIn: 0, bytesOut: 9 }]);
    expect(timingsOf(decodeFrame(encodeFrame(two))).map((t) => t.stage)).toEqual([2, 1]);
  });

  it('refuses a trailer whose count disagrees with its length, whole or streamed', () => {
    const bad = hex(TOKEN_TIMED_HEX);
    bad[bad.length - 4] = 2;
    expectCode(() => decodeFrame(bad), 'FRAME_BAD_LENGTH', 'timings');
    const d = new FrameDecoder();
    expectCode(() => { for (let i = 0; i < bad.length; i++) d.push(bad.subarray(i, i + 1)); }, 'FRAME_BAD_LENGTH', 'timings');
    expectCode(() => decodeFrame(patched(TOKEN_TIMED_HEX, 48, [0x27])), 'FRAME_BAD_LENGTH', 'payload length');
    // a JSON frame cannot carry a trailer
    expectCode(() => decodeFrame(patched(ERROR_HEX, 6, [0x12])), 'FRAME_BAD_FLAGS', 'flags');
  });
});

describe('incremental decoder', () => {
  const stream = new Uint8Array([...hex(DECODE_HEX), ...hex(HIDDEN_HEX), ...hex(ERROR_HEX)]);
  const whole = new FrameDecoder().push(stream).map((f) => toHex(encodeFrame(f)));

  it('decodes three concatenated frames', () => {
    expect(whole).toHaveLength(3);
    expect(whole[0]).toBe(toHex(hex(DECODE_HEX)));
  });

  it('decodes the same frames when the stream is split at every byte boundary', () => {
    for (let cut = 1; cut < stream.byteLength; cut++) {
      const d = new FrameDecoder();
      const got = [...d.push(stream.subarray(0, cut)), ...d.push(stream.subarray(cut))].map((f) => toHex(encodeFrame(f)));
      expect(got).toEqual(whole);
      expect(d.idle).toBe(true);
    }
  });

  it('decodes the same frames fed one byte at a time', () => {
    const d = new FrameDecoder();
    const got: string[] = [];
    for (let i = 0; i < stream.byteLength; i++) got.push(...d.push(stream.subarray(i, i + 1)).map((f) => toHex(encodeFrame(f))));
    expect(got).toEqual(whole);
    d.end();
  });

  it('refuses a bad magic from its first byte and stays failed', () => {
    const d = new FrameDecoder();
    expectCode(() => d.push(new Uint8Array([0x58])), 'FRAME_BAD_MAGIC', 'magic');
    expectCode(() => d.push(hex(DECODE_HEX)), 'FRAME_BAD_MAGIC');
  });

  it('refuses an impossible payload length before the payload arrives', () => {
    const h = patched(HIDDEN_HEX, 48, [0xff, 0xff, 0xff, 0x7f]).subarray(0, HEADER_BYTES);
    expectCode(() => new FrameDecoder().push(h), 'FRAME_BAD_LENGTH', 'payload length');
  });

  it('names a stream that ends inside a frame', () => {
    const d = new FrameDecoder();
    d.push(hex(HIDDEN_HEX).subarray(0, HEADER_BYTES + 3));
    expectCode(() => d.end(), 'FRAME_TRUNCATED', 'payload');
    const d2 = new FrameDecoder();
    d2.push(hex(HIDDEN_HEX).subarray(0, 10));
    expectCode(() => d2.end(), 'FRAME_TRUNCATED', 'header');
  });
});

describe('strict decoding names the wrong field', () => {
  // [name, bytes, code, field, code from the stream decoder when it differs]
  const cases: Array<[string, Uint8Array, string, string, string?]> = [
    ['magic', patched(DECODE_HEX, 0, [0x47, 0x47, 0x55, 0x46]), 'FRAME_BAD_MAGIC', 'magic'],
    ['version', patched(DECODE_HEX, 4, [2]), 'FRAME_BAD_VERSION', 'version'],
    ['type', patched(DECODE_HEX, 5, [99]), 'FRAME_BAD_TYPE', 'type'],
    ['flags', patched(DECODE_HEX, 7, [0x04]), 'FRAME_BAD_FLAGS', 'flags'],
    ['reserved', patched(DECODE_HEX, 42, [1]), 'FRAME_BAD_RESERVED', 'reserved'],
    ['dtype for type', patched(DECODE_HEX, 40, [DType.F16]), 'FRAME_BAD_DTYPE', 'dtype'],
    ['unknown dtype', patched(HIDDEN_HEX, 40, [77]), 'FRAME_BAD_DTYPE', 'dtype'],
    ['decode with two tokens', patched(DECODE_HEX, 36, [2]), 'FRAME_BAD_DIMENSION', 'token count'],
    ['hidden with width 0', patched(HIDDEN_HEX, 44, [0]), 'FRAME_BAD_DIMENSION', 'width'],
    ['token width 2', patched(DECODE_HEX, 44, [2]), 'FRAME_BAD_DIMENSION', 'width'],
    ['payload length vs shape', patched(HIDDEN_HEX, 48, [6]), 'FRAME_BAD_LENGTH', 'payload length'],
    ['trailing bytes', new Uint8Array([...hex(DECODE_HEX), 0]), 'FRAME_BAD_LENGTH', 'payload length', 'FRAME_BAD_MAGIC'],
    ['short payload', hex(DECODE_HEX).subarray(0, HEADER_BYTES + 2), 'FRAME_TRUNCATED', 'payload'],
    ['short header', hex(DECODE_HEX).subarray(0, 20), 'FRAME_TRUNCATED', 'header'],
  ];
  for (const [name, bytes, code, field, streamCode] of cases) {
    it(`${name} → ${code}`, () => {
      expectCode(() => decodeFrame(bytes), code, field);
      expectCode(() => {
        const d = new FrameDecoder();
        d.push(bytes);
        d.end();
      }, streamCode ?? code);
    });
  }

  it('refuses to encode what a peer would refuse', () => {
    expectCode(() => encodeFrame(makeFrame({ type: FrameType.Decode, dtype: DType.I32, width: 1, nTokens: 1, payload: new Uint8Array(8) })), 'FRAME_BAD_LENGTH');
    expectCode(() => encodeFrame(makeFrame({ type: FrameType.SessionClose, sessionId: 'xyz' })), 'FRAME_BAD_SESSION');
  });

  it('survives random garbage without crashing', () => {
    let seed = 12345;
    const rnd = (): number => (seed = (seed * 1103515245 + 12345) >>> 0) >>> 24;
    for (let n = 0; n < 2000; n++) {
      const b = hex(n % 2 ? DECODE_HEX : HIDDEN_HEX);
      b[rnd() % b.byteLength] = rnd();
      try {
        decodeFrame(b);
      } catch (e) {
        expect(isMeshError(e)).toBe(true);
      }
    }
  });
});

describe('fragmentation', () => {
  // 4096 tokens × 64 f32 = 1 MiB of hidden states
  const rows = new Float32Array(4096 * 64).map((_, i) => Math.sin(i));
  const big = encodeFrame(hiddenFrame({ routeId: 1, sessionId: SESSION }, 0, rows, 4096, DType.F32));

  for (const limit of [16 * 1024, 256 * 1024]) {
    it(`splits a 1 MiB frame into messages ≤ ${limit / 1024} KiB and reassembles it`, () => {
      const parts = new Fragmenter(limit).split(big);
      expect(parts.length).toBe(Math.ceil(big.byteLength / (limit - FRAGMENT_HEADER_BYTES)));
      for (const p of parts) expect(p.byteLength).toBeLessThanOrEqual(limit);
      const r = new Reassembler();
      const frames = parts.map((p) => r.push(p));
      expect(frames.slice(0, -1).every((f) => f === null)).toBe(true);
      const f = frames.at(-1) as Frame;
      expect(toHex(encodeFrame(f)) === toHex(big)).toBe(true);
      expect(r.pendingCount).toBe(0);
    });
  }

  it('passes a frame under the limit through unchanged', () => {
    const small = hex(DECODE_HEX);
    expect(fragment(small, 16 * 1024, 1)).toEqual([small]);
    expect(new Reassembler().push(small)?.type).toBe(FrameType.Decode);
  });

  it('reassembles two interleaved messages', () => {
    const a = fragment(big, 16 * 1024, 1);
    const b = fragment(big, 16 * 1024, 2);
    const r = new Reassembler();
    const done: Frame[] = [];
    for (let i = 0; i < a.length; i++) {
      for (const m of [a[i]!, b[i]!]) {
        const f = r.push(m);
        if (f) done.push(f);
      }
    }
    expect(done).toHaveLength(2);
  });

  it('refuses a missing fragment, a changed total and an over-long message', () => {
    const parts = fragment(big, 16 * 1024, 9);
    const r = new Reassembler();
    r.push(parts[0]!);
    expectCode(() => r.push(parts[2]!), 'FRAGMENT_OUT_OF_ORDER', 'index');
    expectCode(() => new Reassembler().push(parts[1]!), 'FRAGMENT_OUT_OF_ORDER');
    const changed = parts[1]!.slice();
    new DataView(changed.buffer).setUint32(16, big.byteLength + 1, true);
    const r2 = new Reassembler();
    r2.push(parts[0]!);
    expectCode(() => r2.push(changed), 'FRAGMENT_BAD_LENGTH', 'total');
    const tiny = fragment(encodeFrame(hiddenFrame({ routeId: 1, sessionId: SESSION }, 0, new Float32Array(64), 1, DType.F32)), 64, 3);
    const lastCut = tiny.at(-1)!.subarray(0, FRAGMENT_HEADER_BYTES + 1);
    const r3 = new Reassembler();
    tiny.slice(0, -1).forEach((m) => r3.push(m));
    expectCode(() => r3.push(lastCut), 'FRAGMENT_TRUNCATED');
  });
});
