// The WGSL sources for Node (Dawn): read from the shaders/ folder of the checkout.

import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sourcesFromPaths } from './shader-library.ts';
import type { ShaderSources } from './shader-library.ts';

export function loadShaderSources(dir = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'shaders')): ShaderSources {
  const byPath: Record<string, string> = {};
  const walk = (d: string): void => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.wgsl')) byPath[`shaders/${relative(dir, p)}`] = readFileSync(p, 'utf8');
    }
  };
  walk(dir);
  return sourcesFromPaths(byPath);
}
