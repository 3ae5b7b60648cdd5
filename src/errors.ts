// One error class for the whole product: a stable `code` for tests and telemetry, and a
// message that names what was wrong. Tests assert on `code`, not on message text.

export class MeshError extends Error {
  readonly code: string;
  readonly details: Record<string, unknown> | undefined;

  constructor(code: string, message: string, details?: Record<string, unknown>) {
    super(message);
    this.name = 'MeshError';
    this.code = code;
    this.details = details;
  }
}

export function isMeshError(e: unknown, code?: string): e is MeshError {
  return e instanceof MeshError && (code === undefined || e.code === code);
}
