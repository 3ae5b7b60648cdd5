// The WGSL sources for code bundled by vite (pages, workers, browser tests): `?raw` imports of
// every file under shaders/, inlined at build time.

import { sourcesFromPaths } from './shader-library.ts';
import type { ShaderSources } from './shader-library.ts';

const files = import.meta.glob('../../../shaders/**/*.wgsl', { query: '?raw', import: 'default', eager: true }) as Record<string, string>;

export const SHADERS: ShaderSources = sourcesFromPaths(files);
