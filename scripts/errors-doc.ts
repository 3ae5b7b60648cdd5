// Writes docs/errors.md from the error-code registry (src/error-codes.ts):
// `npm run docs:errors`. test/errors.test.ts fails when the file and the registry disagree.

import { writeFileSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { ERROR_AREAS } from '../src/error-codes.ts';

export const ERRORS_DOC_PATH = fileURLToPath(new URL('../docs/errors.md', import.meta.url));

/** A table cell: pipes would end the cell early. */
const cell = (text: string): string => text.replaceAll('|', '\\|');

export function renderErrorsDoc(): string {
  const out = [
    '# Error codes',
    '',
    '<!-- generated from src/error-codes.ts by `npm run docs:errors`; edit the registry, not this file -->',
    '',
    'Every error that crosses a module boundary is a `MeshError` (`src/errors.ts`) with one of the',
    'codes below and a message naming what was wrong. The code is stable: tests, telemetry and',
    "peers match on it, never on the message. The HTTP status is what the signaling server, the",
    'OpenAI-compatible API and the frame HTTP transport answer when the error ends a request',
    '(4xx: the caller’s fault; 5xx: ours or a stage’s). An error received from a peer, a worker or',
    'a server with a code this build does not register becomes `REMOTE_ERROR`, the original code',
    'kept in `details.remoteCode` and in the message.',
  ];
  for (const area of ERROR_AREAS) {
    out.push('', `## ${area.title}`, '', '| code | HTTP | meaning |', '|---|---|---|');
    for (const [code, info] of Object.entries(area.codes)) out.push(`| \`${code}\` | ${info.status} | ${cell(info.meaning)} |`);
  }
  return `${out.join('\n')}\n`;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  writeFileSync(ERRORS_DOC_PATH, renderErrorsDoc());
  console.log(`wrote ${ERRORS_DOC_PATH}`);
}
