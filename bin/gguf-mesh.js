#!/usr/bin/env node
// Entry point for `npx gguf-mesh`: registers tsx so the TypeScript sources run as they are,
// with no build step between `npm install` and the first command.
import { register } from 'tsx/esm/api';

register();
const { main } = await import('../src/cli/main.ts');
process.exitCode = await main(process.argv.slice(2));
