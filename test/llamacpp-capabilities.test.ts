// What peers advertise they can serve (src/backends/capabilities.ts) and the rule the planner,
// the room and the audit share (src/model/serve-capability.ts): the llama.cpp architecture
// table is the bundled library's own, and servable() answers ranges / whole model / nothing.
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backendCapability } from '../src/backends/capabilities.ts';
import { LLAMACPP_RANGE_ARCHITECTURES, LLAMACPP_WHOLE_MODEL_ARCHITECTURES } from '../src/backends/llamacpp/architectures.ts';
import { llamaBinsDir } from '../src/backends/llamacpp/ffi.ts';
import { isServeCapability, servable } from '../src/model/serve-capability.ts';

describe('serve capabilities', () => {
  it('every llama.cpp architecture named in the table is a name the shipped libllama knows', () => {
    const dir = llamaBinsDir();
    const lib = readFileSync(join(dir, readdirSync(dir).find((f) => /^libllama(\.v[\d.]+)?\.so$/.test(f))!));
    // NUL-terminated (the linker may store "qwen2" as the tail of "rwkv6qwen2", so no leading NUL is required)
    const missing = LLAMACPP_WHOLE_MODEL_ARCHITECTURES.filter((name) => lib.indexOf(Buffer.from(`${name}\0`)) < 0);
    expect(missing).toEqual([]);
    for (const a of LLAMACPP_RANGE_ARCHITECTURES) expect(LLAMACPP_WHOLE_MODEL_ARCHITECTURES).toContain(a);
  });

  it('servable(): ranges, the whole model only, or nothing, with the reason', () => {
    const llama = backendCapability('llamacpp');
    const cpu = backendCapability('cpu');
    const webgpu = backendCapability('webgpu');
    expect(servable(llama, { architecture: 'llama', weightTypes: ['Q4_K', 'Q6_K', 'F32'] })).toEqual({ ranges: true, wholeModel: true, reason: null });
    expect(servable(llama, { architecture: 'qwen3moe', weightTypes: ['Q8_0'] })).toMatchObject({ ranges: false, wholeModel: true, reason: expect.stringMatching(/whole model only/) });
    expect(servable(llama, { architecture: 'made-up', weightTypes: ['F32'] })).toMatchObject({ ranges: false, wholeModel: false });
    expect(servable(cpu, { architecture: 'qwen3moe', weightTypes: ['F32'] })).toMatchObject({ ranges: true, wholeModel: true });
    expect(servable(cpu, { architecture: 'gemma2', weightTypes: ['F32'] })).toMatchObject({ wholeModel: false, reason: "it does not run architecture 'gemma2'" });
    expect(servable(cpu, { architecture: 'qwen2', weightTypes: ['Q4_K', 'F32'] }).ranges).toBe(true);
    // WGSL has no IQ2_XXS kernel; llama.cpp reads any type
    expect(servable(webgpu, { architecture: 'llama', weightTypes: ['IQ2_XXS'] })).toMatchObject({ wholeModel: false, reason: 'it cannot read IQ2_XXS weights' });
    expect(servable(llama, { architecture: 'llama', weightTypes: ['IQ4_NL'] }).ranges).toBe(true);
    expect(servable(undefined, { architecture: 'llama', weightTypes: [] }).wholeModel).toBe(false);
  });

  it('a capability from the wire is three lists of strings', () => {
    expect(isServeCapability(backendCapability('webgpu'))).toBe(true);
    expect(isServeCapability({ rangeArchitectures: 'llama', wholeModelArchitectures: [], weightTypes: [] })).toBe(false);
    expect(isServeCapability({ rangeArchitectures: [1], wholeModelArchitectures: [], weightTypes: [] })).toBe(false);
    expect(isServeCapability(null)).toBe(false);
  });
});
