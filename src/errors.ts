// One error class for the whole product: a stable `code` for tests and telemetry, and a
// message that names what was wrong. Tests assert on `code`, not on message text. Every code
// is registered in `error-codes.ts` with its meaning and HTTP status (docs/errors.md).

import { isErrorCode } from './error-codes.ts';
import type { ErrorCode } from './error-codes.ts';

export { ERROR_CODES, codeForRefusal, httpStatusFor, isErrorCode } from './error-codes.ts';
export type { ErrorCode } from './error-codes.ts';

export class MeshError extends Error {
  readonly code: ErrorCode;
  readonly details: Record<string, unknown> | undefined;

  constructor(code: ErrorCode, message: string, details?: Record<string, unknown>) {
    super(message);
    this.name = 'MeshError';
    this.code = code;
    this.details = details;
  }

  /**
   * An error a peer, a worker or a server sent us as `{code, message}`. A code this build does
   * not register (a newer peer's, a proxy's) becomes REMOTE_ERROR with the original kept in
   * `details.remoteCode` and in the message, so it stays visible without being trusted.
   */
  static fromWire(code: unknown, message: string, details?: Record<string, unknown>): MeshError {
    if (isErrorCode(code)) return new MeshError(code, message, details);
    if (code === undefined || code === null || code === '') return new MeshError('REMOTE_ERROR', message, details);
    return new MeshError('REMOTE_ERROR', `${String(code)}: ${message}`, { ...details, remoteCode: String(code) });
  }
}

export function isMeshError(e: unknown, code?: ErrorCode): e is MeshError {
  return e instanceof MeshError && (code === undefined || e.code === code);
}
