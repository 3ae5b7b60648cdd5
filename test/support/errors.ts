// What a promise fails with, as tests compare it: a MeshError's code, else the error's text
// (undefined when it resolves).
import { isMeshError } from '../../src/errors.ts';

export async function errorCode(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
    return undefined;
  } catch (e) {
    return isMeshError(e) ? e.code : String(e);
  }
}
