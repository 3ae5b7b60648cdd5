// What a peer can compute, as it advertises it in its hello (`serves`), and the one rule that
// decides what of a model it may be given: any contiguous layer range, only the whole model
// (every layer in one stage), or nothing. The route planner, the room and `gguf-mesh audit`
// all ask `servable()`, so what audit calls ready is what serve plans. Browser-safe.

import type { GgufHeader } from '../gguf/types.ts';
import { ggmlTypeName } from '../gguf/traits.ts';

/** '*' in a list means "any". */
export const ANY = '*';

export interface ServeCapability {
  /** architectures (general.architecture) served as any contiguous layer range */
  rangeArchitectures: string[];
  /** architectures served only whole: all layers in one stage (a superset of the range ones) */
  wholeModelArchitectures: string[];
  /** weight types read, as ggml names them (Q8_0, Q4_K, …) */
  weightTypes: string[];
}

/** What a model asks of whoever serves it. */
export interface ModelTraits {
  architecture: string;
  /** the ggml types of its tensors, each once */
  weightTypes: string[];
}

export interface Servable {
  /** any contiguous layer range */
  ranges: boolean;
  /** the whole model as one stage */
  wholeModel: boolean;
  /** why not (ranges or whole model), null when both are fine */
  reason: string | null;
}

export function modelTraits(header: GgufHeader): ModelTraits {
  return {
    architecture: String(header.metadata['general.architecture'] ?? ''),
    weightTypes: [...new Set(header.tensors.map((t) => ggmlTypeName(t.type)))].sort(),
  };
}

const has = (list: readonly string[], x: string): boolean => list.includes(ANY) || list.includes(x);

/** What of `model` a peer with `cap` may serve (a peer with no capability serves nothing). */
export function servable(cap: ServeCapability | undefined, model: ModelTraits): Servable {
  if (!cap) return { ranges: false, wholeModel: false, reason: 'the peer advertised no capability' };
  const unreadable = model.weightTypes.filter((t) => !has(cap.weightTypes, t));
  if (unreadable.length > 0) return { ranges: false, wholeModel: false, reason: `it cannot read ${unreadable.join(', ')} weights` };
  const ranges = has(cap.rangeArchitectures, model.architecture);
  const wholeModel = ranges || has(cap.wholeModelArchitectures, model.architecture);
  if (!wholeModel) return { ranges, wholeModel, reason: `it does not run architecture '${model.architecture}'` };
  return { ranges, wholeModel, reason: ranges ? null : `it runs '${model.architecture}' as the whole model only, not as a layer range` };
}

/** Checks a capability from the wire: three lists of strings. */
export function isServeCapability(x: unknown): x is ServeCapability {
  const c = x as Partial<ServeCapability> | null;
  const list = (v: unknown): boolean => Array.isArray(v) && v.length <= 1024 && v.every((s) => typeof s === 'string');
  return !!c && typeof c === 'object' && list(c.rangeArchitectures) && list(c.wholeModelArchitectures) && list(c.weightTypes);
}
