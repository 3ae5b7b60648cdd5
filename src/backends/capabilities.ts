// What each backend serves (model/serve-capability.ts): peers advertise these in their hello,
// and the audit reads the same table. Data only — importing it loads no engine (no koffi,
// no Dawn), so browser code may use it.

import { DEQUANT_TYPES } from '../gguf/dequant.ts';
import { ggmlTypeName } from '../gguf/traits.ts';
import { SUPPORTED_ARCHITECTURES } from '../model/config.ts';
import { ANY } from '../model/serve-capability.ts';
import type { ServeCapability } from '../model/serve-capability.ts';
import { LLAMACPP_RANGE_ARCHITECTURES, LLAMACPP_WHOLE_MODEL_ARCHITECTURES } from './llamacpp/architectures.ts';
import { SUPPORTED_WEIGHT_TYPES } from './webgpu/shader-library.ts';

export type BackendName = 'cpu' | 'webgpu' | 'llamacpp';


const CAPABILITIES: Readonly<Record<BackendName, ServeCapability>> = {
  // the CPU reference and the WGSL kernels read their model through configFromHeader (Qwen3.5 included)
  cpu: { rangeArchitectures: [...SUPPORTED_ARCHITECTURES], wholeModelArchitectures: [...SUPPORTED_ARCHITECTURES], weightTypes: DEQUANT_TYPES.map(ggmlTypeName) },
  webgpu: { rangeArchitectures: [...SUPPORTED_ARCHITECTURES], wholeModelArchitectures: [...SUPPORTED_ARCHITECTURES], weightTypes: SUPPORTED_WEIGHT_TYPES.map(ggmlTypeName) },
  // llama.cpp reads every ggml type; ranges only where the range path is checked (range-stage.ts)
  llamacpp: { rangeArchitectures: [...LLAMACPP_RANGE_ARCHITECTURES], wholeModelArchitectures: [...LLAMACPP_WHOLE_MODEL_ARCHITECTURES], weightTypes: [ANY] },
};

export function backendCapability(backend: BackendName): ServeCapability {
  const c = CAPABILITIES[backend];
  return { rangeArchitectures: [...c.rangeArchitectures], wholeModelArchitectures: [...c.wholeModelArchitectures], weightTypes: [...c.weightTypes] };
}
