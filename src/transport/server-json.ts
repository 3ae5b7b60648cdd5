// JSON from the signaling server's HTTP API, with the room secret as a Bearer token: the one
// reader native nodes, browser peers, the route client and the page share. The server answers
// a refusal as `{error: {code, message}}`; that becomes the MeshError thrown, so a caller sees
// the server's own code (AUTH_FAILED, NOT_FOUND, …) rather than a bare HTTP status.

import { MeshError } from '../errors.ts';
import type { ErrorCode } from '../errors.ts';

export interface FetchJsonOptions {
  signal?: AbortSignal;
  /** the code when the server cannot be reached at all (default JOIN_FAILED) */
  unreachableCode?: ErrorCode;
  /** give up when no answer came within this long (ms; default: no limit) */
  timeoutMs?: number;
}

/** GET `url` with `Authorization: Bearer <secret>` and read its JSON body. */
export async function fetchJson<T>(url: string, secret: string, opts: FetchJsonOptions = {}): Promise<T> {
  let res: Response;
  try {
    const signals = [opts.signal, opts.timeoutMs ? AbortSignal.timeout(opts.timeoutMs) : undefined].filter((x): x is AbortSignal => x !== undefined);
    const signal = signals.length > 1 ? AbortSignal.any(signals) : signals[0];
    res = await fetch(url, { headers: { authorization: `Bearer ${secret}` }, ...(signal ? { signal } : {}) });
  } catch (e) {
    // fetch says only 'fetch failed'; the cause names the refused certificate or the refused connection
    const cause = (e as Error & { cause?: Error }).cause?.message;
    throw new MeshError(opts.unreachableCode ?? 'JOIN_FAILED', `cannot reach ${url}: ${(e as Error).message}${cause ? ` (${cause})` : ''}`);
  }
  return jsonReply<T>(res, url);
}

/** A reply's JSON body; an error status is the MeshError its body names (else HTTP_ERROR naming `what`). */
export async function jsonReply<T>(res: Response, what: string): Promise<T> {
  const body = (await res.json().catch(() => ({}))) as T & { error?: { code: string; message: string } };
  if (!res.ok) throw MeshError.fromWire(body.error?.code ?? 'HTTP_ERROR', body.error?.message ?? `${what}: HTTP ${res.status}`, { status: res.status });
  return body;
}
